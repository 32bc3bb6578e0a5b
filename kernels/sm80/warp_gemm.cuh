// Warp-level matrix products on m16n8k16 tensor cores. First the two of the
// forward pass, as one warp sees them: its band of query rows times a K/V
// tile in shared memory; then (SmemOperand, warp_mma) products of two shared
// tiles in either orientation, which the backward pass is made of.
//
//   S[m][n]  = Q_frag[m] * K_tile^T     (K rows are keys: ldmatrix, no transpose)
//   O[m][d] += P[m] * V_tile            (V rows are keys: ldmatrix.trans)
//
// P never leaves registers: the m16n8 accumulator layout of two adjacent S
// tiles is exactly the m16k16 A-operand layout, so P is packed in place.
#pragma once

#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"
#include "sm80/smem_tile.cuh"

namespace flashcore {

// Rows of Q and K tiles (kHeadDim elements), and of V tiles (kHeadDimV), as
// the fragment loops step through them.
template <typename Traits>
using QKRowSteps = SwizzledRowSteps<typename Traits::Element, Traits::kHeadDim>;
template <typename Traits>
using VRowSteps = SwizzledRowSteps<typename Traits::Element, Traits::kHeadDimV>;

// ldmatrix.x4 lane roles: lane l addresses row (l % 8) of matrix (l / 8).
__device__ __forceinline__ int ldm_row(int lane) { return lane % 8; }
__device__ __forceinline__ int ldm_matrix(int lane) { return lane / 8; }

// Q's A fragments, either all held in registers for the whole kernel or
// re-read from shared memory one k-step at a time (Traits::kQInRegisters).
template <typename Traits>
struct QFragments {
    static_assert(sizeof(typename Traits::Element) == 2, "ldmatrix .b16 and mma m16n8k16 take two-byte elements");
    uint32_t frag[Traits::kMAtoms][Traits::kQFragSteps][4];
    uint32_t smem_base;            // Q's tile
    QKRowSteps<Traits> lane_rows;  // this lane's ldmatrix offsets for m-tile 0

    // Matrices: rows 0-7 / 8-15 at k 0-7, then the same at k 8-15.
    __device__ __forceinline__ void init(const typename Traits::Element *smem_q, int first_row, int lane) {
        smem_base = smem_address(smem_q);
        lane_rows = QKRowSteps<Traits>::of(first_row + lane % kMmaM, lane / kMmaM);
        if constexpr (Traits::kQInRegisters) {
#pragma unroll
            for (int ks = 0; ks < Traits::kKStepsQK; ++ks) load_step(ks, ks);
        }
    }

    __device__ __forceinline__ void load_step(int ks, int slot) {
#pragma unroll
        for (int m = 0; m < Traits::kMAtoms; ++m) {
            ldmatrix_x4(frag[m][slot], smem_base + lane_rows.at(ks) + QKRowSteps<Traits>::block_bytes(m * kMmaM));
        }
    }

    // The fragments of k-step ks, loading them first if they are not held.
    __device__ __forceinline__ int step(int ks) {
        if constexpr (Traits::kQInRegisters) {
            return ks;
        } else {
            load_step(ks, 0);
            return 0;
        }
    }
};

// This lane's K fragment rows in a K tile. Matrices: keys 0-7 at k 0-7 and
// k 8-15, then keys 8-15 the same.
template <typename Traits>
__device__ __forceinline__ QKRowSteps<Traits> k_fragment_rows(int lane) {
    return QKRowSteps<Traits>::of((ldm_matrix(lane) / 2) * kMmaN + ldm_row(lane), ldm_matrix(lane) % 2);
}

// This lane's V fragment rows in a V tile. Matrices: keys 0-7 / 8-15 at
// head-dim columns 0-7, then at columns 8-15; ldmatrix.trans turns them into
// B fragments.
template <typename Traits>
__device__ __forceinline__ VRowSteps<Traits> v_fragment_rows(int lane) {
    return VRowSteps<Traits>::of((ldm_matrix(lane) % 2) * kMmaN + ldm_row(lane), ldm_matrix(lane) / 2);
}

template <typename Traits>
__device__ __forceinline__ void gemm_qk(float (&scores)[Traits::kMAtoms][Traits::kNAtomsS][4], QFragments<Traits> &q,
                                        uint32_t smem_k, const QKRowSteps<Traits> &k_rows) {
    using Element = typename Traits::Element;
#pragma unroll
    for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
        for (int n = 0; n < Traits::kNAtomsS; ++n) {
#pragma unroll
            for (int j = 0; j < 4; ++j) scores[m][n][j] = 0.f;
        }
    }
#pragma unroll
    for (int ks = 0; ks < Traits::kKStepsQK; ++ks) {
        const int slot = q.step(ks);
        const uint32_t step_addr = smem_k + k_rows.at(ks);
#pragma unroll
        for (int n = 0; n < Traits::kNAtomsS; n += 2) {
            uint32_t k_frag[4];
            ldmatrix_x4(k_frag, step_addr + QKRowSteps<Traits>::block_bytes(n * kMmaN));
#pragma unroll
            for (int m = 0; m < Traits::kMAtoms; ++m) {
                mma_m16n8k16<Element>(scores[m][n], q.frag[m][slot], k_frag[0], k_frag[1]);
                mma_m16n8k16<Element>(scores[m][n + 1], q.frag[m][slot], k_frag[2], k_frag[3]);
            }
        }
    }
}

// The A fragments of P for k-step ks of P*V (keys 16 ks .. 16 ks + 15: S
// tiles 2 ks and 2 ks + 1, whose accumulator layout is the A operand's),
// rounded to the MMA's Element.
template <typename Element, int kMAtoms, int kNAtomsS>
__device__ __forceinline__ void pack_p_fragments(uint32_t (&p_frag)[kMAtoms][4],
                                                 const float (&probs)[kMAtoms][kNAtomsS][4], int ks) {
#pragma unroll
    for (int m = 0; m < kMAtoms; ++m) {
        p_frag[m][0] = pack2<Element>(probs[m][2 * ks][0], probs[m][2 * ks][1]);
        p_frag[m][1] = pack2<Element>(probs[m][2 * ks][2], probs[m][2 * ks][3]);
        p_frag[m][2] = pack2<Element>(probs[m][2 * ks + 1][0], probs[m][2 * ks + 1][1]);
        p_frag[m][3] = pack2<Element>(probs[m][2 * ks + 1][2], probs[m][2 * ks + 1][3]);
    }
}

template <typename Traits>
__device__ __forceinline__ void gemm_pv(float (&out)[Traits::kMAtoms][Traits::kNAtomsO][4],
                                        const float (&probs)[Traits::kMAtoms][Traits::kNAtomsS][4], uint32_t smem_v,
                                        const VRowSteps<Traits> &v_rows) {
    using Element = typename Traits::Element;
#pragma unroll
    for (int ks = 0; ks < Traits::kKStepsPV; ++ks) {
        uint32_t p_frag[Traits::kMAtoms][4];
        pack_p_fragments<Element>(p_frag, probs, ks);
        const uint32_t step_addr = smem_v + VRowSteps<Traits>::block_bytes(ks * kMmaK);
#pragma unroll
        for (int n = 0; n < Traits::kNAtomsO; n += 2) {
            uint32_t v_frag[4];
            ldmatrix_x4_trans(v_frag, step_addr + v_rows.at(n / 2));
#pragma unroll
            for (int m = 0; m < Traits::kMAtoms; ++m) {
                mma_m16n8k16<Element>(out[m][n], p_frag[m], v_frag[0], v_frag[1]);
                mma_m16n8k16<Element>(out[m][n + 1], p_frag[m], v_frag[2], v_frag[3]);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Products of two shared-memory tiles in either orientation, for kernels
// whose operands are not all in the forward's shapes (the backward pass:
// S = Q K^T and dP = dO V^T as above, but also dV = P^T dO, dK = dS^T Q and
// dQ = dS K, whose operands are transposed tiles).
//
// A tile is a swizzled [rows][kRowElems] array (smem_tile.cuh). As a GEMM
// operand it is either
//   K-major: its rows run along the GEMM's M (for A) or N (for B) and its
//            contiguous elements along the reduction K: Q and K in Q K^T.
//            Read with ldmatrix.
//   MN-major: its rows run along K and its elements along M or N: dO in
//            P^T dO, K in dS K. Read with ldmatrix.trans, which hands each
//            lane the transposed pairs the MMA's fragments want.
template <typename Element, int kRowElems, bool kKMajor>
struct SmemOperand {
    static_assert(sizeof(Element) == 2, "ldmatrix .b16 and mma m16n8k16 take two-byte elements");
    static constexpr int kVectors = kRowElems / kElemsPerVector<Element>;
    static constexpr uint32_t kRowBytes = uint32_t(kRowElems * sizeof(Element));
    // Rows of whole 8-vector groups (128-byte multiples) swizzle vector v of
    // row r to v ^ (r % 8). A lane's ldmatrix row is then row0 + (its row
    // in the matrix) with row0 a multiple of 8, and its vector vec0 + (0 or
    // 1) with vec0 even, so its address is
    //   lane_addr + row0 * kRowBytes + (vec0 & ~7) * 16 + ((vec0 & 6) * 16 ^ lane_xor)
    // with lane_addr (the tile, the lane's row) and lane_xor (its vector bit
    // XOR its row % 8) fixed: with row0 and vec0 compile-time constants, one
    // XOR and an immediate per load. Other rows (a half group: head dims
    // 32, 96) compute the swizzle per load.
    static constexpr bool kWholeGroups = kVectors % kSwizzleGroupVectors == 0;
    uint32_t base;       // shared address of the tile
    uint32_t lane_addr;  // base + the lane's row's bytes
    uint32_t lane_xor;   // the lane's vector bit XOR its row % 8, in bytes
    int lane_row;        // the lane's row within the 16 rows a load spans
    int lane_vec;        // the lane's vector bit

    // lane_rows_by_low_matrix_bit: the lane's matrix's bit 0 (rather than
    // bit 1) picks its 8 rows, bit 1 its vector (the A operand of a K-major
    // tile and the B operand of an MN-major one); otherwise the reverse.
    __device__ __forceinline__ static SmemOperand make(const Element *tile, int lane, bool rows_by_low_bit) {
        SmemOperand o;
        const int matrix = ldm_matrix(lane);
        o.base = smem_address(tile);
        o.lane_row = (rows_by_low_bit ? matrix % 2 : matrix / 2) * kMmaN + ldm_row(lane);
        o.lane_vec = rows_by_low_bit ? matrix / 2 : matrix % 2;
        o.lane_addr = o.base + uint32_t(o.lane_row) * kRowBytes;
        o.lane_xor = uint32_t(o.lane_vec ^ (o.lane_row % kSwizzleRows)) * uint32_t(kVectorBytes);
        return o;
    }
    // As the A operand (rows along M) or the B operand (rows along N).
    __device__ __forceinline__ static SmemOperand a_of(const Element *tile, int lane) { return make(tile, lane, kKMajor); }
    __device__ __forceinline__ static SmemOperand b_of(const Element *tile, int lane) { return make(tile, lane, !kKMajor); }

    // The lane's address for the 16 x 16 block at (row0, vec0): row0 a
    // multiple of 8, vec0 even.
    __device__ __forceinline__ uint32_t at(int row0, int vec0) const {
        if constexpr (kWholeGroups) {
            return lane_addr + uint32_t(row0) * kRowBytes + uint32_t(vec0 & ~(kSwizzleGroupVectors - 1)) * kVectorBytes +
                   ((uint32_t(vec0 & (kSwizzleGroupVectors - 2)) * uint32_t(kVectorBytes)) ^ lane_xor);
        } else {
            return base + swizzled_byte_offset<Element, kRowElems>(row0 + lane_row, vec0 + lane_vec);
        }
    }

    // The A fragment of rows [m0, m0 + 16), k-step ks (an operand made by
    // a_of). Its four matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7,
    // k 8-15), (m 8-15, k 8-15).
    __device__ __forceinline__ void load_a(uint32_t (&frag)[4], int m0, int ks) const {
        if constexpr (kKMajor) {
            ldmatrix_x4(frag, at(m0, ks * 2));
        } else {
            ldmatrix_x4_trans(frag, at(ks * kMmaK, m0 / kMmaN));
        }
    }

    // The B fragments of the two n8 tiles [n0, n0 + 16), k-step ks (an
    // operand made by b_of): frag[0], frag[1] of tile n0, frag[2], frag[3]
    // of tile n0 + 8. Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15,
    // k 0-7), (n 8-15, k 8-15).
    __device__ __forceinline__ void load_b(uint32_t (&frag)[4], int n0, int ks) const {
        if constexpr (kKMajor) {
            ldmatrix_x4(frag, at(n0, ks * 2));
        } else {
            ldmatrix_x4_trans(frag, at(ks * kMmaK, n0 / kMmaN));
        }
    }

    // The B fragment of the one n8 tile [n0, n0 + 8), k-step ks: load_b's
    // first two matrices, read by .x2 from lanes 0-15's addresses, which
    // are theirs in the .x4 pattern (make: a B operand's lanes 0-15 are
    // matrices 0 and 1). Of a K-major tile that is row n0 (a multiple of
    // 8) at vector 2 ks, as load_b's. Of an MN-major one it is vector
    // n0 / 8, which may be odd (where a warp has one n8 tile; after pairs,
    // which start at even vectors, it is even): lanes 0-15 have vector bit
    // 0, so their swizzled vector is (n0 / 8) ^ (row % 8) in full, where
    // at() takes vector pairs.
    __device__ __forceinline__ void load_b_single(uint32_t (&frag)[2], int n0, int ks) const {
        if constexpr (kKMajor) {
            ldmatrix_x2(frag, at(n0, ks * 2));
        } else if constexpr (kWholeGroups) {
            const uint32_t vec = uint32_t(n0 / kMmaN);
            const uint32_t group_bytes = (vec & ~uint32_t(kSwizzleGroupVectors - 1)) * uint32_t(kVectorBytes);
            const uint32_t vec_bytes = (vec & uint32_t(kSwizzleGroupVectors - 1)) * uint32_t(kVectorBytes);
            const uint32_t row_bytes = uint32_t(ks * kMmaK) * kRowBytes;
            ldmatrix_x2_trans(frag, lane_addr + row_bytes + group_bytes + (vec_bytes ^ lane_xor));
        } else {
            ldmatrix_x2_trans(frag, at(ks * kMmaK, n0 / kMmaN));  // swizzled per load: any vector
        }
    }
};

// acc[m][n] (m16 tiles from row m0, n8 tiles from column n0) += A * B over
// kKSteps k16 steps, A and B SmemOperands. B is read two n8 tiles at a
// time; an odd count's last tile alone (a warp with one n8 tile of S: the
// backward's 32 x 32 tiles).
template <typename Element, int kMTiles, int kNTiles, int kKSteps, typename AOperand, typename BOperand>
__device__ __forceinline__ void warp_mma(float (&acc)[kMTiles][kNTiles][4], const AOperand &a, int m0,
                                         const BOperand &b, int n0) {
    constexpr int kPairedNTiles = kNTiles - kNTiles % 2;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t a_frag[kMTiles][4];
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) a.load_a(a_frag[m], m0 + m * kMmaM, ks);
#pragma unroll
        for (int n = 0; n < kPairedNTiles; n += 2) {
            uint32_t b_frag[4];
            b.load_b(b_frag, n0 + n * kMmaN, ks);
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) {
                mma_m16n8k16<Element>(acc[m][n], a_frag[m], b_frag[0], b_frag[1]);
                mma_m16n8k16<Element>(acc[m][n + 1], a_frag[m], b_frag[2], b_frag[3]);
            }
        }
        if constexpr (kPairedNTiles != kNTiles) {
            uint32_t b_frag[2];
            b.load_b_single(b_frag, n0 + kPairedNTiles * kMmaN, ks);
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) {
                mma_m16n8k16<Element>(acc[m][kPairedNTiles], a_frag[m], b_frag[0], b_frag[1]);
            }
        }
    }
}

template <int kMTiles, int kNTiles>
__device__ __forceinline__ void zero_fragments(float (&acc)[kMTiles][kNTiles][4]) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
        }
    }
}

// Writes accumulator fragments (m16 tiles from row m0, n8 tiles from column
// n0) into a swizzled shared tile of Element, converted, as the pairs each
// lane holds (frag_row, frag_col: fragment_layout.cuh). m0 and n0 are
// multiples of 8.
//
// With rows of whole 8-vector groups, every row a lane writes has the same
// row % 8 (frag_row: m0 and the tiles' steps are multiples of 8), so each n8
// tile's swizzled vector is computed once and the rows are immediate offsets
// from it: one store per pair, not a swizzle per pair.
template <typename Element, int kRowElems, int kMTiles, int kNTiles>
__device__ __forceinline__ void store_fragments(Element *tile, const float (&acc)[kMTiles][kNTiles][4], int m0, int n0,
                                                int lane) {
    constexpr int kVectors = kRowElems / kElemsPerVector<Element>;
    if constexpr (kVectors % kSwizzleGroupVectors == 0) {
        constexpr int kRowBytes = kRowElems * int(sizeof(Element));
        constexpr int kVecBytes = int(kVectorBytes);
        const int lane_row = frag_row(lane);  // the rows' index % 8
        char *row_base = reinterpret_cast<char *>(tile) + (m0 + lane_row) * kRowBytes +
                         frag_col(lane) * int(sizeof(Element));
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
            const int vec = n0 / kElemsPerVector<Element> + n;  // frag_col stays inside it
            char *tile_base = row_base + (vec & ~(kSwizzleGroupVectors - 1)) * kVecBytes +
                              ((vec % kSwizzleGroupVectors) ^ lane_row) * kVecBytes;
#pragma unroll
            for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    *reinterpret_cast<uint32_t *>(tile_base + (m * kMmaM + half * kFragRowHalf) * kRowBytes) =
                        pack2<Element>(acc[m][n][2 * half], acc[m][n][2 * half + 1]);
                }
            }
        }
    } else {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
            for (int n = 0; n < kNTiles; ++n) {
                const int col = n0 + n * kMmaN + frag_col(lane);
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int row = m0 + m * kMmaM + frag_row(lane) + half * kFragRowHalf;
                    Element *dst = tile + swizzled_offset<Element, kRowElems>(row, col / kElemsPerVector<Element>) +
                                   col % kElemsPerVector<Element>;
                    *reinterpret_cast<uint32_t *>(dst) = pack2<Element>(acc[m][n][2 * half], acc[m][n][2 * half + 1]);
                }
            }
        }
    }
}

}  // namespace flashcore
