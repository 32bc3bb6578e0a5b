// Shared-memory tiles of [rows][kRowElems] elements, moved in 16-byte
// vectors (kElemsPerVector<Element> elements: common/element.cuh) and stored
// with an XOR swizzle of those vectors, and their cooperative loads from (and
// stores to) global memory.
//
// Why the swizzle: ldmatrix reads one 16-byte vector from each of 8
// consecutive rows. Unswizzled, rows of 64 bytes or more put several of those
// 8 vectors in the same banks. Within each full group of 8 vectors (128
// bytes) of a row, vector v is stored at v ^ (row % 8); a row that ends in a
// half group of 4 vectors (head dims 32, 96) stores those at
// v ^ ((row / 2) % 4). Either way the 8 rows an ldmatrix reads land in 8
// different 16-byte bank groups, for rows of 64, 128, 192, 256 or 512 bytes,
// and the permutation stays inside the row. It repeats every 8 rows.
//
// Rows of a one-byte type (a quantized K/V tile) of 2 or 6 vectors (head
// dims 32 and 96) are not swizzled: the ldmatrix of 8 such rows meets 2-way
// bank conflicts, which those head dims' decode tiles accept.
#pragma once

#include <cstdint>

#include "common/element.cuh"
#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"

namespace flashcore {

// Rows whose vector indices are permuted together by the swizzle.
constexpr int kSwizzleRows = 8;
constexpr int kSwizzleGroupVectors = 8;
constexpr int kHalfGroupVectors = 4;

// Element offset of vector `vec` (0 .. kRowElems / kElemsPerVector - 1) of
// row `row`.
template <typename Element, int kRowElems>
__device__ __forceinline__ int swizzled_offset(int row, int vec) {
    constexpr int kVectors = kRowElems / kElemsPerVector<Element>;
    constexpr int kFullGroupVectors = kVectors / kSwizzleGroupVectors * kSwizzleGroupVectors;
    if constexpr (kVectors % kHalfGroupVectors != 0) {
        static_assert(sizeof(Element) == 1, "rows are whole groups of 8 vectors, plus at most 4");
        return row * kRowElems + vec * kElemsPerVector<Element>;
    }
    const int swizzled = kFullGroupVectors == kVectors || vec < kFullGroupVectors
                             ? vec ^ (row % kSwizzleRows)
                             : vec ^ ((row / 2) % kHalfGroupVectors);
    return row * kRowElems + swizzled * kElemsPerVector<Element>;
}

// Byte offset of vector `vec` of row `row`, as above.
template <typename Element, int kRowElems>
__device__ __forceinline__ uint32_t swizzled_byte_offset(int row, int vec) {
    return uint32_t(swizzled_offset<Element, kRowElems>(row, vec)) * uint32_t(sizeof(Element));
}

// Moving 8 rows down leaves the swizzle unchanged.
template <typename Element, int kRowElems>
__device__ __forceinline__ constexpr uint32_t row_block_bytes(int rows) {
    return uint32_t(rows) * kRowElems * uint32_t(sizeof(Element));
}

// Fragment loops step through a row 2 vectors (one k-step of the MMA: 32
// bytes, k16 of a two-byte type) at a time from
// a lane's vector b in {0, 1}. Since b ^ x stays in the pair's group for the
// XORs above, the swizzle only permutes vectors within a group; with o(v) the
// offset of vector v within the row,
//   full group:  o(2*step + b) == (o(b) ^ (step % 4) * 32) + (step / 4) * 128
//   half group:  o(F + 2*s + b) == o(F + b) ^ s * 32   (F: vectors in full groups)
// With step a compile-time constant each is one XOR with at most four
// distinct results and an immediate offset, so a loop over a 128-element row
// keeps four address registers per base, not eight. Where rows are a multiple
// of 128 bytes the row's own offset has no bits in common with the XOR and
// rides along in the base; otherwise (192-byte rows) it is added after.
template <typename Element, int kRowElems>
struct SwizzledRowSteps {
    static constexpr int kVectors = kRowElems / kElemsPerVector<Element>;
    static constexpr int kFullSteps = kVectors / kSwizzleGroupVectors * kSwizzleGroupVectors / 2;
    static constexpr bool kHasHalfGroup = kVectors % kSwizzleGroupVectors != 0;
    static constexpr bool kRowsAligned = !kHasHalfGroup;  // rows a multiple of 128 bytes
    uint32_t row_base;   // byte offset of the row (0 where kRowsAligned: it is in full_base)
    uint32_t full_base;  // offset of vector b
    uint32_t half_base;  // byte offset of vector F + b, row included (rows that end in a half group)

    __device__ __forceinline__ static SwizzledRowSteps of(int row, int b) {
        SwizzledRowSteps s;
        s.row_base = kRowsAligned ? 0u : row_block_bytes<Element, kRowElems>(row);
        s.full_base = swizzled_byte_offset<Element, kRowElems>(row, b) - s.row_base;
        s.half_base = kHasHalfGroup ? swizzled_byte_offset<Element, kRowElems>(row, 2 * kFullSteps + b) : 0u;
        return s;
    }

    // Bytes of `rows` rows (row_block_bytes).
    __device__ __forceinline__ static constexpr uint32_t block_bytes(int rows) {
        return row_block_bytes<Element, kRowElems>(rows);
    }

    // Byte offset of vector 2 * step + b; step is a compile-time constant.
    __device__ __forceinline__ uint32_t at(int step) const {
        if (step < kFullSteps) {
            return row_base + (full_base ^ (uint32_t(step % 4) * 2u * uint32_t(kVectorBytes))) +
                   uint32_t(step / 4) * 8u * uint32_t(kVectorBytes);
        }
        return half_base ^ (uint32_t(step - kFullSteps) * 2u * uint32_t(kVectorBytes));
    }
};

// Whether kThreads threads copy a tile of kRowElems-element rows in row
// groups (load_tile_async's third way): rows of whole swizzle groups that
// the threads do not divide into vector columns (576 elements: 72
// vectors), in passes of one row per 8 threads.
template <typename Element, int kRowElems, int kRows, int kThreads>
constexpr bool kGroupCopy = (kRowElems / kElemsPerVector<Element>) % kSwizzleGroupVectors == 0 &&
                            kThreads % (kRowElems / kElemsPerVector<Element>) != 0 &&
                            kThreads % kSwizzleGroupVectors == 0 &&
                            (kThreads / kSwizzleGroupVectors) % kSwizzleRows == 0 &&
                            kRows % (kThreads / kSwizzleGroupVectors) == 0;

// A row group copy's share of one row (kGroupCopy): vectors group_vec,
// group_vec + 8, ... of the row at src into shared memory from dst (vector
// group_vec's swizzled address: the swizzle keeps each in its group of 8, so
// the others sit at immediate offsets from it); vectors past valid_vectors
// and an invalid row zero-filled, their source the mapped `mapped`.
template <typename Element, int kVectorsPerRow>
__device__ __forceinline__ void copy_row_group_async(uint32_t dst, const Element *src, const Element *mapped,
                                                     bool row_valid, int group_vec, int valid_vectors) {
#pragma unroll
    for (int c = 0; c < kVectorsPerRow / kSwizzleGroupVectors; ++c) {
        const bool valid = row_valid && group_vec + c * kSwizzleGroupVectors < valid_vectors;
        cp_async_16(dst + uint32_t(c * kSwizzleGroupVectors * kVectorBytes),
                    valid ? src + c * kSwizzleGroupVectors * kElemsPerVector<Element> : mapped, valid);
    }
}

// Copies rows [0, kRows) of a global tile whose row r starts at
// gmem + r * row_stride into shared memory. Rows >= valid_rows, and vectors
// >= valid_vectors of each row (a head dim smaller than the kernel's), are
// zero-filled without touching global memory. Asynchronous: completes at the
// next cp_async_wait after the caller's cp_async_commit.
//
// Each thread copies one column of vectors: rows row0, row0 + kRowsPerPass,
// ... of vector `vec`. Its source pointer advances by an opaque add: written
// as gmem + row * row_stride, the compiler hoists every row's 64-bit product
// out of the kernel's tile loop and keeps them all in registers.
//
// kThreads threads, numbered tid = 0 .. kThreads - 1, share the copy.
template <typename Element, int kRowElems, int kRows, int kThreads>
__device__ __forceinline__ void load_tile_async(Element *smem, const Element *gmem, int64_t row_stride,
                                                int valid_rows, int valid_vectors, int tid) {
    constexpr int kVectorsPerRow = kRowElems / kElemsPerVector<Element>;
    if constexpr (kThreads % kVectorsPerRow == 0 && kRows % (kThreads / kVectorsPerRow) == 0) {
        // Each thread keeps one column of vectors. Where a pass covers whole
        // swizzle blocks of rows it also keeps one swizzled offset;
        // otherwise (few threads, e.g. one warp per tile) the offset is
        // swizzled per row.
        constexpr int kRowsPerPass = kThreads / kVectorsPerRow;
        constexpr bool kWholeSwizzleBlocks = kRowsPerPass % kSwizzleRows == 0;
        const int row0 = tid / kVectorsPerRow;
        const int vec = tid % kVectorsPerRow;
        const uint32_t base = smem_address(smem);
        const uint32_t dst = base + swizzled_byte_offset<Element, kRowElems>(row0, vec);
        const int64_t pass_stride = row_stride * kRowsPerPass;
        const bool vec_valid = vec < valid_vectors;
        const auto *src = gmem + row0 * row_stride + vec * kElemsPerVector<Element>;
#pragma unroll
        for (int i = 0; i < kRows / kRowsPerPass; ++i) {
            const int row = row0 + i * kRowsPerPass;
            const bool valid = vec_valid && row < valid_rows;
            // An invalid vector still needs a mapped address in the
            // instruction; the tile's first element is always in bounds.
            cp_async_16(kWholeSwizzleBlocks ? dst + row_block_bytes<Element, kRowElems>(i * kRowsPerPass)
                                            : base + swizzled_byte_offset<Element, kRowElems>(row, vec),
                        valid ? src : gmem, valid);
            src = opaque_advance(src, pass_stride);
        }
    } else if constexpr (kGroupCopy<Element, kRowElems, kRows, kThreads>) {
        // Each thread takes one row a pass, its vectors g, g + 8, ... (g:
        // its place among the row's 8 threads). The swizzle keeps a vector
        // in its group of 8, so they sit at immediate offsets from the
        // first, in the source and in shared memory: one pointer and one
        // address a pass, where the per-vector path below kept 9 of each
        // live at 576 and the ragged kernel spilled.
        constexpr int kRowsPerPass = kThreads / kSwizzleGroupVectors;
        const int row0 = tid / kSwizzleGroupVectors;
        const int group_vec = tid % kSwizzleGroupVectors;
        const uint32_t dst = smem_address(smem) + swizzled_byte_offset<Element, kRowElems>(row0, group_vec);
        const auto *src = gmem + row0 * row_stride + group_vec * kElemsPerVector<Element>;
        const int64_t pass_stride = row_stride * kRowsPerPass;
#pragma unroll
        for (int i = 0; i < kRows / kRowsPerPass; ++i) {
            copy_row_group_async<Element, kVectorsPerRow>(dst + row_block_bytes<Element, kRowElems>(i * kRowsPerPass),
                                                          src, gmem, row0 + i * kRowsPerPass < valid_rows, group_vec,
                                                          valid_vectors);
            src = opaque_advance(src, pass_stride);
        }
    } else {
        // Rows of 12 vectors (head dim 96), or tiles with fewer rows than a
        // pass: each thread takes vectors tid, tid + kThreads, ... of the
        // tile in row-major order (the last round partly, where the threads
        // do not divide the vectors).
        constexpr int kVectors = kRows * kVectorsPerRow;
        const uint32_t base = smem_address(smem);
#pragma unroll
        for (int i = 0; i < (kVectors + kThreads - 1) / kThreads; ++i) {
            const int idx = tid + i * kThreads;
            if (kVectors % kThreads != 0 && idx >= kVectors) break;
            const int row = idx / kVectorsPerRow;
            const int vec = idx % kVectorsPerRow;
            const bool valid = vec < valid_vectors && row < valid_rows;
            cp_async_16(base + swizzled_byte_offset<Element, kRowElems>(row, vec),
                        valid ? gmem + row * row_stride + vec * kElemsPerVector<Element> : gmem, valid);
        }
    }
}

// As load_tile_async, for rows that are not evenly strided: row r starts at
// gmem + row_offset(r) (GQA-packed Q tiles gather rows of several heads).
// Each thread takes vectors tid, tid + kThreads, ... in row-major order.
template <typename Element, int kRowElems, int kRows, int kThreads, typename RowOffset>
__device__ __forceinline__ void load_rows_async(Element *smem, const Element *gmem, RowOffset &&row_offset,
                                                int valid_rows, int valid_vectors, int tid) {
    constexpr int kVectorsPerRow = kRowElems / kElemsPerVector<Element>;
    const uint32_t base = smem_address(smem);
    for (int idx = tid; idx < kRows * kVectorsPerRow; idx += kThreads) {
        const int row = idx / kVectorsPerRow;
        const int vec = idx % kVectorsPerRow;
        const bool valid = vec < valid_vectors && row < valid_rows;
        cp_async_16(base + swizzled_byte_offset<Element, kRowElems>(row, vec),
                    valid ? gmem + row_offset(row) + vec * kElemsPerVector<Element> : gmem, valid);
    }
}

// Copies rows [0, valid_rows), vectors [0, valid_vectors) of a shared tile
// (rows of kRowElems, of which the first kCopyVectors vectors are copied) to
// global memory with 16-byte stores, by kThreads threads. The caller
// synchronises the CTA before calling.
template <typename Element, int kRowElems, int kCopyVectors, int kRows, int kThreads>
__device__ __forceinline__ void store_tile(Element *gmem, int64_t row_stride, const Element *smem, int valid_rows,
                                           int valid_vectors, int tid) {
    constexpr int kVectors = kRows * kCopyVectors;
    static_assert(kCopyVectors <= kRowElems / kElemsPerVector<Element>, "the copied vectors are a prefix of the row");
#pragma unroll
    for (int i = 0; i < (kVectors + kThreads - 1) / kThreads; ++i) {
        const int idx = tid + i * kThreads;
        if (kVectors % kThreads != 0 && idx >= kVectors) break;
        const int row = idx / kCopyVectors;
        const int vec = idx % kCopyVectors;
        if (row < valid_rows && vec < valid_vectors) {
            const uint4 value = *reinterpret_cast<const uint4 *>(smem + swizzled_offset<Element, kRowElems>(row, vec));
            *reinterpret_cast<uint4 *>(gmem + row * row_stride + vec * kElemsPerVector<Element>) = value;
        }
    }
}

}  // namespace flashcore
