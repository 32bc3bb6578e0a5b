// Parameters of one forward launch, shared by the host dispatcher (src/) and
// the kernels. Plain data only: this header is included by host C++ files
// that are not compiled by nvcc.
#pragma once

#include <cstdint>

namespace flashcore {

enum class DType : int { kFp16 = 1, kBf16 = 2 };

// The kernel families (kernels/sm80/, kernels/sm90/).
enum class KernelPath : int { kSm80 = 0, kSm90 = 1 };

// Tile variants (kernels/fwd_variants.list): the dispatcher picks one per
// call among those built for the call's path and head dims.
enum class FwdVariant : int {
    kLargeTiles = 0,   // sm80: large query blocks, most work per shared-memory read
    kKeySplit = 1,     // sm80: small query blocks, key tiles split over two warp groups: least latency
    kPersistent = 2,   // sm90: persistent wgmma/TMA kernel
};

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
    // The call's head dims: at most the kernel's, whose columns past them
    // are loaded as zeros and never stored.
    int head_dim;
    int head_dim_v;

    float softmax_scale;       // natural-exp scale applied to Q*K^T
    float softmax_scale_log2;  // softmax_scale * log2(e): the kernels use exp2
    bool causal;
};

}  // namespace flashcore
