#!/usr/bin/env bash
# compute-sanitizer over a representative subset of the GPU tests, the check
# to run on a GPU before resolving a kernel change: memcheck (out-of-bounds
# and misaligned accesses, leaks of device memory) and racecheck (shared
# memory hazards) on every kernel family and tile variant, the split-KV
# path with its merge kernel, flashcore_merge_states and the backward pass;
# synccheck (invalid uses of barriers and warp-synchronous primitives) on
# the sm_90a kernel, whose warpgroups meet at named barriers and mbarriers,
# and on the backward kernels. Each run is a few
# shapes, since the tools slow the kernels 10-100x.
#
#   tests/run_sanitizers.sh BUILD_DIR [LOG_DIR]
#
# Prints one line per run (tool, what, the tool's summary) and exits
# non-zero if any run reported an error or failed a test. Needs
# compute-sanitizer (CUDA toolkit) on PATH and a GPU.
set -u
build=${1:?usage: run_sanitizers.sh BUILD_DIR [LOG_DIR]}
logs=${2:-${build}/sanitizer-logs}
tests_dir=${build}/tests
mkdir -p "${logs}"
if ! command -v compute-sanitizer >/dev/null 2>&1; then
  echo "compute-sanitizer not found on PATH (it comes with the CUDA toolkit)" >&2
  exit 2
fi

# Shapes that cover full and causal masks, partial tiles, GQA and strided
# layouts at two head dims, without taking minutes under the tools.
# Then a sliding window with softcap on a padded GQA layout, a window with
# more queries than keys, and a windowed decode (GQA packing). Then
# per-batch key counts (seqused_k) over a cache whose unused rows hold NaN:
# decode with a count of 0 and one of the whole cache, forced splits, causal
# chunks, and head dim 256.
shapes='Shapes/*_d64_*b1_hq2_hkv2_sq113_sk203*:Shapes/*_d128_causal_b2_hq8_hkv2_sq300_sk421*:Shapes/*_d64_full_b2_hq6_hkv3_sq190_sk333*'
shapes+=':Shapes/*_window100_0_softcap30*:Shapes/*sq600_sk300_bhsd_window50_10:Shapes/*sq1_sk2048_bshd_window500_m1'
shapes+=':Shapes/*_used_0_1_777_2048:Shapes/*_used_1500_129_2000_64:Shapes/*_used_100_600_50:Shapes/*_used_300_650'
# Variable-length batches (lengths 0 and 1, queries and keys apart) and
# paged caches (pages of 16, 48 and 64 keys, the pool's last page in use;
# packed queries over pages).
shapes+=':Shapes/*_qlens_0_1_17_200_513_*:Shapes/*_qlens_128_1_300_*:Shapes/*_page16:Shapes/*_page48:Shapes/*_page64'

# The backward pass (its preprocess, main and postprocess kernels, in the
# default and the deterministic mode, which every Gradients case runs):
# small shapes at head dims 40/24 (a larger kernel, masked), 64, 128,
# 192/128 and 256, full and causal, rows that see no key (seqlen_q >
# seqlen_k), GQA, a window with softcap, seqused_k, variable-length batches
# with empty sequences, calls without queries; for memcheck also the
# workspace and refused-call tests and graph capture. On an sm_90 GPU the
# head-dim 64 and 128 shapes run the sm_90a kernel by default; the kvblock
# runs check the portable kernel there.
bwd_shapes='Gradients/*/fp16_d64_*_b2_hq4_hkv2_sq200_sk333_bshd:Gradients/*/bf16_d128_causal_b1_hq2_hkv1_sq257_sk129_bhsd'
bwd_shapes+=':Gradients/*/fp16_d256_full_b2_hq4_hkv2_sq200_sk333_padded:Gradients/*/bf16_d40x24_causal_b2_hq4_hkv2_sq200_sk333_bhsd'
bwd_shapes+=':Gradients/*_d192x128_full_b1_hq4_hkv1_sq100_sk300_bhsd_softcap50:Gradients/*_window100_0_softcap30*'
bwd_shapes+=':Gradients/*_used_100_600_50:Gradients/*_qlens_0_1_17_200_513_*:Gradients/*_qlens_0_0_*:Gradients/*_sq0_*'
bwd_shapes+=':Gradients/*_window37_0:Gradients/*/bf16_d128_full_b2_hq8_hkv2_sq300_sk421_bshd'

# The sm_90a kernel's three-warpgroup configuration (head dim 64 without a
# mask; the d64 full shape above chooses it under 3 CTAs too).
sm90_shapes="${shapes}:ForwardSm90.WideConfiguration*"

# fp8 prefill (the sm_90a kernels on e4m3 inputs: V transposed by the
# producer warps, the consumers' turns): head dims 64, 128 and 256, full
# and causal, GQA, padded layouts, packed batches with empty sequences,
# seqused_k over NaN tails, and paged caches of 16 and 256 keys whose tables
# point at the pool's last page.
fp8_shapes='Shapes/ForwardFp8Test.*page*:Shapes/ForwardFp8Test.*_d128_causal_b2_hq8_hkv2_sq300_sk421_bshd*'
fp8_shapes+=':Shapes/ForwardFp8Test.*_hq6_hkv3_*padded*:Shapes/ForwardFp8Test.*qlens_0_1_17*'
fp8_shapes+=':Shapes/ForwardFp8Test.*used_100_600_50*'

# name | tool | binary | gtest filter | environment
runs=(
  "default|memcheck|test_forward|${shapes}|"
  "large|memcheck|test_forward|${shapes}|FLASHCORE_FWD_VARIANT=large"
  "keysplit|memcheck|test_forward|${shapes}|FLASHCORE_FWD_VARIANT=keysplit"
  "keysplit4|memcheck|test_forward|${shapes}|FLASHCORE_FWD_VARIANT=keysplit4"
  "decode|memcheck|test_forward|${shapes}|FLASHCORE_FWD_VARIANT=decode"
  "decodepair|memcheck|test_forward|${shapes}|FLASHCORE_FWD_VARIANT=decodepair"
  "sm90|memcheck|test_forward|${sm90_shapes}|FLASHCORE_FWD_VARIANT=hopper FLASHCORE_PERSISTENT_CTAS=3"
  "split|memcheck|test_split|Splits/*d64*sq1_*splits128:Splits/*d128*sq3*:States/*:MergeStates.*|"
  "large|racecheck|test_forward|${shapes}|FLASHCORE_FWD_VARIANT=large"
  "keysplit|racecheck|test_forward|${shapes}|FLASHCORE_FWD_VARIANT=keysplit"
  "keysplit4|racecheck|test_forward|${shapes}|FLASHCORE_FWD_VARIANT=keysplit4"
  "decode|racecheck|test_forward|${shapes}|FLASHCORE_FWD_VARIANT=decode"
  "decodepair|racecheck|test_forward|${shapes}|FLASHCORE_FWD_VARIANT=decodepair"
  "sm90|racecheck|test_forward|${sm90_shapes}|FLASHCORE_FWD_VARIANT=hopper FLASHCORE_PERSISTENT_CTAS=3"
  "split|racecheck|test_split|Splits/*d64*sq1_*splits128:States/*|"
  "sm90|synccheck|test_forward|${sm90_shapes}|FLASHCORE_FWD_VARIANT=hopper FLASHCORE_PERSISTENT_CTAS=3"
  "split.sm90|synccheck|test_split|Splits/*d128*sq3*:Splits/*d64*sq1_*splits128|FLASHCORE_FWD_VARIANT=hopper"
  "fp8|memcheck|test_forward|${fp8_shapes}|"
  "fp8|racecheck|test_forward|${fp8_shapes}|"
  "fp8|synccheck|test_forward|${fp8_shapes}|"
  "split.fp8|memcheck|test_split|Splits/SplitFp8PrefillTest.*page*|"
  "backward|memcheck|test_backward|${bwd_shapes}:BackwardApi.*:BackwardGraph.*|"
  "backward|racecheck|test_backward|${bwd_shapes}|"
  "backward|synccheck|test_backward|${bwd_shapes}|"
  "backward.kvblock|memcheck|test_backward|${bwd_shapes}|FLASHCORE_BWD_VARIANT=portable"
  "backward.kvblock|racecheck|test_backward|${bwd_shapes}|FLASHCORE_BWD_VARIANT=portable"
)

status=0
for run in "${runs[@]}"; do
  IFS='|' read -r name tool binary filter env_vars <<<"${run}"
  log=${logs}/${tool}.${name}.log
  # shellcheck disable=SC2086 # env_vars is a list of NAME=VALUE words
  env ${env_vars} compute-sanitizer --tool "${tool}" --error-exitcode 9 \
    "${tests_dir}/${binary}" "--gtest_filter=${filter}" --gtest_brief=1 >"${log}" 2>&1
  code=$?
  summary=$(grep -E "(ERROR|RACECHECK) SUMMARY" "${log}" | tail -1 | sed 's/^=* *//')
  passed=$(grep -E '^\[  PASSED  \] [0-9]+ test' "${log}" | awk '{print $4}')
  echo "${tool} ${name}: ${summary:-no summary} (${passed:-0} tests passed, exit code ${code})"
  # 77: every selected test skipped (e.g. sm90 on another GPU).
  if [ "${code}" -ne 0 ] && [ "${code}" -ne 77 ]; then
    status=1
  fi
done
exit "${status}"
