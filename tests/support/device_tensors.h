// Host <-> device helpers for the GPU tests and the demo: CUDA error checks,
// fp16/bf16 conversion, strided attention tensors with their logical view
// (of 16-bit elements, or of the one-byte e4m3 elements of an fp8 K/V cache).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashcore.h"

namespace flashcore_test {

// Throws with the failed call and the CUDA error: tests report it as a
// failure, the demo prints it.
#define FC_CHECK_CUDA(call)                                                                                   \
    do {                                                                                                      \
        const cudaError_t err_ = (call);                                                                      \
        if (err_ != cudaSuccess)                                                                              \
            throw std::runtime_error(std::string(#call) + " failed: " + cudaGetErrorString(err_) + " at " +   \
                                     __FILE__ + ":" + std::to_string(__LINE__));                              \
    } while (0)

// Whether a CUDA device is usable here; *reason says why not.
bool cuda_device_available(std::string *reason);

// Bytes of one element of a tensor of `dtype`: 1 for FLASHCORE_DTYPE_FP8_E4M3,
// 2 for fp16 and bf16 (the tensors here hold no other).
size_t element_bytes(flashcore_dtype dtype);

// Rounds through the element type and returns the rounded value.
float round_to(flashcore_dtype dtype, float x);
uint16_t to_bits(flashcore_dtype dtype, float x);
float from_bits(flashcore_dtype dtype, uint16_t bits);

// Bytes of the guard bands allocated before and after the test buffers
// (a multiple of cudaMalloc's 256-byte alignment, so the buffers keep it),
// and the byte they hold: a kernel or a launcher that writes outside the
// caller's tensors shows up as a changed guard byte.
constexpr size_t kGuardBytes = 256;
constexpr unsigned char kGuardByte = 0xA5;

// Every helper here that writes device memory (allocate, upload, poison)
// returns only once the device has done it. cudaMemset and a pageable
// cudaMemcpy to the device may return before their work lands, and that
// work is on the legacy default stream, which a cudaStreamNonBlocking
// stream does not wait for: a test that launches on its own stream would
// otherwise race its own setup (the multi-threaded test's last thread read
// a V still being copied).
void finish_device_writes();

// Device memory of `bytes` between two guard bands; `data` is the caller's
// part. check() names the first changed guard byte, or returns "".
struct GuardedBuffer {
    unsigned char *base = nullptr;
    void *data = nullptr;
    size_t bytes = 0;

    GuardedBuffer() = default;
    explicit GuardedBuffer(size_t bytes_) { allocate(bytes_); }
    GuardedBuffer(const GuardedBuffer &) = delete;
    GuardedBuffer &operator=(const GuardedBuffer &) = delete;
    ~GuardedBuffer();
    void allocate(size_t bytes_);
    std::string check(const char *what) const;
};

// One attention tensor on the device: [batch, heads, seqlen, head_dim]
// logically, stored with arbitrary element strides inside a buffer of
// `capacity` elements of `element_bytes` each, between guard bands.
struct DeviceTensor {
    int batch = 0, heads = 0, seqlen = 0, head_dim = 0;
    int64_t batch_stride = 0, seq_stride = 0, head_stride = 0;
    size_t capacity = 0;
    size_t element_bytes = 2;  // 1: e4m3 (an fp8 K/V cache)
    void *data = nullptr;
    GuardedBuffer memory;

    DeviceTensor() = default;
    DeviceTensor(const DeviceTensor &) = delete;
    DeviceTensor &operator=(const DeviceTensor &) = delete;
    ~DeviceTensor() = default;

    // Elements of element_bytes_ bytes (element_bytes(dtype) of what it will hold).
    void allocate(int batch_, int heads_, int seqlen_, int head_dim_, int64_t batch_stride_, int64_t seq_stride_,
                  int64_t head_stride_, size_t element_bytes_ = 2);
    size_t offset(int b, int h, int s) const { return size_t(b * batch_stride + h * head_stride + s * seq_stride); }
    // Calls f(element offset) for every element of the logical view, in
    // dense BHSD order.
    template <typename F>
    void for_each_view_offset(F &&f) const {
        for (int b = 0; b < batch; ++b)
            for (int h = 0; h < heads; ++h)
                for (int s = 0; s < seqlen; ++s)
                    for (int c = 0; c < head_dim; ++c) f(offset(b, h, s) + size_t(c));
    }
    // Writes dense BHSD float values (rounded to dtype: e4m3_encode for
    // FLASHCORE_DTYPE_FP8_E4M3, whose tensors pass values it holds exactly)
    // into the strided layout. dtype's elements must be element_bytes wide.
    void upload(flashcore_dtype dtype, const std::vector<float> &dense_bhsd);
    // Reads the strided layout back as dense BHSD floats.
    std::vector<float> download(flashcore_dtype dtype) const;
    // Fills the whole buffer with 0xFF bytes: NaN in fp16, bf16 and e4m3.
    void poison();
    // "" if the guard bands are intact and every element outside the
    // logical view (the padding of strided layouts) still holds the poison
    // that upload() and poison() put there; else what changed.
    std::string check_untouched(const char *what) const;
};

// n values from a normal distribution, rounded to dtype.
std::vector<float> random_values(flashcore_dtype dtype, size_t n, std::mt19937_64 &rng);

}  // namespace flashcore_test
