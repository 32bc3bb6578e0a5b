// flashcore_forward_params as the library reads it: the caller's struct of
// any header version, its defaults, the values derived from it, the strides
// of packed tensors, and the kernels' parameter block built from it.
#pragma once

#include <cstddef>
#include <climits>
#include <cstdint>

#include "common/params.h"
#include "struct_io.h"
#include "flashcore.h"

namespace flashcore {

// Size of flashcore_forward_params as version 0.1 defined it (it ended
// before head_dim_v): the smallest a caller may pass. read_params gives such
// a caller the defaults of the fields added since (head_dim_v in 0.2,
// num_splits in 0.3, the window and softcap in 0.4, seqused_k in 0.5, the
// varlen and paged fields in 0.6, the dtypes and descales of quantized
// inputs in 0.8, attention_chunk, sinks and sm_margin in 0.9).
constexpr size_t kParamsSizeV0_1 = offsetof(flashcore_forward_params, head_dim_v);
// Where each released header's flashcore_forward_params ended: after the
// last field that version added (0.1 before head_dim_v, 0.2 after it, 0.3
// after num_splits, 0.4 after softcap, 0.5 after seqused_k, 0.6 and 0.7
// after num_pages, 0.8 after v_descale_head_stride; 0.9's is our sizeof).
// A caller's struct_size must be one of these, or that rounded up to the
// struct's alignment (its sizeof then), or at least our own sizeof (a newer
// header's): any other size ends inside a field, which would be read in
// part (check_released_size).
constexpr size_t field_end(size_t offset, size_t size) { return offset + size; }
constexpr size_t kReleasedParamsEnds[] = {
    kParamsSizeV0_1,
    field_end(offsetof(flashcore_forward_params, head_dim_v), sizeof(int32_t)),     // 0.2
    field_end(offsetof(flashcore_forward_params, num_splits), sizeof(int32_t)),     // 0.3
    field_end(offsetof(flashcore_forward_params, softcap), sizeof(float)),          // 0.4
    field_end(offsetof(flashcore_forward_params, seqused_k), sizeof(const void *)), // 0.5
    field_end(offsetof(flashcore_forward_params, num_pages), sizeof(int32_t)),      // 0.6, 0.7
    field_end(offsetof(flashcore_forward_params, v_descale_head_stride), sizeof(int64_t)),  // 0.8
};
// Where the last field this library knows ends: bytes of a caller's struct
// past it belong to fields of a newer header (sizeof adds only padding).
constexpr size_t kParamsKnownEnd =
    offsetof(flashcore_forward_params, sm_margin) + sizeof(flashcore_forward_params::sm_margin);

// Checks a caller's struct_size against the sizes this library accepts.
flashcore_status check_struct_size(size_t struct_size, const char *what);

// Writes the defaults into the caller's struct_size bytes at *params.
void init_params(flashcore_forward_params *params, size_t struct_size);

// Copies the caller's struct into *params whatever header version it was
// built with (see the ABI policy in flashcore.h): fields an older caller
// lacks keep their defaults; a newer caller's struct is refused when it sets
// fields this library does not know. The copy holds the caller's values;
// the defaults they stand for come from the functions below.
flashcore_status read_params(const flashcore_forward_params *user, flashcore_forward_params *params);

// The softmax scale the kernels use: the caller's, or 1/sqrt(head_dim).
float effective_softmax_scale(const flashcore_forward_params &params);

// That scale times kLog2e, as the kernels use it (they exponentiate with
// exp2). Validation requires it to be finite.
float softmax_scale_log2(const flashcore_forward_params &params);

// softmax_scale / softcap, by which the kernels scale the raw scores before
// the tanh (FwdKernelParams::softcap_prescale); 0 without a softcap.
// Validation requires it to be a finite float > 0 where softcap is set.
float softcap_prescale(const flashcore_forward_params &params);

// The window's bounds as the call asks for them: keys a query sees to the
// left and to the right of its diagonal, kWindowUnbounded where there is no
// bound (no window, a bound of -1); causal is a right bound of 0. The
// kernels get them clamped (kernel_params).
constexpr int32_t kWindowUnbounded = INT32_MAX;
int32_t effective_window_left(const flashcore_forward_params &params);
int32_t effective_window_right(const flashcore_forward_params &params);

// Whether the call has packed or paged tensors (cu_seqlens_q, cu_seqlens_k or
// block_table): it runs on the kernels compiled for ragged batches
// (FwdKernelParams::ragged).
bool is_ragged(const flashcore_forward_params &params);

// The head dim of v and out: head_dim_v, or head_dim where it is 0.
int32_t effective_head_dim_v(const flashcore_forward_params &params);

// The flashcore_dtype of k and v: kv_dtype, or dtype where it is 0.
int32_t effective_kv_dtype(const flashcore_forward_params &params);

// Whether k and v are of another (narrower) type than q: a quantized cache.
bool has_quantized_kv(const flashcore_forward_params &params);

// Whether q (and then k and v) are e4m3: an fp8 prefill, on the sm_90a
// kernels only.
bool has_fp8_queries(const flashcore_forward_params &params);

// The flashcore_dtype of out: out_dtype, or where it is 0 q's type (bf16
// for e4m3 queries).
int32_t effective_out_dtype(const flashcore_forward_params &params);

// Writes the twelve strides of densely packed q, k, v and out in `layout`
// (FLASHCORE_LAYOUT_BHSD or _BSHD) into *strides (only those fields), from
// the shapes in `shapes` (already validated: sizes >= 0, head_dim >= 1).
// The products are computed in 128 bits: where a tensor would span more
// than 2^63 bytes, nothing is written and INVALID_ARGUMENT returned.
flashcore_status set_contiguous_strides(flashcore_forward_params *strides, const flashcore_forward_params &shapes,
                                        int32_t layout);

// The kernels' parameter block for validated parameters, neither split nor
// GQA-packed (the dispatcher sets those).
FwdKernelParams kernel_params(const flashcore_forward_params &params);

}  // namespace flashcore
