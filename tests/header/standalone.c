/*
 * Compiled with -fsyntax-only by the header.standalone.* tests (as C99 and as
 * C++): flashcore.h must come first and alone, with no CUDA include path,
 * provide size_t and the fixed-width integers itself, be include-guarded and
 * compile without a single warning. It also appears in the typical-use
 * sequence the header documents.
 */
#include "flashcore.h"
#include "flashcore.h" /* a second include must be harmless */

int flashcore_header_standalone(void *q, void *k, void *v, void *out, void *stream);

int flashcore_header_standalone(void *q, void *k, void *v, void *out, void *stream)
{
    flashcore_handle h = NULL;
    flashcore_forward_params p;
    size_t ws = 0;
    int64_t stride = 0;
    flashcore_status st;

    if (flashcore_create(&h) != FLASHCORE_STATUS_SUCCESS)
        return (int)flashcore_last_error_message()[0];
    flashcore_forward_params_init(&p, sizeof p);
    p.dtype = FLASHCORE_DTYPE_FP16;
    p.batch_size = 1;
    p.num_heads_q = p.num_heads_kv = 8;
    p.seqlen_q = p.seqlen_k = 512;
    p.head_dim = 64;
    p.softmax_scale = FLASHCORE_SOFTMAX_SCALE_DEFAULT;
    p.q = q;
    p.k = k;
    p.v = v;
    p.out = out;
    p.lse = NULL;
    flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD);
    stride = p.q_seq_stride;
    flashcore_forward_workspace_size(h, &p, &ws);
    st = flashcore_forward(h, &p, NULL, ws, stream);
    flashcore_destroy(h);
    return st == FLASHCORE_STATUS_SUCCESS && stride % FLASHCORE_ALIGNMENT == 0 &&
           flashcore_version_number() == FLASHCORE_VERSION_NUMBER;
}
