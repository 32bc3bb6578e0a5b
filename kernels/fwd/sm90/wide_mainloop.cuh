// The sm_90a wide kernel's mainloop (Sm90WideTraits, wide_traits.cuh): a
// portable-shell kernel (sm80/kernel_shell.cuh: one CTA per query block and
// split part, the portable BlockScheduler) whose products run on wgmma.
//
// Per pair of key tiles (2i, 2i + 1 of the block's BlockKeyRange, last key
// block first), warpgroup w taking tile 2i + w:
//   1. S = Q K^T of its tile (wgmma, Q and K from shared memory) -> softcap
//      -> mask (boundary tiles only); a pair's missing second tile is all
//      -inf, without a product;
//   2. its row maxima to the exchange, a barrier, and both warpgroups fold
//      the pair's maxima into the same running maxima;
//   3. its probabilities into its columns of P (shared memory), O's columns
//      rescaled by the correction, a barrier;
//   4. O (its half of the columns) += P V over the pair's 2 kBlockN keys,
//      V read MN-major from the two tiles' slots (their K rows at MLA's 576 /
//      512, V tiles of their own at d512).
// K (and V) tiles arrive by cp.async in panels (a paged cache's rows each
// from its page), a pair ahead: the ring holds two pairs, and one barrier per
// pair both publishes the landed pair and frees the last one's slots, P and
// the exchange. An e4m3 cache's tiles land as stored, each loaded by the
// warpgroup that computes its S, which then widens it in place
// (widen_own_tile). At the end the warpgroups' row sums meet in the exchange.
//
// (Measured against this on an H200, MLA B64/128 x H128 at 4k and 32k:
// issuing the next pair's S behind this pair's P V, 2-5% slower; FA3's
// roles for a wide V, a producer warpgroup loading 64-key tiles by cp.async
// and one consumer computing S for the other, 1.5x slower; with K by TMA,
// FlashMLA's seesaw on 64-key tiles (two slots) 1.2-1.3x slower, on 32-key
// tiles (four slots) 1.5x, and FA3's roles without a producer warpgroup
// 1.35x: docs/log/models-2026.md.)
#pragma once

#include <cmath>
#include <cstdint>

#include "common/element.cuh"
#include "common/fp8.cuh"
#include "common/fragment_layout.cuh"
#include "common/key_range.cuh"
#include "common/online_softmax.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/softcap.cuh"
#include "common/tile_coords.cuh"
#include "fwd/sm80/mainloop.cuh"
#include "fwd/sm90/mainloop.cuh"
#include "fwd/sm90/wide_traits.cuh"
#include "sm80/warp_gemm.cuh"
#include "sm90/ptx.cuh"
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_wide.cuh"

namespace flashcore::sm90 {

// Copies kRows rows (row r from row_src(r), or zeros where that is null) of
// kPanels * 64 two-byte columns into panels at `panels` (panel c of row r at
// c * panel_bytes + Swizzle::offset(r, chunk)), by the CTA's kThreads
// threads, 8 to a row: each takes chunks g, g + 8, ... of its rows (one per
// panel), at immediate offsets from its first; where the threads outnumber
// 8 a row, kPanelGroups of them share a row's panels (panels t, t +
// kPanelGroups, ...). Chunks at or past valid_chunks are zero-filled too (a
// head dim smaller than the kernel's). Asynchronous: completes at the
// caller's cp_async_wait.
template <typename Element, int kPanels, int kRows, int kThreads, typename RowSource>
__device__ __forceinline__ void load_panels_async(uint32_t panels, RowSource &&row_src, int valid_chunks, int tid) {
    constexpr int kChunksPerPanel = 8;
    constexpr int kPanelGroups = kThreads / kChunksPerPanel > kRows ? kThreads / kChunksPerPanel / kRows : 1;
    constexpr int kRowsPerPass = kThreads / kChunksPerPanel / kPanelGroups;
    constexpr uint32_t kPanelBytes = kRows * 128u;
    static_assert(kRows % kRowsPerPass == 0 && kRowsPerPass % 8 == 0, "whole passes of whole swizzle atoms");
    static_assert(kPanels % kPanelGroups == 0, "the panel groups share a row's panels evenly");
    const int g = tid % kChunksPerPanel;
    // (With one group the thread's row needs no modulo: the threads are
    // exactly a pass.)
    const int row0 = kPanelGroups == 1 ? tid / kChunksPerPanel : tid / kChunksPerPanel % kRowsPerPass;
    const int first_panel = kPanelGroups == 1 ? 0 : tid / kChunksPerPanel / kRowsPerPass;
#pragma unroll
    for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
        const int row = row0 + pass * kRowsPerPass;
        const Element *src = row_src(row);
        const uint32_t dst = panels + first_panel * kPanelBytes + PanelSwizzle<128>::offset(row, g);
#pragma unroll
        for (int c = 0; c < kPanels / kPanelGroups; ++c) {
            const int chunk = (first_panel + c * kPanelGroups) * kChunksPerPanel + g;
            const bool valid = src != nullptr && chunk < valid_chunks;
            // An invalid chunk still needs a mapped address: any row's.
            cp_async_16(dst + c * kPanelGroups * kPanelBytes,
                        valid ? src + chunk * kElemsPerVector<Element> : row_src(-1), valid);
        }
    }
}

// Named barriers of one warpgroup (0 is __syncthreads): 1 + its index.
constexpr int kFirstWarpgroupBarrier = 1;

template <typename Traits, bool kRagged>
struct WideMainloop {
    using Element = typename Traits::Element;
    static constexpr int kBlockM = Traits::kBlockM;
    static constexpr int kBlockN = Traits::kBlockN;
    static constexpr int kNAtomsS = kBlockN / kMmaN;
    static constexpr int kNAtomsO = Traits::kColsPerWarpgroup / kMmaN;
    using KeyRange = BlockKeyRange<kBlockM, kBlockN>;
    // O's accumulators: the warp's 16 rows, its warpgroup's columns.
    using Accumulators = float[1][kNAtomsO][4];
    using RowValues = float[2];
    using Softmax = OnlineSoftmax<1>;
    using Swizzle = typename Traits::Swizzle;

    unsigned char *smem;  // aligned to kSmemBaseAlignment
    int tid;
    int lane;
    int warpgroup;       // which tile of each pair, which half of O's columns
    int warp_first_row;  // the warp's 16 rows of the block (of S, P and O)

    const Element *q_heads;
    using ElementKV = typename Traits::ElementKV;
    const ElementKV *k;
    const ElementKV *v;
    float k_descale = 1.f;  // a quantized cache's, of the work's (batch, K/V head)
    int num_n_blocks;

    __device__ __forceinline__ explicit WideMainloop(unsigned char *smem_)
        : smem(smem_),
          tid(threadIdx.x),
          lane(threadIdx.x % kWarpSize),
          warpgroup(threadIdx.x / kWarpgroupThreads),
          warp_first_row((threadIdx.x % kWarpgroupThreads) / kWarpSize * kMmaM) {}

    __device__ __forceinline__ float *exchange() const {
        return reinterpret_cast<float *>(smem + Traits::kSmemExchange);
    }
    // The scales of the raw scores (sm80::ScoreScales: a quantized cache's
    // k_descale in them).
    __device__ __forceinline__ float lse_scale(const FwdKernelParams &p) const {
        return sm80::ScoreScales<Traits>::lse_scale(p, k_descale);
    }

    template <typename Work>
    __device__ __forceinline__ bool bind(const FwdKernelParams &p, const Work &work) {
        num_n_blocks = sm80::bind_block_operands<Traits, kRagged>(p, work, q_heads, k, v, k_descale);
        return num_n_blocks > 0;
    }

    // The block's Q rows (a GQA-packed block gathers them from its heads:
    // row r is query (first_query + r) / packed_heads of head
    // head_q + that remainder), rows past valid_rows zero-filled.
    __device__ __forceinline__ void load_q(const FwdKernelParams &p, int first_query, int valid_rows) const {
        const FastDivisor packed_heads = p.divisors.packed_heads;
        load_panels_async<Element, Traits::kQKPanels, kBlockM, Traits::kNumThreads>(
            smem_address(smem),
            [&](int row) -> const Element * {
                if (row < 0) return q_heads;
                if (row >= valid_rows) return nullptr;
                return q_heads + packed_heads.strided(first_query + row, p.q_seq_stride, p.q_head_stride);
            },
            p.head_dim / kElemsPerVector<Element>, tid);
    }

    // A quantized cache's tile is loaded and widened by one warpgroup (the
    // one computing its S), 4 threads a row, each a run of kRunChunks of the
    // row's 16-byte chunks.
    static constexpr int kRunsPerRow = kWarpgroupThreads / kBlockN;
    static constexpr int kRunChunks = Traits::kRawRowChunks / kRunsPerRow;
    static_assert(!Traits::kQuantizedKV ||
                      (kWarpgroupThreads % kBlockN == 0 && Traits::kRawRowChunks % kRunsPerRow == 0),
                  "whole runs of a stored row per thread");
    __device__ __forceinline__ int row_of_thread() const { return (tid % kWarpgroupThreads) / kRunsPerRow; }
    __device__ __forceinline__ int run_of_thread() const { return tid % kRunsPerRow; }

    // Key tile j of the block into its ring slot (j % kStages): its K rows,
    // and its V rows where V is not in them; past the block's tiles, or past
    // the batch's keys, zeros.
    __device__ __forceinline__ void request(const FwdKernelParams &p, const KeyRange &keys, int batch, int seqlen_k,
                                            int j) const {
        const uint32_t slot = smem_address(smem + Traits::kSmemRing) + (j % Traits::kStages) * Traits::kSlotBytes;
        const int first_key = j < num_n_blocks ? keys.n_block(j) * kBlockN : seqlen_k;
        const bool paged = kRagged && p.block_table != nullptr;
        const auto rows_of = [&](const ElementKV *base, int64_t page_stride, int64_t row_stride) {
            return [=, &p](int row) -> const ElementKV * {
                if (row < 0) return base;
                const int key = first_key + row;
                if (key >= seqlen_k) return nullptr;
                if (paged) {
                    return base + int64_t(fwd_page_of(p, batch, key)) * page_stride +
                           int64_t(fwd_page_row(p, key)) * row_stride;
                }
                return base + int64_t(key) * row_stride;
            };
        };
        if constexpr (Traits::kQuantizedKV) {
            // As stored, rows of 16-byte chunks, for widen_own_tile; by this
            // warpgroup's threads, 4 to a row, each a run of kRunChunks.
            const ElementKV *src = rows_of(k, p.k_batch_stride, p.k_seq_stride)(row_of_thread());
            const ElementKV *mapped = k;
            const int valid_chunks = p.head_dim * int(sizeof(ElementKV)) / 16;
            const int first_chunk = run_of_thread() * kRunChunks;
            const uint32_t raw =
                slot + Traits::kRawTileOffset + (row_of_thread() * Traits::kRawRowChunks + first_chunk) * 16u;
#pragma unroll
            for (int c = 0; c < kRunChunks; ++c) {
                const bool valid = src != nullptr && first_chunk + c < valid_chunks;
                cp_async_16(raw + c * 16u, valid ? src + (first_chunk + c) * 16 / int(sizeof(ElementKV)) : mapped,
                            valid);
            }
        } else {
            load_panels_async<Element, Traits::kQKPanels, kBlockN, Traits::kNumThreads>(
                slot, rows_of(k, p.k_batch_stride, p.k_seq_stride), p.head_dim / kElemsPerVector<Element>, tid);
        }
        if constexpr (!Traits::kVInK) {
            load_panels_async<Element, Traits::kVPanels, kBlockN, Traits::kNumThreads>(
                slot + Traits::kKTileBytes, rows_of(v, p.v_batch_stride, p.v_seq_stride),
                p.head_dim_v / kElemsPerVector<Element>, tid);
        }
    }

    // The block's key tiles, a pair at a time; then finish(acc_o, softmax,
    // row_lse) with the warp's rows of O's columns of its warpgroup, their
    // softmax state (both warpgroups the same) and room for their LSE.
    template <typename Work, typename Finish>
    __device__ __forceinline__ void run(const FwdKernelParams &p, const Work &work, Finish &&finish) {
        const FwdTile &tile = work.tile;
        const int first_query = tile.m_block * kBlockM;
        const KeyMask &mask = work.mask;
        const KeyRange &keys = work.keys;
        const int seqlen_k = mask.seqlen_k;
        const int num_pairs = (num_n_blocks + 1) / 2;

        load_q(p, first_query, work.valid_rows);
        if constexpr (Traits::kQuantizedKV) {
            request(p, keys, tile.batch, seqlen_k, warpgroup);
        } else {
            request(p, keys, tile.batch, seqlen_k, 0);
            request(p, keys, tile.batch, seqlen_k, 1);
        }
        cp_async_commit();

        const uint32_t q_addr = smem_address(smem);
        const uint32_t ring_addr = smem_address(smem + Traits::kSmemRing);
        const uint32_t p_addr = smem_address(smem + Traits::kSmemP);
        float *const max_exchange = exchange();
        const int lane_row = warp_first_row + frag_row(lane);
        const Softcap softcap{sm80::ScoreScales<Traits>::softcap_prescale(p, k_descale)};
        const float scale_log2 = sm80::ScoreScales<Traits>::score_scale_log2(p, k_descale);

        Accumulators acc_o;
#pragma unroll
        for (int n = 0; n < kNAtomsO; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[0][n][e] = 0.f;
        }
        float row_max[2] = {-INFINITY, -INFINITY};
        float row_sum[2] = {0.f, 0.f};

        for (int i = 0; i < num_pairs; ++i) {
            // Pair i has landed, for every thread's copies; every thread is
            // done with pair i - 1 (its slots, P, the exchange).
            cp_async_wait<0>();
            fence_shared_to_async_proxy();
            __syncthreads();
            if constexpr (Traits::kQuantizedKV) {
                // Each warpgroup its tile of the next pair, and its tile of
                // this one widened.
                request(p, keys, tile.batch, seqlen_k, 2 * i + 2 + warpgroup);
                cp_async_commit();
                widen_own_tile(ring_addr + ((2 * i + warpgroup) % Traits::kStages) * Traits::kSlotBytes);
            } else {
                request(p, keys, tile.batch, seqlen_k, 2 * i + 2);
                request(p, keys, tile.batch, seqlen_k, 2 * i + 3);
                cp_async_commit();
            }

            // 1. This warpgroup's scores.
            const int j = 2 * i + warpgroup;
            float scores[1][kNAtomsS][4];
            if (j < num_n_blocks) {
                issue_qk<Traits>(scores[0], q_addr, ring_addr + (j % Traits::kStages) * Traits::kSlotBytes);
                wgmma_wait<0>();
                fence_accumulators(scores[0]);
                if (softcap.enabled()) softcap.apply(scores);
                const int n_block = keys.n_block(j);
                if (keys.needs_mask(n_block)) {
                    FragmentKeyMask<1>::of(mask, first_query + warp_first_row, n_block * kBlockN, lane).apply(scores);
                }
            } else {
#pragma unroll
                for (int n = 0; n < kNAtomsS; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) scores[0][n][e] = -INFINITY;
                }
            }

            // 2. The pair's row maxima, over both warpgroups' tiles.
            float tile_max[2];
            tile_row_maxima(scores, tile_max);
            if (lane % 4 == 0) {
                max_exchange[warpgroup * kBlockM + lane_row] = tile_max[0];
                max_exchange[warpgroup * kBlockM + lane_row + kFragRowHalf] = tile_max[1];
            }
            __syncthreads();

            // 3. Probabilities into P, O rescaled.
            float correction[2];
            fold_tile_into_rows(
                scores,
                [&](int half) {
                    const int row = lane_row + half * kFragRowHalf;
                    return fmaxf(max_exchange[row], max_exchange[kBlockM + row]);
                },
                scale_log2, row_max, row_sum, correction);
            store_fragments<Element, Traits::kPairKeys, 1, kNAtomsS>(reinterpret_cast<Element *>(smem + Traits::kSmemP),
                                                                     scores, warp_first_row, warpgroup * kBlockN, lane);
            if (__any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f)) {
#pragma unroll
                for (int n = 0; n < kNAtomsO; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc_o[0][n][e] *= correction[e / 2];
                }
            }
            fence_shared_to_async_proxy();
            __syncthreads();

            // 4. O += P V over the pair's keys: k-steps 0, 1 from tile 2i's
            // rows, 2, 3 from tile 2i + 1's.
            issue_pv(acc_o[0], p_addr, ring_addr + ((2 * i) % Traits::kStages) * Traits::kSlotBytes);
            wgmma_wait<0>();
            fence_accumulators(acc_o[0]);
        }
        // Drain the (empty) trailing requests.
        cp_async_wait<0>();

        // The rows' sums over both warpgroups' tiles. The last reads of the
        // exchange's maxima were before the last pair's second barrier.
        float *const sum_exchange = max_exchange + Traits::kWarpgroups * kBlockM;
#pragma unroll
        for (int half = 0; half < 2; ++half) row_sum[half] = quad_sum(row_sum[half]);
        if (lane % 4 == 0) {
            sum_exchange[warpgroup * kBlockM + lane_row] = row_sum[0];
            sum_exchange[warpgroup * kBlockM + lane_row + kFragRowHalf] = row_sum[1];
        }
        __syncthreads();
        // The state as OnlineSoftmax::finalize takes it: it adds a row's sums
        // over the quad's lanes, so the quad's first lane carries the whole.
        Softmax softmax;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = lane_row + half * kFragRowHalf;
            softmax.row_max[half] = row_max[half];
            softmax.row_sum[half] = lane % 4 == 0 ? sum_exchange[row] + sum_exchange[kBlockM + row] : 0.f;
        }
        RowValues row_lse;
        finish(acc_o, softmax, row_lse);
    }

    // A quantized cache: this warpgroup's landed tile (its slot at `slot`)
    // widened in place, from its stored rows at the end of the slot to
    // Element's panels over the whole slot. Every thread reads its run of a
    // row into registers first, then (a barrier of the warpgroup: the panels
    // overwrite stored rows) writes it widened; a second barrier publishes
    // the panels to the warpgroup's S (the other's P V reads them after the
    // tile's later CTA barriers).
    __device__ __forceinline__ void widen_own_tile(uint32_t slot) const {
        const int row = row_of_thread();
        const int first_chunk = run_of_thread() * kRunChunks;
        const uint32_t raw = slot + Traits::kRawTileOffset + (row * Traits::kRawRowChunks + first_chunk) * 16u;
        uint4 codes[kRunChunks];
#pragma unroll
        for (int c = 0; c < kRunChunks; ++c) {
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(codes[c].x), "=r"(codes[c].y), "=r"(codes[c].z), "=r"(codes[c].w)
                         : "r"(raw + c * 16u)
                         : "memory");
        }
        named_barrier_sync_id(kFirstWarpgroupBarrier + warpgroup, kWarpgroupThreads);
#pragma unroll
        for (int c = 0; c < kRunChunks; ++c) {
            // 16 codes: two 16-byte vectors of Element.
            const int vec = (first_chunk + c) * 2;
            const uint32_t words[4] = {codes[c].x, codes[c].y, codes[c].z, codes[c].w};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint32_t wide[4];
#pragma unroll
                for (int w = 0; w < 2; ++w) {
                    wide[2 * w] = widen_e4m3x2<Element>(uint16_t(words[2 * h + w] & 0xffffu));
                    wide[2 * w + 1] = widen_e4m3x2<Element>(uint16_t(words[2 * h + w] >> 16));
                }
                const int v8 = vec + h;
                const uint32_t dst = slot + (v8 / 8) * Traits::kKVPanelBytes + Swizzle::offset(row, v8 % 8);
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(wide[0]), "r"(wide[1]),
                             "r"(wide[2]), "r"(wide[3])
                             : "memory");
            }
        }
        fence_shared_to_async_proxy();
        named_barrier_sync_id(kFirstWarpgroupBarrier + warpgroup, kWarpgroupThreads);
    }

    // out += P * V of the pair whose first tile is at `first_tile` (the
    // second follows it in the ring: pairs start at even slots), this
    // warpgroup's columns.
    __device__ __forceinline__ void issue_pv(float (&out)[kNAtomsO][4], uint32_t p_addr, uint32_t first_tile) const {
        const auto desc_p = Traits::PSwizzle::k_major(p_addr);
        // V: the slot's K rows, or its own tile after them.
        const uint32_t v_cols = (Traits::kVInK ? 0u : Traits::kKTileBytes) +
                                warpgroup * Traits::kVPanelsPerWarpgroup * Traits::kKVPanelBytes;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Traits::kPairKeys / kMmaK; ++kk) {
            constexpr int kStepsPerTile = kBlockN / kMmaK;
            const uint32_t tile = first_tile + (kk / kStepsPerTile) * Traits::kSlotBytes + v_cols;
            const auto desc_v = Swizzle::mn_major(tile, Traits::kKVPanelBytes);
            WgmmaSs<Element, Element, Traits::kColsPerWarpgroup, WgmmaMajor::kK, WgmmaMajor::kMN>::mma(
                out, desc_p.at(kk * kKStepRowBytes), desc_v.at((kk % kStepsPerTile) * kMmaK * Traits::kPanelRowBytes),
                1);
        }
        wgmma_commit();
    }
};

}  // namespace flashcore::sm90
