// Merging the partial results of a CTA's key splits (FwdTraits::kKeySplits:
// 2 for the 64-row key-split tiles, 4 for the 32-row keysplit4 and the 16-row
// decode tiles).
//
// Every split ran the online softmax over the same query rows but disjoint
// key tiles, and their warps hold identically laid-out fragments: thread i of
// split s holds the same (row, column) elements as thread i of split 0. The
// other splits hand their output accumulators and softmax state to their
// counterparts in split 0 through shared memory, which fold them in one after
// another, each time rescaling to the common row maximum (exactly what one
// split would have computed, up to rounding).
#pragma once

#include "fwd/sm80/traits.cuh"
#include "common/ptx.cuh"
#include "common/online_softmax.cuh"

namespace flashcore {

// Barrier ids: 0 is the CTA-wide __syncthreads; key split s uses 1 + s.
constexpr int kFirstSplitBarrier = 1;
constexpr int kMaxKeySplits = 4;

// Synchronises the warps of one key split (the whole CTA when there is one).
// The ids are immediates: with an id in a register ptxas reserves all 16
// barriers, and tools that track barriers see only a register.
template <typename Traits>
__device__ __forceinline__ void sync_key_split(int split) {
    static_assert(Traits::kKeySplits <= kMaxKeySplits, "one named barrier per key split");
    if constexpr (Traits::kKeySplits == 1) {
        __syncthreads();
    } else if (split == 0) {
        named_barrier_sync<kFirstSplitBarrier>(Traits::kThreadsPerSplit);
    } else if (Traits::kKeySplits == 2 || split == 1) {
        named_barrier_sync<kFirstSplitBarrier + 1>(Traits::kThreadsPerSplit);
    } else if (split == 2) {
        named_barrier_sync<kFirstSplitBarrier + 2>(Traits::kThreadsPerSplit);
    } else {
        named_barrier_sync<kFirstSplitBarrier + 3>(Traits::kThreadsPerSplit);
    }
}

// smem_rings: the splits' K/V rings (kSmemRingBytes each). Split s > 0
// hands over through its own ring, free once its warps have left their loop
// and drained their copies (split 0 may still be reading its own ring). Laid
// out [value][thread], so each of the warp's accesses is 32 consecutive
// words: conflict-free.
//
// barrier_deficit: how many fewer tiles (so loop barriers) this split had
// than split 0. compute-sanitizer's racecheck does not tell barrier ids
// apart: it orders two threads' accesses across a CTA-wide barrier only if
// both have executed equally many barriers before it, and otherwise reports
// every later exchange as a hazard. Padding the splits to equal counts with
// barriers on their own ids costs one 128-thread barrier per split and
// keeps racecheck meaningful for this kernel.
template <typename Traits>
__device__ __forceinline__ void merge_key_splits(OnlineSoftmax<Traits::kMAtoms> &softmax,
                                                 float (&acc_o)[Traits::kMAtoms][Traits::kNAtomsO][4],
                                                 unsigned char *smem_rings, int split, int split_tid,
                                                 int barrier_deficit, float scale_log2) {
    using Softmax = OnlineSoftmax<Traits::kMAtoms>;
    constexpr int kAccValues = Traits::kMAtoms * Traits::kNAtomsO * 4;
    constexpr int kValues = kAccValues + 2 * Softmax::kRows;
    static_assert(kValues * Traits::kThreadsPerSplit * sizeof(float) == Traits::kSmemMergeBytes &&
                      Traits::kSmemMergeBytes <= Traits::kSmemRingBytes,
                  "the exchange must fit in one split's K/V ring (FwdTraits::kSmemMergeBytes)");
    const auto slot_of = [&](int from_split, int value) -> float & {
        float *ring = reinterpret_cast<float *>(smem_rings + from_split * Traits::kSmemRingBytes);
        return ring[value * Traits::kThreadsPerSplit + split_tid];
    };
    const auto slot = [&](int value) -> float & { return slot_of(split, value); };

    for (int i = 0; i < barrier_deficit; ++i) sync_key_split<Traits>(split);
    // Splits > 0: every warp is done reading its ring. Split 0: equal counts.
    sync_key_split<Traits>(split);
    if (split != 0) {
#pragma unroll
        for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
            for (int n = 0; n < Traits::kNAtomsO; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) slot((m * Traits::kNAtomsO + n) * 4 + e) = acc_o[m][n][e];
            }
        }
#pragma unroll
        for (int r = 0; r < Softmax::kRows; ++r) {
            slot(kAccValues + r) = softmax.row_max[r];
            slot(kAccValues + Softmax::kRows + r) = softmax.row_sum[r];
        }
    }
    __syncthreads();
    if (split != 0) return;

#pragma unroll 1
    for (int other = 1; other < Traits::kKeySplits; ++other) {
        float other_max[Softmax::kRows], other_sum[Softmax::kRows];
#pragma unroll
        for (int r = 0; r < Softmax::kRows; ++r) {
            other_max[r] = slot_of(other, kAccValues + r);
            other_sum[r] = slot_of(other, kAccValues + Softmax::kRows + r);
        }
        float own_factor[Softmax::kRows], other_factor[Softmax::kRows];
        softmax.merge(other_max, other_sum, scale_log2, own_factor, other_factor);
#pragma unroll
        for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
            for (int n = 0; n < Traits::kNAtomsO; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = m * 2 + e / 2;  // accumulator elements 0, 1: row g; 2, 3: row g + 8
                    acc_o[m][n][e] = acc_o[m][n][e] * own_factor[r] +
                                     slot_of(other, (m * Traits::kNAtomsO + n) * 4 + e) * other_factor[r];
                }
            }
        }
    }
}

}  // namespace flashcore
