// The parameter block every kernel family reads: the forward launch's
// tensors, strides, sizes, scale, mask window, softcap and key-range inputs
// (seqused_k, cu_seqlens, block_table), and the device helpers that decode
// them (a batch's sequences, descale factors, pages). The forward fills it
// for its own launches; the backward embeds it whole (BwdKernelParams::fwd,
// bwd/params.h) and the merge kernel and the shared schedulers
// (common/key_range.cuh, sm90/tile_scheduler.cuh) read it. Its split-KV,
// GQA-packing and paged-cache fields are the forward's only, but they stay in
// this one struct: taking them out would change the layout the backward's
// kernels see. The forward's own tile enum is in fwd/params.h.
//
// Plain data only: this header is included by host C++ files that are not
// compiled by nvcc.
#pragma once

#include <cstdint>

#include "common/fast_divisor.h"
#include "common/types.h"

namespace flashcore {

// The two divisions that place a (batch, head group) pair's query tile
// (common/tile_coords.cuh, fwd_tile): by the head groups of a batch and by
// the query heads of a K/V head.
struct FwdTileDivisors {
    FastDivisor head_groups;         // fwd_head_groups
    FastDivisor query_heads_per_kv;  // num_heads_q / num_heads_kv
};

// The divisors of a launch's per-block and per-row arithmetic, by values that
// are fixed once the call is planned. A 32-bit division by a run-time value is
// some 20 dependent instructions; a CTA of the portable forward made about
// seven of them before its first load, and each GQA-packed row another (its
// query and head): the host works them out once per launch (fwd_divisors) and
// the kernels multiply. That made the batch-1 calls 4-9% and d64 decode 5%
// faster on an H200 (docs/log/perf.md, 2026-12-01).
struct FwdDivisors {
    FastDivisor packed_heads;  // rows per query of a GQA-packed tile (FwdKernelParams::packed_heads)
    FwdTileDivisors tile;
    // Query blocks per (batch, head group) of the launched portable tile:
    // ceil(fwd_packed_rows / block_m) (fwd/sm80/scheduler.cuh).
    FastDivisor query_blocks;
    FastDivisor splits;  // num_splits
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

    // The scale of the scores the softmax exponentiates (for the natural-log
    // LSE), and it times log2(e) (the kernels use exp2): the call's
    // softmax_scale, or with a softcap the softcap (common/softcap.cuh).
    float softmax_scale;
    float softmax_scale_log2;
    // softmax_scale / softcap: each raw score q.k becomes tanh(q.k * it)
    // before the softmax. 0: no softcap.
    float softcap_prescale;
    // causal is window_right = 0 (kept for the schedulers). The window's
    // bounds are keys seen left and right of a query's diagonal (KeyMask),
    // clamped to seqlen_k and seqlen_q - 1: those see every key on their
    // side, and the kernels' 32-bit sums of positions and bounds cannot
    // overflow (src/fwd/forward_params.cpp kernel_params says why that matters).
    bool causal;
    int window_left;
    int window_right;
    // 0, or the chunk length of chunked attention
    // (flashcore_forward_params::attention_chunk; KeyMask::chunk).
    int attention_chunk;
    // Learnable sinks (flashcore_forward_params::sinks): num_heads_q logits
    // in lse units, or nullptr. A split-KV part leaves them to the merge
    // (fwd_row_sink).
    const float *sinks;

    // Per-batch key counts (flashcore_forward_params::seqused_k), or nullptr:
    // every batch has seqlen_k. Read on the device through fwd_batch_seqs.
    const int32_t *seqused_k;

    // Variable-length batches (flashcore_forward_params::cu_seqlens_q/_k):
    // prefix sums of the packed rows of q/out and k/v, or nullptr. The batch
    // strides of packed tensors are 0, so every address is batch *
    // batch_stride + (first row + position) * seq_stride. seqlen_q/_k are the
    // longest sequences, total_seqlen_q/_k the rows the tensors hold.
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    // Whether any of cu_seqlens_q, cu_seqlens_k, block_table is set: the call
    // needs a kernel compiled for ragged batches (kRagged below).
    bool ragged;
    int total_seqlen_q;
    int total_seqlen_k;
    // lse entry of (batch, head, row) r: batch * lse_batch_stride + head *
    // lse_head_stride + first row + r ([batch][head][seqlen_q], or with
    // cu_seqlens_q [head][total_seqlen_q]).
    int64_t lse_batch_stride;
    int64_t lse_head_stride;

    // Paged K/V (flashcore_forward_params::block_table), or nullptr: key j of
    // batch b is row j % page_size of page block_table[b * stride + j /
    // page_size], the k/v batch strides being the page strides.
    const int32_t *block_table;
    int64_t block_table_batch_stride;
    int page_size;
    int num_pages;
    // log2(page_size) where it is a power of two (the usual 16 ... 256), so
    // the kernels find a key's page and row with shifts; -1 otherwise.
    int page_shift;

    // GQA packing: the query heads that share a K/V head (packed_heads of
    // them, num_heads_q / num_heads_kv, or 1 for none) are the rows of one
    // query tile. Row r of a (batch, head group) is query r / packed_heads of
    // query head head_group * packed_heads + r % packed_heads, so each K/V
    // tile is read once for the whole group. The portable kernel only.
    int packed_heads;

    // Split-KV (num_splits > 1): the key blocks of each query block are
    // split into num_splits parts (BlockKeyRange::split), each computed by
    // its own CTA, which writes its normalised rows and their log-sum-exp to
    // the workspace in fp32 (not to out and lse):
    //   partial_out [num_splits][batch_size][num_heads_q][seqlen_q][head_dim_v]
    //   partial_lse [num_splits][batch_size][num_heads_q][seqlen_q]
    // and the merge kernel (merge/merge_states.cu) combines them.
    int num_splits;
    // Under a split, the keys a part holds at least (0: every block's keys
    // cut into num_splits equal parts): a block whose keys would fill fewer
    // parts of this many takes fewer, and its other splits are empty (the
    // portable kernel; BlockKeyRange::split).
    int split_min_keys;
    float *partial_out;
    float *partial_lse;

    // Descale factors of quantized (e4m3) tensors (flashcore_forward_params::
    // q_descale, k_descale, v_descale), or nullptr for 1: the factor of
    // (batch, K/V head) is at batch * batch_stride + head * head_stride. The
    // kernels fold q's and k's into the score scale and v's into the output
    // (fwd_descale); the kernels of 16-bit tensors never read them, and
    // q_descale is set only for e4m3 queries.
    const float *k_descale;
    const float *v_descale;
    int64_t k_descale_batch_stride, k_descale_head_stride;
    int64_t v_descale_batch_stride, v_descale_head_stride;
    const float *q_descale;
    int64_t q_descale_batch_stride, q_descale_head_stride;

    // The divisors of packed_heads, the head counts, num_splits and the
    // launched tile's query blocks (fwd_divisors): set where the launch's
    // fields above are final.
    FwdDivisors divisors;
};

// Rows of query tiles per (batch, head group): seqlen_q, times the heads
// packed into each row group.
FLASHCORE_HOST_DEVICE inline int fwd_packed_rows(const FwdKernelParams &p) { return p.seqlen_q * p.packed_heads; }

#if defined(__CUDACC__)
// One batch's sequences: the first rows of its queries in q/out and of its
// keys in k/v (0 unless packed), and how many of each it has.
struct BatchSeqs {
    int q_row0;
    int seqlen_q;
    int k_row0;
    int seqlen_k;
};

// Rows [cu[batch], cu[batch + 1]) of a packed tensor of `total` rows,
// clamped into it, at most max_len long: a wrong prefix sum must give a
// wrong result, not an access outside the tensor.
// (Host code too: the sm90 schedule's host test walks ragged batches.)
__host__ __device__ __forceinline__ void packed_rows(const int32_t *cu_seqlens, int batch, int total, int max_len,
                                                     int &row0, int &len) {
#ifdef __CUDA_ARCH__
    const int first = __ldg(cu_seqlens + batch), last = __ldg(cu_seqlens + batch + 1);
#else
    const int first = cu_seqlens[batch], last = cu_seqlens[batch + 1];
#endif
    const int begin = min(max(first, 0), total);
    const int end = min(max(last, begin), total);
    row0 = begin;
    len = min(end - begin, max_len);
}

// Batch `batch`'s sequences: its packed rows (cu_seqlens_q/_k), and its key
// count clamped by seqused_k.
//
// kRagged: whether the kernel serves packed or paged tensors (a template
// flag of both kernel families). Dense kernels know at compile time that
// every batch starts at row 0 with seqlen_q queries: the run-time rows and
// lengths of ragged batches cost dense calls 3-8% (live registers through
// the mainloops, branches in the producer and epilogue), measured on an H100.
template <bool kRagged>
__device__ __forceinline__ BatchSeqs fwd_batch_seqs(const FwdKernelParams &p, int batch) {
    BatchSeqs s{0, p.seqlen_q, 0, p.seqlen_k};
    if (kRagged && p.cu_seqlens_q != nullptr) packed_rows(p.cu_seqlens_q, batch, p.total_seqlen_q, p.seqlen_q, s.q_row0, s.seqlen_q);
    if (kRagged && p.cu_seqlens_k != nullptr) packed_rows(p.cu_seqlens_k, batch, p.total_seqlen_k, p.seqlen_k, s.k_row0, s.seqlen_k);
    if (p.seqused_k != nullptr) s.seqlen_k = min(max(__ldg(p.seqused_k + batch), 0), s.seqlen_k);
    return s;
}

// The factor of (batch, head_kv) in a descale array of these strides (1
// where there is none).
__device__ __forceinline__ float fwd_descale(const float *descale, int64_t batch_stride, int64_t head_stride,
                                             int batch, int head_kv) {
    return descale == nullptr ? 1.f : __ldg(descale + batch * batch_stride + head_kv * head_stride);
}

// The page holding key `key` of batch `batch` of a paged cache, clamped
// into the pool.
__device__ __forceinline__ int fwd_page_index(const FwdKernelParams &p, int key) {
    return p.page_shift >= 0 ? key >> p.page_shift : key / p.page_size;
}
// The row of key `key` within its page.
__device__ __forceinline__ int fwd_page_row(const FwdKernelParams &p, int key) {
    return p.page_shift >= 0 ? key & (p.page_size - 1) : key % p.page_size;
}
// The block table's entry for key `key` of batch `batch`, as stored (a
// caller's table may hold anything: fwd_clamp_page before use).
__device__ __forceinline__ int fwd_page_entry(const FwdKernelParams &p, int batch, int key) {
    return __ldg(p.block_table + batch * p.block_table_batch_stride + fwd_page_index(p, key));
}
__device__ __forceinline__ int fwd_clamp_page(const FwdKernelParams &p, int entry) {
    return min(max(entry, 0), p.num_pages - 1);
}
__device__ __forceinline__ int fwd_page_of(const FwdKernelParams &p, int batch, int key) {
    return fwd_clamp_page(p, fwd_page_entry(p, batch, key));
}
#endif

// Whether every query sees every key: the window's bounds reach past both
// ends (they are clamped to seqlen_k and seqlen_q - 1; causal is
// window_right 0) and there are no chunks. What the schedules that assume a
// full mask ask (fwd/sm90/config.cuh wide_fits, bwd/passes.cuh's rotated
// walk).
FLASHCORE_HOST_DEVICE inline bool fwd_sees_every_key(const FwdKernelParams &p) {
    return p.window_left >= p.seqlen_k && p.window_right >= p.seqlen_q - 1 && p.attention_chunk == 0;
}

// (batch, head group) pairs: one per query head, or per K/V head when packed.
FLASHCORE_HOST_DEVICE inline int fwd_head_groups(const FwdKernelParams &p) { return p.num_heads_q / p.packed_heads; }

// FwdKernelParams::divisors of a launch whose packed_heads, head counts and
// num_splits are final, on a kernel of block_m-row query blocks. The
// backward sets them for the forward's view of its call too, though its
// kernels pack no heads and place no block by query_blocks.
FLASHCORE_HOST_DEVICE inline FwdDivisors fwd_divisors(const FwdKernelParams &p, int block_m) {
    FwdDivisors d;
    d.packed_heads = FastDivisor::of(p.packed_heads);
    d.tile = {FastDivisor::of(fwd_head_groups(p)), FastDivisor::of(p.num_heads_q / p.num_heads_kv)};
    // At most INT32_MAX - 256 packed rows (the dispatcher's kMaxPackedRows):
    // the sum does not wrap.
    d.query_blocks = FastDivisor::of((fwd_packed_rows(p) + block_m - 1) / block_m);
    d.splits = FastDivisor::of(p.num_splits);
    return d;
}

}  // namespace flashcore
