// Thin wrappers over the sm_80 instructions the forward kernels are built
// from: asynchronous global->shared copies, ldmatrix, and the m16n8k16
// tensor-core MMA. Each is one instruction; keeping them here lets every
// kernel file speak in terms of fragments rather than inline assembly.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace flashcore {

__device__ __forceinline__ uint32_t smem_address(const void *ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16-byte asynchronous copy global -> shared. With `valid` false nothing is
// read from global memory and the 16 destination bytes are zero-filled, which
// is how tile rows past the end of a sequence become harmless zeros.
__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void *gmem_src, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src),
                 "r"(src_bytes));
}

// 4-byte asynchronous copy global -> shared (through L1: single values
// such as a row's statistics), zero-filled without a read when !valid.
__device__ __forceinline__ void cp_async_4(uint32_t smem_dst, const void *gmem_src, bool valid) {
    const int src_bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_dst), "l"(gmem_src), "r"(src_bytes));
}

// *address += value in global memory, as a reduction (no value returned, so
// nothing waits for it).
__device__ __forceinline__ void red_add(float *address, float value) {
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(address), "f"(value) : "memory");
}

// address[0] += lo, address[1] += hi (address 8-byte aligned). sm_90 has a
// two-float reduction: one instruction, and a warp's pairs of adjacent
// columns fill whole 32-byte sectors instead of touching each sector twice
// (half the L2 traffic of two scalar reductions, measured by ncu on an H200).
__device__ __forceinline__ void red_add2(float *address, float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(address), "f"(lo), "f"(hi) : "memory");
#else
    red_add(address, lo);
    red_add(address + 1, hi);
#endif
}

// address[0..3] += values (address 16-byte aligned): one instruction on
// sm_90, four scalar reductions before it.
__device__ __forceinline__ void red_add4(float *address, const float (&values)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "f"(values[0]), "f"(values[1]),
                 "f"(values[2]), "f"(values[3])
                 : "memory");
#else
#pragma unroll
    for (int e = 0; e < 4; ++e) red_add(address + e, values[e]);
#endif
}

// ptr + elements, computed by an instruction the compiler cannot see into,
// so it cannot hoist or combine the address arithmetic (see load_tile_async).
template <typename T>
__device__ __forceinline__ const T *opaque_advance(const T *ptr, int64_t elements) {
    uint64_t result;
    asm("add.s64 %0, %1, %2;\n"
        : "=l"(result)
        : "l"(reinterpret_cast<uint64_t>(ptr)), "l"(elements * int64_t(sizeof(T))));
    return reinterpret_cast<const T *>(result);
}

// blockIdx.x and threadIdx.x read afresh: the compiler cannot reuse values
// derived from an earlier read, so it recomputes them instead of keeping
// them live (see the kernel's epilogue).
__device__ __forceinline__ int opaque_block_index() {
    int i;
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(i));
    return i;
}

__device__ __forceinline__ int opaque_thread_index() {
    int i;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(i));
    return i;
}

// Programmatic dependent launch (sm_90+; no-ops on older GPUs and for
// grids launched without the attribute). A kernel that lets its dependents
// launch early calls launch_dependent_grids(): the next kernel on the stream,
// if launched with cudaLaunchAttributeProgrammaticStreamSerialization, may
// then start once every CTA of this grid has called it, and overlap its launch
// with this grid's tail. The dependent calls wait_for_prerequisite_grids()
// before it reads what they wrote: it returns once they have completed and
// their memory is visible.
__device__ __forceinline__ void launch_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// A barrier of the whole CTA that its warps may reach from different
// branches: barrier.sync without .aligned. __syncthreads is the aligned form,
// which every thread must reach at the same instruction (compute-sanitizer's
// synccheck reports "divergent thread(s)" otherwise).
__device__ __forceinline__ void cta_barrier_from_branches() { asm volatile("barrier.sync 0;\n" ::: "memory"); }

// Barrier kId among `num_threads` threads (a multiple of 32) that all name
// the same id; other warps are not held.
template <int kId>
__device__ __forceinline__ void named_barrier_sync(int num_threads) {
    asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "r"(num_threads) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPendingGroups>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPendingGroups));
}

// Four 8x8 b16 matrices; lane i supplies the row address for matrix i / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&frag)[4], uint32_t smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
                 : "r"(smem_row));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&frag)[4], uint32_t smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
                 : "r"(smem_row));
}

// Two 8x8 b16 matrices; lane i < 16 supplies the row address for matrix
// i / 8 (the other lanes' addresses are not read).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&frag)[2], uint32_t smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(frag[0]), "=r"(frag[1])
                 : "r"(smem_row));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&frag)[2], uint32_t smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(frag[0]), "=r"(frag[1])
                 : "r"(smem_row));
}

// D = A * B + D for one m16n8k16 tile, fp32 accumulation.
template <typename Element>
__device__ __forceinline__ void mma_m16n8k16(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0,
                                                     uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0,
                                                            uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to the element type, packed low-first into one register
// (the order the MMA operand fragments and 32-bit stores expect).
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

// 2^x with the hardware approximation (2 ulp); exp2(-inf) = +0, which the
// masking relies on.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// 1/x with the hardware approximation (1 ulp); 1/inf = +0.
__device__ __forceinline__ float fast_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

}  // namespace flashcore
