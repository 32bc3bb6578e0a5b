// flashcore_bench: latency and throughput of flashcore_forward, or with
// --backward of flashcore_backward, through the public C API only
// (include/flashcore.h) plus the CUDA runtime for memory, streams, events
// and graphs. No device code: inputs are generated on the host and copied
// over.
//
// Two measurements per case (see bench/README.md for the details):
//   graph  - N calls captured in one CUDA graph, the graph replayed many
//            times after warm-up, each replay timed with events; the median
//            replay time / N is the per-call time (GPU time, launch
//            overhead hidden).
//   single - one call at a time between two events, synchronised after each
//            call; p50 and p90 over many calls (includes the host-side
//            validation and launch of the call as the GPU sees it).
//
// --backward times flashcore_backward (dq, dk and dv, all three of its
// kernels) on out and lse that one flashcore_forward call per buffer set
// computed beforehand, outside the timing.
//
// Exit status: 0 all cases ran and passed the output check, 1 a case failed
// (error or non-finite output), 2 no usable GPU, 3 bad command line.

#include <flashcore.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitNoDevice = 2;
constexpr int kExitUsage = 3;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

// Something that ends the whole run (a CUDA error leaves the context suspect).
struct FatalError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Something that ends one case only (flashcore rejected the parameters).
struct CaseError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::string strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
    if (n > 0) std::vsnprintf(&s[0], s.size() + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

void cuda_check(cudaError_t err, const char *what, const char *file, int line) {
    if (err != cudaSuccess)
        throw FatalError(
            strprintf("%s:%d: %s failed: %s (%s)", file, line, what, cudaGetErrorString(err), cudaGetErrorName(err)));
}
#define CUDA_CHECK(expr) cuda_check((expr), #expr, __FILE__, __LINE__)

// For destructors, which must not throw: report and carry on.
void cuda_warn(cudaError_t err, const char *what) {
    if (err != cudaSuccess) std::fprintf(stderr, "flashcore_bench: warning: %s: %s\n", what, cudaGetErrorString(err));
}

std::string flashcore_error(flashcore_status st, const char *what) {
    return strprintf("%s: %s: %s", what, flashcore_status_string(st), flashcore_last_error_message());
}

// Invalid parameters or unsupported shapes end the case; anything else (CUDA
// errors, out of memory, internal errors) ends the run.
void fc_check(flashcore_status st, const char *what) {
    if (st == FLASHCORE_STATUS_SUCCESS) return;
    std::string msg = flashcore_error(st, what);
    if (st == FLASHCORE_STATUS_INVALID_ARGUMENT || st == FLASHCORE_STATUS_UNSUPPORTED ||
        st == FLASHCORE_STATUS_MISALIGNED)
        throw CaseError(msg);
    throw FatalError(msg);
}

// ---------------------------------------------------------------------------
// RAII wrappers for CUDA objects
// ---------------------------------------------------------------------------

class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
        if (bytes > 0) CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    }
    DeviceBuffer(DeviceBuffer &&o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
    DeviceBuffer &operator=(DeviceBuffer &&o) noexcept {
        std::swap(ptr_, o.ptr_);
        std::swap(bytes_, o.bytes_);
        return *this;
    }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    ~DeviceBuffer() {
        if (ptr_) cuda_warn(cudaFree(ptr_), "cudaFree");
    }
    void *get() const { return ptr_; }
    size_t bytes() const { return bytes_; }

  private:
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
};

class Stream {
  public:
    Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~Stream() { cuda_warn(cudaStreamDestroy(s_), "cudaStreamDestroy"); }
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    cudaStream_t get() const { return s_; }

  private:
    cudaStream_t s_ = nullptr;
};

class Events {
  public:
    explicit Events(size_t n) : ev_(n, nullptr) {
        for (auto &e : ev_) CUDA_CHECK(cudaEventCreate(&e));
    }
    ~Events() {
        for (auto e : ev_)
            if (e) cuda_warn(cudaEventDestroy(e), "cudaEventDestroy");
    }
    Events(const Events &) = delete;
    Events &operator=(const Events &) = delete;
    cudaEvent_t operator[](size_t i) const { return ev_[i]; }
    float ms_between(size_t a, size_t b) const {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, ev_[a], ev_[b]));
        return ms;
    }

  private:
    std::vector<cudaEvent_t> ev_;
};

class GraphExec {
  public:
    GraphExec() = default;
    ~GraphExec() {
        if (exec_) cuda_warn(cudaGraphExecDestroy(exec_), "cudaGraphExecDestroy");
        if (graph_) cuda_warn(cudaGraphDestroy(graph_), "cudaGraphDestroy");
    }
    GraphExec(const GraphExec &) = delete;
    GraphExec &operator=(const GraphExec &) = delete;
    cudaGraph_t *graph_slot() { return &graph_; }
    void instantiate() { CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0)); }
    void launch(cudaStream_t s) const { CUDA_CHECK(cudaGraphLaunch(exec_, s)); }

  private:
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
};

// ---------------------------------------------------------------------------
// Host-side data generation and 16-bit float conversion
// ---------------------------------------------------------------------------

uint64_t splitmix64(uint64_t &state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint16_t float_to_half_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t exp = (x >> 23) & 0xFFu;
    uint32_t mant = x & 0x7FFFFFu;
    if (exp == 0xFFu) return static_cast<uint16_t>(sign | 0x7C00u | (mant ? 0x200u : 0u));
    const int e = static_cast<int>(exp) - 127 + 15;
    if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
    uint32_t shift = 13, h;
    if (e <= 0) {  // half subnormal (or zero)
        if (e < -10) return static_cast<uint16_t>(sign);
        mant |= 0x800000u;
        shift = static_cast<uint32_t>(14 - e);
        h = mant >> shift;
    } else {
        h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
    }
    const uint32_t rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;  // round to nearest even; may carry into exponent
    return static_cast<uint16_t>(sign | h);
}

float half_bits_to_float(uint16_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    if (exp == 0) {
        const float f = std::ldexp(static_cast<float>(mant), -24);
        return sign ? -f : f;
    }
    const uint32_t x = sign | (exp == 31 ? (0xFFu << 23) | (mant << 13) : ((exp + 112u) << 23) | (mant << 13));
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

uint16_t float_to_bf16_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    x += 0x7FFFu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
}

float bf16_bits_to_float(uint16_t b) {
    const uint32_t x = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

// Approximately standard-normal values (sum of four uniforms, variance 1),
// never all zero, as 16-bit floats of the requested type.
void fill_random(std::vector<uint16_t> &out, size_t n, flashcore_dtype dtype, uint64_t seed) {
    out.resize(n);
    uint64_t state = seed;
    const float scale = std::sqrt(3.0f) / 65536.0f;
    for (size_t i = 0; i < n; ++i) {
        const uint64_t r = splitmix64(state);
        const int32_t sum = static_cast<int32_t>(r & 0xFFFF) + static_cast<int32_t>((r >> 16) & 0xFFFF) +
                            static_cast<int32_t>((r >> 32) & 0xFFFF) + static_cast<int32_t>(r >> 48) - 131072;
        const float v = static_cast<float>(sum) * scale;
        out[i] = dtype == FLASHCORE_DTYPE_BF16 ? float_to_bf16_bits(v) : float_to_half_bits(v);
    }
}

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------

struct Shape {
    std::string name;
    int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v;
};

struct Preset {
    const char *name;
    int batch, heads, seqlen, head_dim, head_dim_v;
    const char *note;
};

// Keep in step with PRESETS in compare.py.
// clang-format off
const Preset kPresets[] = {
    {"mission", 1, 8, 512, 64, 64, "the mission shape"},
    {"short", 1, 8, 256, 64, 64, "short sequence"},
    {"long", 1, 8, 1024, 64, 64, "long sequence"},
    {"tput-2k-d64", 16, 16, 2048, 64, 64, "throughput"},
    {"tput-8k-d64", 4, 16, 8192, 64, 64, "throughput"},
    {"tput-16k-d64", 2, 16, 16384, 64, 64, "throughput"},
    {"tput-2k-d128", 16, 16, 2048, 128, 128, "throughput"},
    {"tput-8k-d128", 4, 16, 8192, 128, 128, "throughput"},
    {"tput-16k-d128", 2, 16, 16384, 128, 128, "throughput"},
    {"tput-2k-d96", 16, 16, 2048, 96, 96, "throughput (Phi-style head dim)"},
    {"tput-8k-d96", 4, 16, 8192, 96, 96, "throughput (Phi-style head dim)"},
    {"tput-4k-h32-d96", 4, 32, 4096, 96, 96, "throughput (Phi-style head dim)"},
    {"tput-2k-d192", 16, 16, 2048, 192, 128, "throughput (DeepSeek-style prefill)"},
    {"tput-8k-d192", 4, 16, 8192, 192, 128, "throughput (DeepSeek-style prefill)"},
    {"tput-2k-d256", 16, 16, 2048, 256, 256, "throughput (Gemma-style head dim)"},
    {"tput-8k-d256", 4, 16, 8192, 256, 256, "throughput (Gemma-style head dim)"},
    {"tput-4k-d256", 4, 16, 4096, 256, 256, "throughput (Gemma-style head dim; issue 34's d256 backward target)"},
    {"tput-4k-b8-d256", 8, 16, 4096, 256, 256, "throughput (Gemma-style head dim; issue 36's d256 fp8 prefill target)"},
    {"tput-2k-d32", 16, 16, 2048, 32, 32, "throughput (small head dim)"},
    {"tput-8k-d32", 4, 16, 8192, 32, 32, "throughput (small head dim)"},
};
// clang-format on

// Names that select several presets.
struct PresetGroup {
    const char *name;
    std::vector<const char *> presets;
    const char *note;
};
const PresetGroup kPresetGroups[] = {
    {"backward-targets",
     {"tput-2k-d64", "tput-8k-d64", "tput-2k-d128", "tput-8k-d128", "tput-4k-d256"},
     "issue 34's backward targets; run with --backward --mask both"},
};

// --sinks' logit for every head: about a row's log-sum-exp over a few
// thousand keys of these random inputs, so the sink takes a real share.
constexpr float kSinkLogit = 4.f;

struct Case {
    Shape shape;
    flashcore_dtype dtype;
    bool causal;
    flashcore_layout layout;
    // --window LEFT,RIGHT (flashcore_forward_params::window_left/right; -1
    // unbounded); use_window false: none.
    bool use_window = false;
    int window_left = -1, window_right = -1;
    // --chunk N (flashcore_forward_params::attention_chunk; 0: none).
    int attention_chunk = 0;
};

const char *dtype_name(flashcore_dtype d) { return d == FLASHCORE_DTYPE_BF16 ? "bf16" : "fp16"; }
const char *layout_name(flashcore_layout l) { return l == FLASHCORE_LAYOUT_BSHD ? "bshd" : "bhsd"; }

// Query/key pairs the mask lets through, summed over one head. Causal masks
// are aligned bottom-right (flashcore.h): query i sees keys j <= i + Sk - Sq.
// For Sq == Sk this is S(S+1)/2, i.e. "half" plus the diagonal.
double visible_pairs(int64_t sq, int64_t sk, bool causal) {
    if (!causal) return static_cast<double>(sq) * static_cast<double>(sk);
    if (sk >= sq) return static_cast<double>(sq) * sk - static_cast<double>(sq) * (sq - 1) / 2.0;
    return static_cast<double>(sk) * (sk + 1) / 2.0;  // the first Sq - Sk rows see nothing
}

// The same under a sliding window (flashcore.h: query i sees keys
// i + Sk - Sq - left ... i + Sk - Sq + right) and chunks (only the keys of
// the chunk holding the diagonal), counted row by row.
double window_visible_pairs(const Case &c) {
    const Shape &s = c.shape;
    double pairs = 0;
    for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const int64_t diagonal = i + s.seqlen_k - s.seqlen_q;
        int64_t begin = 0, end = s.seqlen_k;
        if (c.use_window && c.window_left >= 0) begin = std::max<int64_t>(begin, diagonal - c.window_left);
        if (c.causal) end = std::min<int64_t>(end, diagonal + 1);
        if (c.use_window && c.window_right >= 0) end = std::min<int64_t>(end, diagonal + 1 + c.window_right);
        if (c.attention_chunk > 0) {
            // Floor division: a diagonal below key 0 lies in a chunk of no keys.
            const int64_t chunk = c.attention_chunk;
            const int64_t start = (diagonal >= 0 ? diagonal / chunk : -((-diagonal + chunk - 1) / chunk)) * chunk;
            begin = std::max(begin, start);
            end = std::min(end, start + chunk);
        }
        if (end > begin) pairs += double(end - begin);
    }
    return pairs;
}

// Two matrix products, 2 flops per multiply-add: Q K^T (head_dim per pair)
// and P V (head_dim_v per pair); 4*B*Hq*D*pairs when the two are equal.
double attention_flops(const Case &c) {
    const Shape &s = c.shape;
    const double pairs = c.use_window || c.attention_chunk > 0 ? window_visible_pairs(c)
                                                                : visible_pairs(s.seqlen_q, s.seqlen_k, c.causal);
    return 2.0 * s.batch * s.heads_q * (s.head_dim + s.head_dim_v) * pairs;
}

// The backward pass's flops, by the convention FlashAttention's benchmarks
// and issue 34's anchors use: 2.5 times the forward's (five matrix products
// against two: Q K^T recomputed, dO V^T, P^T dO, dS K, dS^T Q). Exact when
// head_dim_v = head_dim; otherwise the products count 2*(3*D + 2*Dv) flops
// a pair against this 2.5*2*(D + Dv).
constexpr double kBackwardFlopsPerForwardFlop = 2.5;

double case_flops(const Case &c, bool backward) {
    return attention_flops(c) * (backward ? kBackwardFlopsPerForwardFlop : 1.0);
}

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

struct Options {
    std::vector<std::string> presets;
    // Shape overrides, -1 when not given.
    int batch = -1, heads_q = -1, heads_kv = -1, seqlen_q = -1, seqlen_k = -1, head_dim = -1, head_dim_v = -1;
    std::vector<flashcore_dtype> dtypes{FLASHCORE_DTYPE_FP16};
    std::vector<bool> masks{false};
    flashcore_layout layout = FLASHCORE_LAYOUT_BHSD;
    float softmax_scale = FLASHCORE_SOFTMAX_SCALE_DEFAULT;
    bool use_window = false;
    int window_left = -1, window_right = -1;
    float softcap = 0.f;
    int attention_chunk = 0;
    // --sinks: learnable sinks, one logit per query head (kSinkLogit).
    bool sinks = false;
    int device = -1;
    int buffer_sets = 0;  // 0: auto
    int graph_calls = 20;
    int replays = 0;  // 0: auto
    int iters = 0;    // 0: auto
    int num_splits = 0;  // flashcore_forward_params::num_splits (0: the library's choice)
    bool num_splits_given = false;
    bool backward = false;       // time flashcore_backward instead of flashcore_forward
    bool deterministic = false;  // flashcore_backward_params::deterministic
    double budget_ms = 300.0;
    uint64_t seed = 1234;
    bool json = false;
    std::string json_out;  // also write the JSON document to this file
    bool check = true;
    bool list = false;
};

void print_usage(FILE *f) {
    std::fprintf(f,
                 "usage: flashcore_bench [options]\n"
                 "\n"
                 "Shapes (default: --preset mission):\n"
                 "  --preset NAME[,NAME...]   named shape(s); --list shows them (repeatable)\n"
                 "  --all                     every preset\n"
                 "  --batch N, -b N           batch size\n"
                 "  --heads N                 query heads (also key/value heads unless --heads-kv)\n"
                 "  --heads-kv N              key/value heads (GQA/MQA: a divisor of --heads)\n"
                 "  --seqlen N                query and key length\n"
                 "  --seqlen-q N, --seqlen-k N  separate lengths\n"
                 "  --head-dim N              head dim of q and k (and of v and out unless\n"
                 "                            --head-dim-v): a multiple of 8 that a kernel of\n"
                 "                            this build covers (--list shows them)\n"
                 "  --num-splits N            split-KV parts (0: the library's choice, 1: none)\n"
                 "  --head-dim-v N            head dim of v and out (default: --head-dim if\n"
                 "                            given, else the preset's)\n"
                 "  Shape options given with presets override those fields of each preset;\n"
                 "  without presets they override the mission shape.\n"
                 "\n"
                 "Variants (each combination is a case):\n"
                 "  --dtype fp16|bf16|all     (comma list; default fp16)\n"
                 "  --causal                  causal mask only (bottom-right aligned)\n"
                 "  --mask none|causal|both   (default none)\n"
                 "  --layout bhsd|bshd        packed storage order (default bhsd)\n"
                 "  --scale F                 softmax scale (default 1/sqrt(head_dim))\n"
                 "  --window L,R              sliding window: keys seen left and right of each\n"
                 "                            query's diagonal, -1 unbounded (with --causal, R\n"
                 "                            is 0 or -1); TFLOP/s count the window's pairs\n"
                 "  --softcap F               logit softcap (default 0: none)\n"
                 "  --chunk N                 chunked attention (attention_chunk; TFLOP/s count\n"
                 "                            the pairs it leaves)\n"
                 "  --sinks                   learnable sinks (one logit per query head; with\n"
                 "                            --backward dsinks too)\n"
                 "\n"
                 "Pass:\n"
                 "  --backward                time flashcore_backward (dq, dk, dv) on out and lse from\n"
                 "                            a forward call made beforehand; TFLOP/s count 2.5x the\n"
                 "                            forward's flops (--preset backward-targets: issue 34's)\n"
                 "  --deterministic           with --backward: the deterministic mode (bitwise-\n"
                 "                            identical dq run to run)\n"
                 "\n"
                 "Timing:\n"
                 "  --budget-ms F             target GPU time per measurement (default 300)\n"
                 "  --graph-calls N           calls captured per graph, at most (default 20; raised\n"
                 "                            to a multiple of the buffer-set count)\n"
                 "  --replays N               graph replays timed (default: from the budget)\n"
                 "  --iters N                 single calls timed (default: from the budget)\n"
                 "  --buffers N               input/output sets to rotate (default: enough to\n"
                 "                            exceed twice the L2 cache; 1 measures warm L2)\n"
                 "\n"
                 "Other:\n"
                 "  --device N                CUDA device ordinal (default: current device)\n"
                 "  --seed N                  random-data seed\n"
                 "  --no-check                skip the finite-output check\n"
                 "  --json                    print one JSON document on stdout (progress on stderr)\n"
                 "  --json-out PATH           print the table and write the JSON document to PATH\n"
                 "  --list                    list presets (and preset groups) and exit\n"
                 "  -h, --help\n"
                 "\n"
                 "Exit status: 0 ok, 1 a case failed, 2 no usable GPU, 3 bad command line.\n");
}

long parse_int(const std::string &opt, const std::string &v, long lo, long hi) {
    char *end = nullptr;
    errno = 0;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi)
        throw UsageError(strprintf("%s: expected an integer in [%ld, %ld], got '%s'", opt.c_str(), lo, hi, v.c_str()));
    return x;
}

double parse_double(const std::string &opt, const std::string &v, double lo) {
    char *end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(x) || x < lo)
        throw UsageError(strprintf("%s: expected a number >= %g, got '%s'", opt.c_str(), lo, v.c_str()));
    return x;
}

std::vector<std::string> split_commas(const std::string &s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= s.size()) {
        const size_t comma = s.find(',', start);
        const size_t end = comma == std::string::npos ? s.size() : comma;
        if (end > start) out.push_back(s.substr(start, end - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

// Options that take one integer, stored as is.
struct IntOption {
    const char *flag;
    int Options::*field;
    long lo, hi;
};

constexpr long kMaxDim = 1L << 30;
const IntOption kIntOptions[] = {
    {"--batch", &Options::batch, 1, kMaxDim},       {"-b", &Options::batch, 1, kMaxDim},
    {"--heads", &Options::heads_q, 1, kMaxDim},     {"--heads-kv", &Options::heads_kv, 1, kMaxDim},
    {"--seqlen-q", &Options::seqlen_q, 1, kMaxDim}, {"--seqlen-k", &Options::seqlen_k, 1, kMaxDim},
    {"--head-dim", &Options::head_dim, 1, kMaxDim}, {"--head-dim-v", &Options::head_dim_v, 1, kMaxDim},
    {"--device", &Options::device, 0, 1024},
    {"--buffers", &Options::buffer_sets, 1, 1024},  {"--graph-calls", &Options::graph_calls, 1, 100000},
    {"--replays", &Options::replays, 1, 1000000},   {"--iters", &Options::iters, 1, 1000000},
    {"--num-splits", &Options::num_splits, 0, FLASHCORE_MAX_NUM_SPLITS},
};

const IntOption *find_int_option(const std::string &flag) {
    for (const IntOption &io : kIntOptions)
        if (flag == io.flag) return &io;
    return nullptr;
}

const Preset *find_preset(const std::string &name) {
    for (const Preset &p : kPresets)
        if (name == p.name) return &p;
    return nullptr;
}

const PresetGroup *find_preset_group(const std::string &name) {
    for (const PresetGroup &g : kPresetGroups)
        if (name == g.name) return &g;
    return nullptr;
}

Options parse_args(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string opt = argv[i], val;
        bool has_inline = false;
        const size_t eq = opt.find('=');
        if (opt.rfind("--", 0) == 0 && eq != std::string::npos) {
            val = opt.substr(eq + 1);
            opt = opt.substr(0, eq);
            has_inline = true;
        }
        auto value = [&]() -> std::string {
            if (has_inline) return val;
            if (i + 1 >= argc) throw UsageError(opt + ": missing value");
            return argv[++i];
        };
        if (const IntOption *io = find_int_option(opt)) {
            o.*(io->field) = static_cast<int>(parse_int(opt, value(), io->lo, io->hi));
            if (io->field == &Options::num_splits) o.num_splits_given = true;
        } else if (opt == "-h" || opt == "--help") {
            print_usage(stdout);
            std::exit(0);
        } else if (opt == "--preset") {
            for (const std::string &n : split_commas(value())) {
                if (const PresetGroup *g = find_preset_group(n)) {
                    o.presets.insert(o.presets.end(), g->presets.begin(), g->presets.end());
                    continue;
                }
                if (!find_preset(n)) throw UsageError("unknown preset '" + n + "' (see --list)");
                o.presets.push_back(n);
            }
        } else if (opt == "--all") {
            for (const Preset &p : kPresets) o.presets.push_back(p.name);
        } else if (opt == "--seqlen") {
            o.seqlen_q = o.seqlen_k = static_cast<int>(parse_int(opt, value(), 1, kMaxDim));
        } else if (opt == "--dtype") {
            o.dtypes.clear();
            for (const std::string &d : split_commas(value())) {
                if (d == "fp16" || d == "all") o.dtypes.push_back(FLASHCORE_DTYPE_FP16);
                if (d == "bf16" || d == "all") o.dtypes.push_back(FLASHCORE_DTYPE_BF16);
                if (d != "fp16" && d != "bf16" && d != "all") throw UsageError("--dtype: fp16, bf16 or all");
            }
            if (o.dtypes.empty()) throw UsageError("--dtype: fp16, bf16 or all");
        } else if (opt == "--causal") {
            o.masks = {true};
        } else if (opt == "--mask") {
            const std::string m = value();
            if (m == "none")
                o.masks = {false};
            else if (m == "causal")
                o.masks = {true};
            else if (m == "both")
                o.masks = {false, true};
            else
                throw UsageError("--mask: none, causal or both");
        } else if (opt == "--layout") {
            const std::string l = value();
            if (l == "bhsd")
                o.layout = FLASHCORE_LAYOUT_BHSD;
            else if (l == "bshd")
                o.layout = FLASHCORE_LAYOUT_BSHD;
            else
                throw UsageError("--layout: bhsd or bshd");
        } else if (opt == "--scale") {
            o.softmax_scale = static_cast<float>(parse_double(opt, value(), 0.0));
        } else if (opt == "--window") {
            const std::vector<std::string> bounds = split_commas(value());
            if (bounds.size() != 2) throw UsageError("--window: LEFT,RIGHT (each -1 or >= 0)");
            o.use_window = true;
            o.window_left = static_cast<int>(parse_int(opt, bounds[0], -1, kMaxDim));
            o.window_right = static_cast<int>(parse_int(opt, bounds[1], -1, kMaxDim));
        } else if (opt == "--softcap") {
            o.softcap = static_cast<float>(parse_double(opt, value(), 0.0));
        } else if (opt == "--chunk") {
            o.attention_chunk = static_cast<int>(parse_int(opt, value(), 0, kMaxDim));
        } else if (opt == "--sinks") {
            o.sinks = true;
        } else if (opt == "--budget-ms") {
            o.budget_ms = parse_double(opt, value(), 1.0);
        } else if (opt == "--seed") {
            o.seed = static_cast<uint64_t>(parse_int(opt, value(), 0, 0x7FFFFFFFL));
        } else if (opt == "--backward") {
            o.backward = true;
        } else if (opt == "--deterministic") {
            o.deterministic = true;
        } else if (opt == "--json") {
            o.json = true;
        } else if (opt == "--json-out") {
            o.json_out = value();
        } else if (opt == "--no-check") {
            o.check = false;
        } else if (opt == "--list") {
            o.list = true;
        } else {
            throw UsageError("unknown option '" + std::string(argv[i]) + "' (see --help)");
        }
    }
    if (o.deterministic && !o.backward) throw UsageError("--deterministic: a backward option (add --backward)");
    // The forward that gives the backward its out and lse is not timed.
    if (o.num_splits_given && o.backward) throw UsageError("--num-splits: a forward option, not with --backward");
    return o;
}

Shape apply_overrides(Shape s, const Options &o) {
    if (o.batch > 0) s.batch = o.batch;
    if (o.heads_q > 0) s.heads_q = s.heads_kv = o.heads_q;
    if (o.heads_kv > 0) s.heads_kv = o.heads_kv;
    if (o.seqlen_q > 0) s.seqlen_q = o.seqlen_q;
    if (o.seqlen_k > 0) s.seqlen_k = o.seqlen_k;
    if (o.head_dim > 0) s.head_dim = s.head_dim_v = o.head_dim;
    if (o.head_dim_v > 0) s.head_dim_v = o.head_dim_v;
    return s;
}

std::vector<Case> build_cases(const Options &o) {
    const bool custom =
        o.batch > 0 || o.heads_q > 0 || o.heads_kv > 0 || o.seqlen_q > 0 || o.seqlen_k > 0 || o.head_dim > 0 ||
        o.head_dim_v > 0;
    std::vector<std::string> names = o.presets;
    if (names.empty()) names.push_back("mission");
    std::vector<Case> cases;
    for (const std::string &n : names) {
        const Preset *p = find_preset(n);
        Shape s = apply_overrides(
            {n, p->batch, p->heads, p->heads, p->seqlen, p->seqlen, p->head_dim, p->head_dim_v}, o);
        if (custom && o.presets.empty()) s.name = "custom";
        for (flashcore_dtype d : o.dtypes)
            for (bool causal : o.masks) {
                cases.push_back(
                    Case{s, d, causal, o.layout, o.use_window, o.window_left, o.window_right, o.attention_chunk});
            }
    }
    return cases;
}

// ---------------------------------------------------------------------------
// Measurement
// ---------------------------------------------------------------------------

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return NAN;
    std::sort(v.begin(), v.end());
    const double pos = p * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

int clamp_count(double x, int lo, int hi) {
    if (!(x >= lo)) return lo;  // also catches NaN
    if (x >= hi) return hi;
    return static_cast<int>(std::lround(x));
}

struct Device {
    int ordinal = 0;
    cudaDeviceProp prop{};
    size_t l2_bytes = 0;
};

struct Result {
    Case c;
    double flops = 0;
    std::string error;  // empty: ran
    int buffer_sets = 0;
    size_t workspace_bytes = 0;
    int graph_calls = 0, graph_replays = 0;
    double graph_us = NAN;
    int single_iters = 0;
    double single_p50_us = NAN, single_p90_us = NAN;
    std::string check = "skipped";  // "ok", "skipped" or what was wrong
};

double tflops(double flops, double us) { return us > 0 ? flops / (us * 1e6) : NAN; }

// Everything one case needs on the device: `sets` copies of q, k, v and out
// (and for --backward of lse, dout, dq, dk and dv), one params struct per
// set, one workspace shared by all (calls are serial).
class CaseBuffers {
  public:
    CaseBuffers(const Case &c, const Options &o, int sets) : backward_(o.backward) {
        const Shape &s = c.shape;
        const size_t elem = 2;
        const size_t rows_q = static_cast<size_t>(s.batch) * s.heads_q * s.seqlen_q;
        const size_t rows_kv = static_cast<size_t>(s.batch) * s.heads_kv * s.seqlen_k;
        const size_t out_elems = rows_q * s.head_dim_v;
        std::vector<uint16_t> host;
        uint64_t seed = o.seed;
        for (int i = 0; i < sets; ++i) {
            Set set;
            set.q = DeviceBuffer(rows_q * s.head_dim * elem);
            set.k = DeviceBuffer(rows_kv * s.head_dim * elem);
            set.v = DeviceBuffer(rows_kv * s.head_dim_v * elem);
            set.out = DeviceBuffer(out_elems * elem);
            std::vector<DeviceBuffer *> inputs{&set.q, &set.k, &set.v};
            // 0xFFFF is a NaN in fp16 and bf16: output the kernel never writes shows up in the check.
            std::vector<DeviceBuffer *> outputs{&set.out};
            if (backward_) {
                set.lse = DeviceBuffer(rows_q * sizeof(float));
                set.dout = DeviceBuffer(out_elems * elem);
                set.dq = DeviceBuffer(rows_q * s.head_dim * elem);
                set.dk = DeviceBuffer(rows_kv * s.head_dim * elem);
                set.dv = DeviceBuffer(rows_kv * s.head_dim_v * elem);
                inputs.push_back(&set.dout);
                outputs.insert(outputs.end(), {&set.dq, &set.dk, &set.dv});
            }
            for (DeviceBuffer *b : inputs) {
                fill_random(host, b->bytes() / elem, c.dtype, seed++ * 0x100000001B3ull);
                CUDA_CHECK(cudaMemcpy(b->get(), host.data(), b->bytes(), cudaMemcpyHostToDevice));
            }
            if (backward_ && o.sinks) set.dsinks = DeviceBuffer(static_cast<size_t>(s.heads_q) * sizeof(float));
            for (DeviceBuffer *b : outputs) CUDA_CHECK(cudaMemset(b->get(), 0xFF, b->bytes()));
            sets_.push_back(std::move(set));
        }
        if (o.sinks) {
            const std::vector<float> logits(static_cast<size_t>(s.heads_q), kSinkLogit);
            sinks_ = DeviceBuffer(logits.size() * sizeof(float));
            CUDA_CHECK(cudaMemcpy(sinks_.get(), logits.data(), sinks_.bytes(), cudaMemcpyHostToDevice));
        }
        for (Set &set : sets_) {
            flashcore_forward_params p;
            fc_check(flashcore_forward_params_init(&p, sizeof p), "flashcore_forward_params_init");
            p.dtype = c.dtype;
            p.batch_size = s.batch;
            p.num_heads_q = s.heads_q;
            p.num_heads_kv = s.heads_kv;
            p.seqlen_q = s.seqlen_q;
            p.seqlen_k = s.seqlen_k;
            p.head_dim = s.head_dim;
            p.head_dim_v = s.head_dim_v;
            p.causal = c.causal ? 1 : 0;
            p.softmax_scale = o.softmax_scale;
            // The backward's out and lse come from an unsplit call, which
            // needs no workspace (any split gives the same values to rounding).
            p.num_splits = backward_ ? 1 : o.num_splits;
            p.use_window = c.use_window ? 1 : 0;
            p.window_left = c.window_left;
            p.window_right = c.window_right;
            p.softcap = o.softcap;
            p.attention_chunk = c.attention_chunk;
            p.sinks = static_cast<const float *>(sinks_.get());
            p.q = set.q.get();
            p.k = set.k.get();
            p.v = set.v.get();
            p.out = set.out.get();
            p.lse = static_cast<float *>(set.lse.get());  // NULL (not written) unless --backward
            fc_check(flashcore_set_contiguous_strides(&p, c.layout), "flashcore_set_contiguous_strides");
            fc_check(flashcore_forward_check(&p), "flashcore_forward_check");
            params_.push_back(p);
            if (!backward_) continue;

            flashcore_backward_params b;
            fc_check(flashcore_backward_params_init(&b, sizeof b), "flashcore_backward_params_init");
            b.dtype = p.dtype;
            b.batch_size = p.batch_size;
            b.num_heads_q = p.num_heads_q;
            b.num_heads_kv = p.num_heads_kv;
            b.seqlen_q = p.seqlen_q;
            b.seqlen_k = p.seqlen_k;
            b.head_dim = p.head_dim;
            b.head_dim_v = p.head_dim_v;
            b.causal = p.causal;
            b.softmax_scale = p.softmax_scale;
            b.use_window = p.use_window;
            b.window_left = p.window_left;
            b.window_right = p.window_right;
            b.softcap = p.softcap;
            b.attention_chunk = p.attention_chunk;
            b.sinks = p.sinks;
            b.dsinks = static_cast<float *>(set.dsinks.get());
            b.deterministic = o.deterministic ? 1 : 0;
            b.q = p.q;
            b.k = p.k;
            b.v = p.v;
            b.out = p.out;
            b.lse = p.lse;
            b.dout = set.dout.get();
            b.dq = set.dq.get();
            b.dk = set.dk.get();
            b.dv = set.dv.get();
            fc_check(flashcore_backward_set_contiguous_strides(&b, c.layout), "flashcore_backward_set_contiguous_strides");
            fc_check(flashcore_backward_check(&b), "flashcore_backward_check");
            backward_params_.push_back(b);
        }
    }

    // --backward: each set's out and lse, from one forward call per set.
    void run_forward_calls(flashcore_handle h, cudaStream_t stream) const {
        for (const flashcore_forward_params &p : params_)
            fc_check(flashcore_forward(h, &p, nullptr, 0, stream), "flashcore_forward (out and lse for the backward)");
        CUDA_CHECK(cudaStreamSynchronize(stream));
    }

    // Device bytes of one set: q and k (head_dim wide), v and out (head_dim_v
    // wide), 2 bytes an element; for the backward also dq, dk, dv and dout
    // (as many again) and lse.
    static size_t set_bytes(const Shape &s, bool backward) {
        const size_t rows_q = static_cast<size_t>(s.batch) * s.heads_q * s.seqlen_q;
        const size_t rows_kv = static_cast<size_t>(s.batch) * s.heads_kv * s.seqlen_k;
        const size_t forward =
            2 * (rows_q + rows_kv) * (static_cast<size_t>(s.head_dim) + static_cast<size_t>(s.head_dim_v));
        return backward ? 2 * forward + rows_q * sizeof(float) : forward;
    }

    int sets() const { return static_cast<int>(params_.size()); }
    const flashcore_forward_params &params(int i) const { return params_[static_cast<size_t>(i) % params_.size()]; }
    const flashcore_backward_params &backward_params(int i) const {
        return backward_params_[static_cast<size_t>(i) % backward_params_.size()];
    }
    // The buffers the timed call writes in set i, with their names and
    // element counts: out, or dq, dk and dv.
    struct Output {
        const char *name;
        const DeviceBuffer *buffer;
    };
    std::vector<Output> outputs(int i) const {
        const Set &set = sets_[static_cast<size_t>(i)];
        if (!backward_) return {{"out", &set.out}};
        return {{"dq", &set.dq}, {"dk", &set.dk}, {"dv", &set.dv}};
    }

  private:
    struct Set {
        DeviceBuffer q, k, v, out, lse, dout, dq, dk, dv, dsinks;
    };
    bool backward_;
    DeviceBuffer sinks_;  // --sinks: the logits, shared by every set
    std::vector<Set> sets_;
    std::vector<flashcore_forward_params> params_;
    std::vector<flashcore_backward_params> backward_params_;
};

// Sets of buffers to rotate through: enough to exceed twice the L2 cache,
// at most 64 and at most 70% of free memory (less what the workspace takes:
// the backward's dQ accumulator, 4 bytes per query row and head_dim column).
int auto_buffer_sets(const Shape &s, const Device &dev, bool backward) {
    const size_t per_set = CaseBuffers::set_bytes(s, backward);
    const double workspace =
        backward ? 4.0 * static_cast<double>(s.batch) * s.heads_q * s.seqlen_q * s.head_dim : 0.0;
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double want = std::ceil(2.0 * static_cast<double>(dev.l2_bytes) / static_cast<double>(per_set));
    const double fit = std::floor((0.7 * static_cast<double>(free_b) - workspace) / static_cast<double>(per_set));
    return std::max(1, static_cast<int>(std::min({want, fit, 64.0})));
}

class Bench {
  public:
    Bench(flashcore_handle h, const Options &o, const Device &dev) : h_(h), o_(o), dev_(dev) {}

    Result run(const Case &c) {
        Result r;
        r.c = c;
        r.flops = case_flops(c, o_.backward);
        try {
            measure(c, r);
        } catch (const CaseError &e) {
            r.error = e.what();
        }
        return r;
    }

  private:
    flashcore_handle h_;
    const Options &o_;
    const Device &dev_;
    Stream stream_;
    DeviceBuffer workspace_;

    void call(const CaseBuffers &bufs, int i) {
        if (o_.backward) {
            fc_check(flashcore_backward(h_, &bufs.backward_params(i), workspace_.get(), workspace_.bytes(),
                                        stream_.get()),
                     "flashcore_backward");
            return;
        }
        fc_check(flashcore_forward(h_, &bufs.params(i), workspace_.get(), workspace_.bytes(), stream_.get()),
                 "flashcore_forward");
    }

    // Mean time of `n` back-to-back calls, in ms.
    double timed_batch(const CaseBuffers &bufs, int n, int &next) {
        Events ev(2);
        CUDA_CHECK(cudaEventRecord(ev[0], stream_.get()));
        for (int i = 0; i < n; ++i) call(bufs, next++);
        CUDA_CHECK(cudaEventRecord(ev[1], stream_.get()));
        CUDA_CHECK(cudaEventSynchronize(ev[1]));
        return ev.ms_between(0, 1) / n;
    }

    void measure(const Case &c, Result &r) {
        const int sets = o_.buffer_sets > 0 ? o_.buffer_sets : auto_buffer_sets(c.shape, dev_, o_.backward);
        CaseBuffers bufs(c, o_, sets);
        r.buffer_sets = sets;

        size_t ws = 0;
        if (o_.backward) {
            bufs.run_forward_calls(h_, stream_.get());
            fc_check(flashcore_backward_workspace_size(h_, &bufs.backward_params(0), &ws),
                     "flashcore_backward_workspace_size");
        } else {
            fc_check(flashcore_forward_workspace_size(h_, &bufs.params(0), &ws), "flashcore_forward_workspace_size");
        }
        r.workspace_bytes = ws;
        if (ws > workspace_.bytes()) workspace_ = DeviceBuffer(ws);

        // Warm-up: a few calls to estimate the time, then about 50 ms more.
        int next = 0;
        double t_ms = timed_batch(bufs, 3, next);
        t_ms = timed_batch(bufs, clamp_count(50.0 / t_ms, 3, 1000), next);

        measure_single(bufs, t_ms, r);
        measure_graph(bufs, t_ms, r);

        if (o_.check) r.check = check_outputs(bufs, c.dtype);
    }

    void measure_single(const CaseBuffers &bufs, double t_ms, Result &r) {
        const int iters = o_.iters > 0 ? o_.iters : clamp_count(o_.budget_ms / t_ms, 20, 200);
        Events ev(2);
        std::vector<double> us;
        us.reserve(static_cast<size_t>(iters));
        for (int i = 0; i < iters; ++i) {
            CUDA_CHECK(cudaEventRecord(ev[0], stream_.get()));
            call(bufs, i);
            CUDA_CHECK(cudaEventRecord(ev[1], stream_.get()));
            CUDA_CHECK(cudaEventSynchronize(ev[1]));
            us.push_back(1000.0 * ev.ms_between(0, 1));
        }
        r.single_iters = iters;
        r.single_p50_us = percentile(us, 0.5);
        r.single_p90_us = percentile(us, 0.9);
    }

    void measure_graph(const CaseBuffers &bufs, double t_ms, Result &r) {
        // Enough calls per graph that a replay lasts ~5 ms (launch cost hidden),
        // at most --graph-calls, and a whole number of passes over the sets.
        const int sets = bufs.sets();
        int calls = std::min(o_.graph_calls, clamp_count(std::ceil(5.0 / t_ms), 1, 1 << 20));
        calls = (calls + sets - 1) / sets * sets;

        GraphExec graph;
        CUDA_CHECK(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
        try {
            for (int i = 0; i < calls; ++i) call(bufs, i);
        } catch (...) {
            cudaGraph_t broken = nullptr;
            cuda_warn(cudaStreamEndCapture(stream_.get(), &broken), "cudaStreamEndCapture");
            if (broken) cuda_warn(cudaGraphDestroy(broken), "cudaGraphDestroy");
            throw;
        }
        CUDA_CHECK(cudaStreamEndCapture(stream_.get(), graph.graph_slot()));
        graph.instantiate();

        // Two warm-up replays, timed to size the timed run to the budget.
        Events warm(2);
        CUDA_CHECK(cudaEventRecord(warm[0], stream_.get()));
        for (int i = 0; i < 2; ++i) graph.launch(stream_.get());
        CUDA_CHECK(cudaEventRecord(warm[1], stream_.get()));
        CUDA_CHECK(cudaEventSynchronize(warm[1]));
        const int replays =
            o_.replays > 0 ? o_.replays : clamp_count(o_.budget_ms / (warm.ms_between(0, 1) / 2), 5, 200);
        Events ev(static_cast<size_t>(replays) + 1);
        CUDA_CHECK(cudaEventRecord(ev[0], stream_.get()));
        for (int i = 0; i < replays; ++i) {
            graph.launch(stream_.get());
            CUDA_CHECK(cudaEventRecord(ev[static_cast<size_t>(i) + 1], stream_.get()));
        }
        CUDA_CHECK(cudaEventSynchronize(ev[static_cast<size_t>(replays)]));
        std::vector<double> per_call_us;
        for (int i = 0; i < replays; ++i)
            per_call_us.push_back(1000.0 * ev.ms_between(static_cast<size_t>(i), static_cast<size_t>(i) + 1) / calls);
        r.graph_calls = calls;
        r.graph_replays = replays;
        r.graph_us = percentile(per_call_us, 0.5);
    }

    // Every output element of set 0 (out, or dq, dk and dv) finite, and not
    // all of a tensor zero.
    std::string check_outputs(const CaseBuffers &bufs, flashcore_dtype dtype) {
        CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
        for (const CaseBuffers::Output &output : bufs.outputs(0)) {
            std::vector<uint16_t> host(output.buffer->bytes() / 2);
            CUDA_CHECK(cudaMemcpy(host.data(), output.buffer->get(), host.size() * 2, cudaMemcpyDeviceToHost));
            size_t bad = 0, nonzero = 0;
            for (uint16_t b : host) {
                const float f = dtype == FLASHCORE_DTYPE_BF16 ? bf16_bits_to_float(b) : half_bits_to_float(b);
                if (!std::isfinite(f))
                    ++bad;
                else if (f != 0.0f)
                    ++nonzero;
            }
            if (bad) return strprintf("%zu of %zu %s elements not finite", bad, host.size(), output.name);
            if (!nonzero) return strprintf("all %s elements are zero", output.name);
        }
        return "ok";
    }
};

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

std::string json_string(const std::string &s) {
    std::string out = "\"";
    for (unsigned char ch : s) {
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += static_cast<char>(ch);
        } else if (ch < 0x20) {
            out += strprintf("\\u%04x", ch);
        } else {
            out += static_cast<char>(ch);
        }
    }
    return out + "\"";
}

std::string json_number(double x) { return std::isfinite(x) ? strprintf("%.6g", x) : "null"; }

void print_json_result(FILE *f, const Result &r, bool last) {
    const Shape &s = r.c.shape;
    std::fprintf(f,
                 "    {\"name\": %s, \"batch\": %d, \"num_heads_q\": %d, \"num_heads_kv\": %d, "
                 "\"seqlen_q\": %d, \"seqlen_k\": %d, \"head_dim\": %d, \"head_dim_v\": %d, \"dtype\": \"%s\", "
                 "\"causal\": %s, \"layout\": \"%s\", \"flops\": %.0f,\n",
                 json_string(s.name).c_str(), s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k, s.head_dim,
                 s.head_dim_v, dtype_name(r.c.dtype), r.c.causal ? "true" : "false", layout_name(r.c.layout), r.flops);
    if (!r.error.empty()) {
        std::fprintf(f, "     \"error\": %s}%s\n", json_string(r.error).c_str(), last ? "" : ",");
        return;
    }
    std::fprintf(f, "     \"buffer_sets\": %d, \"workspace_bytes\": %zu,\n", r.buffer_sets, r.workspace_bytes);
    std::fprintf(f, "     \"graph\": {\"calls_per_graph\": %d, \"replays\": %d, \"median_us\": %s, \"tflops\": %s},\n",
                 r.graph_calls, r.graph_replays, json_number(r.graph_us).c_str(),
                 json_number(tflops(r.flops, r.graph_us)).c_str());
    std::fprintf(f, "     \"single\": {\"iters\": %d, \"p50_us\": %s, \"p90_us\": %s, \"tflops_p50\": %s},\n",
                 r.single_iters, json_number(r.single_p50_us).c_str(), json_number(r.single_p90_us).c_str(),
                 json_number(tflops(r.flops, r.single_p50_us)).c_str());
    std::fprintf(f, "     \"output_check\": %s, \"error\": null}%s\n", json_string(r.check).c_str(), last ? "" : ",");
}

void print_json(FILE *f, const Device &dev, const Options &o, const std::vector<Result> &results) {
    std::fprintf(f, "{\n  \"tool\": \"flashcore_bench\",\n  \"flashcore_version\": %s,\n",
                 json_string(flashcore_version_string()).c_str());
    std::fprintf(f,
                 "  \"device\": {\"ordinal\": %d, \"name\": %s, \"compute_capability\": \"%d.%d\", "
                 "\"multiprocessors\": %d, \"l2_bytes\": %zu},\n",
                 dev.ordinal, json_string(dev.prop.name).c_str(), dev.prop.major, dev.prop.minor,
                 dev.prop.multiProcessorCount, dev.l2_bytes);
    std::fprintf(
        f,
        "  \"settings\": {\"budget_ms\": %g, \"max_graph_calls\": %d, \"seed\": %" PRIu64
        ", \"pass\": \"%s\", \"deterministic\": %s, \"flops\": \"%s2*B*Hq*(D+Dv)*visible_pairs, "
        "4*B*Hq*D*visible_pairs when Dv == D (causal: bottom-right mask, S(S+1)/2 pairs when Sq == Sk)\"},\n",
        o.budget_ms, o.graph_calls, o.seed, o.backward ? "backward" : "forward", o.deterministic ? "true" : "false",
        o.backward ? "2.5 * " : "");
    std::fprintf(f, "  \"results\": [\n");
    for (size_t i = 0; i < results.size(); ++i) print_json_result(f, results[i], i + 1 == results.size());
    std::fprintf(f, "  ]\n}\n");
}

void print_table_header() {
    std::printf("%-15s %3s %4s %4s %6s %6s %4s %4s %-5s %-6s %-6s %4s | %10s %8s | %10s %10s %8s | %s\n", "case", "B",
                "Hq", "Hkv", "Sq", "Sk", "D", "Dv", "dtype", "causal", "layout", "sets", "graph us", "TFLOP/s",
                "call p50", "call p90", "TFLOP/s", "check");
}

void print_table_row(const Result &r) {
    const Shape &s = r.c.shape;
    std::printf("%-15s %3d %4d %4d %6d %6d %4d %4d %-5s %-6s %-6s ", s.name.c_str(), s.batch, s.heads_q, s.heads_kv,
                s.seqlen_q, s.seqlen_k, s.head_dim, s.head_dim_v, dtype_name(r.c.dtype), r.c.causal ? "yes" : "no",
                layout_name(r.c.layout));
    if (!r.error.empty()) {
        std::printf("   - | error: %s\n", r.error.c_str());
    } else {
        std::printf("%4d | %10.2f %8.1f | %10.2f %10.2f %8.1f | %s\n", r.buffer_sets, r.graph_us,
                    tflops(r.flops, r.graph_us), r.single_p50_us, r.single_p90_us, tflops(r.flops, r.single_p50_us),
                    r.check.c_str());
    }
    std::fflush(stdout);
}

// This build's (head_dim, head_dim_v) kernels, e.g. "32, 64, 96, 128, 192/128, 256".
std::string supported_head_dims_text() {
    size_t count = 0;
    if (flashcore_supported_head_dims(nullptr, nullptr, 0, &count) != FLASHCORE_STATUS_SUCCESS)
        return std::string("unknown (") + flashcore_last_error_message() + ")";
    std::vector<int32_t> dims(count), dims_v(count);
    if (flashcore_supported_head_dims(dims.data(), dims_v.data(), count, &count) != FLASHCORE_STATUS_SUCCESS)
        return std::string("unknown (") + flashcore_last_error_message() + ")";
    std::string text;
    for (size_t i = 0; i < std::min(count, dims.size()); ++i) {
        if (!text.empty()) text += ", ";
        text += dims[i] == dims_v[i] ? strprintf("%d", dims[i]) : strprintf("%d/%d", dims[i], dims_v[i]);
    }
    return text;
}

void print_presets() {
    std::printf("%-15s %5s %5s %7s %8s %10s  %s\n", "preset", "batch", "heads", "seqlen", "head_dim", "head_dim_v",
                "");
    for (const Preset &p : kPresets)
        std::printf("%-15s %5d %5d %7d %8d %10d  %s\n", p.name, p.batch, p.heads, p.seqlen, p.head_dim, p.head_dim_v,
                    p.note);
    std::printf("\n%-17s %s\n", "preset group", "presets");
    for (const PresetGroup &g : kPresetGroups) {
        std::string names;
        for (const char *n : g.presets) names += (names.empty() ? "" : ",") + std::string(n);
        std::printf("%-17s %s  (%s)\n", g.name, names.c_str(), g.note);
    }
    std::printf("\nThis build's kernels (head_dim or head_dim/head_dim_v): %s; other multiples of 8 run on the\n"
                "first that covers both head dims.\n",
                supported_head_dims_text().c_str());
}

int run(const Options &o) {
    flashcore_handle h = nullptr;
    const flashcore_status st = o.device >= 0 ? flashcore_create_for_device(&h, o.device) : flashcore_create(&h);
    if (st != FLASHCORE_STATUS_SUCCESS) {
        const std::string msg = flashcore_error(st, "flashcore_create");
        const bool no_gpu = st == FLASHCORE_STATUS_NO_DEVICE || st == FLASHCORE_STATUS_UNSUPPORTED;
        std::fprintf(stderr, "flashcore_bench: %s%s\n", no_gpu ? "no usable GPU: " : "", msg.c_str());
        if (o.json) std::printf("{\"tool\": \"flashcore_bench\", \"error\": %s}\n", json_string(msg).c_str());
        return no_gpu ? kExitNoDevice : kExitFailure;
    }
    struct HandleGuard {
        flashcore_handle h;
        ~HandleGuard() {
            if (flashcore_destroy(h) != FLASHCORE_STATUS_SUCCESS)
                std::fprintf(stderr, "flashcore_bench: warning: %s\n", flashcore_last_error_message());
        }
    } guard{h};

    Device dev;
    fc_check(flashcore_handle_device(h, &dev.ordinal), "flashcore_handle_device");
    CUDA_CHECK(cudaSetDevice(dev.ordinal));
    CUDA_CHECK(cudaGetDeviceProperties(&dev.prop, dev.ordinal));
    dev.l2_bytes = static_cast<size_t>(dev.prop.l2CacheSize);

    if (flashcore_version_number() != FLASHCORE_VERSION_NUMBER)
        std::fprintf(stderr, "flashcore_bench: warning: built against flashcore %d.%d.%d, running with %s\n",
                     FLASHCORE_VERSION_MAJOR, FLASHCORE_VERSION_MINOR, FLASHCORE_VERSION_PATCH,
                     flashcore_version_string());

    FILE *info = o.json ? stderr : stdout;
    std::fprintf(info, "flashcore %s on %s (device %d, sm_%d%d, %d SMs, L2 %.0f MiB)\n", flashcore_version_string(),
                 dev.prop.name, dev.ordinal, dev.prop.major, dev.prop.minor, dev.prop.multiProcessorCount,
                 static_cast<double>(dev.l2_bytes) / (1 << 20));
    std::fprintf(info, "kernels for head dims (head_dim or head_dim/head_dim_v): %s\n",
                 supported_head_dims_text().c_str());
    std::fprintf(info,
                 "us per call. graph: median over replays of a CUDA graph of many calls; call p50/p90: one "
                 "call between two events, synchronised each time. TFLOP/s: %s2*B*Hq*(D+Dv)*(visible q/k pairs).\n",
                 o.backward ? "2.5 * " : "");
    if (o.backward)
        std::fprintf(info, "pass: backward (flashcore_backward: dq, dk, dv; %s mode), on out and lse from a forward "
                           "call per buffer set made beforehand\n",
                     o.deterministic ? "deterministic" : "default");
    if (!o.json) print_table_header();

    const std::vector<Case> cases = build_cases(o);
    std::vector<Result> results;
    Bench bench(h, o, dev);
    bool failed = false;
    for (const Case &c : cases) {
        if (o.json)
            std::fprintf(stderr, "  %s %s %s...\n", c.shape.name.c_str(), dtype_name(c.dtype),
                         c.causal ? "causal" : "non-causal");
        bool fatal = false;
        try {
            results.push_back(bench.run(c));
        } catch (const FatalError &e) {  // the context may be unusable: report this case, skip the rest
            Result r;
            r.c = c;
            r.flops = case_flops(c, o.backward);
            r.error = e.what();
            results.push_back(r);
            fatal = true;
        }
        const Result &r = results.back();
        failed = failed || !r.error.empty() || (r.check != "ok" && r.check != "skipped");
        if (!o.json) print_table_row(r);
        if (fatal) {
            std::fprintf(stderr, "flashcore_bench: stopping after a CUDA error: %s\n", r.error.c_str());
            break;
        }
    }
    if (o.json) print_json(stdout, dev, o, results);
    if (!o.json_out.empty()) {
        FILE *f = std::fopen(o.json_out.c_str(), "w");
        if (!f) throw FatalError("cannot open " + o.json_out + ": " + std::strerror(errno));
        print_json(f, dev, o, results);
        if (std::fclose(f) != 0) throw FatalError("cannot write " + o.json_out + ": " + std::strerror(errno));
        std::fprintf(o.json ? stderr : stdout, "JSON written to %s\n", o.json_out.c_str());
    }
    return failed ? kExitFailure : 0;
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    try {
        o = parse_args(argc, argv);
    } catch (const UsageError &e) {
        std::fprintf(stderr, "flashcore_bench: %s\n", e.what());
        return kExitUsage;
    }
    if (o.list) {
        print_presets();
        return 0;
    }
    try {
        return run(o);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "flashcore_bench: %s\n", e.what());
        return kExitFailure;
    }
}
