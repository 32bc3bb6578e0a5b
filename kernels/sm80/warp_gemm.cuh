// The two matrix products of the forward pass, as one warp sees them: its band
// of query rows times a K/V tile in shared memory, on m16n8k16 tensor cores.
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

template <typename Traits>
__device__ __forceinline__ void gemm_pv(float (&out)[Traits::kMAtoms][Traits::kNAtomsO][4],
                                        const float (&probs)[Traits::kMAtoms][Traits::kNAtomsS][4], uint32_t smem_v,
                                        const VRowSteps<Traits> &v_rows) {
    using Element = typename Traits::Element;
#pragma unroll
    for (int ks = 0; ks < Traits::kKStepsPV; ++ks) {
        uint32_t p_frag[Traits::kMAtoms][4];
#pragma unroll
        for (int m = 0; m < Traits::kMAtoms; ++m) {
            p_frag[m][0] = pack2<Element>(probs[m][2 * ks][0], probs[m][2 * ks][1]);
            p_frag[m][1] = pack2<Element>(probs[m][2 * ks][2], probs[m][2 * ks][3]);
            p_frag[m][2] = pack2<Element>(probs[m][2 * ks + 1][0], probs[m][2 * ks + 1][1]);
            p_frag[m][3] = pack2<Element>(probs[m][2 * ks + 1][2], probs[m][2 * ks + 1][3]);
        }
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

}  // namespace flashcore
