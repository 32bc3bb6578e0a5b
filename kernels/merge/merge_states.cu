// The merge kernel: combines num_states partial attention results over
// disjoint sets of keys into one,
//     LSE = log(sum_s exp(LSE_s)),   O = sum_s exp(LSE_s - LSE) * O_s,
// in fp32. It finishes every split-KV forward call (the parts in the
// workspace) and serves flashcore_merge_states.
//
// One warp per row (batch, head, query): the lanes first reduce the row's
// LSE values (lane i holds state i's), then each lane accumulates 4
// consecutive columns of every state, 128 columns per pass, loading up to
// kStatesInFlight states at once. Rows every state saw nothing of (all LSE_s
// -inf) get O = 0 and LSE = -inf, as the forward kernels give them (LSE =
// the sink, with learnable sinks: a state of output 0 added once). States
// are visited in order, so results are deterministic.
//
// After a split forward kernel (sm_90+) the merge is that kernel's
// programmatic dependent, launched while it runs: what needs only the
// call's parameters is done before the wait for it, and what follows its
// last CTA is one round trip to memory (the LSE values and the first states'
// values together) and the arithmetic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "common/fragment_layout.cuh"
#include "common/params.h"
#include "merge/params.h"
#include "common/ptx.cuh"
#include "flashcore.h"

namespace flashcore {
namespace {

constexpr int kMergeThreads = 128;
constexpr int kWarpsPerBlock = kMergeThreads / kWarpSize;
constexpr int kColsPerLane = 4;
constexpr int kColsPerPass = kColsPerLane * kWarpSize;
// States whose values one warp loads before it uses the first. A split
// decode call merges 8 to 16 per row, few rows, and each round trip to
// memory costs more than the arithmetic of the whole merge; a split prefill
// call merges 2 to 4 per row, many rows, and there the unused slots of a
// wide batch cost more than they save (chunked prefill 256/2k with 2 splits
// on an H100: 27.9 us with 4 in flight, 32.6 with 16). (8 spills 28 bytes
// in ptxas of CUDA 13.)
constexpr int kManyStatesInFlight = 16;
constexpr int kFewStatesInFlight = 4;
// Blocks of the grid-stride loop: enough to fill any GPU several times.
constexpr int64_t kMaxMergeBlocks = 1 << 16;
// The kernel counts columns and states in 32-bit ints, each loop stepping
// past its bound by less than one step: validation caps both (the merge's
// documented limits, which also cover every split-KV forward call) so that
// no count wraps.
static_assert(int64_t(FLASHCORE_MERGE_MAX_HEAD_DIM) + kColsPerPass <= INT32_MAX, "column counter wraps");
static_assert(int64_t(FLASHCORE_MERGE_MAX_NUM_STATES) + kWarpSize <= INT32_MAX, "state counter wraps");
static_assert(FLASHCORE_MAX_NUM_SPLITS <= FLASHCORE_MERGE_MAX_NUM_STATES, "a split call's merge is refused");

template <typename T>
struct Vec4;
template <>
struct Vec4<float> {
    __device__ static void load(const float *p, float (&v)[4]) {
        const float4 x = *reinterpret_cast<const float4 *>(p);
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    }
    __device__ static void store(float *p, const float (&v)[4]) {
        *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
    }
};
template <typename Half2, float2 (*kToFloat2)(Half2), Half2 (*kFromFloat2)(float2)>
struct Vec4Of2Byte {
    template <typename T>
    __device__ static void load(const T *p, float (&v)[4]) {
        const uint2 raw = *reinterpret_cast<const uint2 *>(p);
        const float2 lo = kToFloat2(*reinterpret_cast<const Half2 *>(&raw.x));
        const float2 hi = kToFloat2(*reinterpret_cast<const Half2 *>(&raw.y));
        v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
    }
    template <typename T>
    __device__ static void store(T *p, const float (&v)[4]) {
        const Half2 lo = kFromFloat2(make_float2(v[0], v[1]));
        const Half2 hi = kFromFloat2(make_float2(v[2], v[3]));
        uint2 raw;
        raw.x = *reinterpret_cast<const uint32_t *>(&lo);
        raw.y = *reinterpret_cast<const uint32_t *>(&hi);
        *reinterpret_cast<uint2 *>(p) = raw;
    }
};
__device__ float2 half2_to_float2(__half2 x) { return __half22float2(x); }
__device__ __half2 float2_to_half2(float2 x) { return __float22half2_rn(x); }
__device__ float2 bf162_to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
__device__ __nv_bfloat162 float2_to_bf162(float2 x) { return __float22bfloat162_rn(x); }
template <>
struct Vec4<__half> : Vec4Of2Byte<__half2, half2_to_float2, float2_to_half2> {};
template <>
struct Vec4<__nv_bfloat16> : Vec4Of2Byte<__nv_bfloat162, bf162_to_float2, float2_to_bf162> {};

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Where one row (batch, head, query) of the merge reads and writes, from
// the call's parameters alone (nothing the forward kernel writes).
template <typename In, typename Out>
struct MergeRow {
    bool exists;      // false: a packed sequence's query past its length
    int64_t out_row;  // its lse entry
    Out *out;
    const float *partial_lse;  // state 0's
    const In *partial_out;     // state 0's
    float sink;                // a learnable sink's logit, or -inf

    __device__ __forceinline__ static MergeRow of(const MergeKernelParams &p, int64_t row) {
        MergeRow r;
        const int query = int(row % p.seqlen);
        const int head = int(row / p.seqlen % p.num_heads);
        const int batch = int(row / p.seqlen / p.num_heads);
        r.exists = true;
        r.out_row = row;
        r.out = static_cast<Out *>(p.out) + batch * p.out_batch_stride + head * p.out_head_stride +
                query * p.out_seq_stride;
        if (p.cu_seqlens != nullptr) {
            int row0 = 0, len = 0;
            packed_rows(p.cu_seqlens, batch, p.total_seqlen, p.seqlen, row0, len);
            r.exists = query < len;
            r.out_row = int64_t(head) * p.total_seqlen + row0 + query;
            r.out = static_cast<Out *>(p.out) + head * p.out_head_stride + int64_t(row0 + query) * p.out_seq_stride;
        }
        r.partial_lse =
            p.partial_lse + batch * p.lse_batch_stride + head * p.lse_head_stride + query * p.lse_seq_stride;
        r.partial_out = static_cast<const In *>(p.partial_out) + batch * p.partial_batch_stride +
                        head * p.partial_head_stride + query * p.partial_seq_stride;
        r.sink = p.sinks != nullptr ? __ldg(p.sinks + head) : -INFINITY;
        return r;
    }
};

template <typename In, typename Out, int kStatesInFlight>
__global__ void __launch_bounds__(kMergeThreads) merge_states_kernel(const __grid_constant__ MergeKernelParams p) {
    const int lane = threadIdx.x % kWarpSize;
    const int64_t num_rows = int64_t(p.batch_size) * p.num_heads * p.seqlen;
    const int64_t first_warp = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
    const int64_t warp_stride = int64_t(gridDim.x) * kWarpsPerBlock;
    // Each warp places its first row (64-bit divisions, the sinks' load)
    // before the wait for the forward kernel that this one follows by
    // programmatic launch, which leaves only the partial results' loads
    // behind its last CTA; a warp without rows touches no memory and does
    // not wait. What it reads there (cu_seqlens, sinks) the forward kernel
    // does not write, and the forward, launched in stream order, started
    // only after all earlier work on the stream had finished. Rows are
    // placed in one place in the code: the merge runs for every dtype pair
    // and architecture, and a second place (the first row before the loop)
    // cost 270-370 instructions a kernel.
    for (int64_t row = first_warp; row < num_rows; row += warp_stride) {
        const MergeRow<In, Out> r = MergeRow<In, Out>::of(p, row);
        if (row == first_warp) wait_for_prerequisite_grids();
        if (!r.exists) continue;  // the same for the whole warp
        // A batch of states' values, kStatesInFlight from state `first`
        // (states past num_states and columns past head_dim read as 0), all
        // loads issued before the first use.
        float v[kStatesInFlight][kColsPerLane];
        const auto load_batch = [&](int pass_col, int first) {
            const int col = pass_col + lane * kColsPerLane;
            const In *state_in = r.partial_out + int64_t(first) * p.partial_state_stride + col;
#pragma unroll
            for (int j = 0; j < kStatesInFlight; ++j) {
                if (col < p.head_dim && first + j < p.num_states) {
                    Vec4<In>::load(state_in + int64_t(j) * p.partial_state_stride, v[j]);
                } else {
#pragma unroll
                    for (int c = 0; c < kColsPerLane; ++c) v[j][c] = 0.f;
                }
            }
        };
        // Lane i holds state i's LSE (the states past the warp's width,
        // rare, are read again in the loops below). The first batch of
        // values is loaded with it: neither depends on the other, so the
        // merge's latency, its round trips to memory (a split decode merges
        // 8-16 states per row, few rows), is one before the arithmetic
        // rather than two.
        const float own_lse = lane < p.num_states ? r.partial_lse[lane * p.lse_state_stride] : -INFINITY;
        load_batch(0, 0);
        float max_lse = own_lse;
        for (int s = lane + kWarpSize; s < p.num_states; s += kWarpSize) {
            max_lse = fmaxf(max_lse, r.partial_lse[s * p.lse_state_stride]);
        }
        // A learnable sink: one more state, of output 0, counted once.
        max_lse = fmaxf(warp_max(max_lse), r.sink);
        float lse = -INFINITY;
        if (max_lse != -INFINITY) {
            float sum = expf(own_lse - max_lse);
            for (int s = lane + kWarpSize; s < p.num_states; s += kWarpSize) {
                sum += expf(r.partial_lse[s * p.lse_state_stride] - max_lse);
            }
            lse = max_lse + logf(warp_sum(sum) + expf(r.sink - max_lse));
        }

        // Every lane runs every pass, also where its columns are past
        // head_dim: the weights travel by shuffle, which needs the whole warp.
        for (int pass_col = 0; pass_col < p.head_dim; pass_col += kColsPerPass) {
            const int col = pass_col + lane * kColsPerLane;
            float acc[kColsPerLane] = {0.f, 0.f, 0.f, 0.f};
            for (int first = 0; lse != -INFINITY && first < p.num_states; first += kWarpSize) {
                // Lane i weighs state first + i once; the loop below takes
                // the weights by shuffle, so the states' loads do not wait
                // on one another and are all issued before the first use.
                const int own_state = first + lane;
                const float state_lse = first == 0 ? own_lse
                                        : own_state < p.num_states ? r.partial_lse[own_state * p.lse_state_stride]
                                                                   : -INFINITY;
                const float own_weight = expf(state_lse - lse);
                const int states = min(kWarpSize, p.num_states - first);
                for (int batch_first = 0; batch_first < states; batch_first += kStatesInFlight) {
                    // v already holds the first batch (pass 0, state 0).
                    if (pass_col + first + batch_first != 0) load_batch(pass_col, first + batch_first);
#pragma unroll
                    for (int j = 0; j < kStatesInFlight; ++j) {
                        // Lanes past the states hold weight 0 (their LSE is -inf).
                        const float weight = __shfl_sync(0xffffffffu, own_weight, (batch_first + j) % kWarpSize);
                        // exp(-inf - lse) = 0: a state that saw no key of
                        // the row contributes nothing, whatever its values
                        // (NaN, say): selected away, not multiplied.
#pragma unroll
                        for (int c = 0; c < kColsPerLane; ++c) acc[c] += weight != 0.f ? weight * v[j][c] : 0.f;
                    }
                }
            }
            if (col < p.head_dim) Vec4<Out>::store(r.out + col, acc);
        }
        if (lane == 0 && p.lse != nullptr) p.lse[r.out_row] = lse;
    }
}

template <typename In, typename Out>
cudaError_t launch(const MergeKernelParams &p, cudaStream_t stream, bool after_forward) {
    const int64_t rows = int64_t(p.batch_size) * p.num_heads * p.seqlen;
    int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (blocks > kMaxMergeBlocks) blocks = kMaxMergeBlocks;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(blocks));
    config.blockDim = dim3(kMergeThreads);
    config.stream = stream;
    cudaLaunchAttribute programmatic[1];
    if (after_forward) {
        programmatic[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        programmatic[0].val.programmaticStreamSerializationAllowed = 1;
        config.attrs = programmatic;
        config.numAttrs = 1;
    }
    if (p.num_states > kFewStatesInFlight) {
        return cudaLaunchKernelEx(&config, merge_states_kernel<In, Out, kManyStatesInFlight>, p);
    }
    return cudaLaunchKernelEx(&config, merge_states_kernel<In, Out, kFewStatesInFlight>, p);
}

template <typename In>
cudaError_t launch_for_output(MergeType out_type, const MergeKernelParams &p, cudaStream_t stream,
                              bool after_forward) {
    switch (out_type) {
        case MergeType::kFp16: return launch<In, __half>(p, stream, after_forward);
        case MergeType::kBf16: return launch<In, __nv_bfloat16>(p, stream, after_forward);
        case MergeType::kFp32: return launch<In, float>(p, stream, after_forward);
    }
    return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t run_merge_states(MergeType partial_type, MergeType out_type, const MergeKernelParams &params,
                             cudaStream_t stream, bool after_forward) {
    switch (partial_type) {
        case MergeType::kFp16: return launch_for_output<__half>(out_type, params, stream, after_forward);
        case MergeType::kBf16: return launch_for_output<__nv_bfloat16>(out_type, params, stream, after_forward);
        case MergeType::kFp32: return launch_for_output<float>(out_type, params, stream, after_forward);
    }
    return cudaErrorInvalidValue;
}

}  // namespace flashcore
