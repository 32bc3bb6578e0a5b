// Shared-memory tiles of [rows][head_dim] 2-byte elements, stored with an XOR
// swizzle, and their cooperative loads from (and stores to) global memory.
//
// Why the swizzle: ldmatrix reads one 16-byte vector from each of 8
// consecutive rows. Unswizzled, rows of 128 or 256 bytes put those 8 vectors
// in the same banks (8-way conflict). XOR-ing the vector index with (row % 8)
// spreads them over all 32 banks, for both ldmatrix and the 16-byte copies.
#pragma once

#include <cstdint>

#include "kernel_traits.cuh"
#include "ptx.cuh"

namespace flashcore {

// Rows whose vector indices are permuted together by the swizzle.
constexpr int kSwizzleRows = 8;

// Element offset of vector `vec` (0 .. head_dim/8 - 1) of row `row`.
template <int kHeadDim>
__device__ __forceinline__ int swizzled_offset(int row, int vec) {
    return row * kHeadDim + ((vec ^ (row % kSwizzleRows)) * kElemsPerVector);
}

// Byte offset of vector `vec` of row `row`, as above.
template <int kHeadDim>
__device__ __forceinline__ uint32_t swizzled_byte_offset(int row, int vec) {
    return uint32_t(swizzled_offset<kHeadDim>(row, vec)) * 2u;
}

// Fragment loops step through a row 2 vectors (one k16 slice) at a time from a
// per-thread base offset at vector b in {0, 1}. Since b ^ (row % 8) < 8, the
// swizzle only permutes vectors within each group of 8 (128 bytes):
//   swizzled_byte_offset(row, 2*step + b)
//     == (swizzled_byte_offset(row, b) ^ (step % 4) * 32) + (step / 4) * 128
// (the row part of the offset, a multiple of 128 bytes, has no bits in common
// with the XOR). With step a compile-time constant this is one XOR with at
// most four distinct results and an immediate offset, so a loop over a
// 128-element head_dim keeps four address registers per base, not eight.
__device__ __forceinline__ constexpr uint32_t vector_step_offset(uint32_t base_offset, int step) {
    return (base_offset ^ (uint32_t(step % 4) * 2u * 16u)) + uint32_t(step / 4) * 8u * 16u;
}

// Moving 8 rows down leaves row % 8, and with it the swizzle, unchanged.
template <int kHeadDim>
__device__ __forceinline__ constexpr uint32_t row_block_bytes(int rows) {
    return uint32_t(rows) * kHeadDim * 2u;
}

// Calls body(row, vec) for this thread's share of the 16-byte vectors of a
// [kRows][head_dim] tile: consecutive threads take consecutive vectors of a
// row, so each warp touches whole rows (coalesced in global memory, and a
// permutation of banks in swizzled shared memory).
template <typename Traits, int kRows, typename Body>
__device__ __forceinline__ void for_each_tile_vector(int tid, Body &&body) {
    constexpr int kVectors = kRows * Traits::kVectorsPerRow;
    static_assert(kVectors % Traits::kNumThreads == 0, "tile vectors must divide evenly among the threads");
#pragma unroll
    for (int i = 0; i < kVectors / Traits::kNumThreads; ++i) {
        const int idx = tid + i * Traits::kNumThreads;
        body(idx / Traits::kVectorsPerRow, idx % Traits::kVectorsPerRow);
    }
}

// Copies rows [0, kRows) of a global tile whose row r starts at
// gmem + r * row_stride into shared memory. Rows >= valid_rows are
// zero-filled without touching global memory. Asynchronous: completes at the
// next cp_async_wait after the caller's cp_async_commit.
//
// Each thread copies one column of vectors: rows row0, row0 + kRowsPerPass,
// ... of vector `vec` (the same (row, vec) order as for_each_tile_vector).
// Its source pointer advances by an opaque add: written as
// gmem + row * row_stride, the compiler hoists every row's 64-bit product out
// of the kernel's tile loop and keeps them all in registers.
//
// kThreads threads, numbered tid = 0 .. kThreads - 1, share the copy.
template <typename Traits, int kRows, int kThreads>
__device__ __forceinline__ void load_tile_async(typename Traits::Element *smem,
                                                const typename Traits::Element *gmem, int64_t row_stride,
                                                int valid_rows, int tid) {
    constexpr int kRowsPerPass = kThreads / Traits::kVectorsPerRow;
    static_assert(kThreads % Traits::kVectorsPerRow == 0 && kRowsPerPass % kSwizzleRows == 0 &&
                      kRows % kRowsPerPass == 0,
                  "each pass must cover whole swizzle blocks of rows");
    const int row0 = tid / Traits::kVectorsPerRow;
    const int vec = tid % Traits::kVectorsPerRow;
    const uint32_t dst = smem_address(smem) + swizzled_byte_offset<Traits::kHeadDim>(row0, vec);
    const int64_t pass_stride = row_stride * kRowsPerPass;
    const auto *src = gmem + row0 * row_stride + vec * kElemsPerVector;
#pragma unroll
    for (int i = 0; i < kRows / kRowsPerPass; ++i) {
        const bool valid = row0 + i * kRowsPerPass < valid_rows;
        // An invalid row still needs a mapped address in the instruction; the
        // tile's first row is always in bounds.
        cp_async_16(dst + row_block_bytes<Traits::kHeadDim>(i * kRowsPerPass), valid ? src : gmem, valid);
        src = opaque_advance(src, pass_stride);
    }
}

// Copies rows [0, valid_rows) of a shared tile to global memory with 16-byte
// stores. The caller synchronises the CTA before calling.
template <typename Traits, int kRows>
__device__ __forceinline__ void store_tile(typename Traits::Element *gmem, int64_t row_stride,
                                           const typename Traits::Element *smem, int valid_rows, int tid) {
    for_each_tile_vector<Traits, kRows>(tid, [&](int row, int vec) {
        if (row < valid_rows) {
            const uint4 value =
                *reinterpret_cast<const uint4 *>(smem + swizzled_offset<Traits::kHeadDim>(row, vec));
            *reinterpret_cast<uint4 *>(gmem + row * row_stride + vec * kElemsPerVector) = value;
        }
    });
}

}  // namespace flashcore
