// The wide kernel's mainloop (WideTraits, traits.cuh): head dims whose
// output rows do not fit one warp's registers (512: Gemma's d512, MLA's
// latent cache of 576 / 512), so the warps split O's columns.
//
// Per key tile, last key block first (BlockKeyRange order), with one ring of
// K/V tiles (KvRing, the row-split kernel's) taken by every warp:
//   1. S = Q K^T, each warp its row band and key group of the tile
//      (WideTraits) -> softcap -> mask (boundary tiles only);
//   2. each key group's partial row maxima to shared memory, a barrier, and
//      every warp folds all groups' into the running maxima of its band: the
//      same values in every key group, so their probabilities and partial
//      row sums are against one maximum;
//   3. P (in the inputs' type) and the tile's correction factors to shared
//      memory, a barrier;
//   4. every warp rescales its columns of O by the factors and adds P times
//      its columns of V (V in K's tile where WideTraits::kVInK).
// At the end the key groups' partial row sums meet in shared memory, and
// every warp finalises its columns (the sink included) for the epilogue
// (wide_epilogue.cuh).
//
// The barriers per tile are the ring's and steps 2 and 3's; the exchanged
// values are single-buffered: a tile's are written after the next tile's
// ring barrier, which every warp passes only once done with the last
// tile's.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/element.cuh"
#include "common/fp8.cuh"
#include "common/key_range.cuh"
#include "common/online_softmax.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/softcap.cuh"
#include "common/tile_coords.cuh"
#include "fwd/sm80/mainloop.cuh"
#include "fwd/sm80/traits.cuh"
#include "sm80/smem_tile.cuh"
#include "sm80/warp_gemm.cuh"

namespace flashcore::sm80 {

template <typename Traits, bool kRagged>
struct WideMainloop {
    using Element = typename Traits::Element;
    using ElementKV = typename Traits::ElementKV;
    static constexpr int kBlockM = Traits::kBlockM;
    static constexpr int kBlockN = Traits::kBlockN;
    using KeyRange = BlockKeyRange<kBlockM, kBlockN>;
    // O's accumulators: all kBlockM rows, the warp's columns.
    using Accumulators = float[Traits::kMAtomsO][Traits::kNAtomsO][4];
    using RowValues = float[Traits::kMAtomsO * 2];
    using Softmax = OnlineSoftmax<Traits::kMAtomsO>;
    // Shared-memory operands: Q and K rows along their reduction (K-major),
    // P's rows likewise, V's rows along the reduction over keys (MN-major).
    using QOperand = SmemOperand<Element, Traits::kHeadDim, true>;
    using KOperand = SmemOperand<Element, Traits::kHeadDim, true>;
    using POperand = SmemOperand<Element, Traits::kPRowElems, true>;
    using VOperand = SmemOperand<Element, Traits::kVRowElems, false>;

    // The thread's place: its warp's row band and key group (of S) and its
    // columns (of O).
    Element *smem_q;
    ElementKV *smem_kv;
    Element *smem_widened;  // a quantized slot widened to 16 bits (WideTraits::kSmemWidenedBytes)
    Element *smem_p;
    float *exchange;
    int tid;
    int lane;
    int warp;
    int row_band;   // of S: rows [16 row_band, + 16)
    int key_group;  // of S: keys [kKeysPerWarp key_group, + kKeysPerWarp) of each tile

    const Element *q_heads;
    const ElementKV *k;
    const ElementKV *v;
    int num_n_blocks;
    // A quantized cache's k_descale of the work's (batch, K/V head).
    float k_descale;

    // The scales of the raw scores (ScoreScales: mainloop.cuh).
    __device__ __forceinline__ float score_scale_log2(const FwdKernelParams &p) const {
        return ScoreScales<Traits>::score_scale_log2(p, k_descale);
    }
    __device__ __forceinline__ float lse_scale(const FwdKernelParams &p) const {
        return ScoreScales<Traits>::lse_scale(p, k_descale);
    }
    __device__ __forceinline__ float softcap_prescale(const FwdKernelParams &p) const {
        return ScoreScales<Traits>::softcap_prescale(p, k_descale);
    }

    __device__ __forceinline__ explicit WideMainloop(unsigned char *smem_)
        : smem_q(reinterpret_cast<Element *>(smem_)),
          smem_kv(reinterpret_cast<ElementKV *>(smem_ + Traits::kSmemQBytes)),
          smem_widened(reinterpret_cast<Element *>(smem_ + Traits::kSmemQBytes + Traits::kSmemRingBytes)),
          smem_p(reinterpret_cast<Element *>(smem_ + Traits::kSmemQBytes + Traits::kSmemRingBytes +
                                             Traits::kSmemWidenedBytes)),
          exchange(reinterpret_cast<float *>(smem_ + Traits::kSmemQBytes + Traits::kSmemRingBytes +
                                             Traits::kSmemWidenedBytes + Traits::kSmemPBytes)),
          tid(threadIdx.x),
          lane(tid % kWarpSize),
          warp(tid / kWarpSize),
          row_band(warp % Traits::kRowGroups),
          key_group(warp / Traits::kRowGroups) {}

    // The exchange's arrays (WideTraits::kExchangeFloats): [key group][row]
    // partial maxima, then [key group][row] partial sums, the tile's
    // correction factors [row], the final maxima [row].
    __device__ __forceinline__ float &partial_max(int group, int row) const { return exchange[group * kBlockM + row]; }
    __device__ __forceinline__ float &partial_sum(int group, int row) const {
        return exchange[(Traits::kKeyGroups + group) * kBlockM + row];
    }
    __device__ __forceinline__ float &correction_of(int row) const {
        return exchange[2 * Traits::kKeyGroups * kBlockM + row];
    }
    __device__ __forceinline__ float &final_max(int row) const {
        return exchange[2 * Traits::kKeyGroups * kBlockM + kBlockM + row];
    }

    // Step 2's barrier. Warps that compute no S (WideTraits::kSWarps) take
    // it too, from their own branch: with a barrier of the S warps only,
    // racecheck (which orders accesses across a CTA barrier only between
    // threads that have passed equally many barriers) reported every later
    // exchange as a hazard. The unaligned form, which warps may reach at
    // different instructions (synccheck reported __syncthreads there).
    __device__ __forceinline__ static void sync_tile_max() { cta_barrier_from_branches(); }

    // The 16-bit tile the products read of a landed slot: the slot itself,
    // or a quantized cache's slot widened into smem_widened by the CTA (a
    // barrier after: every warp reads all of it). The widened tile is
    // rewritten only after the next tile's ring barrier, past every read.
    __device__ __forceinline__ const Element *landed_tile(const ElementKV *slot) const {
        if constexpr (!Traits::kQuantizedKV) {
            return slot;
        } else {
            widen_rows<Traits::kHeadDim>(slot, smem_widened);
            if constexpr (!Traits::kVInK) {
                widen_rows<Traits::kHeadDimV>(slot + Traits::kSmemKElems, smem_widened + Traits::kSmemKElems);
            }
            __syncthreads();
            return smem_widened;
        }
    }

    // kBlockN swizzled rows of kRowElems e4m3 values to the same rows of
    // Element, one 16-byte vector of e4m3 (two of Element) a step.
    template <int kRowElems>
    __device__ __forceinline__ void widen_rows(const ElementKV *from, Element *to) const {
        constexpr int kVectors = kRowElems / kElemsPerVector<ElementKV>;
        static_assert(kElemsPerVector<ElementKV> == 2 * kElemsPerVector<Element>, "one e4m3 vector, two 16-bit ones");
#pragma unroll
        for (int i = 0; i < (kBlockN * kVectors + Traits::kNumThreads - 1) / Traits::kNumThreads; ++i) {
            const int idx = tid + i * Traits::kNumThreads;
            if ((kBlockN * kVectors) % Traits::kNumThreads != 0 && idx >= kBlockN * kVectors) break;
            const int row = idx / kVectors;
            const int vec = idx % kVectors;
            const uint4 codes =
                *reinterpret_cast<const uint4 *>(from + swizzled_offset<ElementKV, kRowElems>(row, vec));
            const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
            uint32_t wide[8];
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                wide[2 * w] = widen_e4m3x2<Element>(uint16_t(words[w] & 0xffffu));
                wide[2 * w + 1] = widen_e4m3x2<Element>(uint16_t(words[w] >> 16));
            }
            *reinterpret_cast<uint4 *>(to + swizzled_offset<Element, kRowElems>(row, 2 * vec)) =
                make_uint4(wide[0], wide[1], wide[2], wide[3]);
            *reinterpret_cast<uint4 *>(to + swizzled_offset<Element, kRowElems>(row, 2 * vec + 1)) =
                make_uint4(wide[4], wide[5], wide[6], wide[7]);
        }
    }

    template <typename Work>
    __device__ __forceinline__ bool bind(const FwdKernelParams &p, const Work &work) {
        num_n_blocks = bind_block_operands<Traits, kRagged>(p, work, q_heads, k, v, k_descale);
        return num_n_blocks > 0;
    }

    // The block's key tiles; then finish(acc_o, softmax, row_lse): O's
    // columns of the warp, all rows, with the rows' softmax state (every
    // warp the same) and room for their log-sum-exp values.
    template <typename Work, typename Finish>
    __device__ __forceinline__ void run(const FwdKernelParams &p, const Work &work, Finish &&finish) {
        const FwdTile &tile = work.tile;
        const int first_query = tile.m_block * kBlockM;
        const KeyMask &mask = work.mask;
        const KeyRange &keys = work.keys;
        const int q_vectors = p.head_dim / kElemsPerVector<Element>;
        const int qk_vectors = p.head_dim / kElemsPerVector<ElementKV>;
        const int v_vectors = p.head_dim_v / kElemsPerVector<ElementKV>;
        const bool paged = kRagged && p.block_table != nullptr;
        TilePages<kBlockN> pages;
        KvRing<Traits, kRagged> ring(p, keys, smem_kv, k, v, tile.batch, mask.seqlen_k, 0, tid, num_n_blocks,
                                     qk_vectors, v_vectors, paged, pages);
        ring.start();
        load_q_async<Traits>(smem_q, p, q_heads, first_query, work.valid_rows, q_vectors, tid);
        cp_async_commit();
#pragma unroll
        for (int j = 0; j < Traits::kStages - 1; ++j) ring.request(j);

        const QOperand q_op = QOperand::a_of(smem_q, lane);
        const POperand p_op = POperand::a_of(smem_p, lane);
        const int band_first_row = row_band * kMmaM;
        const int group_first_key = key_group * Traits::kKeysPerWarp;
        const int first_col = warp * Traits::kColsPerWarp;
        // The lane's two rows of its band (m16 fragment rows g and g + 8).
        const int lane_row = band_first_row + frag_row(lane);
        const bool computes_s = warp < Traits::kSWarps;

        Accumulators acc_o;
        zero_fragments(acc_o);
        // The running maxima and this key group's partial sums of the
        // lane's two rows of S.
        float row_max[2] = {-INFINITY, -INFINITY};
        float row_sum[2] = {0.f, 0.f};
        const Softcap softcap{softcap_prescale(p)};
        const float scale_log2 = score_scale_log2(p);

        for (int j = 0; j < num_n_blocks; ++j) {
            const int n_block = keys.n_block(j);
            // Tile j has landed; every warp is done with tile j - 1 (its
            // slot, P and the exchange).
            cp_async_wait<Traits::kStages - 2>();
            __syncthreads();
            ring.request(j + Traits::kStages - 1);
            const Element *slot_k = landed_tile(smem_kv + (j % Traits::kStages) * Traits::kSmemSlotElems);
            const Element *slot_v = Traits::kVInK ? slot_k : slot_k + Traits::kSmemKElems;

            // Steps 1-3 on the warps that compute S.
            if (computes_s) {
                // 1. The warp's scores.
                float scores[1][Traits::kNAtomsS][4];
                zero_fragments(scores);
                warp_mma<Element, 1, Traits::kNAtomsS, Traits::kKStepsQK>(
                    scores, q_op, band_first_row, KOperand::b_of(slot_k, lane), group_first_key);
                if (softcap.enabled()) softcap.apply(scores);
                if (keys.needs_mask(n_block)) {
                    FragmentKeyMask<1>::of(mask, first_query + band_first_row, n_block * kBlockN + group_first_key,
                                           lane)
                        .apply(scores);
                }

                // 2. The tile's row maxima over every key group.
                float tile_max[2];
                tile_row_maxima(scores, tile_max);
                if constexpr (Traits::kKeyGroups > 1) {
                    if (lane % 4 == 0) {
                        partial_max(key_group, lane_row) = tile_max[0];
                        partial_max(key_group, lane_row + kFragRowHalf) = tile_max[1];
                    }
                    sync_tile_max();
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        float m = partial_max(0, lane_row + half * kFragRowHalf);
#pragma unroll
                        for (int g = 1; g < Traits::kKeyGroups; ++g) {
                            m = fmaxf(m, partial_max(g, lane_row + half * kFragRowHalf));
                        }
                        tile_max[half] = m;
                    }
                }

                // 3. Probabilities and correction factors.
                float correction[2];
                fold_tile_into_rows(
                    scores, [&](int half) { return tile_max[half]; }, scale_log2, row_max, row_sum, correction);
                store_fragments<Element, Traits::kPRowElems, 1, Traits::kNAtomsS>(smem_p, scores, band_first_row,
                                                                                  group_first_key, lane);
                if (key_group == 0 && lane % 4 == 0) {
                    correction_of(lane_row) = correction[0];
                    correction_of(lane_row + kFragRowHalf) = correction[1];
                }
            } else if constexpr (Traits::kKeyGroups > 1) {
                sync_tile_max();
            }
            __syncthreads();

            // 4. O's columns of the warp, every row: rescaled (skipped where
            // no row of the block changed its maximum), then += P V.
            float row_correction[Traits::kMAtomsO * 2];
            bool rescale = false;
#pragma unroll
            for (int m = 0; m < Traits::kMAtomsO; ++m) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const float c = correction_of(m * kMmaM + frag_row(lane) + half * kFragRowHalf);
                    row_correction[m * 2 + half] = c;
                    rescale |= c != 1.f;
                }
            }
            if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
                for (int m = 0; m < Traits::kMAtomsO; ++m) {
#pragma unroll
                    for (int n = 0; n < Traits::kNAtomsO; ++n) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc_o[m][n][e] *= row_correction[m * 2 + e / 2];
                    }
                }
            }
            warp_mma<Element, Traits::kMAtomsO, Traits::kNAtomsO, Traits::kKStepsPV>(
                acc_o, p_op, 0, VOperand::b_of(slot_v, lane), first_col);
        }
        // Drain the (empty) trailing requests.
        cp_async_wait<0>();

        // The rows' sums over the key groups, and their maxima, for every
        // warp's rows of O. The last reads of the exchange were before the
        // last tile's third barrier, which every writer here is past.
#pragma unroll
        for (int half = 0; half < 2; ++half) row_sum[half] = quad_sum(row_sum[half]);
        if (computes_s && lane % 4 == 0) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                partial_sum(key_group, lane_row + half * kFragRowHalf) = row_sum[half];
                if (key_group == 0) final_max(lane_row + half * kFragRowHalf) = row_max[half];
            }
        }
        __syncthreads();
        // The state of the rows of the warp's O fragments, as
        // OnlineSoftmax::finalize takes it: it adds a row's sums over the
        // quad's lanes, so the first lane of each quad carries the row's
        // whole sum and the others 0.
        Softmax softmax;
#pragma unroll
        for (int m = 0; m < Traits::kMAtomsO; ++m) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = m * kMmaM + frag_row(lane) + half * kFragRowHalf;
                float sum = 0.f;
#pragma unroll
                for (int g = 0; g < Traits::kKeyGroups; ++g) sum += partial_sum(g, row);
                softmax.row_max[m * 2 + half] = final_max(row);
                softmax.row_sum[m * 2 + half] = lane % 4 == 0 ? sum : 0.f;
            }
        }
        RowValues row_lse;
        finish(acc_o, softmax, row_lse);
    }
};

}  // namespace flashcore::sm80
