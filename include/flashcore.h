/*
 * flashcore.h: fused scaled-dot-product attention on NVIDIA GPUs, as a C library.
 *
 *     O = softmax(softmax_scale * Q * K^T [+ causal mask]) * V
 *
 * computed in one kernel (FlashAttention-style: K/V tiles streamed through
 * shared memory, online softmax in fp32, both matrix products on tensor cores),
 * never materialising the seqlen_q x seqlen_k score matrix.
 *
 * This header needs only the C standard library: it can be read by ctypes,
 * bindgen or any FFI generator without CUDA headers. It compiles as C99 and as
 * C++.
 *
 * ---------------------------------------------------------------------------
 * Typical use
 * ---------------------------------------------------------------------------
 *
 *     flashcore_handle h;
 *     if (flashcore_create(&h) != FLASHCORE_STATUS_SUCCESS) {
 *         fprintf(stderr, "%s\n", flashcore_last_error_message());
 *         ...
 *     }
 *     flashcore_forward_params p;
 *     flashcore_forward_params_init(&p, sizeof p);  // sets struct_size, defaults
 *     p.dtype = FLASHCORE_DTYPE_FP16;
 *     p.batch_size = 1; p.num_heads_q = p.num_heads_kv = 8;
 *     p.seqlen_q = p.seqlen_k = 512; p.head_dim = 64;
 *     p.q = dq; p.k = dk; p.v = dv; p.out = dout;
 *     flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BHSD);
 *     size_t ws = 0;
 *     flashcore_forward_workspace_size(h, &p, &ws);   // allocate ws bytes if > 0
 *     flashcore_forward(h, &p, workspace, ws, stream);
 *     flashcore_destroy(h);
 *
 * ---------------------------------------------------------------------------
 * Conventions and ABI policy (stated once, apply to every declaration below)
 * ---------------------------------------------------------------------------
 *
 * - Every function that can fail returns flashcore_status. On failure the
 *   calling thread's last error message (flashcore_last_error_message) says
 *   what was wrong and what is supported. No function aborts, exits, prints
 *   or lets a C++ exception escape.
 * - Bad input never writes anywhere: parameters are validated completely
 *   before any work is queued. Only a call's outputs (`out` and `lse`; for
 *   flashcore_backward `dq`, `dk` and `dv`) and the workspace are ever
 *   written, and only by a call that returned FLASHCORE_STATUS_SUCCESS, or
 *   by one the CUDA runtime failed while it queued its kernels
 *   (FLASHCORE_STATUS_CUDA_ERROR after the first was queued: the backward
 *   queues three, and its first writes per-row values into dq).
 * - Device pointers are plain CUDA device addresses (from cudaMalloc, a
 *   framework's allocator, or cudaMallocManaged). Streams are cudaStream_t
 *   passed as void*; NULL means the legacy default stream.
 * - Aliasing: what a call writes (`out`, `lse`, the workspace) must not
 *   overlap what it reads (`q`, `k`, `v`, `seqused_k`, `cu_seqlens_q`, `cu_seqlens_k`,
 *   `block_table`, the descale factors, `sinks`; for flashcore_merge_states
 *   the partials and `sinks`) nor one another; inputs may share memory (q, k and v may be
 *   the same buffer). Each tensor is taken as the address range from its
 *   first to its last byte, so an output interleaved with another tensor in
 *   one buffer is refused too. Overlap returns
 *   FLASHCORE_STATUS_INVALID_ARGUMENT, naming the two tensors.
 * - Work is queued asynchronously: a fault while it runs (a pointer to too
 *   little memory, say) is not reported by the call that queued it but by
 *   the caller's next synchronisation on that stream (cudaStreamSynchronize
 *   and the like), as a CUDA error that then sticks to the device's context.
 *   A later flashcore call that meets such an error says so (it comes from
 *   earlier work) and returns FLASHCORE_STATUS_CUDA_ERROR.
 * - Enum values pass the ABI as ints: a function taking a flashcore_layout
 *   or flashcore_status accepts any int value, and refuses (or, for
 *   flashcore_status_string, names as unknown) those it does not know.
 * - Status values and enum values are never renumbered; new ones may be added.
 * - Structs that cross the ABI begin with a `struct_size` field, set to
 *   sizeof(struct) by the caller (the *_init functions do this). Fields are
 *   only ever appended. A library reading a struct from an older header
 *   treats the missing fields as their documented defaults; a library reading
 *   a struct from a newer header accepts it when every field it does not know
 *   is zero, and returns FLASHCORE_STATUS_UNSUPPORTED otherwise. A
 *   struct_size must be where the struct of a released header ends (its
 *   sizeof, or the end of its last field) or at least this header's sizeof
 *   (a newer header's; at most 64 KiB); any other size would end inside a
 *   field and returns FLASHCORE_STATUS_INVALID_ARGUMENT.
 *   One released size is two callers': a 0.2 caller's sizeof(
 *   flashcore_forward_params) (192, its padding after head_dim_v included)
 *   is where 0.3's num_splits ends, so the library reads those padding
 *   bytes as num_splits. A 0.2 caller must zero its struct before setting
 *   fields (flashcore_forward_params_init, or memset) so that its padding
 *   reads as num_splits = 0, the default; the library cannot tell the two
 *   callers apart.
 * - The SONAME is libflashcore.so.<MAJOR>. Within one major version, existing
 *   functions keep their signatures and meaning; functions may be added.
 * - Only symbols starting with `flashcore_` are exported.
 *
 * Thread safety: every function may be called from several threads at once.
 * A handle may be shared by threads and streams: flashcore_forward,
 * flashcore_backward, flashcore_merge_states and the workspace queries on
 * one handle from several threads at once, each queueing on its own stream
 * (or the same one), are safe; the handle holds no per-call state. Calls on
 * different streams run concurrently on the GPU, so they must not write
 * memory another of them reads or writes (each call's workspace included).
 * flashcore_destroy must not race with other uses of that handle.
 */
#ifndef FLASHCORE_H
#define FLASHCORE_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(FLASHCORE_BUILDING_LIBRARY)
#    define FLASHCORE_API __declspec(dllexport)
#  else
#    define FLASHCORE_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define FLASHCORE_API __attribute__((visibility("default")))
#else
#  define FLASHCORE_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------- */

#define FLASHCORE_VERSION_MAJOR 0
#define FLASHCORE_VERSION_MINOR 9
#define FLASHCORE_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, e.g. 400 for 0.4.0. */
#define FLASHCORE_VERSION_NUMBER \
    (FLASHCORE_VERSION_MAJOR * 10000 + FLASHCORE_VERSION_MINOR * 100 + FLASHCORE_VERSION_PATCH)

/* The version of the library loaded at run time, in FLASHCORE_VERSION_NUMBER
 * form. Compare it with FLASHCORE_VERSION_NUMBER to detect a header/library
 * mismatch. */
FLASHCORE_API unsigned flashcore_version_number(void);

/* The same version as a static string, "MAJOR.MINOR.PATCH". */
FLASHCORE_API const char *flashcore_version_string(void);

/* The version of the CUDA runtime linked (statically) into the library, as
 * CUDA writes versions: 1000 * major + 10 * minor, e.g. 12040 for 12.4 or
 * 13000 for 13.0. flashcore is built with CUDA 12 and with CUDA 13 from the
 * same sources; the two builds differ only in the drivers they run on: an
 * NVIDIA driver for CUDA major.0 or newer (cuDriverGetVersion() >= 1000 *
 * major; CUDA's minor-version compatibility), that is driver 525.60.13 or
 * newer for a CUDA 12 build and 580.65.06 or newer for a CUDA 13 build.
 * Needs no GPU or driver. */
FLASHCORE_API int flashcore_cuda_runtime_version(void);

/* ---------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------- */

typedef enum flashcore_status {
    FLASHCORE_STATUS_SUCCESS = 0,
    /* A parameter is wrong whatever the GPU: a null pointer, a size <= 0, head
     * counts that do not divide, a bad stride, a struct_size too small. */
    FLASHCORE_STATUS_INVALID_ARGUMENT = 1,
    /* Valid, but not implemented: a head_dim or dtype this build has no
     * kernel for (the message lists what it has), a GPU older than sm_80, a
     * struct from a newer header that uses fields this library does not know. */
    FLASHCORE_STATUS_UNSUPPORTED = 2,
    /* A pointer or stride does not meet the alignment the kernels need. */
    FLASHCORE_STATUS_MISALIGNED = 3,
    /* The workspace passed is smaller than flashcore_forward_workspace_size
     * asked for (see "Workspace" below). */
    FLASHCORE_STATUS_WORKSPACE_TOO_SMALL = 4,
    /* No CUDA device is visible, or the NVIDIA driver is missing (the
     * message says "no NVIDIA driver found") or too old for this library
     * (the message gives both versions). */
    FLASHCORE_STATUS_NO_DEVICE = 5,
    /* The CUDA runtime reported an error (the message names it). */
    FLASHCORE_STATUS_CUDA_ERROR = 6,
    /* Host or device memory could not be allocated. */
    FLASHCORE_STATUS_OUT_OF_MEMORY = 7,
    /* A bug in flashcore: please report it with the message. */
    FLASHCORE_STATUS_INTERNAL = 8
} flashcore_status;

/* A static, human-readable name for a status ("invalid argument", ...).
 * Never NULL; any other int value gives "unknown status". */
FLASHCORE_API const char *flashcore_status_string(flashcore_status status);

/* The detail of the last failure on the calling thread, e.g.
 * "num_heads_q (12) must be a multiple of num_heads_kv (5)". The text stays
 * valid until the next flashcore call on this thread. It is "" when the
 * thread's last call succeeded; never NULL. */
FLASHCORE_API const char *flashcore_last_error_message(void);

/* ---------------------------------------------------------------------------
 * Handle
 * ------------------------------------------------------------------------- */

/* Opaque. Bound to one CUDA device; caches what dispatch needs (compute
 * capability, multiprocessor count, shared-memory limits). */
typedef struct flashcore_handle_s *flashcore_handle;

/* Creates a handle for the CUDA device current on the calling thread
 * (cudaGetDevice; device 0 if none was set). Writes NULL to *handle on failure.
 * Returns FLASHCORE_STATUS_NO_DEVICE when no device or driver is present and
 * FLASHCORE_STATUS_UNSUPPORTED for GPUs older than sm_80. */
FLASHCORE_API flashcore_status flashcore_create(flashcore_handle *handle);

/* Creates a handle for the given CUDA device ordinal. */
FLASHCORE_API flashcore_status flashcore_create_for_device(flashcore_handle *handle, int device);

/* Releases a handle. Passing NULL is allowed and does nothing. Work already
 * queued by flashcore_forward is not waited for and stays valid.
 * A handle carries a magic value that every call checks and that destroy
 * clears: a destroyed handle (or a pointer that never was one) passed to any
 * function returns FLASHCORE_STATUS_INVALID_ARGUMENT, "not a live flashcore
 * handle", as long as its memory can still be read; this catches mistakes,
 * it does not make using a destroyed handle valid. */
FLASHCORE_API flashcore_status flashcore_destroy(flashcore_handle handle);

/* The CUDA device ordinal the handle is bound to. */
FLASHCORE_API flashcore_status flashcore_handle_device(flashcore_handle handle, int *device);

/* ---------------------------------------------------------------------------
 * Forward attention
 * ------------------------------------------------------------------------- */

typedef enum flashcore_dtype {
    FLASHCORE_DTYPE_FP16 = 1, /* IEEE half (CUDA __half) */
    FLASHCORE_DTYPE_BF16 = 2, /* bfloat16 (CUDA __nv_bfloat16) */
    FLASHCORE_DTYPE_FP32 = 3, /* float; only flashcore_merge_states takes it */
    /* 8-bit float, 4 exponent bits, 3 mantissa bits, no infinities, largest
     * 448 (CUDA __nv_fp8_e4m3, PyTorch torch.float8_e4m3fn): as
     * flashcore_forward_params::kv_dtype, a quantized KV cache; as its
     * dtype, fp8 queries (fp8 prefill on sm_90 GPUs). */
    FLASHCORE_DTYPE_FP8_E4M3 = 4
} flashcore_dtype;

/* Storage orders understood by flashcore_set_contiguous_strides. Any other
 * order works through explicit strides. */
typedef enum flashcore_layout {
    FLASHCORE_LAYOUT_BHSD = 0, /* [batch, heads, seqlen, head_dim] (PyTorch SDPA) */
    FLASHCORE_LAYOUT_BSHD = 1  /* [batch, seqlen, heads, head_dim] (FlashAttention) */
} flashcore_layout;

/* softmax_scale value that asks for 1 / sqrt(head_dim). */
#define FLASHCORE_SOFTMAX_SCALE_DEFAULT 0.0f

/* Alignment, in bytes, that q, k, v, out and the workspace must have, and
 * that every batch/seq/head stride must be a multiple of (in bytes). */
#define FLASHCORE_ALIGNMENT 16

/* The largest num_splits a call may ask for (flashcore_forward_params). */
#define FLASHCORE_MAX_NUM_SPLITS 128

/*
 * Everything one attention call needs. Logical shapes:
 *   q:      [batch_size, num_heads_q,  seqlen_q, head_dim]
 *   k:      [batch_size, num_heads_kv, seqlen_k, head_dim]
 *   v:      [batch_size, num_heads_kv, seqlen_k, head_dim_v]
 *   out:    [batch_size, num_heads_q,  seqlen_q, head_dim_v]
 *   lse:    [batch_size, num_heads_q,  seqlen_q], float32, contiguous
 * (head_dim_v is head_dim unless set; see the field.)
 * Each tensor's last dimension (head_dim) is contiguous; the other three are
 * addressed through element strides (not bytes), so [B,S,H,D], [B,H,S,D] and
 * views with padding all work. Strides must be >= 0 and multiples of
 * FLASHCORE_ALIGNMENT / sizeof(element) (8 for fp16/bf16, 16 for fp8); `out` must not
 * overlap itself (its strides must give each element its own address;
 * interleaved layouts are fine), nor any other tensor (see "Aliasing" at
 * the top).
 *
 * Empty calls: batch_size, seqlen_q or num_heads_q may be 0. The output is
 * then empty and the call returns FLASHCORE_STATUS_SUCCESS having read,
 * written and launched nothing (its workspace size is 0, and its pointers
 * and strides are not looked at), as PyTorch returns an empty result.
 * num_heads_kv may be 0 only with num_heads_q 0, seqlen_k only in an empty
 * call; head_dim is never 0.
 *
 * Grouped-query / multi-query attention: num_heads_q must be a multiple of
 * num_heads_kv; query head h reads key/value head h / (num_heads_q / num_heads_kv).
 */
typedef struct flashcore_forward_params {
    /* sizeof(flashcore_forward_params) as the caller compiled it. */
    size_t struct_size;

    int32_t dtype; /* flashcore_dtype of q, k, v and out (but see kv_dtype,
                    * out_dtype: FP8_E4M3 queries write a BF16 out) */
    int32_t batch_size;
    int32_t seqlen_q;
    int32_t seqlen_k;
    int32_t num_heads_q;
    int32_t num_heads_kv;
    /* Head dimension of q and k. Any multiple of 8 from 8 to 576. The
     * default build has kernels for 32, 64, 96, 128, 192 (with head_dim_v
     * 128), 256, 512 and 576 (with head_dim_v 512: DeepSeek MLA's latent
     * cache, whose v must be k's view; see head_dim_v)
     * (flashcore_supported_head_dims lists what this build has); any other
     * head dim runs on the smallest kernel that covers it, its q, k, v and
     * out loaded and stored only up to their real width. Past 256 the
     * backward has the 512 kernel only (not MLA's 576), which needs 132 KiB
     * of shared memory per block: not on sm_86 and sm_89 (99 KiB), where
     * flashcore_backward returns FLASHCORE_STATUS_UNSUPPORTED; e4m3 K/V is
     * taken past 256 on MLA's latent cache only. */
    int32_t head_dim;

    /* Non-zero: causal mask aligned to the bottom-right corner, as in
     * FlashAttention >= 2.1: query i sees key j iff j <= i + seqlen_k - seqlen_q.
     * Query rows that see no key (seqlen_q > seqlen_k) give out = 0 and
     * lse = -infinity. */
    int32_t causal;

    /* Multiplies Q*K^T before the softmax. Must be finite and > 0, or
     * FLASHCORE_SOFTMAX_SCALE_DEFAULT (+0) for 1 / sqrt(head_dim); -0 is
     * refused (a negative scale that underflowed, not a request for the
     * default). softmax_scale * log2(e) must be a finite float too (the
     * kernels exponentiate with exp2): at most about 2.36e38. */
    float softmax_scale;

    const void *q;
    const void *k;
    const void *v;
    void *out;
    /* Optional (NULL: not written). Natural-log log-sum-exp of each row of the
     * scaled, masked scores; 4-byte aligned. */
    float *lse;

    /* Element strides. Use flashcore_set_contiguous_strides for packed tensors. */
    int64_t q_batch_stride, q_seq_stride, q_head_stride;
    int64_t k_batch_stride, k_seq_stride, k_head_stride;
    int64_t v_batch_stride, v_seq_stride, v_head_stride;
    int64_t out_batch_stride, out_seq_stride, out_head_stride;

    /* ---- Fields added in 0.2 (a 0.1 caller's struct ends above; they read
     * as their defaults for it). ---- */

    /* Head dimension of v and out, when it differs from head_dim (e.g. 128
     * with head_dim 192, as in DeepSeek-style prefill). 0 (the default)
     * means head_dim. Same rules as head_dim.
     *
     * MLA decode on a latent cache (DeepSeek V2/V3, Kimi K2): head_dim 576
     * (512 latent + 64 rope dims), head_dim_v 512, one K/V head, and v the
     * first 512 columns of k's rows, passed as k's view: v == k with k's
     * three strides. That kernel reads each cache row once for both
     * products; a call that the (576, 512) kernel covers with a v of its own
     * returns FLASHCORE_STATUS_UNSUPPORTED, saying so. */
    int32_t head_dim_v;

    /* ---- Fields added in 0.3. ---- */

    /* Split-KV: into how many parts the keys each query block sees are
     * split, each part computed by its own thread block into the workspace,
     * the parts then merged into out and lse (the same math as
     * flashcore_merge_states). Splitting lets calls that are too small to
     * fill the GPU (decode, chunked prefill, few heads) use every SM.
     *   0 (the default): chosen per call from the grid, the device's
     *     multiprocessor count and seqlen_k (docs/log/perf.md gives the
     *     measured crossovers); usually 1 where the grid fills the GPU.
     *     Decode over sequences of their own lengths (seqused_k or
     *     cu_seqlens_k set) splits even a full grid where seqlen_k is long,
     *     since its longest sequence would set the call's time: each
     *     sequence's keys go into no more parts than hold a few thousand
     *     keys, so short sequences stay whole.
     *   1: never split; the call needs no workspace.
     *   N (2 .. FLASHCORE_MAX_NUM_SPLITS): exactly N parts, some of which may
     *     be empty when a query block sees fewer than N key tiles.
     * Results do not depend on the workspace's contents and stay
     * deterministic for a given num_splits; different num_splits round
     * differently. */
    int32_t num_splits;

    /* ---- Fields added in 0.4. ---- */

    /* Sliding window (local attention), as FlashAttention's window_size =
     * (window_left, window_right). With use_window non-zero, query i sees
     * key j only where
     *     i + d - window_left <= j <= i + d + window_right,
     * d = seqlen_k - seqlen_q (the diagonal, bottom-right aligned as for
     * causal); a bound of -1 is dropped (unbounded on that side). Each bound
     * is -1 or >= 0; window_left = window_right = 0 sees the diagonal key
     * only. causal non-zero is the same as window_right = 0, so with causal
     * window_right must be -1 or 0. Key tiles that no row of a query block
     * sees are skipped, not computed. Rows that see no key give out = 0 and
     * lse = -infinity. use_window 0 (the default): no window, and the two
     * bounds are ignored. */
    int32_t use_window;
    int32_t window_left;
    int32_t window_right;

    /* Logit softcapping, as in Gemma 2: with softcap > 0 each score s =
     * softmax_scale * q.k becomes softcap * tanh(s / softcap) before the
     * mask and the softmax (lse is of the capped scores). 0 (the default):
     * off. Must be finite and >= 0; softcap * log2(e) must be a finite float
     * and softmax_scale / softcap must not underflow to 0. */
    float softcap;

    /* ---- Fields added in 0.5. ---- */

    /* Per-sequence key counts, as FlashAttention's seqused_k (its kv-cache
     * call's cache_seqlens): NULL (the default), or a device array of
     * batch_size int32 values, 4-byte aligned. Batch b then attends to its
     * first seqused_k[b] keys only, as if its seqlen_k were that: k and v
     * keep their seqlen_k (the cache's capacity) for the strides and the
     * workspace, and the causal diagonal and the window are aligned to
     * seqused_k[b] (query i of b sees key j <= i + seqused_k[b] - seqlen_q).
     * A sequence with 0 keys gives out = 0 and lse = -infinity. Keys past
     * seqused_k[b] are never used and may hold anything, NaN and infinity
     * included. Each value should lie in [0, seqlen_k]; the kernels read
     * the array on the device and clamp each value into that range, so a
     * wrong value gives a wrong result, never an access outside k and v. */
    const int32_t *seqused_k;

    /* ---- Fields added in 0.6. ---- */

    /* Variable-length batches, as FlashAttention's varlen calls: NULL (the
     * default), or a device array of batch_size + 1 int32 prefix sums,
     * 4-byte aligned. With cu_seqlens_q, q and out are packed along the
     * sequence axis: query i of batch b is row cu_seqlens_q[b] + i of q
     * and out (element row * q_seq_stride + head * q_head_stride; the batch
     * strides are ignored), batch b has cu_seqlens_q[b + 1] - cu_seqlens_q[b]
     * queries, seqlen_q is the longest of them (FlashAttention's
     * max_seqlen_q; it sizes the grid and the workspace) and
     * total_seqlen_q the number of rows q and out hold. lse, when given, is
     * then [num_heads_q][total_seqlen_q] (FlashAttention's varlen layout).
     * cu_seqlens_k likewise packs k and v (total_seqlen_k rows; seqlen_k is
     * the longest key sequence); with seqused_k too, batch b uses the first
     * min(seqused_k[b], its length) of its keys. The causal diagonal and the
     * window are aligned to each sequence's own lengths. Offsets are read
     * on the device and clamped into [0, total_seqlen] and lengths into
     * [0, seqlen], so wrong arrays give wrong results, never an access
     * outside q, k, v and out. Rows of out outside every sequence are not
     * written. As in FlashAttention, a sequence's last key tile may read
     * the next sequence's rows (with zero weight): NaN or infinity in one
     * sequence's v can reach the previous sequence's output. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int32_t total_seqlen_q;
    int32_t total_seqlen_k;

    /* Paged KV cache, as FlashAttention's block_table and vLLM's paged
     * attention: NULL (the default), or a device array of int32 page
     * indices, 4-byte aligned, row b (block_table + b *
     * block_table_batch_stride) listing the pages of batch b in key order.
     * k and v are then [num_pages][page_size][num_heads_kv][head_dim(_v)]
     * pools: key j of batch b is row j % page_size of page
     * block_table[b][j / page_size], at element page * k_batch_stride +
     * row * k_seq_stride + head * k_head_stride (the batch strides are the
     * page strides). seqlen_k is the longest sequence and batch b's length
     * is seqused_k[b] (seqlen_k without it); each row of the table holds
     * ceil(seqlen_k / page_size) entries, of which only those of a batch's
     * keys are read. page_size is a multiple of 16; num_pages >= 1. Entries
     * are clamped into [0, num_pages) on the device. Not combined with
     * cu_seqlens_k (cu_seqlens_q is fine: chunked prefill on a paged
     * cache). */
    const int32_t *block_table;
    int64_t block_table_batch_stride;
    int32_t page_size;
    int32_t num_pages;

    /* ---- Fields added in 0.8. ---- */

    /* Quantized K/V (an fp8 KV cache, as vLLM's kv_cache_dtype="fp8" and
     * FlashInfer's fp8 decode): the flashcore_dtype of k and v, or 0 (the
     * default) or dtype itself for dtype's. FLASHCORE_DTYPE_FP8_E4M3 under
     * dtype FP16 or BF16 is supported on every GPU and with every other
     * field (split-KV, GQA, seqused_k, varlen, paged caches, window,
     * softcap); the kernels widen each K/V tile to dtype in shared memory
     * (exactly: every e4m3 value is a dtype value), so the results are
     * those of the dequantized cache (k_descale * k, v_descale * v) in
     * dtype. k and v strides are then in one-byte elements, multiples of
     * 16, and head_dim and head_dim_v multiples of 16. out has dtype. */
    int32_t kv_dtype;
    /* The flashcore_dtype of out: 0 (the default) for dtype's, or dtype
     * itself; BF16 for FP8_E4M3 queries (0 means BF16 there too, as in
     * FlashAttention 3). Any other value returns FLASHCORE_STATUS_UNSUPPORTED.
     *
     * fp8 prefill: dtype FLASHCORE_DTYPE_FP8_E4M3 makes q, k and v e4m3
     * (kv_dtype 0 or FP8_E4M3) and out bf16; the products run on fp8 tensor
     * cores, the probabilities rounded to e4m3 (scaled so that each row's
     * largest is 256) before P * V, as FlashAttention 3 does. It runs on
     * sm_90 GPUs (H100, H200) with the library's sm_90a kernels only
     * (FLASHCORE_STATUS_UNSUPPORTED elsewhere, or in a build without them,
     * or where the TMA unit cannot describe q, k, v or out: a stride of
     * 2^40 bytes or more),
     * with kernels at head dims (64, 64), (128, 128) and (256, 256) (other
     * head dims run on the smallest that covers them), with causal, window,
     * GQA, lse, split-KV, varlen, seqused_k and paged K/V; softcap is not
     * supported. q, k and v strides are then in one-byte elements,
     * multiples of 16; lse is in the usual units, of the dequantized
     * scores. */
    int32_t out_dtype;

    /* Descale factors of quantized inputs, as FlashAttention 3's and vLLM's:
     * the values a quantized tensor stands for are its elements times the
     * factor. Each is NULL (the default: 1) or a device array of float32,
     * 4-byte aligned, indexed by (batch, K/V head): the factor of batch b
     * and K/V head h (query heads h * num_heads_q / num_heads_kv ... of
     * GQA) is descale[b * descale_batch_stride + h * descale_head_stride].
     * Strides are in elements and >= 0, and 0 where the array is NULL;
     * both 0 is one factor for the whole tensor (vLLM's per-tensor k_scale
     * and v_scale), and [batch_size, num_heads_kv] contiguous is
     * (num_heads_kv, 1). These rules are checked in empty calls too.
     * k_descale and v_descale need e4m3 k and v (kv_dtype or dtype
     * FP8_E4M3); q_descale needs dtype FP8_E4M3 (fp8 queries). The scores are
     * softmax_scale * q_descale * k_descale * (q . k), and the output is
     * multiplied by v_descale; factors should be finite and > 0 (they are
     * read on the device, not checked: others give wrong results). */
    const float *q_descale;
    const float *k_descale;
    const float *v_descale;
    int64_t q_descale_batch_stride, q_descale_head_stride;
    int64_t k_descale_batch_stride, k_descale_head_stride;
    int64_t v_descale_batch_stride, v_descale_head_stride;

    /* ---- Fields added in 0.9. ---- */

    /* Chunked attention, as Llama 4's and FlashAttention 3's
     * attention_chunk: 0 (the default) is off; a chunk length > 0 lets query
     * i see key j only where j and i's diagonal key (i + seqlen_k -
     * seqlen_q, aligned as for causal) lie in the same chunk,
     * [c * attention_chunk, (c + 1) * attention_chunk) for an integer c.
     * It combines with causal and the window (a key must pass every mask);
     * Llama 4 uses causal with attention_chunk 8192. Key tiles outside a
     * query block's chunks are skipped, not computed. Rows that see no key
     * give out = 0 and lse = -infinity (the sink, with sinks). Must be >= 0. */
    int32_t attention_chunk;

    /* Learnable attention sinks, as gpt-oss's (FlashAttention 4's
     * learnable_sink): NULL (the default), or a device array of num_heads_q
     * float32 logits, 4-byte aligned. Head h's sinks[h], in the units of
     * the scaled (and capped) scores, joins the softmax denominator of each
     * of h's rows and attends to nothing:
     *     out = sum_j exp(s_j) v_j / (exp(sinks[h]) + sum_j exp(s_j)),
     *     lse = log(exp(sinks[h]) + sum_j exp(s_j)),
     * over the keys j the row sees. A row that sees no key gives out = 0
     * and lse = sinks[h]; -infinity is no sink for that head. Supported with
     * every other field; a split-KV call counts the sink once, in its merge.
     * Read on the device, not checked: NaN gives NaN rows. */
    const float *sinks;

    /* SMs the call leaves to kernels on other streams, as FlashAttention
     * 3's sm_margin: 0 (the default) uses every SM of the handle's device.
     * A context-parallel ring sets it so that the NCCL transfer of the next
     * K/V slice runs beside the attention on the slice in hand. Persistent
     * kernels (the sm_90a forward) launch at most (SMs - sm_margin) CTAs,
     * one an SM; the split-KV heuristic and every grid-size decision count
     * those SMs only. The portable kernels' grids are not persistent: their
     * CTAs run wherever an SM is free, so a kernel on another stream takes
     * SMs as their CTAs finish, without a margin. Must be >= 0 and leave at
     * least one SM (INVALID_ARGUMENT, from the calls that plan: the
     * workspace query and the call itself). It changes the plan, not the
     * arithmetic: results are those of another split count at most. */
    int32_t sm_margin;
} flashcore_forward_params;

/* Zeroes the struct_size bytes at params and sets struct_size, dtype = FP16,
 * softmax_scale = default, causal = 0; sizes, pointers and strides are left 0
 * for the caller. Pass sizeof(flashcore_forward_params) as the caller
 * compiled it: the library never writes past it, whatever its own version. */
FLASHCORE_API flashcore_status flashcore_forward_params_init(flashcore_forward_params *params, size_t struct_size);

/* Sets all twelve strides for densely packed q, k, v and out in the given
 * layout, from batch_size, seqlen_q, seqlen_k, num_heads_q, num_heads_kv,
 * head_dim and head_dim_v (which must be set first: head_dim > 0, the
 * others >= 0 as for an empty call). The products are exact: where a packed
 * tensor would span more than 2^63 bytes, it returns
 * FLASHCORE_STATUS_INVALID_ARGUMENT and writes nothing. */
FLASHCORE_API flashcore_status flashcore_set_contiguous_strides(flashcore_forward_params *params,
                                                                flashcore_layout layout);

/* The (head_dim, head_dim_v) pairs this build has kernels of its own for, in
 * increasing order of head_dim, then head_dim_v: the default build has
 * (32, 32), (64, 64), (96, 96), (128, 128), (192, 128), (256, 256),
 * (512, 512) and (576, 512) (v as k's view: see head_dim_v). Every GPU
 * the library supports runs all of them. A call whose head dims are not in
 * the list runs on the first listed pair with head_dim and head_dim_v both at
 * least its own (both must be multiples of 8); with none,
 * flashcore_forward returns FLASHCORE_STATUS_UNSUPPORTED.
 *
 * Writes min(capacity, number of pairs) pairs to head_dims[i] and
 * head_dims_v[i] (either may be NULL when capacity is 0) and the number of
 * pairs to *count, so a first call with capacity 0 sizes the arrays. */
FLASHCORE_API flashcore_status flashcore_supported_head_dims(int32_t *head_dims, int32_t *head_dims_v,
                                                             size_t capacity, size_t *count);

/* Checks everything about *params that does not depend on the GPU: sizes,
 * head counts, head_dim and dtype support, pointers, alignment, strides,
 * scale. Returns the status flashcore_forward would return for these
 * parameters before looking at the device. Useful to validate early; the
 * forward call performs the same checks itself. */
FLASHCORE_API flashcore_status flashcore_forward_check(const flashcore_forward_params *params);

/* ---------------------------------------------------------------------------
 * Workspace
 *
 * A call that splits its keys (num_splits, above) keeps each part's partial
 * output and log-sum-exp in a caller-provided device workspace:
 *   - flashcore_forward_workspace_size gives its size in bytes. The size
 *     depends only on the params' dtype, kv_dtype, batch_size, num_heads_q,
 *     num_heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v, causal,
 *     num_splits, use_window, window_left, window_right and
 *     attention_chunk, on whether
 *     seqused_k, cu_seqlens_q, cu_seqlens_k and block_table are set (not on
 *     what they hold), and on the handle's device (its multiprocessor count
 *     feeds the num_splits heuristic); not on other pointers, strides, the
 *     softmax scale or softcap. The same params on the same handle always give the
 *     same size, so a buffer sized once can be reused, and captured into
 *     CUDA graphs, for every call with those params.
 *   - It is 0 when the call does not split (num_splits = 1 always gives 0);
 *     then workspace and workspace_bytes are not looked at (NULL, or any
 *     pointer and size).
 *   - Otherwise flashcore_forward needs workspace_bytes >= that size
 *     (FLASHCORE_STATUS_WORKSPACE_TOO_SMALL if not) and a workspace pointer
 *     that is not NULL (FLASHCORE_STATUS_INVALID_ARGUMENT) and
 *     FLASHCORE_ALIGNMENT aligned (FLASHCORE_STATUS_MISALIGNED).
 *   - The workspace needs no initialisation; the call overwrites it, and it
 *     must not be used by anything else until the call's work completes on
 *     its stream.
 * ------------------------------------------------------------------------- */

/* Bytes of device workspace flashcore_forward needs for these parameters on
 * this handle's device (0 when the call does not split its keys). Only the
 * fields listed under "Workspace" are read (of seqused_k, cu_seqlens_q,
 * cu_seqlens_k and block_table only whether they are NULL); the data
 * pointers may still be NULL. */
FLASHCORE_API flashcore_status flashcore_forward_workspace_size(flashcore_handle handle,
                                                                const flashcore_forward_params *params,
                                                                size_t *workspace_bytes);

/*
 * Queues the attention computation on `stream` (a cudaStream_t, NULL for the
 * default stream) and returns without waiting. `workspace` must be at least
 * the bytes flashcore_forward_workspace_size returned, FLASHCORE_ALIGNMENT
 * aligned, and not used by anything else until the work completes; it may be
 * NULL when that size is 0. The call uses the handle's device whatever device
 * is current on the calling thread, and leaves the current device as it was.
 * It can be captured into a CUDA graph.
 *
 * Results are deterministic: the same inputs give bitwise-identical outputs.
 */
FLASHCORE_API flashcore_status flashcore_forward(flashcore_handle handle, const flashcore_forward_params *params,
                                                 void *workspace, size_t workspace_bytes, void *stream);

/* ---------------------------------------------------------------------------
 * Backward attention (training)
 *
 * The gradients of the forward pass: given the forward's inputs q, k, v, its
 * output out and log-sum-exp lse, and the gradient of the loss with respect
 * to out (dout), flashcore_backward computes dq, dk and dv, as
 * FlashAttention's backward pass does:
 *     P  = exp(softmax_scale * Q K^T [masked] - lse)      (recomputed)
 *     dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dO * O)),
 *     dQ = softmax_scale * dS K,    dK = softmax_scale * dS^T Q
 * (with a softcap, dS is multiplied by the tanh's derivative first). Nothing
 * of size seqlen_q x seqlen_k is stored. The options are the forward's: the
 * same values must be passed as the forward call that produced out and lse
 * was given (dtype, scale, causal, window, softcap, GQA, head_dim_v,
 * varlen, attention_chunk, sinks), since P is recomputed from them; paged
 * K/V caches are not taken.
 *
 * The call runs three kernels on its stream: a preprocess (the row sums of
 * dO * O; the dQ accumulator zeroed), the main kernel (parallel over blocks
 * of keys, dK and dV accumulated in registers, dQ in an fp32 accumulator in
 * the workspace) and a postprocess (dQ scaled and converted to dtype).
 * ------------------------------------------------------------------------- */

/*
 * Everything one backward call needs. Logical shapes, as the forward's
 * (element strides, the last dimension contiguous):
 *   q, dq:     [batch_size, num_heads_q,  seqlen_q, head_dim]
 *   k, dk:     [batch_size, num_heads_kv, seqlen_k, head_dim]
 *   v, dv:     [batch_size, num_heads_kv, seqlen_k, head_dim_v]
 *   out, dout: [batch_size, num_heads_q,  seqlen_q, head_dim_v]
 *   lse:       [batch_size, num_heads_q,  seqlen_q], float32, contiguous
 *              (with cu_seqlens_q: [num_heads_q, total_seqlen_q]), as the
 *              forward wrote it.
 * dq, dk and dv have the dtype of q; each has strides of its own. Strides
 * follow the forward's rules (>= 0, multiples of FLASHCORE_ALIGNMENT /
 * sizeof(element)); every tensor pointer is FLASHCORE_ALIGNMENT aligned,
 * lse 4-byte aligned.
 *
 * Aliasing: dq, dk, dv, dsinks and the workspace are written; they must not
 * overlap one another nor any input (q, k, v, out, dout, lse, seqused_k,
 * cu_seqlens_q, cu_seqlens_k, sinks), each taken as the address range from its
 * first to its last byte; the inputs may share memory. dq, dk and dv must not
 * overlap themselves either. Overlap returns FLASHCORE_STATUS_INVALID_ARGUMENT
 * naming the two tensors. dq doubles as scratch between the call's kernels
 * (it holds the row sums until the postprocess writes the gradient), so its
 * contents before the call do not matter.
 *
 * Written: every element of dq, dk and dv inside the call's sequences (rows
 * of queries that see no key get dq = 0; keys no query sees, and keys past
 * seqused_k[b], get dk = dv = 0). With cu_seqlens_q/_k, rows of the packed
 * tensors outside every sequence are not written.
 *
 * Empty calls: batch_size or num_heads_q 0 succeed having read, written and
 * launched nothing (workspace size 0, pointers and strides not looked at).
 * seqlen_q 0 (or total_seqlen_q 0 with cu_seqlens_q) with keys is not
 * empty: dq is, but dk and dv are written, as zeros (no query sees a key);
 * q, out, dout, dq and lse then hold nothing, and their pointers and
 * strides are not looked at.
 * seqlen_k must be >= 1 unless the call is empty, as in the forward.
 */
typedef struct flashcore_backward_params {
    /* sizeof(flashcore_backward_params) as the caller compiled it. */
    size_t struct_size;

    int32_t dtype; /* flashcore_dtype of q, k, v, out, dout, dq, dk, dv: FP16 or BF16 */
    int32_t batch_size;
    int32_t seqlen_q;
    int32_t seqlen_k;
    int32_t num_heads_q;
    int32_t num_heads_kv;
    int32_t head_dim;   /* of q and k: as flashcore_forward_params::head_dim */
    int32_t head_dim_v; /* of v and out; 0 (the default): head_dim */

    /* As the forward's fields of the same names. */
    int32_t causal;
    float softmax_scale;
    int32_t use_window;
    int32_t window_left;
    int32_t window_right;
    float softcap;

    /* Non-zero: bitwise-identical dq, dk and dv from run to run for the same
     * inputs (the dQ accumulator's additions are made in a fixed order, which
     * costs some speed). 0 (the default): the additions race, so dq may
     * differ in its last bits from run to run; dk and dv are deterministic
     * either way. */
    int32_t deterministic;

    /* Inputs. */
    const void *q;
    const void *k;
    const void *v;
    const void *out;
    const void *dout;
    const float *lse; /* required: the forward's lse */
    /* Outputs. */
    void *dq;
    void *dk;
    void *dv;

    /* Element strides. flashcore_backward_set_contiguous_strides sets them
     * for packed tensors. */
    int64_t q_batch_stride, q_seq_stride, q_head_stride;
    int64_t k_batch_stride, k_seq_stride, k_head_stride;
    int64_t v_batch_stride, v_seq_stride, v_head_stride;
    int64_t out_batch_stride, out_seq_stride, out_head_stride;
    int64_t dout_batch_stride, dout_seq_stride, dout_head_stride;
    int64_t dq_batch_stride, dq_seq_stride, dq_head_stride;
    int64_t dk_batch_stride, dk_seq_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_seq_stride, dv_head_stride;

    /* Ragged batches, as the forward's fields of the same names: seqused_k
     * (keys past it get dk = dv = 0), and packed q/out/dout/dq with
     * cu_seqlens_q and k/v/dk/dv with cu_seqlens_k (their batch strides then
     * ignored), each NULL (the default) or a device int32 array. */
    const int32_t *seqused_k;
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int32_t total_seqlen_q;
    int32_t total_seqlen_k;

    /* ---- Fields added in 0.9. ---- */

    /* As the forward's fields of the same names. */
    int32_t attention_chunk;
    const float *sinks;
    /* The gradient with respect to sinks: NULL (the default: not computed),
     * or a device array of num_heads_q float32, 4-byte aligned, written
     * (not accumulated), each head's sum over the batch and its rows:
     *     dsinks[h] = -sum over rows of exp(sinks[h] - lse) * rowsum(dout * out).
     * Needs sinks; bitwise the same from run to run in both modes. It is an
     * output as dq, dk and dv are (see "Aliasing"); an empty call
     * (batch_size or num_heads_q 0) leaves it unwritten, as it does them,
     * and looks at neither it nor sinks. */
    float *dsinks;

    /* SMs the call leaves to kernels on other streams, as the forward's
     * field of the same name. The backward's kernels are not persistent,
     * so it bounds what assumes the whole GPU: the deterministic mode's
     * schedule that needs a head's key blocks resident together is taken
     * only where they fit (SMs - sm_margin) / 2. Must be >= 0 and leave at
     * least one SM (INVALID_ARGUMENT from the workspace query and the
     * call). */
    int32_t sm_margin;
} flashcore_backward_params;

/* Zeroes the struct_size bytes at params and sets struct_size, dtype = FP16,
 * softmax_scale = default; everything else 0 (not causal, no window, no
 * softcap, not deterministic). Pass sizeof(flashcore_backward_params). */
FLASHCORE_API flashcore_status flashcore_backward_params_init(flashcore_backward_params *params,
                                                              size_t struct_size);

/* Sets all 24 strides for densely packed tensors in the given layout, as
 * flashcore_set_contiguous_strides does for the forward: dq like q, dk like
 * k, dv like v, dout like out. The sizes and head dims must be set first;
 * nothing is written on failure. */
FLASHCORE_API flashcore_status flashcore_backward_set_contiguous_strides(flashcore_backward_params *params,
                                                                         flashcore_layout layout);

/* Checks everything about *params that does not depend on the GPU, as
 * flashcore_forward_check does: the status flashcore_backward would return
 * before looking at the device. */
FLASHCORE_API flashcore_status flashcore_backward_check(const flashcore_backward_params *params);

/* Bytes of device workspace flashcore_backward needs: the fp32 dQ
 * accumulator, 4 * num_heads_q * head_dim bytes per query row (rows:
 * batch_size * seqlen_q, or total_seqlen_q with cu_seqlens_q), rounded up to
 * FLASHCORE_ALIGNMENT; 0 for an empty call. It depends only on the shapes
 * (dtype, batch_size, seqlen_q, seqlen_k, num_heads_q, num_heads_kv,
 * head_dim, head_dim_v, total_seqlen_q with cu_seqlens_q set), never on
 * pointers, strides or options, so a buffer sized once serves every call of
 * those shapes. The workspace needs no initialisation and must not be used
 * by anything else until the call's work completes. */
FLASHCORE_API flashcore_status flashcore_backward_workspace_size(flashcore_handle handle,
                                                                 const flashcore_backward_params *params,
                                                                 size_t *workspace_bytes);

/* Queues the backward computation on `stream` on the handle's device and
 * returns without waiting, as flashcore_forward does: workspace at least
 * flashcore_backward_workspace_size bytes (FLASHCORE_STATUS_WORKSPACE_TOO_SMALL
 * otherwise), FLASHCORE_ALIGNMENT aligned. Can be captured into a CUDA
 * graph. Bad parameters return a status having queued nothing. */
FLASHCORE_API flashcore_status flashcore_backward(flashcore_handle handle, const flashcore_backward_params *params,
                                                  void *workspace, size_t workspace_bytes, void *stream);

/* ---------------------------------------------------------------------------
 * Merging partial attention results
 *
 * Attention over keys split into parts (a KV cache spread over devices for
 * context parallelism, a shared prefix cached apart from each request's own
 * keys, or any split the caller makes) can be computed part by part, each
 * part giving an output O_s and its log-sum-exp LSE_s (flashcore_forward's
 * out and lse), and merged exactly:
 *     LSE = log(sum_s exp(LSE_s)),   O = sum_s exp(LSE_s - LSE) * O_s.
 * A part in which a row sees no key has LSE_s = -infinity and contributes
 * nothing; a row that no part sees gets O = 0 and LSE = -infinity, as
 * flashcore_forward gives it. This is the step flashcore_forward runs after
 * a split-KV call, in fp32.
 * ------------------------------------------------------------------------- */

/* The largest num_states and head_dim flashcore_merge_params accepts. */
#define FLASHCORE_MERGE_MAX_NUM_STATES 65536
#define FLASHCORE_MERGE_MAX_HEAD_DIM 65536

/*
 * Logical shapes (element strides, last dimension contiguous):
 *   partial_out:  [num_states, batch_size, num_heads, seqlen, head_dim]
 *   partial_lse:  [num_states, batch_size, num_heads, seqlen], float32
 *   out:          [batch_size, num_heads, seqlen, head_dim]
 *   lse:          [batch_size, num_heads, seqlen], float32, contiguous
 *                 (optional)
 * partial_out and out must be FLASHCORE_ALIGNMENT aligned, their strides
 * multiples of FLASHCORE_ALIGNMENT bytes, and head_dim a multiple of 8;
 * partial_lse and lse are 4-byte aligned. out and lse must not overlap the
 * partials, sinks or each other (checked as address ranges, see
 * "Aliasing").
 * batch_size, num_heads or seqlen may be 0: the call then succeeds having
 * done nothing; num_states is 1 to FLASHCORE_MERGE_MAX_NUM_STATES and
 * head_dim 8 to FLASHCORE_MERGE_MAX_HEAD_DIM.
 */
typedef struct flashcore_merge_params {
    /* sizeof(flashcore_merge_params) as the caller compiled it. */
    size_t struct_size;

    int32_t partial_dtype; /* flashcore_dtype of partial_out: FP16, BF16 or FP32 */
    int32_t out_dtype;     /* flashcore_dtype of out: FP16, BF16 or FP32 */
    int32_t num_states;    /* partial results to merge, 1 .. FLASHCORE_MERGE_MAX_NUM_STATES */
    int32_t batch_size;
    int32_t num_heads;
    int32_t seqlen;
    int32_t head_dim;

    const void *partial_out;
    const float *partial_lse; /* natural-log LSE of each partial row */
    void *out;
    float *lse; /* optional (NULL: not written) */

    int64_t partial_state_stride, partial_batch_stride, partial_seq_stride, partial_head_stride;
    int64_t lse_state_stride, lse_batch_stride, lse_seq_stride, lse_head_stride;
    int64_t out_batch_stride, out_seq_stride, out_head_stride;

    /* ---- Fields added in 0.9. ---- */

    /* Learnable sinks (flashcore_forward_params::sinks): NULL (the
     * default), or a device array of num_heads float32 logits, 4-byte
     * aligned. Head h's sink joins each of its rows as one more part, of
     * LSE sinks[h] and output 0:
     *     LSE = log(exp(sinks[h]) + sum_s exp(LSE_s)),  O = sum_s exp(LSE_s - LSE) * O_s;
     * a row that no part sees gets O = 0 and LSE = sinks[h]. Give it only to
     * the merge of all of a row's parts, each computed without sinks: a
     * merge whose result is merged again would count the sink twice. */
    const float *sinks;
} flashcore_merge_params;

/* Zeroes the struct_size bytes at params and sets struct_size, and both
 * dtypes to FP16. Pass sizeof(flashcore_merge_params). */
FLASHCORE_API flashcore_status flashcore_merge_params_init(flashcore_merge_params *params, size_t struct_size);

/* Checks everything about *params that does not depend on the GPU: dtypes,
 * sizes, pointers, alignment, strides, aliasing. Returns the status
 * flashcore_merge_states would return for these parameters before looking
 * at the device, as flashcore_forward_check does for flashcore_forward. */
FLASHCORE_API flashcore_status flashcore_merge_check(const flashcore_merge_params *params);

/* Queues the merge on `stream` (a cudaStream_t, NULL for the default
 * stream) on the handle's device and returns without waiting. Needs no
 * workspace; can be captured into a CUDA graph; deterministic. Bad
 * parameters return a status having queued nothing. */
FLASHCORE_API flashcore_status flashcore_merge_states(flashcore_handle handle, const flashcore_merge_params *params,
                                                      void *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHCORE_H */
