// Where a query block's results go, and the stores both forward kernels make
// there: one component for the portable and the Hopper epilogues.
//
// A block's results (O rows, and one log-sum-exp value per row) go to one of
// three destinations, and with_output_destination() below is the one place
// that picks it:
//   - a split-KV part (p.num_splits > 1): fp32 rows and LSE values in the
//     workspace, for the merge kernel (common/params.h gives the layout);
//   - a GQA-packed tile (p.packed_heads > 1; the portable kernel only): its
//     rows belong to several query heads of out and lse;
//   - otherwise the plain block: rows [first query, + valid_rows) of one
//     head, one strided run of out.
// The first two are ScatteredRows (RowLayout::kScattered: row r at an
// offset computed per row), the plain block BlockRows (kStrided), or
// PlainBlock, which computes its BlockRows where a store asks for them. The
// layout also says how the stores below write:
//   - a block that sees no key (store_empty_rows): 16-byte vectors into a
//     strided block, pairs of columns into scattered rows;
//   - finished accumulator fragments (store_fragment_rows): each thread its
//     fragments' pairs of columns; into scattered rows each row's LSE right
//     after the row, into a strided block the LSE in a pass of its own
//     (store_fragment_lse), the pass the kernels' staged output paths (shared
//     memory, TMA) use too.
//
// Row r of a packed block is packed row first_row + r of its (batch, head
// group): query (first_row + r) / packed_heads of head head_q + that
// remainder.
//
// Where a function here does one thing two ways, or reads a parameter where
// it is used rather than once, that is the order of operations of the code
// it replaced in each kernel: ptxas's register allocation follows it, and
// the kernels' SASS is unchanged by this component.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"
#include "common/params.h"
#include "common/tile_coords.cuh"

namespace flashcore {

template <typename T>
__device__ __forceinline__ void store_pair(T *dst, float lo, float hi) {
    *reinterpret_cast<uint32_t *>(dst) = pack2<T>(lo, hi);
}
template <>
__device__ __forceinline__ void store_pair<float>(float *dst, float lo, float hi) {
    *reinterpret_cast<float2 *>(dst) = make_float2(lo, hi);
}

enum class RowLayout {
    kStrided,    // the block's rows are one strided run of out from its first row
    kScattered,  // row r at an offset of its own (packed heads); lse likewise
};

// The plain block: its rows are one strided run of out.
template <typename T>
struct BlockRows {
    using Element = T;
    static constexpr RowLayout kLayout = RowLayout::kStrided;

    T *out;      // the block's first row
    float *lse;  // likewise; nullptr: not written
    int valid_rows;
    // out's row stride in elements, in the call's parameters: read where a
    // store needs it.
    const int64_t *seq_stride;

    __device__ __forceinline__ int64_t out_offset(int row) const { return int64_t(row) * *seq_stride; }
    __device__ __forceinline__ int64_t lse_offset(int row) const { return row; }
};

// Rows at offsets of their own: a GQA-packed block's (which belong to
// several query heads), a split-KV part's in the workspace.
template <typename T>
struct ScatteredRows {
    using Element = T;
    static constexpr RowLayout kLayout = RowLayout::kScattered;

    T *out;                           // the block's (batch, first head)'s query 0
    float *lse;                       // likewise; nullptr: not written
    int64_t seq_stride, head_stride;  // of out, in elements
    int64_t lse_head_stride;          // of lse (its query stride is 1)
    int first_row;
    FastDivisor packed_heads;  // FwdDivisors::packed_heads
    int valid_rows;

    __device__ __forceinline__ int64_t out_offset(int row) const {
        return packed_heads.strided(first_row + row, seq_stride, head_stride);
    }
    __device__ __forceinline__ int64_t lse_offset(int row) const {
        return packed_heads.strided(first_row + row, 1, lse_head_stride);
    }
};

// The plain block: out and lse rows of the tile's query block.
template <typename T>
__device__ __forceinline__ BlockRows<T> block_rows(const FwdKernelParams &p, const FwdTile &tile, int block_m) {
    const int first_query = tile.m_block * block_m;
    BlockRows<T> d;
    d.out = static_cast<T *>(p.out) + fwd_out_offset(p, tile) + first_query * p.out_seq_stride;
    d.lse = p.lse == nullptr ? nullptr : p.lse + fwd_lse_offset(p, tile) + first_query;
    d.valid_rows = fwd_valid_rows(p, tile, block_m);
    d.seq_stride = &p.out_seq_stride;
    return d;
}

// The plain block of a tile as with_output_destination visits it: its rows
// (BlockRows) are computed where a store asks for them, rows(). (The Hopper
// epilogue asks after staging O: computed before, they would be live across
// its barriers.)
template <typename T>
struct PlainBlock {
    using Element = T;
    static constexpr RowLayout kLayout = RowLayout::kStrided;
    const FwdKernelParams &p;
    const FwdTile &tile;
    int block_m;

    __device__ __forceinline__ BlockRows<T> rows() const { return block_rows<T>(p, tile, block_m); }
};

// The workspace rows of split-KV part `split` (common/params.h gives the
// layout).
__device__ __forceinline__ ScatteredRows<float> split_part_rows(const FwdKernelParams &p, const FwdTile &tile,
                                                                int block_m, int split) {
    const int64_t first_head_row =
        ((int64_t(split) * p.batch_size + tile.batch) * p.num_heads_q + tile.head_q) * p.seqlen_q;
    ScatteredRows<float> d;
    d.out = p.partial_out + first_head_row * p.head_dim_v;
    d.lse = p.partial_lse + first_head_row;
    d.seq_stride = p.head_dim_v;
    d.head_stride = int64_t(p.seqlen_q) * p.head_dim_v;
    d.lse_head_stride = p.seqlen_q;
    d.first_row = tile.m_block * block_m;
    d.packed_heads = p.divisors.packed_heads;
    d.valid_rows = fwd_valid_rows(p, tile, block_m);
    return d;
}

// out and lse rows of a GQA-packed block.
template <typename T>
__device__ __forceinline__ ScatteredRows<T> packed_rows(const FwdKernelParams &p, const FwdTile &tile, int block_m) {
    ScatteredRows<T> d;
    d.out = static_cast<T *>(p.out) + fwd_out_offset(p, tile);
    d.lse = p.lse == nullptr ? nullptr : p.lse + fwd_lse_offset(p, tile);
    d.seq_stride = p.out_seq_stride;
    d.head_stride = p.out_head_stride;
    d.lse_head_stride = p.lse_head_stride;
    d.first_row = tile.m_block * block_m;
    d.packed_heads = p.divisors.packed_heads;
    d.valid_rows = fwd_valid_rows(p, tile, block_m);
    return d;
}

// Calls visit(dst) with the destination of the tile's query block (part
// `split` of its keys): the workspace rows of a split-KV part
// (ScatteredRows<float>), the rows of a GQA-packed tile (where kPackedHeads:
// the kernel has such tiles; ScatteredRows<ElementOut>), or the plain block
// of out (BlockRows<ElementOut>; with kDeferPlain, PlainBlock<ElementOut>,
// whose rows() computes them). visit is instantiated for each; dst.kLayout
// tells them apart.
//
// writes_rows: where only some threads hold rows to write (after a key-split
// merge, split 0's), whether this one does. The others skip scattered
// destinations and are still visited with a plain block, whose store the
// kernel stages through shared memory with all its threads.
template <typename ElementOut, bool kPackedHeads, bool kDeferPlain = false, typename Visit>
__device__ __forceinline__ void with_output_destination(const FwdKernelParams &p, const FwdTile &tile, int block_m,
                                                        int split, Visit &&visit) {
    if (p.num_splits > 1) {
        visit(split_part_rows(p, tile, block_m, split));
    } else if (kPackedHeads && p.packed_heads > 1) {
        visit(packed_rows<ElementOut>(p, tile, block_m));
    } else if constexpr (kDeferPlain) {
        visit(PlainBlock<ElementOut>{p, tile, block_m});
    } else {
        visit(block_rows<ElementOut>(p, tile, block_m));
    }
}
template <typename ElementOut, bool kPackedHeads, typename Visit>
__device__ __forceinline__ void with_output_destination(const FwdKernelParams &p, const FwdTile &tile, int block_m,
                                                        int split, bool writes_rows, Visit &&visit) {
    // The same choice, shaped as the portable epilogue always wrote it: the
    // chain above, with writes_rows tested in its first two branches, makes
    // ptxas allocate that kernel's registers differently.
    if (p.num_splits > 1 || (kPackedHeads && p.packed_heads > 1)) {
        if (!writes_rows) return;
        if (p.num_splits > 1) {
            visit(split_part_rows(p, tile, block_m, split));
        } else {
            visit(packed_rows<ElementOut>(p, tile, block_m));
        }
        return;
    }
    visit(block_rows<ElementOut>(p, tile, block_m));
}

// The learnable sink (FwdKernelParams::sinks) of row `row` of the tile's
// query block, in lse units, for the softmax's finalize: -inf where the call
// has none, and in a split-KV part, whose merge adds it once. GQA-packed
// rows cycle through their group's heads.
__device__ __forceinline__ float fwd_row_sink(const FwdKernelParams &p, const FwdTile &tile, int block_m, int row) {
    if (p.sinks == nullptr || p.num_splits > 1) return -INFINITY;
    const int packed_row = tile.m_block * block_m + row;
    return __ldg(p.sinks + tile.head_q + p.divisors.packed_heads.divide(packed_row).remainder);
}

// The sinks of a warp's fragment rows (kRows = 2 per m16 tile, from block
// row warp_first_row).
template <int kRows>
__device__ __forceinline__ void fwd_fragment_sinks(const FwdKernelParams &p, const FwdTile &tile, int block_m,
                                                   int warp_first_row, int lane, float (&sink)[kRows]) {
#pragma unroll
    for (int m = 0; m < kRows / 2; ++m) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            sink[m * 2 + half] =
                fwd_row_sink(p, tile, block_m, warp_first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf);
        }
    }
}

// A block in which no row sees any key (causal, seqlen_q > seqlen_k; a
// split part past the block's keys): out = 0 and lse = -inf (the row's
// sink, with sinks: fwd_row_sink) for its valid rows, the first valid_cols
// columns of each, written without touching K or V by threads tid = 0 ..
// num_threads - 1. A strided block is written in 16-byte vectors, scattered
// rows in pairs of columns.
template <typename Rows>
__device__ __forceinline__ void store_empty_rows(const Rows &dst, int valid_cols, int tid, int num_threads,
                                                 const FwdKernelParams &p, const FwdTile &tile, int block_m) {
    using T = typename Rows::Element;
    if constexpr (Rows::kLayout == RowLayout::kStrided) {
        const int64_t seq_stride = *dst.seq_stride;
        const int vectors_per_row = valid_cols / kElemsPerVector<T>;
        for (int i = tid; i < dst.valid_rows * vectors_per_row; i += num_threads) {
            *reinterpret_cast<uint4 *>(dst.out + (i / vectors_per_row) * seq_stride +
                                       (i % vectors_per_row) * kElemsPerVector<T>) = make_uint4(0, 0, 0, 0);
        }
    } else {
        const int pairs_per_row = valid_cols / 2;
        for (int i = tid; i < dst.valid_rows * pairs_per_row; i += num_threads) {
            store_pair<T>(dst.out + dst.out_offset(i / pairs_per_row) + (i % pairs_per_row) * 2, 0.f, 0.f);
        }
    }
    if (dst.lse != nullptr) {
        for (int row = tid; row < dst.valid_rows; row += num_threads) {
            dst.lse[dst.lse_offset(row)] = fwd_row_sink(p, tile, block_m, row);
        }
    }
}

// The LSE values of a warp's finished rows (kRows = 2 per m16 tile, from
// block row warp_first_row) into a plain block's (lse: its first row's,
// not null; valid_rows: BlockRows), from one lane of each quad.
template <int kRows>
__device__ __forceinline__ void store_fragment_lse(float *lse, int valid_rows, const float (&row_lse)[kRows],
                                                   int warp_first_row, int lane) {
    if (lane % 4 != 0) return;
#pragma unroll
    for (int m = 0; m < kRows / 2; ++m) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = warp_first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
            if (row < valid_rows) lse[row] = row_lse[m * 2 + half];
        }
    }
}

// Writes a warp's finished accumulator rows (kMAtoms m16 tiles from block
// row warp_first_row; the call's head_dim_v columns) and their LSE values.
// Each store is a pair of columns: 4 or 8 bytes.
//
// (Scattered rows take head_dim_v once, a strided block reads it where it
// compares, and adds the lane's first row first: as the code each replaced
// had it, whose register allocation this keeps.)
template <typename Destination, int kMAtoms, int kNAtoms>
__device__ __forceinline__ void store_fragment_rows(const Destination &destination,
                                                    const float (&out)[kMAtoms][kNAtoms][4],
                                                    const float (&lse)[kMAtoms * 2], int warp_first_row, int lane,
                                                    const FwdKernelParams &p) {
    using T = typename Destination::Element;
    if constexpr (Destination::kLayout == RowLayout::kScattered) {
        const Destination &dst = destination;
        const int valid_cols = p.head_dim_v;
#pragma unroll
        for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = warp_first_row + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
                if (row >= dst.valid_rows) continue;
                T *row_out = dst.out + dst.out_offset(row) + frag_col(lane);
#pragma unroll
                for (int n = 0; n < kNAtoms; ++n) {
                    if (n * kMmaN + frag_col(lane) < valid_cols) {
                        store_pair<T>(row_out + n * kMmaN, out[m][n][half * 2], out[m][n][half * 2 + 1]);
                    }
                }
                if (dst.lse != nullptr && lane % 4 == 0) dst.lse[dst.lse_offset(row)] = lse[m * 2 + half];
            }
        }
    } else {
        // Only the Hopper consumers store a strided block from registers,
        // one m16 tile per warp (the portable kernel stages its block).
        static_assert(kMAtoms == 1, "one m16 tile per warp");
        const PlainBlock<T> &block = destination;
        const BlockRows<T> dst = block.rows();
        const int first_row = warp_first_row + frag_row(lane);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = first_row + half * kFragRowHalf;
            if (row >= dst.valid_rows) continue;
            T *row_out = dst.out + dst.out_offset(row) + frag_col(lane);
#pragma unroll
            for (int n = 0; n < kNAtoms; ++n) {
                if (n * kMmaN + frag_col(lane) < p.head_dim_v) {
                    store_pair<T>(row_out + n * kMmaN, out[0][n][half * 2], out[0][n][half * 2 + 1]);
                }
            }
        }
        // The block's rows again: kept from before the stores, its values
        // would take registers across them.
        const BlockRows<T> rows = block.rows();
        if (rows.lse != nullptr) store_fragment_lse(rows.lse, rows.valid_rows, lse, warp_first_row, lane);
    }
}

}  // namespace flashcore
