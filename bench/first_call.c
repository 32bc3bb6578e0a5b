/* first_call: what loading libflashcore costs a fresh process, in
 * milliseconds: dlopen of the library (its CUDA runtime registers the
 * machine code), flashcore_create, and the first call of three kernels (the
 * CUDA runtime loads a kernel's module, decompressing its machine code, at
 * its first launch) beside the second, identical call. The CUDA context is
 * made before any of it (cudaFree(0), timed on its own), so what is left is
 * the library's own cost. The three calls, bf16 at head dim 128:
 *   prefill   B 2, H 16, S 4096, causal (the sm_90a kernel on an H100/H200)
 *   decode    B 8, H 32 over 8 K/V heads, 1 query, 4096 keys (decode tiles)
 *   backward  the prefill's gradients
 *
 *   first_call LIBRARY [prefill|decode|backward]...
 *
 * Prints one line of "name ms" pairs; run it in several fresh processes
 * (bench/README.md) and compare medians between builds. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashcore.h"

typedef flashcore_status (*CreateFn)(flashcore_handle *);
typedef flashcore_status (*FwdInitFn)(flashcore_forward_params *, size_t);
typedef flashcore_status (*FwdStridesFn)(flashcore_forward_params *, flashcore_layout);
typedef flashcore_status (*FwdWorkspaceFn)(flashcore_handle, const flashcore_forward_params *, size_t *);
typedef flashcore_status (*FwdFn)(flashcore_handle, const flashcore_forward_params *, void *, size_t, void *);
typedef flashcore_status (*BwdInitFn)(flashcore_backward_params *, size_t);
typedef flashcore_status (*BwdStridesFn)(flashcore_backward_params *, flashcore_layout);
typedef flashcore_status (*BwdWorkspaceFn)(flashcore_handle, const flashcore_backward_params *, size_t *);
typedef flashcore_status (*BwdFn)(flashcore_handle, const flashcore_backward_params *, void *, size_t, void *);
typedef const char *(*MessageFn)(void);

static struct {
    CreateFn create;
    FwdInitFn fwd_init;
    FwdStridesFn fwd_strides;
    FwdWorkspaceFn fwd_workspace;
    FwdFn forward;
    BwdInitFn bwd_init;
    BwdStridesFn bwd_strides;
    BwdWorkspaceFn bwd_workspace;
    BwdFn backward;
    MessageFn message;
} api;

enum { kHeadDim = 128 };

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "first_call: %s: %s\n", what, detail);
    exit(1);
}

static void check_cuda(cudaError_t err, const char *what) {
    if (err != cudaSuccess) die(what, cudaGetErrorString(err));
}

static void check_status(flashcore_status status, const char *what) {
    if (status != FLASHCORE_STATUS_SUCCESS) die(what, api.message());
}

/* Device memory of `bytes`, filled with 0x3C3C (about 1.0 in bf16 is
 * 0x3F80; 0x3C3C is 0.0115: small, finite scores). */
static void *filled(size_t bytes) {
    void *p = NULL;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    check_cuda(cudaMemset(p, 0x3C, bytes), "cudaMemset");
    return p;
}

static void *sym(void *library, const char *name) {
    void *f = dlsym(library, name);
    if (f == NULL) die("dlsym", name);
    return f;
}

/* The forward call of a case: B x S x H rows of q, the keys of K/V heads. */
static flashcore_forward_params forward_case(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
                                             int causal) {
    flashcore_forward_params p;
    check_status(api.fwd_init(&p, sizeof p), "flashcore_forward_params_init");
    p.dtype = FLASHCORE_DTYPE_BF16;
    p.batch_size = batch;
    p.seqlen_q = seqlen_q;
    p.seqlen_k = seqlen_k;
    p.num_heads_q = heads_q;
    p.num_heads_kv = heads_kv;
    p.head_dim = kHeadDim;
    p.causal = causal;
    const size_t q_bytes = (size_t)batch * seqlen_q * heads_q * kHeadDim * 2;
    const size_t kv_bytes = (size_t)batch * seqlen_k * heads_kv * kHeadDim * 2;
    p.q = filled(q_bytes);
    p.k = filled(kv_bytes);
    p.v = filled(kv_bytes);
    p.out = filled(q_bytes);
    check_cuda(cudaMalloc((void **)&p.lse, (size_t)batch * heads_q * seqlen_q * sizeof(float)), "cudaMalloc");
    check_status(api.fwd_strides(&p, FLASHCORE_LAYOUT_BSHD), "flashcore_set_contiguous_strides");
    return p;
}

static void run_forward(flashcore_handle handle, const flashcore_forward_params *p) {
    size_t bytes = 0;
    void *workspace = NULL;
    check_status(api.fwd_workspace(handle, p, &bytes), "flashcore_forward_workspace_size");
    if (bytes > 0) check_cuda(cudaMalloc(&workspace, bytes), "cudaMalloc");
    check_status(api.forward(handle, p, workspace, bytes, NULL), "flashcore_forward");
    check_cuda(cudaDeviceSynchronize(), "the forward call");
    cudaFree(workspace);
}

static void run_backward(flashcore_handle handle, const flashcore_forward_params *f) {
    flashcore_backward_params p;
    check_status(api.bwd_init(&p, sizeof p), "flashcore_backward_params_init");
    p.dtype = f->dtype;
    p.batch_size = f->batch_size;
    p.seqlen_q = f->seqlen_q;
    p.seqlen_k = f->seqlen_k;
    p.num_heads_q = f->num_heads_q;
    p.num_heads_kv = f->num_heads_kv;
    p.head_dim = f->head_dim;
    p.causal = f->causal;
    p.q = f->q;
    p.k = f->k;
    p.v = f->v;
    p.out = f->out;
    p.dout = f->out;
    p.lse = f->lse;
    const size_t q_bytes = (size_t)f->batch_size * f->seqlen_q * f->num_heads_q * kHeadDim * 2;
    const size_t kv_bytes = (size_t)f->batch_size * f->seqlen_k * f->num_heads_kv * kHeadDim * 2;
    check_cuda(cudaMalloc(&p.dq, q_bytes), "cudaMalloc");
    check_cuda(cudaMalloc(&p.dk, kv_bytes), "cudaMalloc");
    check_cuda(cudaMalloc(&p.dv, kv_bytes), "cudaMalloc");
    check_status(api.bwd_strides(&p, FLASHCORE_LAYOUT_BSHD), "flashcore_backward_set_contiguous_strides");
    size_t bytes = 0;
    void *workspace = NULL;
    check_status(api.bwd_workspace(handle, &p, &bytes), "flashcore_backward_workspace_size");
    if (bytes > 0) check_cuda(cudaMalloc(&workspace, bytes), "cudaMalloc");
    check_status(api.backward(handle, &p, workspace, bytes, NULL), "flashcore_backward");
    check_cuda(cudaDeviceSynchronize(), "the backward call");
    cudaFree(workspace);
    cudaFree(p.dq);
    cudaFree(p.dk);
    cudaFree(p.dv);
}

int main(int argc, char **argv) {
    double t = now_ms();
    const cudaError_t context = cudaFree(0);
    if (context != cudaSuccess) {
        fprintf(stderr, "first_call: no usable GPU: %s\n", cudaGetErrorString(context));
        return 2;
    }
    const double context_ms = now_ms() - t;
    if (argc < 2) {
        fprintf(stderr, "usage: first_call LIBRARY [prefill|decode|backward]...\n");
        return 2;
    }
    printf("context %.2f", context_ms);

    t = now_ms();
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) die("dlopen", dlerror());
    printf(" dlopen %.2f", now_ms() - t);
    api.create = (CreateFn)sym(library, "flashcore_create");
    api.fwd_init = (FwdInitFn)sym(library, "flashcore_forward_params_init");
    api.fwd_strides = (FwdStridesFn)sym(library, "flashcore_set_contiguous_strides");
    api.fwd_workspace = (FwdWorkspaceFn)sym(library, "flashcore_forward_workspace_size");
    api.forward = (FwdFn)sym(library, "flashcore_forward");
    api.bwd_init = (BwdInitFn)sym(library, "flashcore_backward_params_init");
    api.bwd_strides = (BwdStridesFn)sym(library, "flashcore_backward_set_contiguous_strides");
    api.bwd_workspace = (BwdWorkspaceFn)sym(library, "flashcore_backward_workspace_size");
    api.backward = (BwdFn)sym(library, "flashcore_backward");
    api.message = (MessageFn)sym(library, "flashcore_last_error_message");

    flashcore_handle handle;
    t = now_ms();
    check_status(api.create(&handle), "flashcore_create");
    printf(" create %.2f", now_ms() - t);

    const flashcore_forward_params prefill = forward_case(2, 4096, 4096, 16, 16, 1);
    const flashcore_forward_params decode = forward_case(8, 1, 4096, 32, 8, 0);
    for (int i = 2; i < argc; ++i) {
        for (int call = 0; call < 2; ++call) {
            t = now_ms();
            if (strcmp(argv[i], "prefill") == 0) {
                run_forward(handle, &prefill);
            } else if (strcmp(argv[i], "decode") == 0) {
                run_forward(handle, &decode);
            } else if (strcmp(argv[i], "backward") == 0) {
                run_backward(handle, &prefill);
            } else {
                die("unknown call", argv[i]);
            }
            printf(" %s_%s %.2f", argv[i], call == 0 ? "first" : "second", now_ms() - t);
        }
    }
    printf("\n");
    return 0;
}
