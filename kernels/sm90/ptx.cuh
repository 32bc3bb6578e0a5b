// Hopper (sm_90a) primitives of the sm90 forward kernel that CCCL's
// cuda::ptx does not wrap (wgmma bookkeeping, setmaxnreg, shared-memory
// matrix descriptors), plus thin names over the cuda::ptx mbarrier and TMA
// calls the kernel makes.
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace flashcore::sm90 {

constexpr int kWarpgroupThreads = 128;

// v, which is the same in every lane of the warp, as a value ptxas knows to
// be so (lane 0's broadcast, as CUTLASS's canonical_warp_group_idx): a
// shared-memory address of a wgmma operand derived from it then stays in
// uniform registers, where wgmma reads its descriptors. An address computed
// from threadIdx.x was built in vector registers and moved across for each
// wgmma (two R2UR, an add and a move: in the sm90 backward 4 instructions a
// wgmma, docs/log/hopper.md).
__device__ __forceinline__ uint32_t warp_uniform(uint32_t v) { return __shfl_sync(0xffffffffu, v, 0); }

// ---- wgmma bookkeeping -----------------------------------------------------

// Orders the warpgroup's register and shared-memory writes before the
// wgmma instructions that follow read them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending committed wgmma groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across an
// asynchronous wgmma that uses them.
__device__ __forceinline__ void fence_operand(float &reg) {
    asm volatile("" : "+f"(reg)::"memory");
}

// fence_operand over a warp's accumulator fragments (kNAtoms n8 atoms).
template <int kNAtoms>
__device__ __forceinline__ void fence_accumulators(float (&acc)[kNAtoms][4]) {
#pragma unroll
    for (int n = 0; n < kNAtoms; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) fence_operand(acc[n][e]);
    }
}

// The value of x, opaque to the compiler: what is computed from it cannot be
// hoisted above this point (out of a loop where x is invariant, to hold the
// results in registers for the whole loop).
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
    asm volatile("" : "+r"(x));
    return x;
}

// ---- register reallocation between warpgroups ------------------------------

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_increase() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_decrease() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// ---- shared-memory matrix descriptors --------------------------------------
//
// Tiles are stored as the TMA unit's 128- or 64-byte swizzle writes them:
// panels of kRowBytes bytes per row (kRowBytes / 2 columns of a two-byte
// type), 16-byte chunk c of row r at chunk c ^ ((r * kRowBytes / 128) %
// (kRowBytes / 16)), groups of 8 rows (one swizzle atom) 8 * kRowBytes apart.
// Panels start aligned to the atom. Rows that are multiples of 128 bytes use
// 128-byte panels (two-byte head dims 64, 128, ...); others 64-byte panels
// (32, 96).

template <int kRowBytes>
struct PanelSwizzle {
    static_assert(kRowBytes == 128 || kRowBytes == 64 || kRowBytes == 32, "the 128-, 64- and 32-byte swizzles");
    static constexpr uint32_t kAtomBytes = 8 * kRowBytes;  // 8 rows
    static constexpr int kChunks = kRowBytes / 16;
    // Layout-type field of a wgmma descriptor (bits 62-63).
    static constexpr uint64_t kDescriptorLayout = kRowBytes == 128 ? 1 : kRowBytes == 64 ? 2 : 3;

    // Byte offset of 16-byte chunk `chunk` of row `row` within a panel.
    __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
        return uint32_t(row * kRowBytes + ((chunk ^ ((row * kRowBytes / 128) % kChunks)) * 16));
    }

    // A wgmma shared-memory descriptor as two 32-bit words, whose start
    // address advances by a byte offset with one 32-bit add (at()): the
    // k-steps and panels of a tile are constant offsets from its first, and
    // rebuilding each descriptor from its address cost five instructions a
    // wgmma. Exact while the advanced address stays below 2^18 (the 14-bit
    // field), which every shared-memory address of a CTA is.
    struct Descriptor {
        uint32_t lo;  // start address >> 4 (bits 0-13), leading byte offset >> 4 (bits 16-29)
        uint32_t hi;  // stride byte offset >> 4 (bits 32-45), layout type (bits 62-63)

        __device__ __forceinline__ uint64_t at(uint32_t byte_offset) const {
            return (uint64_t(hi) << 32) | uint32_t(lo + (byte_offset >> 4));
        }
    };

    __device__ __forceinline__ static Descriptor descriptor(uint32_t smem_addr, uint32_t leading_byte_offset,
                                                            uint32_t stride_byte_offset) {
        return {((smem_addr & 0x3FFFFu) >> 4) | (((leading_byte_offset & 0x3FFFFu) >> 4) << 16),
                ((stride_byte_offset & 0x3FFFFu) >> 4) | uint32_t(kDescriptorLayout << 30)};
    }

    // K-major operand (rows are M or N, K along the panel row): 8-row groups
    // step by one atom; the leading offset is unused with these swizzles. A
    // k16 step inside a panel moves the start address by 32 bytes.
    __device__ __forceinline__ static Descriptor k_major(uint32_t smem_addr) {
        return descriptor(smem_addr, 16, kAtomBytes);
    }

    // MN-major operand (rows are K, N along the panel row): panels of N
    // columns are panel_bytes apart, 8-row K groups one atom apart.
    __device__ __forceinline__ static Descriptor mn_major(uint32_t smem_addr, uint32_t panel_bytes) {
        return descriptor(smem_addr, panel_bytes, kAtomBytes);
    }
};

// Bytes a wgmma k-step moves along a swizzled row: 32 (16 two-byte
// columns, or 32 one-byte ones).
constexpr uint32_t kKStepRowBytes = 32;

// The base of dynamic shared memory is aligned up to this (the 128-byte
// swizzle's atom; the 64-byte one's divides it).
constexpr uint32_t kSmemBaseAlignment = 1024;

// The dynamic shared memory's base aligned up to kSmemBaseAlignment: TMA and
// wgmma assume swizzled tiles aligned to their atom (the kernels' kSmemBytes
// include the slack).
__device__ __forceinline__ unsigned char *aligned_smem_base(unsigned char *smem_raw) {
    return reinterpret_cast<unsigned char *>((reinterpret_cast<uintptr_t>(smem_raw) + kSmemBaseAlignment - 1) &
                                             ~uintptr_t(kSmemBaseAlignment - 1));
}

// ---- mbarriers and TMA (cuda::ptx) ------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint64_t *bar, uint32_t arrivals) {
    cuda::ptx::mbarrier_init(bar, arrivals);
}

__device__ __forceinline__ void mbarrier_wait(uint64_t *bar, uint32_t phase_parity) {
    while (!cuda::ptx::mbarrier_try_wait_parity(bar, phase_parity)) {
    }
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t *bar) {
    cuda::ptx::mbarrier_arrive(bar);
}

// Arms `bar` for `bytes` of TMA traffic and counts as this thread's arrival.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar,
                                         bytes);
}

// Makes mbarrier initialisation visible to the TMA unit (async proxy).
__device__ __forceinline__ void fence_barrier_init() {
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

// One box of a 4-d tensor map (head_dim, seq, head, batch) into shared memory;
// completion is signalled on `bar`. Out-of-bounds rows arrive as zeros.
__device__ __forceinline__ void tma_load_4d(void *smem_dst, const void *tensor_map, int col, int row, int head,
                                            int batch, uint64_t *bar) {
    const int32_t coords[4] = {col, row, head, batch};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem_dst, tensor_map, coords,
                                    bar);
}

// One box of shared memory out to a 4-d tensor map, as part of this thread's
// current bulk group. Rows past the map's seqlen are not written.
__device__ __forceinline__ void tma_store_4d(const void *tensor_map, const void *smem_src, int col, int row,
                                             int head, int batch) {
    const int32_t coords[4] = {col, row, head, batch};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, tensor_map, coords, smem_src);
}

// global[0 .. bytes) += shared[0 .. bytes) (fp32 elements) through the TMA
// unit, as part of this thread's current bulk group: both addresses 16-byte
// aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_reduce_add_f32(float *global_dst, uint32_t smem_src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global_dst),
                 "r"(smem_src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { cuda::ptx::cp_async_bulk_commit_group(); }

// Waits until this thread's bulk stores have finished reading shared memory
// (their global writes may still be in flight).
__device__ __forceinline__ void bulk_wait_group_read_all() {
    cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
}

// Waits until this thread's bulk stores are complete, global writes included.
__device__ __forceinline__ void bulk_wait_group_all() { cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{}); }

// Makes this thread's ordinary shared-memory writes visible to the TMA unit.
__device__ __forceinline__ void fence_shared_to_async_proxy() {
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

// Barrier `id` among `num_threads` threads (a multiple of 32); the id may
// be chosen at run time (per warpgroup).
__device__ __forceinline__ void named_barrier_sync_id(int id, int num_threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(num_threads) : "memory");
}

// The same where the threads reach the barrier from different instructions
// (two copies of a loop): bar.sync is barrier.sync.aligned, which requires
// every thread to execute the same instruction (compute-sanitizer's
// synccheck reports "divergent thread(s)" otherwise).
__device__ __forceinline__ void named_barrier_sync_id_unaligned(int id, int num_threads) {
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(num_threads) : "memory");
}

// Stores four 8x8 b16 matrices (sm_90's stmatrix, the counterpart of
// common/ptx.cuh's ldmatrix_x4): lane i supplies the row address for matrix
// i / 8, and each lane's frag[m] holds row lane / 4, columns 2 (lane % 4)
// and 2 (lane % 4) + 1 of matrix m.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_row, const uint32_t (&frag)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_row), "r"(frag[0]),
                 "r"(frag[1]), "r"(frag[2]), "r"(frag[3])
                 : "memory");
}

// stmatrix_x4, each matrix stored transposed: the row lane i addresses
// (matrix i / 8, row r = i % 8) receives column r of the matrix the lanes
// hold as above (lanes 4k + r / 2, k = 0 .. 7, the low half of frag[m] for
// even r, the high half for odd). What turns fragments of S^T into rows of S.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t smem_row, const uint32_t (&frag)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_row),
                 "r"(frag[0]), "r"(frag[1]), "r"(frag[2]), "r"(frag[3])
                 : "memory");
}

// Counts this thread's arrival at barrier `id` without waiting.
__device__ __forceinline__ void named_barrier_arrive_id(int id, int num_threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(num_threads) : "memory");
}

}  // namespace flashcore::sm90
