// The consumer warpgroups' two GEMMs per key tile, on wgmma:
//   S = Q * K^T   both operands from shared memory (K-major);
//   O += P * V    P from registers (the softmax output, converted to 16-bit
//                 A fragments), V from shared memory (MN-major).
// Each issue_* call queues one GEMM as one wgmma group and returns at once;
// the caller waits (wgmma_wait<N>) for the result and then fences the
// accumulators (fence_accumulators) before touching them.
#pragma once

#include <cstdint>

#include "ptx.cuh"
#include "sm90_ptx.cuh"
#include "sm90_traits.cuh"
#include "wgmma.cuh"

namespace flashcore::sm90 {

// Bytes a k16 step moves along a 128-byte swizzled row (16 two-byte columns).
constexpr uint32_t kK16RowBytes = 32;
constexpr int kK16StepsPerPanel = kPanelCols / 16;

template <int kNAtoms>
__device__ __forceinline__ void fence_accumulators(float (&acc)[kNAtoms][4]) {
#pragma unroll
    for (int n = 0; n < kNAtoms; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) fence_operand(acc[n][e]);
    }
}

// scores = (this warpgroup's 64 rows of Q) * K_tile^T. q_rows: shared address
// of the warpgroup's first Q row in panel 0.
template <typename Traits>
__device__ __forceinline__ void issue_qk(float (&scores)[Traits::kBlockN / 8][4], uint32_t q_rows, uint32_t k_tile) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Traits::kHeadDim / 16; ++kk) {
        const uint32_t offset = (kk % kK16StepsPerPanel) * kK16RowBytes;
        const int panel = kk / kK16StepsPerPanel;
        const uint64_t desc_q = k_major_descriptor(q_rows + panel * Traits::kQPanelBytes + offset);
        const uint64_t desc_k = k_major_descriptor(k_tile + panel * Traits::kKVPanelBytes + offset);
        Wgmma<typename Traits::Element, Traits::kBlockN>::ss(scores, desc_q, desc_k, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
}

// The unnormalised probabilities as wgmma A fragments, one per k16 step of
// keys: the accumulator layout of two adjacent n8 tiles is exactly the A
// layout of one k16 slice (as with mma.sync).
template <typename Traits>
__device__ __forceinline__ void probabilities_to_fragments(const float (&p)[Traits::kBlockN / 8][4],
                                                           uint32_t (&a)[Traits::kBlockN / 16][4]) {
    using Element = typename Traits::Element;
#pragma unroll
    for (int kk = 0; kk < Traits::kBlockN / 16; ++kk) {
        a[kk][0] = pack2<Element>(p[2 * kk][0], p[2 * kk][1]);
        a[kk][1] = pack2<Element>(p[2 * kk][2], p[2 * kk][3]);
        a[kk][2] = pack2<Element>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        a[kk][3] = pack2<Element>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
    }
}

// out += P * V_tile. v_tile: shared address of the tile's panel 0.
template <typename Traits>
__device__ __forceinline__ void issue_pv(float (&out)[Traits::kHeadDim / 8][4],
                                        const uint32_t (&p)[Traits::kBlockN / 16][4], uint32_t v_tile) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Traits::kBlockN / 16; ++kk) {
        // 16 keys are 16 rows: two 1024-byte swizzle atoms further down.
        const uint64_t desc_v = mn_major_descriptor(v_tile + kk * 16 * kPanelRowBytes, Traits::kKVPanelBytes);
        Wgmma<typename Traits::Element, Traits::kHeadDim>::rs(out, p[kk], desc_v, 1);
    }
    wgmma_commit();
}

}  // namespace flashcore::sm90
