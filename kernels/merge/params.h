// Parameters of the merge kernel (common/merge_states.cu), which combines
// partial attention results over disjoint key sets: split-KV parts from the
// workspace, or the caller's (flashcore_merge_states). Plain data only: host
// C++ files that nvcc does not compile include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashcore {

// Element types the merge reads and writes (values of flashcore_dtype).
enum class MergeType : int { kFp16 = 1, kBf16 = 2, kFp32 = 3 };

struct MergeKernelParams {
    const void *partial_out;  // [num_states][batch][heads][seqlen][head_dim]
    const float *partial_lse; // [num_states][batch][heads][seqlen]
    void *out;                // [batch][heads][seqlen][head_dim]
    float *lse;               // [batch][heads][seqlen], contiguous; nullptr: not written

    int num_states;
    int batch_size;
    int num_heads;
    int seqlen;
    int head_dim;

    // Element strides.
    int64_t partial_state_stride, partial_batch_stride, partial_seq_stride, partial_head_stride;
    int64_t lse_state_stride, lse_batch_stride, lse_seq_stride, lse_head_stride;
    int64_t out_batch_stride, out_seq_stride, out_head_stride;

    // Packed output (a variable-length forward call's parts): nullptr, or
    // the call's cu_seqlens_q. Row `query` of batch b then goes to out row
    // cu_seqlens[b] + query (out_batch_stride unused) and lse entry
    // head * total_seqlen + that row; rows at or past the batch's length
    // (common/params.h: packed_rows) are skipped.
    const int32_t *cu_seqlens;
    int total_seqlen;

    // Learnable sinks (flashcore_merge_params::sinks), or nullptr: head h's
    // joins each of its rows as one more state of LSE sinks[h] and output 0.
    const float *sinks;
};

// Queues the merge on `stream`; returns the launch error. The parameters
// must be validated (head_dim a multiple of 4, pointers and strides aligned
// to 4 elements).
// after_forward: the merge of a split-KV forward call, queued right behind
// the forward kernel on an sm_90+ GPU: launched as its programmatic
// dependent, so its launch overlaps the forward grid's tail (it waits for
// that grid's results before reading them).
cudaError_t run_merge_states(MergeType partial_type, MergeType out_type, const MergeKernelParams &params,
                             cudaStream_t stream, bool after_forward = false);

}  // namespace flashcore
