/* The README's example: one causal attention call through the C API.
 * Build (the CUDA runtime linked statically, as libflashcore does, so the
 * program needs only the NVIDIA driver at run time; -lcudart instead would
 * need libcudart.so.13 on the loader's path):
 *   cc example.c $(pkg-config --cflags --libs flashcore) \
 *      -L/usr/local/cuda/lib64 -lcudart_static -ldl -lpthread -lrt */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "flashcore.h"

int main(void) {
    const int batch = 2, heads = 8, seqlen = 1000, head_dim = 128;
    const size_t count = (size_t)batch * heads * seqlen * head_dim;
    flashcore_handle handle;
    flashcore_status status = flashcore_create(&handle);
    if (status != FLASHCORE_STATUS_SUCCESS) {
        fprintf(stderr, "flashcore_create: %s: %s\n", flashcore_status_string(status),
                flashcore_last_error_message());
        return 1;
    }

    void *q, *k, *v, *out;
    cudaMalloc(&q, count * 2);
    cudaMalloc(&k, count * 2);
    cudaMalloc(&v, count * 2);
    cudaMalloc(&out, count * 2);
    cudaMemset(q, 0x3C, count * 2); /* 0x3C3C: about 1.06 in fp16 */
    cudaMemset(k, 0x3C, count * 2);
    cudaMemset(v, 0x3C, count * 2);

    flashcore_forward_params p;
    flashcore_forward_params_init(&p, sizeof p);
    p.dtype = FLASHCORE_DTYPE_FP16;
    p.batch_size = batch;
    p.seqlen_q = p.seqlen_k = seqlen;
    p.num_heads_q = p.num_heads_kv = heads;
    p.head_dim = head_dim;
    p.causal = 1;
    p.q = q;
    p.k = k;
    p.v = v;
    p.out = out;
    flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD);

    size_t workspace_bytes = 0;
    void *workspace = NULL;
    status = flashcore_forward_workspace_size(handle, &p, &workspace_bytes);
    if (status == FLASHCORE_STATUS_SUCCESS && workspace_bytes > 0) cudaMalloc(&workspace, workspace_bytes);
    if (status == FLASHCORE_STATUS_SUCCESS) status = flashcore_forward(handle, &p, workspace, workspace_bytes, NULL);
    if (status != FLASHCORE_STATUS_SUCCESS) {
        fprintf(stderr, "flashcore_forward: %s: %s\n", flashcore_status_string(status),
                flashcore_last_error_message());
    } else if (cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "kernel failed\n");
        status = FLASHCORE_STATUS_CUDA_ERROR;
    } else {
        unsigned short first;
        cudaMemcpy(&first, out, sizeof first, cudaMemcpyDeviceToHost);
        printf("flashcore %s: out[0] = 0x%04x (expected 0x3c3c: every value equals the input)\n",
               flashcore_version_string(), first);
        if (first != 0x3C3C) status = FLASHCORE_STATUS_INTERNAL;
    }
    cudaFree(workspace);
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(out);
    flashcore_destroy(handle);
    return status == FLASHCORE_STATUS_SUCCESS ? 0 : 1;
}
