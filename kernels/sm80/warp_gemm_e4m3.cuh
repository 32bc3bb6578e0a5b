// The forward's two warp products (warp_gemm.cuh) on e4m3 K and V tiles as
// they lie in shared memory (a quantized KV cache), widened in registers on
// their way to the m16n8k16 tensor cores: no widened copy of the tile, no
// second barrier, and one ldmatrix per two fragments of either operand.
//
// ldmatrix moves 16-bit units, so each lane receives e4m3 values in other
// places than the 16-bit fragments have them:
//
//   K (ldmatrix): a lane of an 8 x 16-byte matrix (8 keys x 16 dims: one
//   k16 step) gets 4 consecutive dims of one key, 4t..4t+3 for t = lane % 4,
//   where the B fragment wants k = 2t, 2t+1, 2t+8, 2t+9. A product only
//   needs Q and K to agree on the order of k within a step, so Q's A
//   fragments are loaded in the same order (QFragmentsE4m3: dims 4t..4t+3 of
//   each row, one 8-byte load): S is unchanged.
//
//   V (ldmatrix.trans): a lane of an 8 x 16-byte matrix (8 keys x 16 dims)
//   gets keys 2t and 2t+1 of dims 2g and 2g+1 (g = lane / 4), where the B
//   fragment of one n8 tile wants keys 2t, 2t+1 of one dim g. One byte
//   permute splits them into the B fragments of two n8 tiles whose column g
//   is dim 2g (the even tile) and dim 2g + 1 (the odd one). O accumulates in
//   those tiles, so a lane holds dims 4t..4t+3 of each 16 instead of
//   2t, 2t+1 and 2t+8, 2t+9; unpermute_output() trades them across the quad
//   into the usual layout once, after the last tile.
//
// P and V multiply in fp16 whatever q's type: P lies in [0, 1], where fp16
// is the more precise 16-bit type, and e4m3 widens to fp16 in one
// instruction (to bf16 in four). Q K^T runs in fp16 too, bf16 queries
// converted where they fit its range (QFragmentsE4m3), else in bf16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/fp8.cuh"
#include "common/fragment_layout.cuh"
#include "common/ptx.cuh"
#include "sm80/smem_tile.cuh"
#include "sm80/warp_gemm.cuh"

namespace flashcore {

// Dims of one k16 step of Q K^T: one 16-byte vector of e4m3.
constexpr int kE4m3StepDims = kMmaK;
// Bytes of a lane's dims in one step of K's ldmatrix: 4 consecutive e4m3.
constexpr int kE4m3LaneDims = 4;

// Q's A fragments in the order of the e4m3 K fragments: for k-step s, a lane
// (g, t) holds rows g and g + 8 at dims 16s + 4t .. 16s + 4t + 3 ({a0, a1},
// {a4, a5} of row g; {a2, a3}, {a6, a7} of row g + 8). Held for the whole
// kernel (Traits::kQInRegisters), or one k-step loaded where it is used.
//
// bf16 queries are held in fp16 where every element of the block fits its
// range (in_fp16), so that K widens to fp16 in one instruction rather than
// to bf16 in four: fp16 keeps bf16's 8 significant bits exactly from 2^-14
// up, and below that its step (2^-24) is finer than bf16's own spacing
// there. A block with an element past 65504 keeps bf16.
template <typename Traits>
struct QFragmentsE4m3 {
    using Element = typename Traits::Element;
    static constexpr bool kMayNarrow = std::is_same_v<Element, __nv_bfloat16>;
    static constexpr int kSteps = Traits::kQInRegisters ? Traits::kKStepsQK : 1;
    uint32_t frag[Traits::kMAtoms][kSteps][4];
    const Element *smem_q;
    int first_row;  // the lane's row g of m-tile 0
    int lane_quad;  // t
    bool in_fp16;   // the fragments hold fp16 (fp16 queries: always)

    __device__ __forceinline__ void init(const Element *smem_q_, int warp_first_row, int lane) {
        smem_q = smem_q_;
        first_row = warp_first_row + frag_row(lane);
        lane_quad = lane % 4;
        in_fp16 = true;
        if constexpr (kMayNarrow) {
            // The warp's fragments are the whole block's rows (every warp of
            // the CTA reads the same), so the warp's answer is the block's.
            bool too_large = false;
#pragma unroll 1
            for (int ks = 0; ks < Traits::kKStepsQK; ++ks) {
#pragma unroll
                for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const uint2 dims = load(ks, m, half);
                        too_large |= exceeds_fp16(dims.x) || exceeds_fp16(dims.y);
                    }
                }
            }
            in_fp16 = !__any_sync(0xFFFFFFFFu, too_large);
        }
        if constexpr (Traits::kQInRegisters) {
#pragma unroll
            for (int ks = 0; ks < Traits::kKStepsQK; ++ks) load_step(ks, ks);
        }
    }
    // Whether a bf16 pair has an element of magnitude over fp16's largest,
    // 65504 (the next bf16 is 65536: bits 0x4780), infinity and NaN included.
    __device__ __forceinline__ static bool exceeds_fp16(uint32_t pair) {
        constexpr uint32_t kBf16AboveFp16Max = 0x4780u;
        return (pair & 0x7FFFu) >= kBf16AboveFp16Max || ((pair >> 16) & 0x7FFFu) >= kBf16AboveFp16Max;
    }
    // Row g (+ 8 for half 1) of m-tile m at the lane's dims of step ks.
    __device__ __forceinline__ uint2 load(int ks, int m, int half) const {
        const int dim = ks * kE4m3StepDims + lane_quad * kE4m3LaneDims;
        constexpr int kElems = kElemsPerVector<Element>;
        const int row = first_row + m * kMmaM + half * kFragRowHalf;
        return *reinterpret_cast<const uint2 *>(smem_q + swizzled_offset<Element, Traits::kHeadDim>(row, dim / kElems) +
                                                dim % kElems);
    }
    __device__ __forceinline__ static uint32_t to_fp16(uint32_t bf16_pair) {
        const __half2 narrow = __float22half2_rn(__bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&bf16_pair)));
        return *reinterpret_cast<const uint32_t *>(&narrow);
    }
    __device__ __forceinline__ void load_step(int ks, int slot) {
#pragma unroll
        for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                uint2 dims = load(ks, m, half);
                if constexpr (kMayNarrow) {
                    if (in_fp16) dims = make_uint2(to_fp16(dims.x), to_fp16(dims.y));
                }
                frag[m][slot][half] = dims.x;      // k 2t, 2t+1 of the step: dims 4t, 4t+1
                frag[m][slot][2 + half] = dims.y;  // k 2t+8, 2t+9: dims 4t+2, 4t+3
            }
        }
    }
    // The slot of k-step ks, loaded first where the steps are not all held.
    __device__ __forceinline__ int step(int ks) {
        if constexpr (Traits::kQInRegisters) {
            return ks;
        } else {
            load_step(ks, 0);
            return 0;
        }
    }
};

// The lane's address in an e4m3 tile of [rows][kRowElems] for an ldmatrix
// (.x4) of the 16-byte vectors `vec0 + (matrix bit vec_bit)` of rows
// `row0 + (matrix bit row_bit) * 8 + lane % 8`.
template <int kRowElems, typename ElementKV>
__device__ __forceinline__ uint32_t e4m3_ldmatrix_address(uint32_t tile, int row0, int vec0, int lane,
                                                          bool rows_by_low_bit) {
    const int matrix = ldm_matrix(lane);
    const int row = row0 + (rows_by_low_bit ? matrix % 2 : matrix / 2) * kMmaN + ldm_row(lane);
    const int vec = vec0 + (rows_by_low_bit ? matrix / 2 : matrix % 2);
    return tile + swizzled_byte_offset<ElementKV, kRowElems>(row, vec);
}

// S = Q K^T over an e4m3 K tile (kBlockN keys x kHeadDim) in MmaElement
// (the type Q's fragments hold), each ldmatrix.x4 the fragments of two n8
// tiles (keys) over two k-steps (vectors).
template <typename Traits, typename MmaElement>
__device__ __forceinline__ void gemm_qk_e4m3_as(float (&scores)[Traits::kMAtoms][Traits::kNAtomsS][4],
                                                QFragmentsE4m3<Traits> &q, uint32_t smem_k, int lane) {
    static_assert(Traits::kKStepsQK % 2 == 0 && Traits::kNAtomsS % 2 == 0, "K is read two steps, two tiles at once");
#pragma unroll
    for (int ks = 0; ks < Traits::kKStepsQK; ks += 2) {
#pragma unroll
        for (int n = 0; n < Traits::kNAtomsS; n += 2) {
            // Matrices: keys of tile n at steps ks and ks + 1, then tile n + 1's.
            uint32_t k8[4];
            ldmatrix_x4(k8, e4m3_ldmatrix_address<Traits::kHeadDim, typename Traits::ElementKV>(
                                smem_k, n * kMmaN, ks, lane, /*rows_by_low_bit=*/false));
            // Step by step, so that Q not held in registers is one step at a
            // time (head dims past 128 have 2 tiles: it is loaded once).
#pragma unroll
            for (int step = 0; step < 2; ++step) {
                const int slot = q.step(ks + step);
#pragma unroll
                for (int tile = 0; tile < 2; ++tile) {
                    const uint32_t k_pair = k8[2 * tile + step];
                    const uint32_t b0 = widen_e4m3x2<MmaElement>(uint16_t(k_pair & 0xFFFFu));
                    const uint32_t b1 = widen_e4m3x2<MmaElement>(uint16_t(k_pair >> 16));
#pragma unroll
                    for (int m = 0; m < Traits::kMAtoms; ++m) {
                        mma_m16n8k16<MmaElement>(scores[m][n + tile], q.frag[m][slot], b0, b1);
                    }
                }
            }
        }
    }
}

template <typename Traits>
__device__ __forceinline__ void gemm_qk_e4m3(float (&scores)[Traits::kMAtoms][Traits::kNAtomsS][4],
                                             QFragmentsE4m3<Traits> &q, uint32_t smem_k, int lane) {
    zero_fragments(scores);
    if constexpr (QFragmentsE4m3<Traits>::kMayNarrow) {
        if (!q.in_fp16) {
            gemm_qk_e4m3_as<Traits, typename Traits::Element>(scores, q, smem_k, lane);
            return;
        }
    }
    gemm_qk_e4m3_as<Traits, __half>(scores, q, smem_k, lane);
}

// O += P V over an e4m3 V tile (kBlockN keys x kHeadDimV), in fp16, into
// the permuted tiles (see the top): for each 32 dims c, tiles 4c, 4c + 1 are
// the even and odd dims of the first 16, 4c + 2, 4c + 3 of the second.
template <typename Traits>
__device__ __forceinline__ void gemm_pv_e4m3(float (&out)[Traits::kMAtoms][Traits::kNAtomsO][4],
                                             const float (&probs)[Traits::kMAtoms][Traits::kNAtomsS][4],
                                             uint32_t smem_v, int lane) {
    static_assert(Traits::kNAtomsO % 4 == 0, "V is read 32 dims at a time");
    // The even keys' byte then the odd keys' byte of each dim: [k 2t of dim
    // 2g, k 2t+1 of dim 2g, k 2t of dim 2g+1, k 2t+1 of dim 2g+1].
    constexpr uint32_t kDimPairs = 0x3120;
#pragma unroll
    for (int ks = 0; ks < Traits::kKStepsPV; ++ks) {
        uint32_t p_frag[Traits::kMAtoms][4];
        pack_p_fragments<__half>(p_frag, probs, ks);
#pragma unroll
        for (int c = 0; c < Traits::kNAtomsO / 4; ++c) {
            // Matrices: keys 0-7 and 8-15 of the step at dims 32c..+15, then at 32c+16..+31.
            uint32_t v8[4];
            ldmatrix_x4_trans(v8, e4m3_ldmatrix_address<Traits::kHeadDimV, typename Traits::ElementKV>(
                                      smem_v, ks * kMmaK, 2 * c, lane, /*rows_by_low_bit=*/true));
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const uint32_t low_keys = __byte_perm(v8[2 * half], 0u, kDimPairs);
                const uint32_t high_keys = __byte_perm(v8[2 * half + 1], 0u, kDimPairs);
                const uint32_t even_b0 = widen_e4m3x2<__half>(uint16_t(low_keys & 0xFFFFu));
                const uint32_t even_b1 = widen_e4m3x2<__half>(uint16_t(high_keys & 0xFFFFu));
                const uint32_t odd_b0 = widen_e4m3x2<__half>(uint16_t(low_keys >> 16));
                const uint32_t odd_b1 = widen_e4m3x2<__half>(uint16_t(high_keys >> 16));
                const int even = 4 * c + 2 * half;
#pragma unroll
                for (int m = 0; m < Traits::kMAtoms; ++m) {
                    mma_m16n8k16<__half>(out[m][even], p_frag[m], even_b0, even_b1);
                    mma_m16n8k16<__half>(out[m][even + 1], p_frag[m], odd_b0, odd_b1);
                }
            }
        }
    }
}

// O's accumulators from gemm_pv_e4m3's tiles into the usual m16n8 layout
// (tile n: dims 8n..8n+7, a lane's columns 2t, 2t+1), across each quad.
template <typename Traits>
__device__ __forceinline__ void unpermute_output(float (&out)[Traits::kMAtoms][Traits::kNAtomsO][4], int lane) {
    const int t = lane % 4;
    const int quad_base = lane - t;
    // Usual tile 2p + j of a 16-dim half p takes its lane's 2 dims from
    // lane j * 2 + t / 2 of the quad: its dims 4s, 4s+1 (t even) or 4s+2,
    // 4s+3 (t odd).
#pragma unroll
    for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
        for (int p = 0; p < Traits::kNAtomsO / 2; ++p) {
            float(&even)[4] = out[m][2 * p];
            float(&odd)[4] = out[m][2 * p + 1];
#pragma unroll
            for (int row_half = 0; row_half < 2; ++row_half) {
                // This lane's dims 4t, 4t+1, 4t+2, 4t+3 of the row, which
                // the quad's shuffles read before they are overwritten.
                const float mine[4] = {even[2 * row_half], odd[2 * row_half], even[2 * row_half + 1],
                                       odd[2 * row_half + 1]};
                float usual[2][2];
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int source = quad_base + j * 2 + t / 2;
                    // Both halves are shuffled (the source sends the same
                    // register to all), and the lane keeps its own.
                    const float low0 = __shfl_sync(0xFFFFFFFFu, mine[0], source);
                    const float low1 = __shfl_sync(0xFFFFFFFFu, mine[1], source);
                    const float high0 = __shfl_sync(0xFFFFFFFFu, mine[2], source);
                    const float high1 = __shfl_sync(0xFFFFFFFFu, mine[3], source);
                    usual[j][0] = t % 2 == 0 ? low0 : high0;
                    usual[j][1] = t % 2 == 0 ? low1 : high1;
                }
                even[2 * row_half] = usual[0][0];
                even[2 * row_half + 1] = usual[0][1];
                odd[2 * row_half] = usual[1][0];
                odd[2 * row_half + 1] = usual[1][1];
            }
        }
    }
}

}  // namespace flashcore
