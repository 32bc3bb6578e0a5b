// V^T for the P*V product of one-byte (e4m3) inputs.
//
// wgmma reads fp8 operands from shared memory K-major only (PTX ISA,
// wgmma.mma_async: no transpose for .e4m3/.e5m2), and the K of P*V is the
// keys: its B operand must be V^T, keys contiguous, while V arrives (TMA) as
// the caller stores it, head-dim contiguous. So the producer warpgroup's
// warps after the first (kVTransposeWarps; the first warp's one thread
// issues the TMA copies) transpose each V tile of the ring into the V^T
// ring: they wait for V (v_full) and for the consumers to be done with the
// V^T stage (vt_empty), write it, and signal both v_empty (V may reload) and
// vt_full (pipeline.cuh).
//
// Key order. P's fp8 A fragments are packed from the S accumulators without
// moving data between threads (Mainloop::probabilities): of each 16 keys,
// thread t of a quad holds keys {2t, 2t+1, 8+2t, 9+2t} of its rows (the
// m16n8 accumulator layout), which the A fragment's layout (wgmma
// .m64nNk32, A in registers: k = 4t .. 4t+3, and 16 + those) reads as
// columns 4t .. 4t+3. The sum over keys is the same in any order, so V^T's
// columns take the keys in that order: column 4t + i of each 16-key group
// holds key vt_key_of_column(i) + 2t.
//
// A warp's step moves 16 keys times 32 head-dim columns with one
// ldmatrix.trans and one stmatrix (transpose_v_tile says how). V's rows
// past a batch's keys that may hold anything (v_tail_may_hold_garbage: a
// cache's unused tail, a page the batch does not own) become zeros here:
// their probabilities are 0, but 0 times NaN is NaN.
#pragma once

#include <cstdint>

#include "fwd/sm90/pipeline.cuh"
#include "fwd/sm90/traits.cuh"
#include "common/ptx.cuh"
#include "sm90/ptx.cuh"

namespace flashcore::sm90 {

// Keys per group of the key order above.
constexpr int kVtKeyGroup = 16;
__device__ __forceinline__ constexpr int vt_key_of_column(int i) { return (i % 2) + (i / 2) * 8; }

// 4 bytes at a shared-memory address: 32-bit addresses, which the
// transposing warps' registers afford (generic pointers are 64 bits).
__device__ __forceinline__ uint32_t load_shared_u32(uint32_t address) {
    uint32_t value;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(value) : "r"(address) : "memory");
    return value;
}

// Byte selections of two words a, b (a's bytes 0-3, b's 4-7).
constexpr uint32_t kEvenBytes = 0x6420;  // a.b0, a.b2, b.b0, b.b2
constexpr uint32_t kOddBytes = 0x7531;   // a.b1, a.b3, b.b1, b.b3

// V tile (as TMA wrote it: kVPanels panels of kBlockN rows, at shared
// address v_tile) -> V^T tile (panels of kVtPanelKeys keys, head_dim_v rows
// each, at vt_tile), keys at or past valid_keys zeroed where kZeroTail.
// warp: which transposing warp (0 .. kVTransposeWarps-1).
//
// A step moves 16 keys (a group) times 32 head-dim columns (two 16-byte
// chunks) with one ldmatrix and one stmatrix a warp (8 x 8 matrices of
// 16-bit elements, lanes 8i .. 8i+7 addressing matrix i's rows: ldmatrix
// .trans gives lane l rows 2(l % 4) and 2(l % 4) + 1 of column l / 4,
// stmatrix takes from lane l row l / 4, columns 2(l % 4) and 2(l % 4) + 1).
// ldmatrix.trans reads, per chunk, the group's keys 0-7 (matrix A) and 8-15
// (B) as 16-bit pairs of columns, so lane l (t = l % 4, p = l / 4) holds keys 2t, 2t+1 (of A)
// and 8+2t, 9+2t (of B) of columns 2p and 2p+1: exactly the four keys of
// V^T's columns 4t .. 4t+3 (the key order above), for two V^T rows. One
// byte selection per row makes them; stmatrix writes rows 2p or 2p+1 as
// the lane's row p of two matrices, the lanes p < 4 putting the even row in
// the first and the others the odd one, so that each matrix's 8 rows differ
// in row % 8 (no bank conflicts under the 128- and 64-byte swizzles).
//
// The steps of an item (one group, up to 4 steps) are unrolled: their
// addresses differ from the first by constants (a load's chunk bits are
// XORed in, which commutes with the swizzle's XOR; a store moves 32 rows,
// which leaves the swizzle's row bits alone).
template <typename Traits, bool kZeroTail>
__device__ __forceinline__ void transpose_v_tile(uint32_t v_tile, uint32_t vt_tile, int valid_keys, int warp,
                                                 int lane) {
    using Swizzle = typename Traits::Swizzle;
    using VtSwizzle = typename Traits::VtSwizzle;
    constexpr int kStepColumns = 32;  // head-dim columns of a step
    constexpr int kSteps = Traits::kHeadDimV / kStepColumns;
    constexpr int kItemSteps = kSteps < 4 ? kSteps : 4;
    constexpr int kGroups = Traits::kBlockN / kVtKeyGroup;
    constexpr int kItems = kGroups * (kSteps / kItemSteps);
    constexpr int kVRowBytes = Traits::kPanelRowBytes;
    constexpr int kVChunks = kVRowBytes / 16;
    constexpr int kStepsPerVPanel = kVRowBytes / kStepColumns;  // one-byte elements
    static_assert(kSteps % kItemSteps == 0 && kVRowBytes % kStepColumns == 0 && kItemSteps % kStepsPerVPanel == 0,
                  "whole steps per item, whole items of V panels");
    const int matrix = lane / 8;  // the matrix whose row this lane addresses
    const int row = lane % 8;
    // ldmatrix: matrix i is keys 8 (i % 2) + row of the group, chunk i / 2
    // of the step (plus the step's chunk bits, XORed in).
    const uint32_t load_offset = Swizzle::offset(8 * (matrix % 2) + row, matrix / 2);
    // stmatrix: matrix i is chunk i / 2's even rows (i % 2 == 0) for rows
    // 0-3 and odd ones for rows 4-7, or the other way round.
    const int store_row = 16 * (matrix / 2) + 2 * row + ((matrix % 2) ^ (row >= 4 ? 1 : 0));
    const bool even_first = lane / 4 < 4;
    const uint32_t first_select = even_first ? kEvenBytes : kOddBytes;
    const uint32_t second_select = even_first ? kOddBytes : kEvenBytes;
#pragma unroll 1
    for (unsigned item = unsigned(warp); item < unsigned(kItems); item += kVTransposeWarps) {
        const unsigned group = item % kGroups;
        // The item's first step: a whole number of V panels in (so its
        // steps' panels and chunk bits are the first item's, offset by
        // whole panels), and 0 where one item covers the head dim.
        const unsigned first_step = kSteps == kItemSteps ? 0u : (item / kGroups) * kItemSteps;
        const unsigned first_key = group * kVtKeyGroup;
        const uint32_t item_rows =
            v_tile + first_key * kVRowBytes + (first_step / kStepsPerVPanel) * Traits::kKVPanelBytes;
        const uint32_t store_base = vt_tile + (first_key / Traits::kVtPanelKeys) * Traits::kVtPanelBytes +
                                    VtSwizzle::offset(store_row, int(first_key % Traits::kVtPanelKeys) / 16) +
                                    first_step * kStepColumns * Traits::kVtRowBytes;
        // Bytes of keys at or past valid_keys: 16-bit pairs of one key each.
        uint32_t keep_a = ~0u, keep_b = ~0u;
        if constexpr (kZeroTail) {
            const int t = lane % 4;
            const auto keep = [&](int key) { return int(first_key) + key < valid_keys; };
            keep_a = (keep(2 * t) ? 0x0000FFFFu : 0u) | (keep(2 * t + 1) ? 0xFFFF0000u : 0u);
            keep_b = (keep(8 + 2 * t) ? 0x0000FFFFu : 0u) | (keep(9 + 2 * t) ? 0xFFFF0000u : 0u);
        }
#pragma unroll
        for (int j = 0; j < kItemSteps; ++j) {
            const uint32_t panel = item_rows + (j / kStepsPerVPanel) * Traits::kKVPanelBytes;
            const uint32_t chunk_bits = uint32_t(((j * kStepColumns / 16) % kVChunks) * 16);
            uint32_t v[4];  // A and B of the step's first chunk, then of its second
            ldmatrix_x4_trans(v, panel + (load_offset ^ chunk_bits));
            if constexpr (kZeroTail) {
                v[0] &= keep_a, v[1] &= keep_b, v[2] &= keep_a, v[3] &= keep_b;
            }
            const uint32_t rows[4] = {__byte_perm(v[0], v[1], first_select), __byte_perm(v[0], v[1], second_select),
                                      __byte_perm(v[2], v[3], first_select), __byte_perm(v[2], v[3], second_select)};
            stmatrix_x4(store_base + uint32_t(j * kStepColumns * Traits::kVtRowBytes), rows);
        }
    }
}

// A transposing warp (warp 0 .. kVTransposeWarps-1 of them): transposes
// every V tile the producer loads, in the ring's order, until the producer
// marks a stage as holding no tile (producer.cuh).
template <typename Traits>
__device__ __forceinline__ void run_v_transpose(const Sm90KernelParams &params, const Pipeline<Traits> &pipe,
                                                int warp, int lane) {
    // The ring's stage and phase, stepped rather than computed from the
    // 64-bit position each tile (these warps have 24 registers a thread).
    const KvPosition first = Pipeline<Traits>::first_position(params.first_kv_position);
    int stage = Pipeline<Traits>::stage_of(first);
    uint32_t phase = Pipeline<Traits>::phase_of(first);
    const uint32_t smem = smem_address(pipe.smem);
    for (;;) {
        mbarrier_wait(pipe.v_full(stage), phase);
        // Read by the lane that will release V (v_empty) and passed on, so
        // the read is ordered before the release in that lane's program
        // order (compute-sanitizer's racecheck does not see __syncwarp carry
        // other lanes' reads before one lane's arrival).
        int valid_keys = 0;
        if (lane == 0) valid_keys = int(load_shared_u32(smem + Pipeline<Traits>::v_tile_keys_offset(stage)));
        valid_keys = __shfl_sync(0xffffffffu, valid_keys, 0);
        if (valid_keys == kNoMoreVTiles) return;
        mbarrier_wait(pipe.vt_empty(stage), phase ^ 1u);
        const uint32_t v_tile = smem + Pipeline<Traits>::v_tile_offset(stage);
        const uint32_t vt_tile = smem + Pipeline<Traits>::vt_tile_offset(stage);
        if (valid_keys < Traits::kBlockN) {
            transpose_v_tile<Traits, true>(v_tile, vt_tile, valid_keys, warp, lane);
        } else {
            transpose_v_tile<Traits, false>(v_tile, vt_tile, valid_keys, warp, lane);
        }
        // The writes must be visible to wgmma (the async proxy).
        fence_shared_to_async_proxy();
        __syncwarp();
        if (lane == 0) {
            mbarrier_arrive(pipe.v_empty(stage));
            mbarrier_arrive(pipe.vt_full(stage));
        }
        if (++stage == Traits::kStages) {
            stage = 0;
            phase ^= 1u;
        }
    }
}

}  // namespace flashcore::sm90
