// The portable (sm_80+) fused attention forward kernel.
//
// One CTA computes one block of kBlockM query rows of one (batch, head):
//   load Q once; for each visible K/V tile, last to first:
//     S = Q*K^T (tensor cores) -> mask (boundary tiles only) -> online softmax
//     -> O += P*V (tensor cores, P straight from registers)
//   normalise O, write O and the log-sum-exp.
//
// Copies overlap compute: V of tile n streams in while S = Q*K_n^T and its
// softmax run, and K of tile n-1 while O += P*V_n runs. Walking the tiles
// last to first puts the tiles that need masking (the partial last tile, the
// causal diagonal) first, so later iterations run unmasked.
#pragma once

#include "epilogue.cuh"
#include "fwd_params.h"
#include "kernel_traits.cuh"
#include "mask.cuh"
#include "smem_tile.cuh"
#include "softmax.cuh"
#include "tile_scheduler.cuh"
#include "warp_gemm.cuh"

namespace flashcore {

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNumThreads) __maxnreg__(Traits::kMaxRegisters) flash_fwd_kernel(const __grid_constant__ FwdKernelParams p) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;

    extern __shared__ __align__(128) unsigned char smem_raw[];
    Element *smem_q = reinterpret_cast<Element *>(smem_raw);
    Element *smem_k = reinterpret_cast<Element *>(smem_raw + Traits::kSmemQBytes);
    Element *smem_v = reinterpret_cast<Element *>(smem_raw + Traits::kSmemQBytes + Traits::kSmemKVBytes);

    const int tid = threadIdx.x;
    const int lane = tid % kWarpSize;
    const int warp_first_row = (tid / kWarpSize) * Traits::kRowsPerWarp;

    const FwdTile tile = fwd_tile_for_block<kBlockM>(p, blockIdx.x);
    const int first_query = tile.m_block * kBlockM;
    const int valid_rows = min(kBlockM, p.seqlen_q - first_query);
    const int shift = causal_shift(p);

    const Element *q = static_cast<const Element *>(p.q) + tile.batch * p.q_batch_stride +
                       tile.head_q * p.q_head_stride + first_query * p.q_seq_stride;
    const Element *k = static_cast<const Element *>(p.k) + tile.batch * p.k_batch_stride +
                       tile.head_kv * p.k_head_stride;
    const Element *v = static_cast<const Element *>(p.v) + tile.batch * p.v_batch_stride +
                       tile.head_kv * p.v_head_stride;
    Element *out = static_cast<Element *>(p.out) + tile.batch * p.out_batch_stride +
                   tile.head_q * p.out_head_stride + first_query * p.out_seq_stride;
    float *lse = p.lse == nullptr
                     ? nullptr
                     : p.lse + (int64_t(tile.batch) * p.num_heads_q + tile.head_q) * p.seqlen_q + first_query;

    const int num_n_blocks = fwd_num_n_blocks<kBlockM, kBlockN>(p, tile.m_block);
    if (num_n_blocks <= 0) {
        store_empty_block<Traits>(out, p.out_seq_stride, lse, valid_rows, tid);
        return;
    }

    // Prologue: Q and the last K tile in one copy group.
    int n_block = num_n_blocks - 1;
    load_tile_async<Traits, kBlockM>(smem_q, q, p.q_seq_stride, valid_rows, tid);
    load_tile_async<Traits, kBlockN>(smem_k, k + int64_t(n_block) * kBlockN * p.k_seq_stride, p.k_seq_stride,
                                     p.seqlen_k - n_block * kBlockN, tid);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    QFragments<Traits> q_frag;
    q_frag.init(smem_q, warp_first_row, lane);

    const uint32_t smem_k_addr = smem_address(smem_k);
    const uint32_t smem_v_addr = smem_address(smem_v);
    const uint32_t k_offset = k_fragment_offset<Traits>(lane);
    const uint32_t v_offset = v_fragment_offset<Traits>(lane);

    float acc_o[Traits::kMAtoms][Traits::kNAtomsO][4];
#pragma unroll
    for (int m = 0; m < Traits::kMAtoms; ++m) {
#pragma unroll
        for (int n = 0; n < Traits::kNAtomsO; ++n) {
#pragma unroll
            for (int j = 0; j < 4; ++j) acc_o[m][n][j] = 0.f;
        }
    }
    OnlineSoftmax<Traits::kMAtoms> softmax;
    softmax.init();

    for (; n_block >= 0; --n_block) {
        const int first_key = n_block * kBlockN;
        // K[n_block] has landed, and every warp is done reading V[n_block + 1].
        cp_async_wait<0>();
        __syncthreads();
        load_tile_async<Traits, kBlockN>(smem_v, v + int64_t(first_key) * p.v_seq_stride, p.v_seq_stride,
                                         p.seqlen_k - first_key, tid);
        cp_async_commit();

        float scores[Traits::kMAtoms][Traits::kNAtomsS][4];
        gemm_qk<Traits>(scores, q_frag, smem_k_addr, k_offset);
        if (tile_needs_mask<kBlockM, kBlockN>(tile.m_block, n_block, p.seqlen_k, p.causal, shift)) {
            apply_mask(scores, first_query + warp_first_row, first_key, p.seqlen_k, p.causal, shift, lane);
        }
        softmax.update(scores, acc_o, p.softmax_scale_log2);

        // V[n_block] has landed, and every warp is done reading K[n_block].
        cp_async_wait<0>();
        __syncthreads();
        if (n_block > 0) {
            const int next_key = first_key - kBlockN;
            load_tile_async<Traits, kBlockN>(smem_k, k + int64_t(next_key) * p.k_seq_stride, p.k_seq_stride,
                                             p.seqlen_k - next_key, tid);
            cp_async_commit();
        }
        gemm_pv<Traits>(acc_o, scores, smem_v_addr, v_offset);
    }

    float row_lse[Traits::kMAtoms * 2];
    softmax.finalize(acc_o, p.softmax_scale, row_lse);
    if (lse != nullptr) store_lse<Traits>(row_lse, lse, valid_rows, warp_first_row, lane);
    // Each warp reuses only its own rows of Q's shared memory for the output
    // tile, and only it ever read those rows.
    store_output<Traits>(acc_o, smem_q, out, p.out_seq_stride, valid_rows, warp_first_row, lane, tid);
}

}  // namespace flashcore
