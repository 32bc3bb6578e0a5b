#include "device_tensors.h"

#include <cstring>

#include "reference.h"

namespace flashcore_test {

bool cuda_device_available(std::string *reason) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError();
        // The library tells a missing driver from an old one; the runtime's
        // own string says "insufficient" for both.
        flashcore_handle handle = nullptr;
        if (flashcore_create(&handle) == FLASHCORE_STATUS_NO_DEVICE) {
            *reason = std::string("no CUDA device: ") + flashcore_last_error_message();
        } else {
            flashcore_destroy(handle);
            *reason = std::string("no CUDA device: ") + cudaGetErrorString(err);
        }
        return false;
    }
    if (count == 0) {
        *reason = "no CUDA device is visible";
        return false;
    }
    return true;
}

size_t element_bytes(flashcore_dtype dtype) { return dtype == FLASHCORE_DTYPE_FP8_E4M3 ? 1 : 2; }

uint16_t to_bits(flashcore_dtype dtype, float x) {
    uint16_t bits;
    if (dtype == FLASHCORE_DTYPE_BF16) {
        const __nv_bfloat16 h = __float2bfloat16_rn(x);
        std::memcpy(&bits, &h, sizeof bits);
    } else {
        const __half h = __float2half_rn(x);
        std::memcpy(&bits, &h, sizeof bits);
    }
    return bits;
}

float from_bits(flashcore_dtype dtype, uint16_t bits) {
    if (dtype == FLASHCORE_DTYPE_BF16) {
        __nv_bfloat16 h;
        std::memcpy(&h, &bits, sizeof bits);
        return __bfloat162float(h);
    }
    __half h;
    std::memcpy(&h, &bits, sizeof bits);
    return __half2float(h);
}

float round_to(flashcore_dtype dtype, float x) { return from_bits(dtype, to_bits(dtype, x)); }

GuardedBuffer::~GuardedBuffer() {
    if (base != nullptr) cudaFree(base);
}

void GuardedBuffer::allocate(size_t bytes_) {
    bytes = bytes_;
    void *allocation = nullptr;
    FC_CHECK_CUDA(cudaMalloc(&allocation, bytes + 2 * kGuardBytes));
    base = static_cast<unsigned char *>(allocation);
    data = base + kGuardBytes;
    FC_CHECK_CUDA(cudaMemset(base, kGuardByte, kGuardBytes));
    FC_CHECK_CUDA(cudaMemset(base + kGuardBytes + bytes, kGuardByte, kGuardBytes));
    finish_device_writes();
}

void finish_device_writes() { FC_CHECK_CUDA(cudaDeviceSynchronize()); }

std::string GuardedBuffer::check(const char *what) const {
    std::vector<unsigned char> band(kGuardBytes);
    const unsigned char *bands[2] = {base, base + kGuardBytes + bytes};
    for (int side = 0; side < 2; ++side) {
        FC_CHECK_CUDA(cudaMemcpy(band.data(), bands[side], kGuardBytes, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < kGuardBytes; ++i) {
            if (band[i] != kGuardByte) {
                const long long at = side == 0 ? -static_cast<long long>(kGuardBytes - i)
                                               : static_cast<long long>(bytes + i);
                return std::string(what) + ": guard byte at offset " + std::to_string(at) + " (of a " +
                       std::to_string(bytes) + "-byte buffer) was overwritten";
            }
        }
    }
    return "";
}

void DeviceTensor::allocate(int batch_, int heads_, int seqlen_, int head_dim_, int64_t batch_stride_,
                            int64_t seq_stride_, int64_t head_stride_, size_t element_bytes_) {
    batch = batch_;
    heads = heads_;
    seqlen = seqlen_;
    head_dim = head_dim_;
    batch_stride = batch_stride_;
    seq_stride = seq_stride_;
    head_stride = head_stride_;
    element_bytes = element_bytes_;
    // An empty view (seqlen 0, as a call without queries has) holds nothing.
    const bool empty = batch == 0 || heads == 0 || seqlen == 0;
    capacity = empty ? 0 : offset(batch - 1, heads - 1, seqlen - 1) + size_t(head_dim);
    memory.allocate(capacity * element_bytes);
    data = memory.data;
    poison();
}

namespace {

// A tensor's element type must match the dtype its values are converted by:
// a mismatch would write or read the wrong bytes.
void check_element_type(const DeviceTensor &t, flashcore_dtype dtype) {
    if (element_bytes(dtype) != t.element_bytes) {
        throw std::logic_error("a tensor of " + std::to_string(t.element_bytes) + "-byte elements used as dtype " +
                               std::to_string(int(dtype)));
    }
}

}  // namespace

void DeviceTensor::upload(flashcore_dtype dtype, const std::vector<float> &dense) {
    check_element_type(*this, dtype);
    if (capacity == 0) return;  // an empty view (seqlen 0): nothing to copy
    // Outside the view: the poison's 0xFF bytes, which check_untouched expects.
    std::vector<unsigned char> host(capacity * element_bytes, 0xFF);
    size_t i = 0;
    for_each_view_offset([&](size_t at) {
        if (dtype == FLASHCORE_DTYPE_FP8_E4M3) {
            host[at] = e4m3_encode(dense[i++]);
        } else {
            const uint16_t bits = to_bits(dtype, dense[i++]);
            std::memcpy(&host[at * 2], &bits, sizeof bits);
        }
    });
    FC_CHECK_CUDA(cudaMemcpy(data, host.data(), host.size(), cudaMemcpyHostToDevice));
    finish_device_writes();
}

std::vector<float> DeviceTensor::download(flashcore_dtype dtype) const {
    check_element_type(*this, dtype);
    if (capacity == 0) return {};
    std::vector<unsigned char> host(capacity * element_bytes);
    FC_CHECK_CUDA(cudaMemcpy(host.data(), data, host.size(), cudaMemcpyDeviceToHost));
    std::vector<float> dense;
    dense.reserve(size_t(batch) * heads * seqlen * head_dim);
    for_each_view_offset([&](size_t at) {
        if (dtype == FLASHCORE_DTYPE_FP8_E4M3) {
            dense.push_back(float(e4m3_decode(host[at])));
        } else {
            uint16_t bits;
            std::memcpy(&bits, &host[at * 2], sizeof bits);
            dense.push_back(from_bits(dtype, bits));
        }
    });
    return dense;
}

void DeviceTensor::poison() {
    FC_CHECK_CUDA(cudaMemset(data, 0xFF, capacity * element_bytes));
    finish_device_writes();
}

std::string DeviceTensor::check_untouched(const char *what) const {
    const std::string guards = memory.check(what);
    if (!guards.empty() || capacity == 0) return guards;
    std::vector<unsigned char> host(capacity * element_bytes);
    FC_CHECK_CUDA(cudaMemcpy(host.data(), data, host.size(), cudaMemcpyDeviceToHost));
    std::vector<bool> in_view(capacity, false);
    for_each_view_offset([&](size_t at) { in_view[at] = true; });
    for (size_t i = 0; i < capacity; ++i) {
        if (in_view[i]) continue;
        for (size_t byte = 0; byte < element_bytes; ++byte) {
            if (host[i * element_bytes + byte] != 0xFF) {
                return std::string(what) + ": element " + std::to_string(i) +
                       " lies outside the tensor's view (padding) and was overwritten";
            }
        }
    }
    return "";
}

std::vector<float> random_values(flashcore_dtype dtype, size_t n, std::mt19937_64 &rng) {
    std::normal_distribution<float> dist(0.f, 1.f);
    std::vector<float> values(n);
    for (auto &x : values) x = round_to(dtype, dist(rng));
    return values;
}

}  // namespace flashcore_test
