/* Causal attention over a sequence spread across the GPUs of one host
 * (context parallelism), with NCCL moving the keys and values and
 * flashcore doing the rest: flashcore_forward with its log-sum-exp on each
 * slice of keys in hand, ncclSend/ncclRecv passing the slices around a
 * ring, and flashcore_merge_states combining each GPU's partial results.
 * flashcore.distributed.ring_attention (Python) is the same algorithm.
 *
 * One process drives every GPU it sees (ncclCommInitAll), each one a rank.
 * The sequence (S = 2 x ranks x kChunk tokens, [S, heads, head_dim] fp16,
 * FlashAttention's layout with batch 1) is cut into 2 x ranks chunks and
 * rank r holds chunks r and 2 x ranks - 1 - r (the "zig-zag" split: every
 * rank then has the same causal work). At step i rank r holds the keys of
 * rank s = (r - i) mod ranks:
 *   s == r: all its queries against all those keys, causally;
 *   s <  r: all its queries against the slice's first chunk, no mask;
 *   s >  r: its second chunk of queries against the whole slice, no mask;
 * each step's output and log-sum-exp go into partial buffers (rows a step
 * does not compute keep lse = -inf, which the merge gives no weight).
 *
 * The transfers run beside the attention: each rank queues the next
 * slice's send and receive on a stream of their own before the step's
 * attention, whose sm_margin leaves kSmMargin SMs to NCCL's kernels (the
 * sm_90a kernel is persistent: without a margin it holds every SM, and
 * its CTAs would wait for those NCCL holds). The next step waits for the
 * slice to arrive; a receive waits for the step that read its buffer.
 *
 * The program checks itself: GPU 0 also computes the whole sequence in one
 * flashcore_forward call, and each rank's merged rows must match it (a
 * relative L2 difference below 1e-2: the partial results are rounded to
 * fp16 before the merge). Exit status 0 on success.
 *
 * Built by CMake where NCCL is found (-DFLASHCORE_NCCL_ROOT=... or the
 * nvidia-nccl pip package); by hand:
 *   cc ring_attention_nccl.c $(pkg-config --cflags --libs flashcore) -lnccl \
 *      -L/usr/local/cuda/lib64 -lcudart_static -ldl -lpthread -lrt -lm
 * Keep NVLink multicast off on shared hosts: NCCL_NVLS_ENABLE=0. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashcore.h"

enum { kMaxRanks = 8, kChunk = 256, kHeadsQ = 8, kHeadsKv = 2, kHeadDim = 128 };
/* SMs each step's attention leaves to NCCL's send/receive kernels
 * (flashcore_forward_params::sm_margin; flashcore.distributed.RING_SM_MARGIN
 * is the same figure). */
enum { kSmMargin = 2 };

#define CUDA_OK(call)                                                                             \
    do {                                                                                          \
        cudaError_t err_ = (call);                                                                \
        if (err_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)
#define NCCL_OK(call)                                                                             \
    do {                                                                                          \
        ncclResult_t err_ = (call);                                                               \
        if (err_ != ncclSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(err_)); \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)
#define FC_OK(call)                                                                               \
    do {                                                                                          \
        flashcore_status st_ = (call);                                                            \
        if (st_ != FLASHCORE_STATUS_SUCCESS) {                                                    \
            fprintf(stderr, "%s:%d %s: %s: %s\n", __FILE__, __LINE__, #call,                      \
                    flashcore_status_string(st_), flashcore_last_error_message());                \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

/* fp16 from and to float (round to nearest even; normal range only, which
 * the values here stay in) */
static uint16_t to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const int32_t exponent = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mantissa = x & 0x7fffffu;
    if (exponent <= 0) return (uint16_t)sign;  /* tiny: 0 */
    uint32_t h = sign | ((uint32_t)exponent << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)h;
}
static float from_half(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    uint32_t x = sign;
    if (exponent != 0) x |= ((exponent - 15 + 127) << 23) | (mantissa << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint64_t lcg = 0x9E3779B97F4A7C15ull;
static float uniform_pm1(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((lcg >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

/* One rank's buffers on its GPU. */
typedef struct {
    uint16_t *q;        /* [2 chunks][kHeadsQ][kHeadDim] */
    uint16_t *kv[2];    /* k [2 chunks][kHeadsKv][kHeadDim], then v: the slice in hand, and the next */
    uint16_t *partial;  /* [ranks][2 chunks][kHeadsQ][kHeadDim] */
    float *partial_lse; /* [ranks][kHeadsQ][2 chunks] */
    float *lse_half;    /* [kHeadsQ][kChunk]: a half-row step's lse before it moves into partial_lse */
    uint16_t *out;      /* [2 chunks][kHeadsQ][kHeadDim] */
    void *workspace;
    size_t workspace_bytes;
    cudaStream_t stream;   /* the attention and the merge */
    cudaStream_t transfer; /* NCCL's sends and receives, beside the attention */
    cudaEvent_t read_done; /* on stream: the steps so far, which read the buffer the next receive fills */
    cudaEvent_t arrived;   /* on transfer: the next slice is in */
    flashcore_handle handle;
} Rank;

/* The forward parameters of one step of rank r against the slice of rank s
 * (as in the comment at the top); *half_rows says whether only the second
 * chunk of queries is computed. */
static void step_params(flashcore_forward_params *p, const Rank *rank, int r, int s, int step, int ranks,
                        const uint16_t *kv, int *half_rows) {
    const size_t kv_elems = (size_t)2 * kChunk * kHeadsKv * kHeadDim;
    const size_t row_elems = (size_t)kHeadsQ * kHeadDim;
    flashcore_forward_params_init(p, sizeof *p);
    p->dtype = FLASHCORE_DTYPE_FP16;
    p->batch_size = 1;
    p->num_heads_q = kHeadsQ;
    p->num_heads_kv = kHeadsKv;
    p->head_dim = kHeadDim;
    p->sm_margin = kSmMargin;
    p->seqlen_q = 2 * kChunk;
    p->seqlen_k = 2 * kChunk;
    p->q = rank->q;
    p->k = kv;
    p->v = kv + kv_elems;
    p->out = rank->partial + (size_t)step * 2 * kChunk * row_elems;
    p->lse = rank->partial_lse + (size_t)step * kHeadsQ * 2 * kChunk;
    p->causal = s == r;
    *half_rows = 0;
    if (s < r) {
        p->seqlen_k = kChunk; /* the slice's first chunk */
    } else if (s > r) {
        p->seqlen_q = kChunk; /* the second chunk of queries */
        p->q = rank->q + (size_t)kChunk * row_elems;
        p->out = (uint16_t *)p->out + (size_t)kChunk * row_elems;
        p->lse = rank->lse_half;
        *half_rows = 1;
    }
    flashcore_set_contiguous_strides(p, FLASHCORE_LAYOUT_BSHD);
    /* k and v hold 2 chunks whatever seqlen_k is: their strides stay those
     * of [2 chunks][heads][dim] (with batch 1, only seq and head matter). */
    (void)ranks;
}

int main(void) {
    /* A handle first: without a GPU or driver, flashcore_create says so
     * (NO_DEVICE), where the CUDA runtime's first call would only say the
     * driver is "insufficient". */
    flashcore_handle probe;
    const flashcore_status created = flashcore_create(&probe);
    if (created != FLASHCORE_STATUS_SUCCESS) {
        fprintf(stderr, "flashcore_create: %s: %s\n", flashcore_status_string(created), flashcore_last_error_message());
        return 1;
    }
    flashcore_destroy(probe);
    int ranks = 0;
    CUDA_OK(cudaGetDeviceCount(&ranks));
    if (ranks > kMaxRanks) ranks = kMaxRanks;
    const int seq = 2 * ranks * kChunk;
    const size_t row_q = (size_t)kHeadsQ * kHeadDim, row_kv = (size_t)kHeadsKv * kHeadDim;
    printf("ring attention over %d GPU(s): causal, %d tokens, %d/%d heads, head_dim %d, fp16\n", ranks, seq,
           kHeadsQ, kHeadsKv, kHeadDim);

    /* The whole sequence on the host. */
    uint16_t *q = malloc((size_t)seq * row_q * 2), *k = malloc((size_t)seq * row_kv * 2),
             *v = malloc((size_t)seq * row_kv * 2);
    for (size_t i = 0; i < (size_t)seq * row_q; ++i) q[i] = to_half(uniform_pm1());
    for (size_t i = 0; i < (size_t)seq * row_kv; ++i) k[i] = to_half(uniform_pm1());
    for (size_t i = 0; i < (size_t)seq * row_kv; ++i) v[i] = to_half(uniform_pm1());

    int devices[kMaxRanks];
    ncclComm_t comms[kMaxRanks];
    Rank rank[kMaxRanks];
    for (int r = 0; r < ranks; ++r) devices[r] = r;
    NCCL_OK(ncclCommInitAll(comms, ranks, devices));

    const size_t kv_elems = (size_t)2 * kChunk * row_kv;  /* one of k, v: 2 chunks */
    float *neg_inf = malloc((size_t)ranks * kHeadsQ * 2 * kChunk * sizeof(float));
    for (size_t i = 0; i < (size_t)ranks * kHeadsQ * 2 * kChunk; ++i) neg_inf[i] = -INFINITY;
    for (int r = 0; r < ranks; ++r) {
        Rank *R = &rank[r];
        memset(R, 0, sizeof *R);
        CUDA_OK(cudaSetDevice(r));
        FC_OK(flashcore_create_for_device(&R->handle, r));
        CUDA_OK(cudaStreamCreateWithFlags(&R->stream, cudaStreamNonBlocking));
        CUDA_OK(cudaStreamCreateWithFlags(&R->transfer, cudaStreamNonBlocking));
        CUDA_OK(cudaEventCreateWithFlags(&R->read_done, cudaEventDisableTiming));
        CUDA_OK(cudaEventCreateWithFlags(&R->arrived, cudaEventDisableTiming));
        CUDA_OK(cudaMalloc((void **)&R->q, (size_t)2 * kChunk * row_q * 2));
        for (int b = 0; b < 2; ++b) CUDA_OK(cudaMalloc((void **)&R->kv[b], 2 * kv_elems * 2));
        CUDA_OK(cudaMalloc((void **)&R->partial, (size_t)ranks * 2 * kChunk * row_q * 2));
        CUDA_OK(cudaMalloc((void **)&R->partial_lse, (size_t)ranks * kHeadsQ * 2 * kChunk * sizeof(float)));
        CUDA_OK(cudaMalloc((void **)&R->lse_half, (size_t)kHeadsQ * kChunk * sizeof(float)));
        CUDA_OK(cudaMalloc((void **)&R->out, (size_t)2 * kChunk * row_q * 2));
        CUDA_OK(cudaMemset(R->partial, 0, (size_t)ranks * 2 * kChunk * row_q * 2));
        CUDA_OK(cudaMemcpy(R->partial_lse, neg_inf, (size_t)ranks * kHeadsQ * 2 * kChunk * sizeof(float),
                           cudaMemcpyHostToDevice));
        /* The zig-zag slice: chunks r and 2 x ranks - 1 - r. */
        const int chunks[2] = {r, 2 * ranks - 1 - r};
        for (int c = 0; c < 2; ++c) {
            const size_t from = (size_t)chunks[c] * kChunk, to = (size_t)c * kChunk;
            CUDA_OK(cudaMemcpy(R->q + to * row_q, q + from * row_q, (size_t)kChunk * row_q * 2,
                               cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(R->kv[0] + to * row_kv, k + from * row_kv, (size_t)kChunk * row_kv * 2,
                               cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(R->kv[0] + kv_elems + to * row_kv, v + from * row_kv, (size_t)kChunk * row_kv * 2,
                               cudaMemcpyHostToDevice));
        }
        /* The largest workspace any of its steps asks for (0 here: these
         * calls do not split; asked all the same, as a caller should). */
        for (int s = 0; s < ranks; ++s) {
            flashcore_forward_params p;
            int half;
            size_t bytes = 0;
            step_params(&p, R, r, s, 0, ranks, R->kv[0], &half);
            FC_OK(flashcore_forward_workspace_size(R->handle, &p, &bytes));
            if (bytes > R->workspace_bytes) R->workspace_bytes = bytes;
        }
        if (R->workspace_bytes > 0) CUDA_OK(cudaMalloc(&R->workspace, R->workspace_bytes));
    }

    /* The ring: each step's transfer of the next slice, queued first on the
     * transfer streams, then its attention beside it. */
    int current = 0;
    for (int step = 0; step < ranks; ++step) {
        const int more = step + 1 < ranks;
        if (more) {
            for (int r = 0; r < ranks; ++r) {
                CUDA_OK(cudaSetDevice(r));
                CUDA_OK(cudaEventRecord(rank[r].read_done, rank[r].stream));
                CUDA_OK(cudaStreamWaitEvent(rank[r].transfer, rank[r].read_done, 0));
            }
            NCCL_OK(ncclGroupStart());
            for (int r = 0; r < ranks; ++r) {
                Rank *R = &rank[r];
                NCCL_OK(ncclSend(R->kv[current], 2 * kv_elems, ncclFloat16, (r + 1) % ranks, comms[r], R->transfer));
                NCCL_OK(ncclRecv(R->kv[1 - current], 2 * kv_elems, ncclFloat16, (r - 1 + ranks) % ranks, comms[r],
                                 R->transfer));
            }
            NCCL_OK(ncclGroupEnd());
            for (int r = 0; r < ranks; ++r) {
                CUDA_OK(cudaSetDevice(r));
                CUDA_OK(cudaEventRecord(rank[r].arrived, rank[r].transfer));
            }
        }
        for (int r = 0; r < ranks; ++r) {
            Rank *R = &rank[r];
            const int s = (r - step + ranks) % ranks;
            flashcore_forward_params p;
            int half;
            CUDA_OK(cudaSetDevice(r));
            step_params(&p, R, r, s, step, ranks, R->kv[current], &half);
            FC_OK(flashcore_forward(R->handle, &p, R->workspace, R->workspace_bytes, R->stream));
            if (half) {
                /* [heads][kChunk] into the second half of each head's row
                 * of this step's [heads][2 chunks] lse */
                float *dst = R->partial_lse + (size_t)step * kHeadsQ * 2 * kChunk + kChunk;
                CUDA_OK(cudaMemcpy2DAsync(dst, 2 * kChunk * sizeof(float), R->lse_half, kChunk * sizeof(float),
                                          kChunk * sizeof(float), kHeadsQ, cudaMemcpyDeviceToDevice, R->stream));
            }
        }
        if (more) {
            for (int r = 0; r < ranks; ++r) {
                CUDA_OK(cudaSetDevice(r));
                CUDA_OK(cudaStreamWaitEvent(rank[r].stream, rank[r].arrived, 0));
            }
            current = 1 - current;
        }
    }

    /* Each rank merges its steps' results. */
    for (int r = 0; r < ranks; ++r) {
        Rank *R = &rank[r];
        flashcore_merge_params m;
        CUDA_OK(cudaSetDevice(r));
        FC_OK(flashcore_merge_params_init(&m, sizeof m));
        m.partial_dtype = FLASHCORE_DTYPE_FP16;
        m.out_dtype = FLASHCORE_DTYPE_FP16;
        m.num_states = ranks;
        m.batch_size = 1;
        m.num_heads = kHeadsQ;
        m.seqlen = 2 * kChunk;
        m.head_dim = kHeadDim;
        m.partial_out = R->partial;
        m.partial_lse = R->partial_lse;
        m.out = R->out;
        m.partial_state_stride = (int64_t)2 * kChunk * row_q;
        m.partial_batch_stride = m.partial_state_stride;
        m.partial_seq_stride = (int64_t)row_q;
        m.partial_head_stride = kHeadDim;
        m.lse_state_stride = (int64_t)kHeadsQ * 2 * kChunk;
        m.lse_batch_stride = m.lse_state_stride;
        m.lse_head_stride = 2 * kChunk;
        m.lse_seq_stride = 1;
        m.out_batch_stride = m.partial_state_stride;
        m.out_seq_stride = (int64_t)row_q;
        m.out_head_stride = kHeadDim;
        FC_OK(flashcore_merge_states(R->handle, &m, R->stream));
    }

    /* The reference: the whole sequence in one call on GPU 0. */
    uint16_t *dq, *dk, *dv, *dout;
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMalloc((void **)&dq, (size_t)seq * row_q * 2));
    CUDA_OK(cudaMalloc((void **)&dk, (size_t)seq * row_kv * 2));
    CUDA_OK(cudaMalloc((void **)&dv, (size_t)seq * row_kv * 2));
    CUDA_OK(cudaMalloc((void **)&dout, (size_t)seq * row_q * 2));
    CUDA_OK(cudaMemcpy(dq, q, (size_t)seq * row_q * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk, k, (size_t)seq * row_kv * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, v, (size_t)seq * row_kv * 2, cudaMemcpyHostToDevice));
    flashcore_forward_params whole;
    FC_OK(flashcore_forward_params_init(&whole, sizeof whole));
    whole.dtype = FLASHCORE_DTYPE_FP16;
    whole.batch_size = 1;
    whole.num_heads_q = kHeadsQ;
    whole.num_heads_kv = kHeadsKv;
    whole.head_dim = kHeadDim;
    whole.seqlen_q = whole.seqlen_k = seq;
    whole.causal = 1;
    whole.q = dq;
    whole.k = dk;
    whole.v = dv;
    whole.out = dout;
    FC_OK(flashcore_set_contiguous_strides(&whole, FLASHCORE_LAYOUT_BSHD));
    size_t ws_bytes = 0;
    void *ws = NULL;
    FC_OK(flashcore_forward_workspace_size(rank[0].handle, &whole, &ws_bytes));
    if (ws_bytes > 0) CUDA_OK(cudaMalloc(&ws, ws_bytes));
    FC_OK(flashcore_forward(rank[0].handle, &whole, ws, ws_bytes, rank[0].stream));
    uint16_t *expected = malloc((size_t)seq * row_q * 2), *got = malloc((size_t)2 * kChunk * row_q * 2);
    CUDA_OK(cudaStreamSynchronize(rank[0].stream));
    CUDA_OK(cudaMemcpy(expected, dout, (size_t)seq * row_q * 2, cudaMemcpyDeviceToHost));

    int failed = 0;
    for (int r = 0; r < ranks; ++r) {
        CUDA_OK(cudaSetDevice(r));
        CUDA_OK(cudaStreamSynchronize(rank[r].stream));
        CUDA_OK(cudaMemcpy(got, rank[r].out, (size_t)2 * kChunk * row_q * 2, cudaMemcpyDeviceToHost));
        const int chunks[2] = {r, 2 * ranks - 1 - r};
        double diff2 = 0, ref2 = 0, max_diff = 0;
        for (int c = 0; c < 2; ++c) {
            for (size_t i = 0; i < (size_t)kChunk * row_q; ++i) {
                const double a = from_half(got[(size_t)c * kChunk * row_q + i]);
                const double b = from_half(expected[(size_t)chunks[c] * kChunk * row_q + i]);
                diff2 += (a - b) * (a - b);
                ref2 += b * b;
                if (fabs(a - b) > max_diff) max_diff = fabs(a - b);
            }
        }
        const double rel = sqrt(diff2 / ref2);
        const int ok = rel < 1e-2 && isfinite(rel);
        failed |= !ok;
        printf("rank %d (chunks %d and %d): rel-L2 %.3g, max |diff| %.3g against one call: %s\n", r, chunks[0],
               chunks[1], rel, max_diff, ok ? "ok" : "FAILED");
    }
    for (int r = 0; r < ranks; ++r) {
        NCCL_OK(ncclCommDestroy(comms[r]));
        flashcore_destroy(rank[r].handle);
        CUDA_OK(cudaSetDevice(r));
        CUDA_OK(cudaEventDestroy(rank[r].read_done));
        CUDA_OK(cudaEventDestroy(rank[r].arrived));
        CUDA_OK(cudaStreamDestroy(rank[r].transfer));
        CUDA_OK(cudaStreamDestroy(rank[r].stream));
    }
    printf("%s\n", failed ? "FAILED" : "ok");
    return failed;
}
