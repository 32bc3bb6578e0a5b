// Parameters of one forward launch, shared by the host dispatcher (src/) and
// the kernels. Plain data only: this header is included by host C++ files
// that are not compiled by nvcc.
#pragma once

#include <cstdint>

namespace flashcore {

enum class DType : int { kFp16 = 1, kBf16 = 2 };

// The portable kernel's tile configurations (kernels/fwd_config.cuh); the
// dispatcher picks one per call.
enum class FwdVariant : int {
    kLargeTiles = 0,  // large query blocks: most work per shared-memory read
    kKeySplit = 1,    // small query blocks, key tiles split over two warp groups: least latency
};
constexpr int kNumFwdVariants = 2;

struct FwdKernelParams {
    const void *q;
    const void *k;
    const void *v;
    void *out;
    float *lse;  // nullptr: not written

    // Element strides; the head_dim dimension is contiguous.
    int64_t q_batch_stride, q_seq_stride, q_head_stride;
    int64_t k_batch_stride, k_seq_stride, k_head_stride;
    int64_t v_batch_stride, v_seq_stride, v_head_stride;
    int64_t out_batch_stride, out_seq_stride, out_head_stride;

    int batch_size;
    int seqlen_q;
    int seqlen_k;
    int num_heads_q;
    int num_heads_kv;
    int head_dim;

    // A persistent kernel launches at most this many CTAs: one per SM, or
    // fewer where a test asks (FLASHCORE_PERSISTENT_CTAS).
    int max_persistent_ctas;

    float softmax_scale;       // natural-exp scale applied to Q*K^T
    float softmax_scale_log2;  // softmax_scale * log2(e): the kernels use exp2
    bool causal;
};

}  // namespace flashcore
