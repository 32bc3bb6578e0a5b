/* One decode step over a paged KV cache through the C API: four sequences of
 * different lengths keep their keys and values in pages of 16 tokens, taken
 * from one pool in no particular order, as an inference server's block
 * allocator hands them out. Each sequence's new token attends to its own
 * cached tokens (GQA: 8 query heads share 2 K/V heads).
 *
 * The output checks itself: every value row of sequence b is (b + 1) / 4, so
 * whatever the softmax weights, each output element must be that (to within
 * one fp16 step: the weights are rounded for the tensor cores); a page of
 * another sequence, or a pool row past a sequence's length (they hold NaN),
 * would show.
 *
 * Build (the CUDA runtime linked statically, as libflashcore does, so the
 * program needs only the NVIDIA driver at run time; -lcudart instead would
 * need libcudart.so.13 on the loader's path):
 *   cc paged_decode.c $(pkg-config --cflags --libs flashcore) \
 *      -L/usr/local/cuda/lib64 -lcudart_static -ldl -lpthread -lrt */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "flashcore.h"

enum { kBatch = 4, kHeadsQ = 8, kHeadsKv = 2, kHeadDim = 128, kPageSize = 16, kMaxPagesPerSeq = 8 };
static const int32_t kCacheLengths[kBatch] = {37, 128, 1, 100};

/* fp16 bit patterns */
static const uint16_t kFp16Nan = 0x7E00;
static const uint16_t kFp16Quarters[kBatch] = {0x3400, 0x3800, 0x3A00, 0x3C00}; /* 0.25, 0.5, 0.75, 1.0 */

static int check_cuda(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return 0;
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    return 1;
}

static int check_status(flashcore_status status, const char *what) {
    if (status == FLASHCORE_STATUS_SUCCESS) return 0;
    fprintf(stderr, "%s: %s: %s\n", what, flashcore_status_string(status), flashcore_last_error_message());
    return 1;
}

int main(void) {
    /* The handle first: without a GPU or driver, flashcore_create says so
     * (NO_DEVICE, "no NVIDIA driver found"), where a first cudaMalloc would
     * only say the driver is "insufficient". */
    flashcore_handle handle;
    if (check_status(flashcore_create(&handle), "flashcore_create")) return 1;

    /* The pool: as many pages as the sequences need plus two spare, handed
     * out from the back so that no sequence's pages are in order. */
    int32_t pages_needed = 0;
    for (int b = 0; b < kBatch; ++b) pages_needed += (kCacheLengths[b] + kPageSize - 1) / kPageSize;
    const int32_t num_pages = pages_needed + 2;
    const size_t row_elems = (size_t)kHeadsKv * kHeadDim;
    const size_t pool_elems = (size_t)num_pages * kPageSize * row_elems;
    uint16_t *k_pool = malloc(pool_elems * 2), *v_pool = malloc(pool_elems * 2);
    int32_t block_table[kBatch][kMaxPagesPerSeq] = {{0}};
    uint16_t *q = malloc((size_t)kBatch * kHeadsQ * kHeadDim * 2);
    uint16_t *out = malloc((size_t)kBatch * kHeadsQ * kHeadDim * 2);
    if (!k_pool || !v_pool || !q || !out) return 1;
    for (size_t i = 0; i < pool_elems; ++i) k_pool[i] = v_pool[i] = kFp16Nan;
    int32_t next_page = num_pages - 1;
    for (int b = 0; b < kBatch; ++b) {
        for (int32_t key = 0; key < kCacheLengths[b]; ++key) {
            if (key % kPageSize == 0) block_table[b][key / kPageSize] = next_page--;
            const size_t row = (size_t)block_table[b][key / kPageSize] * kPageSize + key % kPageSize;
            for (size_t e = 0; e < row_elems; ++e) {
                k_pool[row * row_elems + e] = (uint16_t)(0x3000 + (key * 7 + e) % 0x0C00); /* 0.125 .. 1 */
                v_pool[row * row_elems + e] = kFp16Quarters[b];
            }
        }
    }
    for (size_t i = 0; i < (size_t)kBatch * kHeadsQ * kHeadDim; ++i) q[i] = (uint16_t)(0x3400 + i % 0x0800);

    void *d_q, *d_k, *d_v, *d_out, *d_table, *d_lengths;
    if (check_cuda(cudaMalloc(&d_q, (size_t)kBatch * kHeadsQ * kHeadDim * 2), "cudaMalloc") ||
        check_cuda(cudaMalloc(&d_out, (size_t)kBatch * kHeadsQ * kHeadDim * 2), "cudaMalloc") ||
        check_cuda(cudaMalloc(&d_k, pool_elems * 2), "cudaMalloc") ||
        check_cuda(cudaMalloc(&d_v, pool_elems * 2), "cudaMalloc") ||
        check_cuda(cudaMalloc(&d_table, sizeof block_table), "cudaMalloc") ||
        check_cuda(cudaMalloc(&d_lengths, sizeof kCacheLengths), "cudaMalloc"))
        return 1;
    cudaMemcpy(d_q, q, (size_t)kBatch * kHeadsQ * kHeadDim * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(d_k, k_pool, pool_elems * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(d_v, v_pool, pool_elems * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(d_table, block_table, sizeof block_table, cudaMemcpyHostToDevice);
    if (check_cuda(cudaMemcpy(d_lengths, kCacheLengths, sizeof kCacheLengths, cudaMemcpyHostToDevice), "upload"))
        return 1;

    flashcore_forward_params p;
    flashcore_forward_params_init(&p, sizeof p);
    p.dtype = FLASHCORE_DTYPE_FP16;
    p.batch_size = kBatch;
    p.seqlen_q = 1;                                /* one new token per sequence */
    p.seqlen_k = kMaxPagesPerSeq * kPageSize;      /* the longest a sequence may be */
    p.num_heads_q = kHeadsQ;
    p.num_heads_kv = kHeadsKv;
    p.head_dim = kHeadDim;
    p.q = d_q;
    p.k = d_k;
    p.v = d_v;
    p.out = d_out;
    if (check_status(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), "strides")) return 1;
    /* The pools are [num_pages][page_size][heads_kv][head_dim]: the batch
     * strides step from page to page. */
    p.k_batch_stride = p.v_batch_stride = (int64_t)kPageSize * kHeadsKv * kHeadDim;
    p.k_seq_stride = p.v_seq_stride = (int64_t)kHeadsKv * kHeadDim;
    p.k_head_stride = p.v_head_stride = kHeadDim;
    p.block_table = d_table;
    p.block_table_batch_stride = kMaxPagesPerSeq;
    p.page_size = kPageSize;
    p.num_pages = num_pages;
    p.seqused_k = d_lengths;

    size_t workspace_bytes = 0;
    void *workspace = NULL;
    if (check_status(flashcore_forward_workspace_size(handle, &p, &workspace_bytes), "workspace size")) return 1;
    if (workspace_bytes > 0 && check_cuda(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc")) return 1;
    if (check_status(flashcore_forward(handle, &p, workspace, workspace_bytes, NULL), "flashcore_forward") ||
        check_cuda(cudaDeviceSynchronize(), "the decode step") ||
        check_cuda(cudaMemcpy(out, d_out, (size_t)kBatch * kHeadsQ * kHeadDim * 2, cudaMemcpyDeviceToHost),
                   "download"))
        return 1;

    int wrong = 0;
    for (int b = 0; b < kBatch; ++b)
        for (size_t i = 0; i < (size_t)kHeadsQ * kHeadDim; ++i)
            wrong += abs((int)out[(size_t)b * kHeadsQ * kHeadDim + i] - (int)kFp16Quarters[b]) > 1;
    printf("flashcore %s: paged decode of %d sequences (cache lengths %d, %d, %d, %d; pages of %d keys, %d in the "
           "pool, workspace %zu bytes): %s\n",
           flashcore_version_string(), kBatch, kCacheLengths[0], kCacheLengths[1], kCacheLengths[2], kCacheLengths[3],
           kPageSize, num_pages, workspace_bytes, wrong == 0 ? "every output as expected" : "WRONG OUTPUT");
    flashcore_destroy(handle);
    cudaFree(d_q);
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree(d_out);
    cudaFree(d_table);
    cudaFree(d_lengths);
    cudaFree(workspace);
    free(k_pool);
    free(v_pool);
    free(q);
    free(out);
    return wrong == 0 ? 0 : 1;
}
