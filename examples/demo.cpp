// flashcore_demo: the mission shape (B=1, H=8, S=512, D=64, fp16) through the
// public C API, checked against the float64 reference, with p50/p90 latency.
// Exits non-zero without a GPU or when the result is wrong.
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "device_tensors.h"
#include "flashcore.h"
#include "reference.h"

using namespace flashcore_test;

namespace {

constexpr int kBatch = 1, kHeads = 8, kSeqlen = 512, kHeadDim = 64;
constexpr int kWarmupCalls = 50;
constexpr int kTimedCalls = 1000;
// fp16 error bar against the float64 reference (as in the GPU tests).
constexpr double kMaxRelL2 = 5.7e-4;

int run() {
    // The library's own message says what is missing: the driver, a newer
    // driver, a device, or a device of compute capability 8.0 or newer.
    flashcore_handle handle;
    flashcore_status status = flashcore_create(&handle);
    if (status == FLASHCORE_STATUS_NO_DEVICE || status == FLASHCORE_STATUS_UNSUPPORTED) {
        std::fprintf(stderr, "flashcore_demo needs an NVIDIA GPU (sm_80 or newer): %s\n",
                     flashcore_last_error_message());
        return 1;
    }
    if (status != FLASHCORE_STATUS_SUCCESS) {
        std::fprintf(stderr, "flashcore_create: %s: %s\n", flashcore_status_string(status),
                     flashcore_last_error_message());
        return 1;
    }
    cudaDeviceProp prop;
    FC_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));

    const flashcore_dtype dtype = FLASHCORE_DTYPE_FP16;
    std::mt19937_64 rng(std::random_device{}());
    const size_t count = size_t(kBatch) * kHeads * kSeqlen * kHeadDim;
    const std::vector<float> q = random_values(dtype, count, rng), k = random_values(dtype, count, rng),
                             v = random_values(dtype, count, rng);
    const int64_t seq_stride = kHeadDim, head_stride = int64_t(kSeqlen) * kHeadDim,
                  batch_stride = kHeads * head_stride;
    DeviceTensor dq, dk, dv, dout;
    for (DeviceTensor *t : {&dq, &dk, &dv, &dout})
        t->allocate(kBatch, kHeads, kSeqlen, kHeadDim, batch_stride, seq_stride, head_stride);
    dq.upload(dtype, q);
    dk.upload(dtype, k);
    dv.upload(dtype, v);

    flashcore_forward_params p;
    flashcore_forward_params_init(&p, sizeof p);
    p.dtype = dtype;
    p.batch_size = kBatch;
    p.seqlen_q = p.seqlen_k = kSeqlen;
    p.num_heads_q = p.num_heads_kv = kHeads;
    p.head_dim = kHeadDim;
    p.q = dq.data;
    p.k = dk.data;
    p.v = dv.data;
    p.out = dout.data;
    flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD);

    size_t ws_bytes = 0;
    void *ws = nullptr;
    status = flashcore_forward_workspace_size(handle, &p, &ws_bytes);
    if (status == FLASHCORE_STATUS_SUCCESS && ws_bytes > 0) FC_CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    if (status == FLASHCORE_STATUS_SUCCESS) status = flashcore_forward(handle, &p, ws, ws_bytes, nullptr);
    if (status != FLASHCORE_STATUS_SUCCESS) {
        std::fprintf(stderr, "flashcore_forward: %s: %s\n", flashcore_status_string(status),
                     flashcore_last_error_message());
        return 1;
    }
    FC_CHECK_CUDA(cudaGetLastError());
    FC_CHECK_CUDA(cudaDeviceSynchronize());

    Problem problem;
    problem.batch = kBatch;
    problem.seqlen_q = problem.seqlen_k = kSeqlen;
    problem.heads_q = problem.heads_kv = kHeads;
    problem.head_dim = kHeadDim;
    std::vector<double> ref_out, ref_lse;
    reference_attention(problem, q, k, v, ref_out, ref_lse);
    const ErrorStats e = compare(dout.download(dtype), ref_out);

    cudaEvent_t start, stop;
    FC_CHECK_CUDA(cudaEventCreate(&start));
    FC_CHECK_CUDA(cudaEventCreate(&stop));
    for (int i = 0; i < kWarmupCalls; ++i) flashcore_forward(handle, &p, ws, ws_bytes, nullptr);
    std::vector<float> us(kTimedCalls);
    for (int i = 0; i < kTimedCalls; ++i) {
        FC_CHECK_CUDA(cudaEventRecord(start));
        flashcore_forward(handle, &p, ws, ws_bytes, nullptr);
        FC_CHECK_CUDA(cudaEventRecord(stop));
        FC_CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0;
        FC_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        us[i] = ms * 1000.f;
    }
    FC_CHECK_CUDA(cudaGetLastError());
    std::sort(us.begin(), us.end());
    const double p50 = us[kTimedCalls / 2], p90 = us[kTimedCalls * 9 / 10];
    const double flops = 4.0 * kBatch * kHeads * kSeqlen * kSeqlen * kHeadDim;
    const bool ok = e.non_finite == 0 && e.rel_l2 <= kMaxRelL2;

    std::printf("flashcore %s on %s (sm_%d%d, %d SMs)\n", flashcore_version_string(), prop.name, prop.major,
                prop.minor, prop.multiProcessorCount);
    std::printf("shape B=%d H=%d S=%d D=%d fp16, non-causal\n", kBatch, kHeads, kSeqlen, kHeadDim);
    std::printf("vs float64 reference: max_abs_err=%.3e rel_l2_err=%.3e non_finite=%zu -> %s\n", e.max_abs,
                e.rel_l2, e.non_finite, ok ? "OK" : "FAILED");
    std::printf("latency over %d calls (CUDA events, single call): p50=%.2f us p90=%.2f us (%.1f TFLOP/s at p50)\n",
                kTimedCalls, p50, p90, flops / (p50 * 1e-6) / 1e12);
    if (ws != nullptr) cudaFree(ws);
    flashcore_destroy(handle);
    return ok ? 0 : 1;
}

}  // namespace

int main() {
    try {
        return run();
    } catch (const std::exception &ex) {
        std::fprintf(stderr, "flashcore_demo: %s\n", ex.what());
        return 1;
    }
}
