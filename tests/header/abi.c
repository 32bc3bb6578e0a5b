/*
 * Compiled with -fsyntax-only by the header.abi.* tests (as C99 and as C++):
 * pins the parts of flashcore.h that are ABI, as the header's policy states
 * them. It fails to compile when
 *   - an enumerator is renumbered or removed,
 *   - a field of flashcore_forward_params, flashcore_merge_params or
 *     flashcore_backward_params moves, changes size or is removed (new
 *     fields may only be appended: the structs may grow),
 *   - a function changes its signature (flashcore_test_api.h),
 *   - a documented macro changes value.
 */
#include "flashcore.h"
#include "flashcore_test_api.h"

#include <stddef.h>

/* C99 has no static_assert: a negative array size stops the compilation. */
#define FC_ASSERT(name, cond) typedef char flashcore_abi_##name[(cond) ? 1 : -1]

/* Status codes: never renumbered. */
FC_ASSERT(status_success, FLASHCORE_STATUS_SUCCESS == 0);
FC_ASSERT(status_invalid_argument, FLASHCORE_STATUS_INVALID_ARGUMENT == 1);
FC_ASSERT(status_unsupported, FLASHCORE_STATUS_UNSUPPORTED == 2);
FC_ASSERT(status_misaligned, FLASHCORE_STATUS_MISALIGNED == 3);
FC_ASSERT(status_workspace_too_small, FLASHCORE_STATUS_WORKSPACE_TOO_SMALL == 4);
FC_ASSERT(status_no_device, FLASHCORE_STATUS_NO_DEVICE == 5);
FC_ASSERT(status_cuda_error, FLASHCORE_STATUS_CUDA_ERROR == 6);
FC_ASSERT(status_out_of_memory, FLASHCORE_STATUS_OUT_OF_MEMORY == 7);
FC_ASSERT(status_internal, FLASHCORE_STATUS_INTERNAL == 8);
FC_ASSERT(status_size, sizeof(flashcore_status) == sizeof(int));

FC_ASSERT(dtype_fp16, FLASHCORE_DTYPE_FP16 == 1);
FC_ASSERT(dtype_bf16, FLASHCORE_DTYPE_BF16 == 2);
FC_ASSERT(dtype_fp32, FLASHCORE_DTYPE_FP32 == 3);
FC_ASSERT(dtype_fp8_e4m3, FLASHCORE_DTYPE_FP8_E4M3 == 4);
FC_ASSERT(layout_bhsd, FLASHCORE_LAYOUT_BHSD == 0);
FC_ASSERT(layout_bshd, FLASHCORE_LAYOUT_BSHD == 1);
FC_ASSERT(layout_size, sizeof(flashcore_layout) == sizeof(int));

FC_ASSERT(alignment, FLASHCORE_ALIGNMENT == 16);
FC_ASSERT(softmax_scale_default, (int)FLASHCORE_SOFTMAX_SCALE_DEFAULT == 0);
FC_ASSERT(version_number,
          FLASHCORE_VERSION_NUMBER ==
              FLASHCORE_VERSION_MAJOR * 10000 + FLASHCORE_VERSION_MINOR * 100 + FLASHCORE_VERSION_PATCH);

/* flashcore_forward_params: every field at its place with its size. The
 * offsets are those of LP64 (x86-64 and aarch64 Linux, where CUDA runs);
 * struct_size must come first everywhere. */
#define FC_FIELD_SIZE(field) sizeof(((flashcore_forward_params *)0)->field)
#define FC_FIELD(field, offset, size)                                                   \
    FC_ASSERT(field##_offset, offsetof(flashcore_forward_params, field) == (offset)); \
    FC_ASSERT(field##_size, FC_FIELD_SIZE(field) == (size))

FC_ASSERT(struct_size_first, offsetof(flashcore_forward_params, struct_size) == 0);
FC_ASSERT(struct_size_type, FC_FIELD_SIZE(struct_size) == sizeof(size_t));

#if defined(__LP64__) || defined(_LP64)
FC_FIELD(dtype, 8, 4);
FC_FIELD(batch_size, 12, 4);
FC_FIELD(seqlen_q, 16, 4);
FC_FIELD(seqlen_k, 20, 4);
FC_FIELD(num_heads_q, 24, 4);
FC_FIELD(num_heads_kv, 28, 4);
FC_FIELD(head_dim, 32, 4);
FC_FIELD(causal, 36, 4);
FC_FIELD(softmax_scale, 40, 4);
FC_FIELD(q, 48, 8);
FC_FIELD(k, 56, 8);
FC_FIELD(v, 64, 8);
FC_FIELD(out, 72, 8);
FC_FIELD(lse, 80, 8);
FC_FIELD(q_batch_stride, 88, 8);
FC_FIELD(q_seq_stride, 96, 8);
FC_FIELD(q_head_stride, 104, 8);
FC_FIELD(k_batch_stride, 112, 8);
FC_FIELD(k_seq_stride, 120, 8);
FC_FIELD(k_head_stride, 128, 8);
FC_FIELD(v_batch_stride, 136, 8);
FC_FIELD(v_seq_stride, 144, 8);
FC_FIELD(v_head_stride, 152, 8);
FC_FIELD(out_batch_stride, 160, 8);
FC_FIELD(out_seq_stride, 168, 8);
FC_FIELD(out_head_stride, 176, 8);
/* Added in 0.2: a 0.1 struct ends at 184 bytes. */
FC_FIELD(head_dim_v, 184, 4);
/* Added in 0.3: a 0.2 struct ends at 188 bytes. */
FC_FIELD(num_splits, 188, 4);
/* Added in 0.4: a 0.3 struct ends at 192 bytes. */
FC_FIELD(use_window, 192, 4);
FC_FIELD(window_left, 196, 4);
FC_FIELD(window_right, 200, 4);
FC_FIELD(softcap, 204, 4);
/* Added in 0.5: a 0.4 struct ends at 208 bytes. */
FC_FIELD(seqused_k, 208, 8);
/* Added in 0.6: a 0.5 struct ends at 216 bytes. */
FC_FIELD(cu_seqlens_q, 216, 8);
FC_FIELD(cu_seqlens_k, 224, 8);
FC_FIELD(total_seqlen_q, 232, 4);
FC_FIELD(total_seqlen_k, 236, 4);
FC_FIELD(block_table, 240, 8);
FC_FIELD(block_table_batch_stride, 248, 8);
FC_FIELD(page_size, 256, 4);
FC_FIELD(num_pages, 260, 4);
/* Added in 0.8: a 0.6 or 0.7 struct ends at 264 bytes. */
FC_FIELD(kv_dtype, 264, 4);
FC_FIELD(out_dtype, 268, 4);
FC_FIELD(q_descale, 272, 8);
FC_FIELD(k_descale, 280, 8);
FC_FIELD(v_descale, 288, 8);
FC_FIELD(q_descale_batch_stride, 296, 8);
FC_FIELD(q_descale_head_stride, 304, 8);
FC_FIELD(k_descale_batch_stride, 312, 8);
FC_FIELD(k_descale_head_stride, 320, 8);
FC_FIELD(v_descale_batch_stride, 328, 8);
FC_FIELD(v_descale_head_stride, 336, 8);
/* Added in 0.9: a 0.8 struct ends at 344 bytes. */
FC_FIELD(attention_chunk, 344, 4);
FC_FIELD(sinks, 352, 8);
FC_FIELD(sm_margin, 360, 4);
FC_ASSERT(params_size, sizeof(flashcore_forward_params) == 368);

/* flashcore_merge_params (0.3). */
#define FC_MERGE_FIELD(field, offset, size)                                                \
    FC_ASSERT(merge_##field##_offset, offsetof(flashcore_merge_params, field) == (offset)); \
    FC_ASSERT(merge_##field##_size, sizeof(((flashcore_merge_params *)0)->field) == (size))
FC_MERGE_FIELD(struct_size, 0, 8);
FC_MERGE_FIELD(partial_dtype, 8, 4);
FC_MERGE_FIELD(out_dtype, 12, 4);
FC_MERGE_FIELD(num_states, 16, 4);
FC_MERGE_FIELD(batch_size, 20, 4);
FC_MERGE_FIELD(num_heads, 24, 4);
FC_MERGE_FIELD(seqlen, 28, 4);
FC_MERGE_FIELD(head_dim, 32, 4);
FC_MERGE_FIELD(partial_out, 40, 8);
FC_MERGE_FIELD(partial_lse, 48, 8);
FC_MERGE_FIELD(out, 56, 8);
FC_MERGE_FIELD(lse, 64, 8);
FC_MERGE_FIELD(partial_state_stride, 72, 8);
FC_MERGE_FIELD(partial_batch_stride, 80, 8);
FC_MERGE_FIELD(partial_seq_stride, 88, 8);
FC_MERGE_FIELD(partial_head_stride, 96, 8);
FC_MERGE_FIELD(lse_state_stride, 104, 8);
FC_MERGE_FIELD(lse_batch_stride, 112, 8);
FC_MERGE_FIELD(lse_seq_stride, 120, 8);
FC_MERGE_FIELD(lse_head_stride, 128, 8);
FC_MERGE_FIELD(out_batch_stride, 136, 8);
FC_MERGE_FIELD(out_seq_stride, 144, 8);
FC_MERGE_FIELD(out_head_stride, 152, 8);
/* Added in 0.9: a 0.3 to 0.8 struct ends at 160 bytes. */
FC_MERGE_FIELD(sinks, 160, 8);
FC_ASSERT(merge_params_size, sizeof(flashcore_merge_params) == 168);

/* flashcore_backward_params (0.7). */
#define FC_BACKWARD_FIELD(field, offset, size)                                                   \
    FC_ASSERT(backward_##field##_offset, offsetof(flashcore_backward_params, field) == (offset)); \
    FC_ASSERT(backward_##field##_size, sizeof(((flashcore_backward_params *)0)->field) == (size))
FC_BACKWARD_FIELD(struct_size, 0, 8);
FC_BACKWARD_FIELD(dtype, 8, 4);
FC_BACKWARD_FIELD(batch_size, 12, 4);
FC_BACKWARD_FIELD(seqlen_q, 16, 4);
FC_BACKWARD_FIELD(seqlen_k, 20, 4);
FC_BACKWARD_FIELD(num_heads_q, 24, 4);
FC_BACKWARD_FIELD(num_heads_kv, 28, 4);
FC_BACKWARD_FIELD(head_dim, 32, 4);
FC_BACKWARD_FIELD(head_dim_v, 36, 4);
FC_BACKWARD_FIELD(causal, 40, 4);
FC_BACKWARD_FIELD(softmax_scale, 44, 4);
FC_BACKWARD_FIELD(use_window, 48, 4);
FC_BACKWARD_FIELD(window_left, 52, 4);
FC_BACKWARD_FIELD(window_right, 56, 4);
FC_BACKWARD_FIELD(softcap, 60, 4);
FC_BACKWARD_FIELD(deterministic, 64, 4);
FC_BACKWARD_FIELD(q, 72, 8);
FC_BACKWARD_FIELD(k, 80, 8);
FC_BACKWARD_FIELD(v, 88, 8);
FC_BACKWARD_FIELD(out, 96, 8);
FC_BACKWARD_FIELD(dout, 104, 8);
FC_BACKWARD_FIELD(lse, 112, 8);
FC_BACKWARD_FIELD(dq, 120, 8);
FC_BACKWARD_FIELD(dk, 128, 8);
FC_BACKWARD_FIELD(dv, 136, 8);
FC_BACKWARD_FIELD(q_batch_stride, 144, 8);
FC_BACKWARD_FIELD(q_seq_stride, 152, 8);
FC_BACKWARD_FIELD(q_head_stride, 160, 8);
FC_BACKWARD_FIELD(k_batch_stride, 168, 8);
FC_BACKWARD_FIELD(k_seq_stride, 176, 8);
FC_BACKWARD_FIELD(k_head_stride, 184, 8);
FC_BACKWARD_FIELD(v_batch_stride, 192, 8);
FC_BACKWARD_FIELD(v_seq_stride, 200, 8);
FC_BACKWARD_FIELD(v_head_stride, 208, 8);
FC_BACKWARD_FIELD(out_batch_stride, 216, 8);
FC_BACKWARD_FIELD(out_seq_stride, 224, 8);
FC_BACKWARD_FIELD(out_head_stride, 232, 8);
FC_BACKWARD_FIELD(dout_batch_stride, 240, 8);
FC_BACKWARD_FIELD(dout_seq_stride, 248, 8);
FC_BACKWARD_FIELD(dout_head_stride, 256, 8);
FC_BACKWARD_FIELD(dq_batch_stride, 264, 8);
FC_BACKWARD_FIELD(dq_seq_stride, 272, 8);
FC_BACKWARD_FIELD(dq_head_stride, 280, 8);
FC_BACKWARD_FIELD(dk_batch_stride, 288, 8);
FC_BACKWARD_FIELD(dk_seq_stride, 296, 8);
FC_BACKWARD_FIELD(dk_head_stride, 304, 8);
FC_BACKWARD_FIELD(dv_batch_stride, 312, 8);
FC_BACKWARD_FIELD(dv_seq_stride, 320, 8);
FC_BACKWARD_FIELD(dv_head_stride, 328, 8);
FC_BACKWARD_FIELD(seqused_k, 336, 8);
FC_BACKWARD_FIELD(cu_seqlens_q, 344, 8);
FC_BACKWARD_FIELD(cu_seqlens_k, 352, 8);
FC_BACKWARD_FIELD(total_seqlen_q, 360, 4);
FC_BACKWARD_FIELD(total_seqlen_k, 364, 4);
/* Added in 0.9: a 0.7 or 0.8 struct ends at 368 bytes. */
FC_BACKWARD_FIELD(attention_chunk, 368, 4);
FC_BACKWARD_FIELD(sinks, 376, 8);
FC_BACKWARD_FIELD(dsinks, 384, 8);
FC_BACKWARD_FIELD(sm_margin, 392, 4);
FC_ASSERT(backward_params_size, sizeof(flashcore_backward_params) == 400);
#endif

/* Every function, assigned to a pointer of the exact type it had when this
 * ABI was fixed: a changed signature does not compile. */
const flashcore_test_api *flashcore_abi_functions(void);

const flashcore_test_api *flashcore_abi_functions(void)
{
    static const flashcore_test_api api = {FLASHCORE_TEST_API(FLASHCORE_TEST_API_LINKED)};
    return &api;
}

/* Every enumerator used through its enum type. */
int flashcore_abi_enums(flashcore_status s, flashcore_dtype d, flashcore_layout l);

int flashcore_abi_enums(flashcore_status s, flashcore_dtype d, flashcore_layout l)
{
    int n = 0;
    switch (s) {
    case FLASHCORE_STATUS_SUCCESS:
    case FLASHCORE_STATUS_INVALID_ARGUMENT:
    case FLASHCORE_STATUS_UNSUPPORTED:
    case FLASHCORE_STATUS_MISALIGNED:
    case FLASHCORE_STATUS_WORKSPACE_TOO_SMALL:
    case FLASHCORE_STATUS_NO_DEVICE:
    case FLASHCORE_STATUS_CUDA_ERROR:
    case FLASHCORE_STATUS_OUT_OF_MEMORY:
    case FLASHCORE_STATUS_INTERNAL:
        n += 1;
        break;
    }
    switch (d) {
    case FLASHCORE_DTYPE_FP16:
    case FLASHCORE_DTYPE_BF16:
    case FLASHCORE_DTYPE_FP32:
    case FLASHCORE_DTYPE_FP8_E4M3:
        n += 2;
        break;
    }
    switch (l) {
    case FLASHCORE_LAYOUT_BHSD:
    case FLASHCORE_LAYOUT_BSHD:
        n += 4;
        break;
    }
    return n;
}
