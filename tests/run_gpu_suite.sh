#!/usr/bin/env bash
# Runs every GPU test configuration that tests/CMakeLists.txt registers with
# ctest (the dispatcher's choice, each path, each pinned tile variant, the
# persistent kernel on 3 CTAs, the split suite on each path, the backward
# pass, pinned to the portable kernel and on 3 CTAs' worth of SMs too, the
# forward, split and backward suites as on GPUs with 99 KiB (sm_86/sm_89)
# and 163 KiB (A100) of shared memory per block, the fp8 widening, and
# last, alone, the race test), but as a few sharded
# processes per configuration instead of one process per test: the same
# tests in minutes rather than the ctest run's quarter hour, which matters on
# a leased GPU. ctest stays the reference; keep the two lists in step.
#
#   tests/run_gpu_suite.sh BUILD_DIR [SHARDS] [LOG_DIR]
#
# SHARDS (default 4) processes run each configuration at once. Each process's
# output goes to LOG_DIR (default BUILD_DIR/gpu-suite-logs); one summary line
# per configuration is printed. GPU_SUITE_CONFIGS="default split" runs only
# the configurations named (default: all). Exits non-zero if any test failed or any
# process did not finish.
set -u
build=${1:?usage: run_gpu_suite.sh BUILD_DIR [SHARDS] [LOG_DIR]}
shards=${2:-4}
logs=${3:-${build}/gpu-suite-logs}
tests_dir=${build}/tests
mkdir -p "${logs}"

# name | binary | gtest filter | environment [| shards: 1 runs it alone]
configs=(
  "default|test_forward|*|"
  "portable|test_forward|*-Shapes/ForwardFp8Test.*|FLASHCORE_FWD_VARIANT=portable"
  "sm90|test_forward|*|FLASHCORE_FWD_VARIANT=hopper"
  "sm90_3ctas|test_forward|Shapes/*|FLASHCORE_FWD_VARIANT=hopper FLASHCORE_PERSISTENT_CTAS=3"
  "large|test_forward|Shapes/*-Shapes/ForwardFp8Test.*|FLASHCORE_FWD_VARIANT=large"
  "keysplit|test_forward|Shapes/*-Shapes/ForwardFp8Test.*|FLASHCORE_FWD_VARIANT=keysplit"
  "keysplit4|test_forward|Shapes/*-Shapes/ForwardFp8Test.*|FLASHCORE_FWD_VARIANT=keysplit4"
  "decode|test_forward|Shapes/*-Shapes/ForwardFp8Test.*|FLASHCORE_FWD_VARIANT=decode"
  "decodepair|test_forward|Shapes/*-Shapes/ForwardFp8Test.*|FLASHCORE_FWD_VARIANT=decodepair"
  "wide|test_forward|Shapes/*d576x512*:Shapes/*_d512_*:Shapes/*_d320_*|FLASHCORE_FWD_VARIANT=wide"
  "widedecode|test_forward|Shapes/*d576x512*:Shapes/*_d512_*:Shapes/*_d320_*|FLASHCORE_FWD_VARIANT=widedecode"
  "split|test_split|*|"
  "split.portable|test_split|Splits/*-Splits/SplitFp8PrefillTest.*|FLASHCORE_FWD_VARIANT=portable"
  "split.sm90|test_split|Splits/*|FLASHCORE_FWD_VARIANT=hopper"
  "backward|test_backward|*|"
  "backward.kvblock|test_backward|Gradients/*:WideGradients/*:BackwardDeterminism.*:BackwardGraph.*|FLASHCORE_BWD_VARIANT=portable"
  "backward.3ctas|test_backward|Gradients/*:WideGradients/*:Sm86SmemGradients/*:BackwardDeterminism.*|FLASHCORE_PERSISTENT_CTAS=3"
  "default.smem99k|test_forward|*|FLASHCORE_TEST_SMEM_PER_BLOCK=101376"
  "portable.smem99k|test_forward|*-Shapes/ForwardFp8Test.*|FLASHCORE_FWD_VARIANT=portable FLASHCORE_TEST_SMEM_PER_BLOCK=101376"
  "default.smem163k|test_forward|*|FLASHCORE_TEST_SMEM_PER_BLOCK=166912"
  "split.smem99k|test_split|*|FLASHCORE_TEST_SMEM_PER_BLOCK=101376"
  "split.smem163k|test_split|*|FLASHCORE_TEST_SMEM_PER_BLOCK=166912"
  "backward.smem99k|test_backward|*-WideGradients/*|FLASHCORE_TEST_SMEM_PER_BLOCK=101376"
  "backward.smem163k|test_backward|*|FLASHCORE_TEST_SMEM_PER_BLOCK=166912"
  "fp8|test_fp8|*||1"
  "race|test_race|*||1"
)

status=0
for config in "${configs[@]}"; do
  IFS='|' read -r name binary filter env_vars config_shards <<<"${config}"
  if [ -n "${GPU_SUITE_CONFIGS:-}" ] && [[ " ${GPU_SUITE_CONFIGS} " != *" ${name} "* ]]; then
    continue
  fi
  n=${config_shards:-${shards}}
  pids=()
  # This run's logs of this configuration only: a glob such as
  # portable.*.log would also read portable.smem99k's, and a log folder used
  # before may hold other shards' logs.
  config_logs=()
  for ((shard = 0; shard < n; ++shard)); do
    log=${logs}/${name}.${shard}.log
    config_logs+=("${log}")
    # shellcheck disable=SC2086 # env_vars is a list of NAME=VALUE words
    env ${env_vars} GTEST_TOTAL_SHARDS=${n} GTEST_SHARD_INDEX=${shard} \
      "${tests_dir}/${binary}" "--gtest_filter=${filter}" --gtest_brief=1 >"${log}" 2>&1 &
    pids+=($!)
  done
  codes=()
  for pid in "${pids[@]}"; do
    wait "${pid}"
    codes+=($?)
  done
  count() { cat "${config_logs[@]}" | awk -v tag="$1" '$0 ~ "^\\[  " tag " *\\] [0-9]+ test" {n += $(NF - ($0 ~ /listed below/ ? 3 : 1))} END {print n + 0}'; }
  passed=$(count PASSED)
  skipped=$(count SKIPPED)
  # gtest's brief mode lists each failed test but prints no count of them.
  failed=$(cat "${config_logs[@]}" | grep -c '^\[  FAILED  \] [A-Za-z]')
  line="${name}: ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped (exit codes ${codes[*]})"
  echo "${line}"
  for code in "${codes[@]}"; do
    # 77: every test of the shard was skipped (no usable GPU for it), which
    # the sm90 configurations report on other GPUs.
    if [ "${code}" -ne 0 ] && [ "${code}" -ne 77 ]; then
      status=1
      grep -h "^\[  FAILED  \]" "${config_logs[@]}" | head -20
      break
    fi
  done
done
exit "${status}"
