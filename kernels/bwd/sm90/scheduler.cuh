// The kernel's schedule: one CTA per key block of a (batch, K/V head), whose
// steps walk the query blocks that see it (with GQA, every query head of
// the group), in the order of the portable kernel's schedule: the shared
// bwd/scheduler.cuh (KeyBlockScheduler, BwdStep, the deterministic mode's
// order of dQ additions). Every warp of the CTA follows the same walk, so
// the producer's warps and the consumers meet at the same steps; the names
// they use are brought into this namespace here.
#pragma once

#include "bwd/scheduler.cuh"

namespace flashcore::sm90 {

using sm80::bwd_batch_key_blocks;
using sm80::bwd_dq_counter;
using sm80::bwd_dq_rank;
using sm80::bwd_has_work;
using sm80::bwd_walk_steps;
using sm80::bwd_rotated_walk_releases_in_pairs;
using sm80::BwdStep;

}  // namespace flashcore::sm90
