// The dQ writer, the producer warpgroup's second warp: each step's dQ, which
// the consumers leave in a shared dQ buffer (pipeline.cuh: DqBlock), added
// to the fp32 workspace with one bulk reduction, and in the deterministic
// mode in the order bwd/scheduler.cuh gives (bwd_dq_rank, the per-query-
// block counters). The dQ leaves the CTA here, step by step; dK and dV
// leave at the end, staged by the consumers through shared memory
// (mainloop.cuh: store_key_gradients_staged).
#pragma once

#include <cstdint>

#include "bwd/params.h"
#include "bwd/sm90/pipeline.cuh"
#include "bwd/sm90/scheduler.cuh"
#include "common/ptx.cuh"
#include "sm90/ptx.cuh"

namespace flashcore::sm90 {

// The dQ writer (the producer warpgroup's second warp): per step, once the
// consumers (one at head dim 96) have stored their dQ in shared memory, its leader adds the
// block to the workspace with one bulk reduction (the TMA unit does the
// adds; no consumer waits for them), and the buffer is released when the
// reduction has read it. In the deterministic mode it first waits for the
// key block's turn, and counts the block once the reduction is complete.
//
// That count's release is a fence at GPU scope, which waits for the
// reduction to land: the per-step fence was most of the mode's cost at d128
// (docs/log/hopper.md). So at head dim 128 (Traits::kPairedDqReleases) the
// writer releases two steps' counts with one fence: the first step's count
// waits for the second's reduction too. The key block that adds next to
// that query block mostly reaches it later anyway (kRotatedWalkStagger
// steps on a rotated walk, kBlockN / kBlockM under a causal mask);
// docs/log/hopper.md has the times. Not on rotated walks with no more steps than key blocks, where that could
// make the waits go round in a circle (bwd_rotated_walk_releases_in_pairs).
template <typename Traits, typename Work>
__device__ __forceinline__ void bwd_write_dq(const BwdKernelParams &p, const BwdSmem<Traits> &sm, const Work &w,
                                             int lane) {
    constexpr int kParticipants = kDqWriterParticipants<Traits>;
    const int num_steps = bwd_walk_steps(w);
    for (int b = 0; b < Traits::kDqBuffers && b < num_steps; ++b) {
        named_barrier_arrive_id(kDqEmptyBarrier + 2 * b, kParticipants);
    }
    const bool release_in_pairs =
        Traits::kPairedDqReleases && p.deterministic && !(Traits::kRotatedWalk && p.rotated_walk &&
                             !bwd_rotated_walk_releases_in_pairs(num_steps, bwd_batch_key_blocks<Traits::kBlockN>(w)));
    int *held_counter = nullptr;  // the previous step's, released with this one's
    BwdStep step = BwdStep::first(w);
    for (int j = 0; j < num_steps; ++j, step = step.next(w)) {
        const int b = j % Traits::kDqBuffers;
        // What it does with the step's dQ it works out itself (handed over
        // in shared memory by a consumer, racecheck reported its reads
        // against the next step's stores), before the consumers are done
        // with it: in the deterministic mode whatever comes between the
        // turn and the release is on the path every key block of the query
        // block waits along. The turn first: its mask arithmetic beside
        // the other values would not fit the warp's 24 registers.
        int turn = 0;
        int *counter = nullptr;
        if (p.deterministic) {
            turn = bwd_dq_rank<Traits>(p, w, step);
            counter = bwd_dq_counter<Traits::kBlockM>(p, w, step.head, step.m_block);
        }
        const DqBlock block = DqBlock::of<Traits>(p, w, step.head, step.m_block);
        const uint32_t bytes = block.bytes<Traits>(p.fwd.head_dim);
        named_barrier_sync_id(kDqFullBarrier + 2 * b, kParticipants);
        if (lane == 0) {
            if (counter != nullptr) {
                while (load_acquire(counter) < turn) {
                }
            }
            bulk_reduce_add_f32(block.accumulator, smem_address(sm.dq(b)), bytes);
            bulk_commit_group();
            bulk_wait_group_read_all();
        }
        __syncwarp();
        // The buffer is free once read; the step's adds may still be on
        // their way to the workspace.
        if (j + Traits::kDqBuffers < num_steps) named_barrier_arrive_id(kDqEmptyBarrier + 2 * b, kParticipants);
        // The deterministic mode: the next key block's turn comes once they
        // have landed.
        if (lane == 0 && counter != nullptr) {
            if (release_in_pairs && held_counter == nullptr && j + 1 < num_steps) {
                held_counter = counter;
            } else {
                bulk_wait_group_all();
                if (held_counter != nullptr) {
                    fence_release_gpu();
                    add_relaxed(held_counter, 1);
                    add_relaxed(counter, 1);
                    held_counter = nullptr;
                } else {
                    add_release(counter, 1);
                }
            }
        }
    }
    // The last reductions' global writes, before the CTA ends.
    if (lane == 0) bulk_wait_group_all();
}

}  // namespace flashcore::sm90
