// Per-row values the backward kernels hand each other through dq itself,
// which no kernel writes as a gradient until the last one (convert.cuh):
// the first 16 bytes of a query row of dq (head dims are at least 8
// two-byte elements) hold
//   word 0: D = rowsum(dO * O) of the row, fp32 (preprocess.cuh writes it,
//           the main kernel reads it);
//   word 1: in the deterministic mode, on the first row of each query block
//           of the main kernel, the count of warps of key blocks that have
//           added their dQ to the block's accumulator rows (zeroed by the
//           preprocess; each warp of key block n waits for the count to
//           reach its rank among the block's key blocks times the warps per
//           CTA, adds, and increments it);
//   word 2: with dsinks asked for, on the first row of each query block of
//           the convert kernel, the block's sum of its rows' terms of their
//           head's sink gradient, exp(sink - lse) * D (the sinks'
//           preprocess writes it, the convert kernel carries it on:
//           row_kernels.cuh, convert.cuh).
// So the call needs no workspace beyond the dQ accumulator, and nothing is
// allocated for these values.
#pragma once

#include <cstdint>

#include "bwd/params.h"
#include "common/params.h"

namespace flashcore {

constexpr int kRowStatsWords = 3;  // words 0 (D), 1 (the counter) and 2 (the sink term)
constexpr int kSinkTermWord = 2;
static_assert(kRowStatsWords * sizeof(float) <= 16, "the stats live in a row's first 16 bytes (8 two-byte elements)");

// The first word of row `row` (of the batch's sequence: q_row0 added by the
// caller) of query head `head` in dq.
__device__ __forceinline__ float *bwd_row_stats(const BwdKernelParams &p, int batch, int head, int64_t row) {
    char *dq = static_cast<char *>(p.dq);
    const int64_t element = int64_t(batch) * p.dq_batch_stride + int64_t(head) * p.dq_head_stride + row * p.dq_seq_stride;
    return reinterpret_cast<float *>(dq + element * 2);  // two-byte elements (BwdTraits: fp16, bf16)
}

// The fp32 dQ accumulator's row `row` (as bwd_row_stats counts rows) of
// query head `head`: head_dim floats (BwdKernelParams::dq_accum).
__device__ __forceinline__ float *bwd_accumulator_row(const BwdKernelParams &p, int batch, int head, int64_t row) {
    return p.dq_accum + batch * p.dq_accum_batch_stride + head * p.dq_accum_head_stride + row * p.fwd.head_dim;
}

// A query block of block_m rows of a (batch, query head): the unit of the
// kernels that go by query block (the convert kernel, the sinks'
// preprocess, the dsinks sum), whose grids have bwd_query_blocks of them per
// (batch, head), block index fastest.
struct BwdQueryBlock {
    int batch;
    int head;
    int seq_rows;    // rows of the sequence from the block's first row on (<= 0: the block is past its end)
    int valid_rows;  // of them in the block: min(seq_rows, block_m), at least 0
    int64_t row0;    // the block's first row, q_row0 added

    __device__ __forceinline__ static BwdQueryBlock at(const BwdKernelParams &p, int block_m, int batch, int head,
                                                       int m_block) {
        const BatchSeqs seqs = fwd_batch_seqs<true>(p.fwd, batch);
        const int first_row = m_block * block_m;
        BwdQueryBlock b;
        b.batch = batch;
        b.head = head;
        b.seq_rows = seqs.seqlen_q - first_row;
        b.valid_rows = max(min(b.seq_rows, block_m), 0);
        b.row0 = int64_t(seqs.q_row0) + first_row;
        return b;
    }

    // The block of this CTA of such a grid.
    __device__ __forceinline__ static BwdQueryBlock of_cta(const BwdKernelParams &p, int block_m) {
        const int64_t num_m_blocks = bwd_query_blocks(p, block_m);
        const int64_t bh = blockIdx.x / num_m_blocks;
        return at(p, block_m, int(bh / p.fwd.num_heads_q), int(bh % p.fwd.num_heads_q), int(blockIdx.x % num_m_blocks));
    }
};

// The deterministic mode's counter of a query block whose first row's stats
// are at `stats`.
__device__ __forceinline__ int *bwd_block_counter(float *stats) { return reinterpret_cast<int *>(stats + 1); }

__device__ __forceinline__ int load_acquire(const int *address) {
    int value;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
    return value;
}

__device__ __forceinline__ void add_release(int *address, int value) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(address), "r"(value) : "memory");
}

// One release for several counters: the fence orders what came before it
// before each relaxed add after it (the PTX memory model's release pattern).
__device__ __forceinline__ void fence_release_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ void add_relaxed(int *address, int value) {
    asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(address), "r"(value) : "memory");
}

}  // namespace flashcore
