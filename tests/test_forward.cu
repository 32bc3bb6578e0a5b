// GPU correctness of flashcore_forward against the float64 CPU reference:
// fp16/bf16 x every kernel head dim (32, 64, 96, 128, 192/128, 256) and head
// dims that run on the next larger kernel (80, 112, 160/128, 40/24) x causal
// on/off over many shapes and layouts, LSE, GQA/MQA, a tensor over 2^31
// elements, determinism, concurrency; an fp8 (e4m3) K/V cache with its
// descale factors over the same head dims, masks, varlen and paged layouts;
// fp8 prefill (q, k and v e4m3, out bf16; compute capability 9.0 only)
// over its head dims, masks, varlen and paged layouts; and dense, varlen and
// paged calls at every head dim as on GPUs with less shared memory per block
// (FLASHCORE_TEST_SMEM_PER_BLOCK: sm_86/sm_89's 99 KiB, an A100's 163 KiB),
// where fp8 prefill is refused and pinned variants that do not fit give way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device_tensors.h"
#include "flashcore.h"
#include "forward_workload.h"
#include "reference.h"
#include "scoped_env.h"
#include "test_skip.h"

using namespace flashcore_test;

namespace {
class ForwardTest : public testing::TestWithParam<FwdCase> {};

TEST_P(ForwardTest, MatchesFloat64Reference) {
    FC_REQUIRE_GPU();
    expect_matches_reference(GetParam());
}

// Sliding windows (0, 1, less than a tile, more than the sequence; with and
// without causal; Sq < Sk, Sq > Sk, decode with GQA packing, forced splits)
// and softcap with large logits, alone and with a window. Part of the
// Shapes suite, so every pinned tile variant runs them too.
std::vector<FwdCase> window_and_softcap_cases() {
    constexpr auto fp16 = FLASHCORE_DTYPE_FP16;
    constexpr auto bf16 = FLASHCORE_DTYPE_BF16;
    const FwdCase square{fp16, 64, true, 1, 2, 2, 512, 512, Layout::kBHSD};
    const FwdCase square_full{bf16, 128, false, 1, 2, 2, 512, 512, Layout::kBSHD};
    const FwdCase chunk{fp16, 128, true, 1, 4, 2, 300, 1000, Layout::kBSHD};
    const FwdCase tall{bf16, 64, false, 1, 2, 2, 600, 300, Layout::kBHSD};
    const FwdCase decode{bf16, 128, false, 2, 8, 2, 1, 2048, Layout::kBSHD};
    const FwdCase few_rows{fp16, 64, true, 1, 8, 8, 16, 4096, Layout::kBHSD};
    const FwdCase gqa{fp16, 64, true, 2, 8, 2, 300, 421, Layout::kPadded};
    const FwdCase long_causal{bf16, 128, true, 1, 2, 2, 2048, 2048, Layout::kBHSD};
    FwdCase split3{fp16, 64, false, 1, 4, 4, 64, 2048, Layout::kBSHD};
    split3.num_splits = 3;
    return {
        square.with_window(0, 0),
        square.with_window(1, -1),
        square.with_window(37, 0),
        square.with_window(200, -1),
        square.with_window(4096, 0),
        square_full.with_window(0, 0),
        square_full.with_window(100, 50),
        square_full.with_window(-1, 0),
        square_full.with_window(-1, 30),
        square_full.with_window(63, -1),
        square_full.with_window(5000, 5000),
        chunk.with_window(128, 0),
        chunk.with_window(700, -1),
        tall.with_window(50, 10),
        tall.with_window(0, 0),
        decode.with_window(500, -1),
        decode.with_window(0, 0),
        few_rows.with_window(1000, 0),
        gqa.with_window(64, 0),
        long_causal.with_window(256, 0),
        split3.with_window(300, 0),
        split3.with_window(100, 100),
        square_full.with_softcap(30.f, 1.f),
        square.with_softcap(50.f, 0.5f),
        gqa.with_softcap(30.f, 1.f).with_window(100, 0),
        chunk.with_softcap(20.f, 1.f),
        decode.with_softcap(30.f, 0.5f),
        split3.with_softcap(30.f, 1.f),
        long_causal.with_softcap(50.f, 1.f).with_window(1000, 0),
    };
}

// Per-batch key counts (seqused_k) over a cache whose unused rows hold NaN
// and infinity: counts of 0, 1, tile multiples and not, the full cache;
// decode with GQA packing and forced splits, chunked prefill with causal
// (rows that see no key when a count is below seqlen_q), full prefill,
// window, softcap, the head dims whose panels differ (32, 96: 64-byte rows;
// 256: the register output path) and padded strides.
std::vector<FwdCase> seqused_k_cases() {
    constexpr auto fp16 = FLASHCORE_DTYPE_FP16;
    constexpr auto bf16 = FLASHCORE_DTYPE_BF16;
    const FwdCase decode{bf16, 128, false, 4, 8, 2, 1, 2048, Layout::kBSHD};
    FwdCase decode_split3 = decode;
    decode_split3.num_splits = 3;
    const FwdCase packed{fp16, 64, false, 2, 16, 2, 4, 4096, Layout::kBSHD};
    const FwdCase chunk{fp16, 64, true, 3, 4, 2, 100, 1024, Layout::kBHSD};
    const FwdCase prefill{bf16, 128, false, 2, 2, 2, 300, 1000, Layout::kBSHD};
    const FwdCase windowed{fp16, 64, true, 2, 2, 2, 64, 2048, Layout::kBHSD};
    const FwdCase d96{bf16, 96, false, 2, 4, 4, 1, 1000, Layout::kPadded};
    const FwdCase d256{fp16, 256, false, 2, 2, 1, 16, 700, Layout::kBSHD};
    const FwdCase d32{bf16, 32, true, 2, 2, 2, 200, 520, Layout::kBHSD};
    return {
        decode.with_seqused_k({0, 1, 777, 2048}),
        decode_split3.with_seqused_k({1500, 129, 2000, 64}),
        packed.with_seqused_k({4000, 33}),
        chunk.with_seqused_k({100, 600, 50}),
        prefill.with_seqused_k({999, 257}),
        windowed.with_window(300, 0).with_seqused_k({2000, 700}),
        prefill.with_softcap(30.f, 1.f).with_seqused_k({640, 1}),
        d96.with_seqused_k({555, 1000}),
        d256.with_seqused_k({300, 650}),
        d32.with_seqused_k({130, 519}),
    };
}

// `count` sequence lengths below `below`, spread by a stride, every
// seventh empty: batches of more sequences than one warp's search over 32
// (the sm90 schedule's step_of).
std::vector<int> spread_lengths(int count, int below) {
    std::vector<int> lengths;
    for (int b = 0; b < count; ++b) lengths.push_back(b % 7 == 3 ? 0 : (b * 733 + 17) % below);
    return lengths;
}

// Variable-length batches and paged caches: sequences of length 0 and 1,
// lengths that are not tile multiples, queries and keys of different
// lengths (chunked prefill), GQA, splits, window, softcap, the head dims
// whose paths differ (96: 64-byte panels; 256: the register output path),
// batches of more than 32 sequences, page sizes 16, 48 (a multiple of 16
// that divides no tile), 64 and 256, in shuffled order with the pool's last
// page in use, and packed queries over a paged cache.
std::vector<FwdCase> serving_cases() {
    constexpr auto fp16 = FLASHCORE_DTYPE_FP16;
    constexpr auto bf16 = FLASHCORE_DTYPE_BF16;
    const FwdCase d64{fp16, 64, true, 1, 4, 2, 1, 1, Layout::kBSHD};
    const FwdCase d128{bf16, 128, true, 1, 8, 2, 1, 1, Layout::kBSHD};
    FwdCase d128_split3 = d128;
    d128_split3.num_splits = 3;
    d128_split3.causal = false;
    const FwdCase d256{fp16, 256, false, 1, 2, 1, 1, 1, Layout::kBSHD};
    const FwdCase d96{bf16, 96, true, 1, 2, 2, 1, 1, Layout::kPadded};
    const FwdCase decode{bf16, 128, false, 4, 8, 2, 1, 2048, Layout::kBSHD};
    FwdCase decode_split3 = decode;
    decode_split3.num_splits = 3;
    const FwdCase prefill{bf16, 64, true, 2, 4, 2, 300, 1000, Layout::kBSHD};
    const FwdCase chunk{fp16, 128, true, 2, 4, 2, 200, 520, Layout::kPadded};
    const FwdCase wide{fp16, 256, false, 2, 2, 1, 16, 700, Layout::kBSHD};
    const FwdCase windowed{fp16, 64, true, 2, 2, 2, 64, 2048, Layout::kBHSD};
    return {
        d64.with_varlen_q({0, 1, 17, 200, 513}).with_varlen_k({0, 1, 17, 200, 513}),
        d128.with_varlen_q({128, 1, 300}).with_varlen_k({1000, 64, 300}),
        d64.with_varlen_q({700, 33, 1500}).with_varlen_k({700, 33, 1500}).with_window(256, 0).with_softcap(30.f, 1.f),
        d128_split3.with_varlen_q({1, 5, 64}).with_varlen_k({2000, 3, 900}),
        d256.with_varlen_q({150, 300}).with_varlen_k({150, 300}),
        d96.with_varlen_q({129, 1, 260}).with_varlen_k({129, 1, 260}),
        d128.with_varlen_q(spread_lengths(40, 700)).with_varlen_k(spread_lengths(40, 700)),
        d128_split3.with_varlen_q(spread_lengths(36, 300)).with_varlen_k(spread_lengths(36, 900)),
        FwdCase{bf16, 128, true, 3, 8, 2, 1, 700, Layout::kBSHD}.with_varlen_q({300, 1, 64}),
        // Packed keys whose tails past seqused_k hold NaN (zeroed in V on sm_90a).
        d128.with_varlen_q({200, 129}).with_varlen_k({700, 900}).with_seqused_k({650, 0}),
        decode.with_seqused_k({0, 1, 777, 2048}).with_pages(16),
        decode_split3.with_seqused_k({1500, 129, 2000, 64}).with_pages(256),
        prefill.with_seqused_k({1000, 257}).with_pages(64),
        chunk.with_seqused_k({500, 1}).with_pages(48),
        wide.with_seqused_k({300, 650}).with_pages(256),
        windowed.with_window(300, 0).with_softcap(30.f, 1.f).with_seqused_k({2000, 700}).with_pages(16),
        FwdCase{fp16, 128, true, 3, 8, 2, 1, 1200, Layout::kBSHD}
            .with_varlen_q({64, 200, 1})
            .with_seqused_k({500, 1200, 33})
            .with_pages(64),
    };
}

// Chunked attention (Llama 4) and learnable sinks (gpt-oss). Chunks:
// tile-aligned and not, of one key, longer than the sequence, causal or
// not, Sq < Sk (the diagonal inside a later chunk) and Sq > Sk (diagonals
// below key 0, whose chunk holds no key), with a window, a softcap, GQA
// decode packed and split. Sinks: causal and full, rows that see no key
// (lse = the sink), gpt-oss's window of 128 with GQA, decode packed and
// split (the merge adds the sink once), softcap, with chunks, varlen,
// seqused_k and paged caches.
std::vector<FwdCase> chunk_and_sinks_cases() {
    constexpr auto fp16 = FLASHCORE_DTYPE_FP16;
    constexpr auto bf16 = FLASHCORE_DTYPE_BF16;
    const FwdCase square{fp16, 64, true, 1, 4, 4, 512, 512, Layout::kBHSD};
    const FwdCase square_full{bf16, 128, false, 1, 2, 2, 512, 512, Layout::kBSHD};
    const FwdCase short_q{fp16, 128, true, 1, 4, 2, 300, 1000, Layout::kBSHD};
    const FwdCase tall{bf16, 64, false, 1, 2, 2, 600, 300, Layout::kBHSD};
    const FwdCase tall_causal{fp16, 64, true, 1, 4, 4, 600, 300, Layout::kBSHD};
    const FwdCase decode{bf16, 128, false, 2, 8, 2, 1, 2048, Layout::kBSHD};
    const FwdCase gqa{fp16, 64, true, 2, 8, 2, 300, 421, Layout::kPadded};
    const FwdCase long_causal{bf16, 128, true, 1, 2, 2, 2048, 2048, Layout::kBHSD};
    const FwdCase d256{fp16, 256, true, 1, 2, 1, 700, 700, Layout::kBSHD};
    const FwdCase d32{bf16, 32, false, 2, 4, 4, 200, 520, Layout::kBHSD};
    FwdCase split3{fp16, 64, false, 1, 4, 4, 64, 2048, Layout::kBSHD};
    split3.num_splits = 3;
    FwdCase decode_split3 = decode;
    decode_split3.num_splits = 3;
    return {
        square.with_chunk(128),
        square.with_chunk(100),
        square.with_chunk(1),
        square.with_chunk(5000),
        square_full.with_chunk(200),
        short_q.with_chunk(256),
        tall.with_chunk(128),
        decode.with_chunk(512),
        split3.with_chunk(300),
        square.with_window(100, 0).with_chunk(128),
        long_causal.with_chunk(512),
        long_causal.with_chunk(384),  // the sm_90a schedule's pairs: runs of 3 blocks, the last run 1
        long_causal.with_chunk(777),
        d256.with_chunk(300),
        d32.with_chunk(64),
        gqa.with_softcap(30.f, 1.f).with_chunk(96),
        square.with_sinks(),
        square_full.with_sinks(),
        tall_causal.with_sinks(),
        gqa.with_window(128, 0).with_sinks(),
        decode.with_sinks(),
        decode_split3.with_sinks(),
        split3.with_window(100, 100).with_sinks(),
        square_full.with_softcap(30.f, 1.f).with_sinks(),
        long_causal.with_chunk(512).with_sinks(),
        d256.with_sinks(),
        d32.with_window(50, 10).with_sinks(),
        decode.with_seqused_k({0, 1}).with_sinks(),
        FwdCase{fp16, 64, true, 1, 8, 2, 1, 1, Layout::kBSHD}
            .with_varlen_q({0, 1, 17, 200, 513})
            .with_varlen_k({0, 1, 17, 200, 513})
            .with_window(128, 0)
            .with_sinks(),
        FwdCase{bf16, 128, true, 1, 8, 2, 1, 1, Layout::kBSHD}
            .with_varlen_q({128, 1, 300})
            .with_varlen_k({1000, 64, 300})
            .with_chunk(256),
        FwdCase{fp16, 128, true, 3, 8, 2, 1, 1200, Layout::kBSHD}
            .with_varlen_q({64, 200, 1})
            .with_seqused_k({500, 1200, 33})
            .with_pages(64)
            .with_chunk(128)
            .with_sinks(),
        decode_split3.with_seqused_k({1500, 129}).with_pages(256).with_sinks(),
    };
}

// The wide kernels (head dims past 256): d512 (Gemma's), and MLA decode on
// a latent cache (576 / 512, v passed as k's view) at 16, 64 and 128 query
// heads on one K/V head, contiguous, packed and paged (pages of 16, 32 and 64), split,
// with speculative steps, windows, chunks, sinks and softcaps; d512 prefill causal and windowed with sinks and a
// softcap, GQA decode packed and split, paged; 320 on the 512 kernel.
std::vector<FwdCase> wide_cases() {
    constexpr auto fp16 = FLASHCORE_DTYPE_FP16;
    constexpr auto bf16 = FLASHCORE_DTYPE_BF16;
    const FwdCase mla16{bf16, 576, false, 2, 16, 1, 1, 700, Layout::kBSHD, 512};
    const FwdCase mla64{bf16, 576, false, 2, 64, 1, 1, 1000, Layout::kBSHD, 512};
    const FwdCase mla128{fp16, 576, false, 2, 128, 1, 1, 513, Layout::kBSHD, 512};
    const FwdCase mla128_spec{bf16, 576, true, 1, 128, 1, 2, 300, Layout::kBSHD, 512};
    const FwdCase d512{fp16, 512, true, 1, 2, 2, 300, 300, Layout::kBSHD};
    const FwdCase d512_full{bf16, 512, false, 2, 2, 1, 130, 257, Layout::kBHSD};
    const FwdCase d512_decode{bf16, 512, false, 2, 8, 2, 1, 1000, Layout::kBSHD};
    return {
        mla16.with_latent_v(),
        mla16.with_latent_v().with_splits(3),
        mla64.with_latent_v().with_seqused_k({1000, 333}).with_pages(64),
        mla64.with_latent_v().with_varlen_k({1, 900}),
        mla128.with_latent_v(),
        mla128.with_latent_v().with_seqused_k({0, 450}).with_pages(64),
        mla128_spec.with_latent_v().with_splits(2),
        // Pairs of key tiles with an odd count and a partial last one, pages
        // of 16 and 32 (a tile from several pages, or one), and splits of odd
        // lengths.
        mla64.with_latent_v().with_seqused_k({150, 40}).with_pages(16),
        mla128.with_latent_v().with_seqused_k({777, 200}).with_pages(32).with_splits(3),
        // Masks, softcap and sinks on the sm_90a kernel's 64-row blocks
        // (the same calls run on the portable tiles elsewhere).
        mla64.with_latent_v().with_window(333, 0).with_sinks(),
        FwdCase{bf16, 576, true, 2, 64, 1, 3, 211, Layout::kBSHD, 512}.with_latent_v().with_softcap(30.f, 1.f),
        FwdCase{fp16, 576, true, 1, 32, 1, 4, 1100, Layout::kBSHD, 512}.with_latent_v().with_chunk(256).with_sinks(),
        d512,
        d512_full,
        d512.with_window(100, 0).with_sinks(),
        d512_full.with_softcap(30.f, 1.f),
        d512_decode,
        d512_decode.with_splits(4).with_sinks(),
        d512_decode.with_seqused_k({1000, 17}).with_pages(64),
        FwdCase{fp16, 320, true, 1, 2, 2, 100, 200, Layout::kPadded},
    };
}

std::vector<FwdCase> all_cases() {
    struct Shape {
        int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
        Layout layout;
    };
    const Shape shapes[] = {
        // The mission shape and its neighbours.
        {1, 8, 8, 512, 512, Layout::kBHSD},
        {1, 8, 8, 256, 256, Layout::kBSHD},
        {1, 8, 8, 1024, 1024, Layout::kBHSD},
        // seqlen_q != seqlen_k, lengths that are not tile multiples, single rows.
        {1, 2, 2, 1, 1, Layout::kBSHD},
        {1, 2, 2, 1, 127, Layout::kBHSD},
        {1, 2, 2, 113, 203, Layout::kBSHD},
        {1, 2, 2, 128, 217, Layout::kBHSD},
        {1, 2, 2, 255, 256, Layout::kBSHD},
        {1, 2, 2, 512, 256, Layout::kBHSD},
        {1, 2, 2, 1023, 1024, Layout::kBSHD},
        {1, 2, 2, 2048, 2048, Layout::kBHSD},
        // GQA and MQA, batch > 1, padded strides.
        {2, 8, 2, 300, 421, Layout::kBSHD},
        {3, 4, 1, 200, 129, Layout::kBHSD},
        {2, 6, 3, 190, 333, Layout::kPadded},
    };
    // (head_dim, head_dim_v): every kernel of the default build, then head
    // dims that run on the next larger kernel with masked loads and stores.
    struct HeadDims {
        int qk, v;
        bool all_shapes;  // else the shapes up to 1024 x 1024 keys (the float64 reference is slow)
    };
    const HeadDims head_dims[] = {
        {32, 32, true},   {64, 64, true},   {96, 96, true},    {128, 128, true},
        {192, 128, true}, {256, 256, true}, {80, 80, false},   {112, 112, false},
        {160, 128, false}, {40, 24, false},
    };
    std::vector<FwdCase> cases;
    for (flashcore_dtype dtype : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
        for (const HeadDims &d : head_dims)
            for (bool causal : {false, true})
                for (const Shape &s : shapes) {
                    if (!d.all_shapes && int64_t(s.seqlen_q) * s.seqlen_k > 1024 * 1024) continue;
                    cases.push_back({dtype, d.qk, causal, s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k,
                                     s.layout, d.v == d.qk ? 0 : d.v});
                }
    const std::vector<FwdCase> masked = window_and_softcap_cases();
    cases.insert(cases.end(), masked.begin(), masked.end());
    const std::vector<FwdCase> used = seqused_k_cases();
    cases.insert(cases.end(), used.begin(), used.end());
    const std::vector<FwdCase> serving = serving_cases();
    cases.insert(cases.end(), serving.begin(), serving.end());
    const std::vector<FwdCase> chunk_and_sinks = chunk_and_sinks_cases();
    cases.insert(cases.end(), chunk_and_sinks.begin(), chunk_and_sinks.end());
    const std::vector<FwdCase> wide = wide_cases();
    cases.insert(cases.end(), wide.begin(), wide.end());
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ForwardTest, testing::ValuesIn(all_cases()),
                         [](const testing::TestParamInfo<FwdCase> &info) { return case_name(info.param); });

// ---------------------------------------------------------------------------
// An fp8 K/V cache (kv_dtype FLASHCORE_DTYPE_FP8_E4M3): K and V as e4m3
// bytes with descale factors, q and out fp16 or bf16, against the float64
// attention of the dequantized K and V, within the 16-bit dtype's bounds.
// ---------------------------------------------------------------------------

class ForwardFp8KvTest : public testing::TestWithParam<FwdCase> {};

TEST_P(ForwardFp8KvTest, MatchesFloat64ReferenceOfTheDequantizedCache) {
    FC_REQUIRE_GPU();
    expect_matches_reference(GetParam());
}

// Every kernel head dim of the default build x fp16/bf16 q x causal on/off
// over prefill (square; GQA with lengths that are not tile multiples;
// padded strides, 16-byte gaps in K and V), decode with MQA, and rows that
// see no key (seqlen_q > seqlen_k, causal: lse -inf); the descale layout
// turns with each case (NULL, per tensor, per (batch, head) either way).
// Then windows, softcap, varlen, seqused_k over a cache whose tail holds
// NaN bytes, and paged caches.
std::vector<FwdCase> fp8_kv_cases() {
    constexpr auto fp16 = FLASHCORE_DTYPE_FP16;
    constexpr auto bf16 = FLASHCORE_DTYPE_BF16;
    struct Shape {
        int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
        Layout layout;
    };
    const Shape shapes[] = {
        {1, 4, 4, 256, 256, Layout::kBHSD},
        {2, 8, 2, 113, 203, Layout::kBSHD},
        {2, 6, 3, 190, 333, Layout::kPadded},
        {3, 4, 1, 1, 517, Layout::kBSHD},
        {1, 2, 2, 300, 100, Layout::kBHSD},
    };
    struct HeadDims {
        int qk, v;
    };
    const HeadDims head_dims[] = {{32, 32}, {64, 64}, {96, 96}, {128, 128}, {192, 128}, {256, 256}};
    std::vector<FwdCase> cases;
    size_t turn = 0;
    for (flashcore_dtype dtype : {fp16, bf16})
        for (const HeadDims &d : head_dims)
            for (bool causal : {false, true})
                for (const Shape &s : shapes) {
                    const FwdCase c{dtype, d.qk, causal, s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k,
                                    s.layout, d.v == d.qk ? 0 : d.v};
                    cases.push_back(c.with_fp8_kv(descale_turn(turn++)));
                }

    const FwdCase chunk{fp16, 64, true, 1, 4, 2, 300, 1000, Layout::kBSHD};
    const FwdCase square_full{bf16, 128, false, 1, 2, 2, 512, 512, Layout::kBSHD};
    const FwdCase gqa{fp16, 64, true, 2, 8, 2, 300, 421, Layout::kPadded};
    const FwdCase decode{bf16, 128, false, 4, 8, 2, 1, 2048, Layout::kBSHD};
    const FwdCase d64{fp16, 64, true, 1, 4, 2, 1, 1, Layout::kBSHD};
    const FwdCase d128{bf16, 128, true, 1, 8, 2, 1, 1, Layout::kBSHD};
    const FwdCase d192{fp16, 192, false, 1, 4, 2, 1, 1, Layout::kBSHD, 128};
    const FwdCase prefill{bf16, 64, true, 2, 4, 2, 300, 1000, Layout::kBSHD};
    const FwdCase padded_chunk{fp16, 128, true, 2, 4, 2, 200, 520, Layout::kPadded};
    const FwdCase wide{fp16, 256, false, 2, 2, 1, 16, 700, Layout::kBSHD};
    const FwdCase d96{bf16, 96, true, 1, 2, 2, 1, 1, Layout::kPadded};
    const std::vector<FwdCase> masked_and_serving = {
        chunk.with_window(128, 0).with_fp8_kv(Descale::kPerBatchHead),
        square_full.with_window(100, 50).with_fp8_kv(Descale::kPerTensor),
        square_full.with_softcap(30.f, 1.f).with_fp8_kv(Descale::kPerHeadBatch),
        gqa.with_softcap(30.f, 1.f).with_window(100, 0).with_fp8_kv(Descale::kPerBatchHead),
        decode.with_softcap(30.f, 0.5f).with_window(500, -1).with_fp8_kv(Descale::kPerTensor),
        decode.with_seqused_k({0, 1, 777, 2048}).with_fp8_kv(Descale::kPerBatchHead),
        prefill.with_seqused_k({999, 257}).with_fp8_kv(Descale::kPerHeadBatch),
        d64.with_varlen_q({0, 1, 17, 200, 513}).with_varlen_k({0, 1, 17, 200, 513}).with_fp8_kv(Descale::kPerBatchHead),
        d128.with_varlen_q({128, 1, 300}).with_varlen_k({1000, 64, 300}).with_fp8_kv(Descale::kPerTensor),
        d192.with_varlen_q({150, 7, 64}).with_varlen_k({150, 300, 64}).with_fp8_kv(Descale::kPerHeadBatch),
        d96.with_varlen_q({129, 1, 260}).with_varlen_k({129, 1, 260}).with_fp8_kv(Descale::kNone),
        d128.with_varlen_q({200, 129}).with_varlen_k({700, 900}).with_seqused_k({650, 0})
            .with_fp8_kv(Descale::kPerBatchHead),
        d64.with_varlen_q({700, 33, 1500}).with_varlen_k({700, 33, 1500}).with_window(256, 0).with_softcap(30.f, 1.f)
            .with_fp8_kv(Descale::kPerTensor),
        decode.with_seqused_k({0, 1, 777, 2048}).with_pages(16).with_fp8_kv(Descale::kPerBatchHead),
        prefill.with_seqused_k({1000, 257}).with_pages(64).with_fp8_kv(Descale::kPerTensor),
        padded_chunk.with_seqused_k({500, 1}).with_pages(48).with_fp8_kv(Descale::kPerHeadBatch),
        wide.with_seqused_k({300, 650}).with_pages(256).with_fp8_kv(Descale::kPerBatchHead),
        FwdCase{fp16, 128, true, 3, 8, 2, 1, 1200, Layout::kBSHD}
            .with_varlen_q({64, 200, 1})
            .with_seqused_k({500, 1200, 33})
            .with_pages(64)
            .with_fp8_kv(Descale::kPerBatchHead),
        // bf16 queries past fp16's range: the products stay in bf16
        // (sm80/warp_gemm_e4m3.cuh), Q in registers (d128) or not (d256).
        decode.with_large_q(17).with_fp8_kv(Descale::kPerBatchHead),
        FwdCase{bf16, 256, false, 2, 2, 1, 16, 700, Layout::kBSHD}.with_large_q(17).with_fp8_kv(Descale::kPerTensor),
        FwdCase{bf16, 64, true, 2, 4, 2, 300, 1000, Layout::kBSHD}.with_large_q(20).with_fp8_kv(Descale::kNone),
        // Chunks and sinks over the fp8 cache.
        gqa.with_window(128, 0).with_sinks().with_fp8_kv(Descale::kPerBatchHead),
        decode.with_seqused_k({0, 1, 777, 2048}).with_pages(16).with_sinks().with_fp8_kv(Descale::kPerTensor),
        prefill.with_chunk(256).with_fp8_kv(Descale::kPerHeadBatch),
        // MLA decode on an e4m3 latent cache (v as k's view, k's factors).
        FwdCase{bf16, 576, false, 2, 16, 1, 1, 700, Layout::kBSHD, 512}.with_latent_v().with_fp8_kv(
            Descale::kPerBatchHead),
        FwdCase{bf16, 576, false, 2, 128, 1, 1, 900, Layout::kBSHD, 512}
            .with_latent_v()
            .with_seqused_k({900, 65})
            .with_pages(64)
            .with_fp8_kv(Descale::kPerTensor),
        FwdCase{fp16, 576, false, 1, 64, 1, 1, 2000, Layout::kBSHD, 512}.with_latent_v().with_splits(3).with_fp8_kv(
            Descale::kPerHeadBatch),
    };
    cases.insert(cases.end(), masked_and_serving.begin(), masked_and_serving.end());
    return cases;
}

// Instantiated as "Shapes" too, so that the runs with each tile variant
// pinned (tests/CMakeLists.txt, TEST_FILTER "Shapes/*") cover the fp8 cache.
INSTANTIATE_TEST_SUITE_P(Shapes, ForwardFp8KvTest, testing::ValuesIn(fp8_kv_cases()),
                         [](const testing::TestParamInfo<FwdCase> &info) { return case_name(info.param); });

// ---------------------------------------------------------------------------
// fp8 prefill (dtype FLASHCORE_DTYPE_FP8_E4M3): q, k and v e4m3 with descale
// factors, out bf16, on the sm_90a kernels (compute capability 9.0; other
// GPUs must refuse the calls, and the tests then skip with the library's
// reason), against the float64 attention of the dequantized inputs within
// the error bounds of e4m3 probabilities (support/reference.h,
// kFp8PrefillModel and kFp8PrefillRelL2).
// ---------------------------------------------------------------------------

class ForwardFp8Test : public testing::TestWithParam<FwdCase> {};

TEST_P(ForwardFp8Test, MatchesFloat64ReferenceOfTheDequantizedInputs) {
    FC_REQUIRE_GPU();
    expect_matches_reference(GetParam());
}

// The fp8 kernels' head dims (64, 128, 256) x causal on/off over whole
// tiles; GQA (8 query heads over 2) with lengths that are no multiple of a
// tile; padded strides (16-byte gaps in q, k and v, 8 elements in out);
// single query rows with MQA; seqlen_q > seqlen_k (causal: rows that see no
// key, lse -inf); and 1000 x 1000 with GQA. The descale layout turns with
// each case (NULL, per tensor, per (batch, K/V head) either way round), and
// kv_dtype/out_dtype are named or left 0 in turn. Then windows, a softmax
// scale, seqused_k over keys whose tails hold NaN bytes, variable-length
// batches, paged caches (pages of 16 and 256 keys in shuffled order, the
// pool's last page in use), and head dims that run on the next larger fp8
// kernel.
std::vector<FwdCase> fp8_prefill_cases() {
    constexpr auto e4m3 = FLASHCORE_DTYPE_FP8_E4M3;
    struct Shape {
        int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
        Layout layout;
    };
    const Shape shapes[] = {
        {1, 4, 4, 256, 256, Layout::kBHSD},
        {2, 8, 2, 300, 421, Layout::kBSHD},
        {2, 6, 3, 190, 333, Layout::kPadded},
        {3, 4, 1, 1, 517, Layout::kBSHD},
        {1, 2, 2, 300, 100, Layout::kBHSD},
        {1, 8, 2, 1000, 1000, Layout::kBSHD},
    };
    std::vector<FwdCase> cases;
    size_t turn = 0;
    for (int head_dim : {64, 128, 256})
        for (bool causal : {false, true})
            for (const Shape &s : shapes) {
                const FwdCase c{e4m3, head_dim, causal, s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k,
                                s.layout};
                cases.push_back(c.with_fp8_q(descale_turn(turn), turn % 3 == 1));
                ++turn;
            }

    const FwdCase chunk{e4m3, 64, true, 1, 4, 2, 300, 1000, Layout::kBSHD};
    const FwdCase square_full{e4m3, 128, false, 1, 2, 2, 512, 512, Layout::kBSHD};
    const FwdCase tall{e4m3, 256, false, 1, 2, 2, 600, 300, Layout::kBHSD};
    const FwdCase gqa{e4m3, 128, true, 2, 8, 2, 300, 421, Layout::kPadded};
    const FwdCase prefill{e4m3, 128, false, 2, 2, 2, 300, 1000, Layout::kBSHD};
    const FwdCase chunks{e4m3, 64, true, 3, 4, 2, 100, 1024, Layout::kBHSD};
    const FwdCase d64{e4m3, 64, true, 1, 4, 2, 1, 1, Layout::kBSHD};
    const FwdCase d128{e4m3, 128, true, 1, 8, 2, 1, 1, Layout::kBSHD};
    const FwdCase d256{e4m3, 256, false, 1, 2, 1, 1, 1, Layout::kPadded};
    const FwdCase paged_prefill{e4m3, 128, true, 2, 8, 2, 300, 1000, Layout::kBSHD};
    const FwdCase paged_wide{e4m3, 256, false, 2, 2, 1, 200, 700, Layout::kPadded};
    const FwdCase paged_varlen{e4m3, 64, true, 3, 8, 2, 1, 1200, Layout::kBSHD};
    FwdCase scaled = prefill;
    scaled.softmax_scale = 0.05f;
    const std::vector<FwdCase> masked_and_serving = {
        chunk.with_window(128, 0).with_fp8_q(Descale::kPerBatchHead),
        square_full.with_window(100, 50).with_fp8_q(Descale::kPerTensor, true),
        square_full.with_window(0, 0).with_fp8_q(Descale::kPerHeadBatch),
        tall.with_window(50, 10).with_fp8_q(Descale::kPerBatchHead, true),
        gqa.with_window(64, 0).with_fp8_q(Descale::kPerHeadBatch),
        scaled.with_fp8_q(Descale::kPerTensor),
        // Keys past seqused_k hold NaN bytes; a count below seqlen_q under
        // causal leaves rows without keys.
        prefill.with_seqused_k({999, 257}).with_fp8_q(Descale::kPerBatchHead),
        chunks.with_seqused_k({100, 600, 50}).with_fp8_q(Descale::kPerHeadBatch, true),
        // Variable-length batches: sequences of 0 and 1 rows, lengths that
        // are no multiple of a tile, fewer queries than keys.
        d64.with_varlen_q({0, 1, 17, 200, 513}).with_varlen_k({0, 1, 17, 200, 513}).with_fp8_q(Descale::kPerBatchHead),
        d128.with_varlen_q({128, 1, 300}).with_varlen_k({1000, 64, 300}).with_fp8_q(Descale::kPerTensor, true),
        d256.with_varlen_q({150, 300}).with_varlen_k({150, 300}).with_fp8_q(Descale::kPerHeadBatch),
        d128.with_varlen_q({200, 129}).with_varlen_k({700, 900}).with_seqused_k({650, 0})
            .with_fp8_q(Descale::kPerBatchHead),
        // Paged K/V, pages in shuffled order, the pool's last page in use
        // (Workload::build_pages).
        paged_prefill.with_seqused_k({1000, 257}).with_pages(16).with_fp8_q(Descale::kPerBatchHead),
        paged_prefill.with_seqused_k({513, 1000}).with_pages(256).with_fp8_q(Descale::kPerTensor, true),
        paged_wide.with_seqused_k({300, 650}).with_pages(256).with_fp8_q(Descale::kPerHeadBatch),
        paged_varlen.with_varlen_q({64, 200, 1}).with_seqused_k({500, 1200, 33}).with_pages(16)
            .with_fp8_q(Descale::kPerBatchHead),
        // Head dims of no fp8 kernel that one covers (flashcore.h's rule:
        // multiples of 16 for e4m3, run on the first kernel with both at
        // least their own): 32 and 96 on the 64 and 128 kernels, (192, 128)
        // on the 256 one.
        FwdCase{e4m3, 32, true, 2, 4, 2, 200, 333, Layout::kBSHD}.with_fp8_q(Descale::kPerBatchHead),
        FwdCase{e4m3, 96, false, 1, 4, 4, 300, 421, Layout::kPadded}.with_fp8_q(Descale::kPerTensor),
        FwdCase{e4m3, 192, true, 1, 4, 2, 256, 300, Layout::kBSHD, 128}.with_fp8_q(Descale::kPerHeadBatch),
        // Chunks and sinks (every row sees a key: fp8_error_bounds gives
        // rows without one a bound of 0, for lse -inf).
        chunk.with_chunk(256).with_fp8_q(Descale::kPerBatchHead),
        square_full.with_chunk(200).with_fp8_q(Descale::kPerTensor),
        gqa.with_window(128, 0).with_sinks().with_fp8_q(Descale::kPerHeadBatch),
        prefill.with_sinks().with_splits(3).with_fp8_q(Descale::kPerBatchHead),
    };
    cases.insert(cases.end(), masked_and_serving.begin(), masked_and_serving.end());
    return cases;
}

// Instantiated as "Shapes", so that the persistent kernel's run on 3 CTAs
// (tests/CMakeLists.txt, gpu.sm90_3ctas.) covers it; the runs that pin a
// portable tile variant leave it out (fp8 queries run on the sm_90a kernel
// whatever the pin).
INSTANTIATE_TEST_SUITE_P(Shapes, ForwardFp8Test, testing::ValuesIn(fp8_prefill_cases()),
                         [](const testing::TestParamInfo<FwdCase> &info) { return case_name(info.param); });

// ---------------------------------------------------------------------------
// A tensor over 2^31 elements: 64-bit offsets all the way.
// ---------------------------------------------------------------------------

__global__ void fill_random_half(__half *data, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        // splitmix64 of the index: independent values without a stored state.
        uint64_t z = i + seed + 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float uniform = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        data[i] = __float2half_rn((uniform * 2.f - 1.f) * 1.7320508f);  // unit variance
    }
}

// One batch of a BSHD tensor of the big problem, as dense BHSD floats.
std::vector<float> batch_slice(const __half *dev, int b, int heads, int seqlen, int head_dim) {
    const size_t per_batch = size_t(heads) * seqlen * head_dim;
    std::vector<uint16_t> bits(per_batch);
    FC_CHECK_CUDA(cudaMemcpy(bits.data(), dev + size_t(b) * per_batch, per_batch * 2, cudaMemcpyDeviceToHost));
    std::vector<float> dense(per_batch);
    for (int s = 0; s < seqlen; ++s)
        for (int h = 0; h < heads; ++h)
            for (int c = 0; c < head_dim; ++c)
                dense[(size_t(h) * seqlen + s) * head_dim + c] =
                    from_bits(FLASHCORE_DTYPE_FP16, bits[(size_t(s) * heads + h) * head_dim + c]);
    return dense;
}

TEST(ForwardLarge, TensorOver2Pow31Elements) {
    FC_REQUIRE_GPU();
    // 16384 * 129 * 8 * 128 = 2.16e9 elements (4.3 GB) per tensor.
    constexpr int kBatch = 16384, kHeads = 8, kSeqlen = 129, kHeadDim = 128;
    const size_t n = size_t(kBatch) * kSeqlen * kHeads * kHeadDim;
    ASSERT_GT(n, size_t(1) << 31);
    size_t free_bytes = 0, total_bytes = 0;
    FC_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (free_bytes < 4 * n * sizeof(__half) + (size_t(1) << 30)) {
        GTEST_SKIP() << "needs " << (4 * n * 2) / (1 << 20) << " MiB of free device memory";
    }
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    __half *buffers[4] = {};
    for (auto &b : buffers) FC_CHECK_CUDA(cudaMalloc(&b, n * sizeof(__half)));
    const uint64_t seed = fresh_seed();
    for (int i = 0; i < 3; ++i) fill_random_half<<<4096, 256>>>(buffers[i], n, seed + uint64_t(i) * n);
    FC_CHECK_CUDA(cudaGetLastError());
    FC_CHECK_CUDA(cudaMemset(buffers[3], 0xFF, n * sizeof(__half)));

    flashcore_forward_params p;
    flashcore_forward_params_init(&p, sizeof p);
    p.batch_size = kBatch;
    p.seqlen_q = p.seqlen_k = kSeqlen;
    p.num_heads_q = p.num_heads_kv = kHeads;
    p.head_dim = kHeadDim;
    p.q = buffers[0];
    p.k = buffers[1];
    p.v = buffers[2];
    p.out = buffers[3];
    ASSERT_EQ(flashcore_set_contiguous_strides(&p, FLASHCORE_LAYOUT_BSHD), FLASHCORE_STATUS_SUCCESS);
    ASSERT_EQ(run_forward(handle.get(), p), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();

    Problem problem;
    problem.seqlen_q = problem.seqlen_k = kSeqlen;
    problem.heads_q = problem.heads_kv = kHeads;
    problem.head_dim = kHeadDim;
    // The first batch, one in the middle, and the last, whose offsets are
    // past 2^31 elements.
    for (int b : {0, kBatch / 2, kBatch - 1}) {
        std::vector<double> ref_out, ref_lse;
        reference_attention(problem, batch_slice(buffers[0], b, kHeads, kSeqlen, kHeadDim),
                            batch_slice(buffers[1], b, kHeads, kSeqlen, kHeadDim),
                            batch_slice(buffers[2], b, kHeads, kSeqlen, kHeadDim), ref_out, ref_lse);
        const ErrorStats e = compare(batch_slice(buffers[3], b, kHeads, kSeqlen, kHeadDim), ref_out);
        std::printf("[ errors ] large batch %d: max_abs=%.3e rel_l2=%.3e\n", b, e.max_abs, e.rel_l2);
        EXPECT_EQ(e.non_finite, 0u) << "batch " << b;
        EXPECT_LE(e.rel_l2, tolerance_for(FLASHCORE_DTYPE_FP16).rel_l2) << "batch " << b;
    }
    for (auto &b : buffers) FC_CHECK_CUDA(cudaFree(b));
}

// ---------------------------------------------------------------------------
// Concurrency, graphs, streams.
// ---------------------------------------------------------------------------

// "" if got == expected (packed [B, S, H, D] outputs of case c), else how
// many elements differ and where, so a failure says which rows went wrong.
std::string describe_differences(const std::vector<uint16_t> &got, const std::vector<uint16_t> &expected,
                                 const FwdCase &c) {
    if (got == expected) return "";
    if (got.size() != expected.size()) return "sizes differ";
    size_t count = 0;
    std::string where;
    const size_t d = c.value_dim(), heads = c.heads_q, seqlen = c.seqlen_q;
    for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] == expected[i]) continue;
        if (++count <= 4) {
            char buf[128];
            std::snprintf(buf, sizeof buf, " [b %zu, s %zu, h %zu, col %zu]: 0x%04x vs 0x%04x", i / (d * heads * seqlen),
                          (i / (d * heads)) % seqlen, (i / d) % heads, i % d, unsigned(got[i]), unsigned(expected[i]));
            where += buf;
        }
    }
    return std::to_string(count) + " of " + std::to_string(got.size()) + " elements differ, first at" + where;
}

TEST(ForwardConcurrency, OneHandleManyThreadsGiveIdenticalResults) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    constexpr int kThreads = 4, kCallsPerThread = 8;
    const FwdCase c{FLASHCORE_DTYPE_FP16, 64, true, 2, 4, 2, 333, 517, Layout::kBSHD};
    std::mt19937_64 rng(fresh_seed());
    Workload reference_run(c, rng);
    ASSERT_EQ(run_forward(handle.get(), reference_run.params), FLASHCORE_STATUS_SUCCESS);
    const std::vector<uint16_t> expected = reference_run.out_bits();

    std::vector<std::unique_ptr<Workload>> copies;
    for (int t = 0; t < kThreads; ++t) {
        std::mt19937_64 same_inputs_rng(0);
        copies.emplace_back(new Workload(c, same_inputs_rng));
        copies.back()->dq.upload(c.dtype, reference_run.q);
        copies.back()->dk.upload(c.dtype, reference_run.k);
        copies.back()->dv.upload(c.dtype, reference_run.v);
    }
    std::vector<int> failures(kThreads, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            cudaStream_t stream;
            if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
                failures[t] = -1;
                return;
            }
            for (int i = 0; i < kCallsPerThread; ++i) {
                if (flashcore_forward(handle.get(), &copies[t]->params, nullptr, 0, stream) != FLASHCORE_STATUS_SUCCESS)
                    ++failures[t];
            }
            if (cudaStreamSynchronize(stream) != cudaSuccess) failures[t] = -1;
            cudaStreamDestroy(stream);
        });
    }
    for (auto &th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) {
        EXPECT_EQ(failures[t], 0) << "thread " << t;
        EXPECT_EQ(describe_differences(copies[t]->out_bits(), expected, c), "") << "thread " << t;
    }
}

TEST(ForwardGraph, CapturedCallReplaysCorrectly) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    const FwdCase c{FLASHCORE_DTYPE_BF16, 128, false, 1, 8, 8, 512, 512, Layout::kBHSD};
    std::mt19937_64 rng(fresh_seed());
    Workload w(c, rng);
    ASSERT_EQ(run_forward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS);
    const std::vector<uint16_t> expected = w.out_bits();
    w.poison_outputs();

    // The workspace the call asks for (none on an H100; on GPUs with less
    // shared memory the portable kernel may split the keys).
    size_t workspace_bytes = 0;
    ASSERT_EQ(flashcore_forward_workspace_size(handle.get(), &w.params, &workspace_bytes), FLASHCORE_STATUS_SUCCESS);
    GuardedBuffer workspace(workspace_bytes);
    cudaStream_t stream;
    FC_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    FC_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const flashcore_status status =
        flashcore_forward(handle.get(), &w.params, workspace.data, workspace_bytes, stream);
    FC_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    ASSERT_EQ(status, FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    cudaGraphExec_t exec;
    FC_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    FC_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    FC_CHECK_CUDA(cudaStreamSynchronize(stream));
    EXPECT_TRUE(w.out_bits() == expected);
    EXPECT_EQ(workspace.check("the workspace"), "");
    FC_CHECK_CUDA(cudaGraphExecDestroy(exec));
    FC_CHECK_CUDA(cudaGraphDestroy(graph));
    FC_CHECK_CUDA(cudaStreamDestroy(stream));
}

// A call that needs no workspace does not look at the one it is given: NULL
// with a size, or a misaligned pointer, as the header says (audit item 7 of
// issue 59: NULL with 4096 bytes was INVALID_ARGUMENT, (void *)8 with 0
// bytes MISALIGNED). A call that needs one still refuses both.
TEST(ForwardWorkspace, AnUnneededWorkspaceIsNotLookedAt) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    FwdCase c{FLASHCORE_DTYPE_FP16, 64, true, 1, 4, 4, 200, 200, Layout::kBHSD};
    c.num_splits = 1;
    std::mt19937_64 rng(fresh_seed());
    Workload w(c, rng);
    size_t needed = 7;
    ASSERT_EQ(flashcore_forward_workspace_size(handle.get(), &w.params, &needed), FLASHCORE_STATUS_SUCCESS);
    ASSERT_EQ(needed, 0u);
    ASSERT_EQ(run_forward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    const std::vector<uint16_t> expected = w.out_bits();
    void *const misaligned = reinterpret_cast<void *>(uintptr_t(8));
    const struct {
        void *workspace;
        size_t bytes;
    } given[] = {{nullptr, 4096}, {misaligned, 0}, {misaligned, 4096}};
    for (const auto &g : given) {
        w.poison_outputs();
        EXPECT_EQ(flashcore_forward(handle.get(), &w.params, g.workspace, g.bytes, nullptr), FLASHCORE_STATUS_SUCCESS)
            << g.workspace << ", " << g.bytes << ": " << flashcore_last_error_message();
        FC_CHECK_CUDA(cudaDeviceSynchronize());
        EXPECT_TRUE(w.out_bits() == expected) << g.workspace << ", " << g.bytes;
    }
    // Two splits need a workspace: NULL and a misaligned one are refused.
    w.params.num_splits = 2;
    ASSERT_EQ(flashcore_forward_workspace_size(handle.get(), &w.params, &needed), FLASHCORE_STATUS_SUCCESS);
    ASSERT_GT(needed, 0u);
    EXPECT_EQ(flashcore_forward(handle.get(), &w.params, nullptr, needed, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(flashcore_forward(handle.get(), &w.params, misaligned, needed, nullptr), FLASHCORE_STATUS_MISALIGNED);
}

// ---------------------------------------------------------------------------
// What a launch keeps for the next call (the sm_90a kernel's TMA descriptors
// per thread and geometry, each kernel's shared-memory opt-in per device).
// ---------------------------------------------------------------------------

// out and lse of w's last run against the float64 reference ("" if within
// the dtype's tolerance).
std::string differences_from_reference(const Workload &w) {
    std::vector<double> ref_out, ref_lse;
    reference_attention(w.problem, w.q, w.k, w.v, ref_out, ref_lse);
    const ErrorStats e = compare(w.dense_out(ref_out), ref_out);
    const ErrorStats e_lse = compare(w.dense_lse(ref_lse), ref_lse);
    const Tolerance tol = tolerance_for(w.c.dtype);
    if (e.non_finite == 0 && e.mismatched_inf == 0 && e.rel_l2 <= tol.rel_l2 && e.max_abs <= tol.max_abs &&
        e_lse.non_finite == 0 && e_lse.mismatched_inf == 0 && e_lse.max_abs <= tol.lse_max_abs) {
        return w.check_untouched();
    }
    char report[200];
    std::snprintf(report, sizeof report, "out: max_abs %.3e rel_l2 %.3e non-finite %zu; lse: max_abs %.3e non-finite %zu",
                  e.max_abs, e.rel_l2, size_t(e.non_finite), e_lse.max_abs, size_t(e_lse.non_finite));
    return report;
}

// Shapes the dispatcher gives the sm_90a kernel on an H100 (a full grid)
// and the portable one (a short, ragged GQA call).
std::vector<FwdCase> launch_cache_cases() {
    FwdCase full{FLASHCORE_DTYPE_BF16, 128, false, 2, 16, 16, 1024, 1024, Layout::kBSHD};
    FwdCase ragged{FLASHCORE_DTYPE_FP16, 64, true, 2, 4, 2, 333, 517, Layout::kBHSD};
    return {full, ragged};
}

TEST(ForwardLaunch, CallsOfOneShapeOnOtherTensorsEachMatchTheReference) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    for (const FwdCase &c : launch_cache_cases()) {
        SCOPED_TRACE(case_name(c));
        std::mt19937_64 rng(fresh_seed());
        // Both alive at once, so their tensors are at different addresses.
        Workload a(c, rng), b(c, rng);
        for (Workload *w : {&a, &b, &a, &b}) {
            w->poison_outputs();
            ASSERT_EQ(run_forward(handle.get(), w->params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
            EXPECT_EQ(differences_from_reference(*w), "") << (w == &a ? "a" : "b");
        }
    }
}

// A device reset drops every kernel's shared-memory opt-in, which the
// library remembers having made: the next launch must make it again.
TEST(ForwardLaunch, CallsAfterADeviceResetSucceed) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    for (const FwdCase &c : launch_cache_cases()) {
        SCOPED_TRACE(case_name(c));
        std::mt19937_64 rng(fresh_seed());
        {
            Workload before(c, rng);
            ASSERT_EQ(run_forward(handle.get(), before.params), FLASHCORE_STATUS_SUCCESS)
                << flashcore_last_error_message();
        }
        FC_CHECK_CUDA(cudaDeviceReset());
        Workload after(c, rng);
        after.poison_outputs();
        ASSERT_EQ(run_forward(handle.get(), after.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
        EXPECT_EQ(differences_from_reference(after), "");
    }
}

// A batch of one whose batch strides the TMA unit cannot take (2^40 bytes:
// the stride of a dimension of extent 1 is the caller's to choose, and
// PyTorch leaves it arbitrary). Planning gives the call to the portable
// kernel (EmulatedGpu.PlanningDecidesWhatTheTmaUnitCanDescribe), whose
// result is right; on GPUs without the sm_90a kernels, the same call.
TEST(ForwardLaunch, StridesTheTmaUnitCannotTakeAreServed) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    const FwdCase c{FLASHCORE_DTYPE_BF16, 128, false, 1, 16, 16, 2048, 2048, Layout::kBSHD};
    std::mt19937_64 rng(fresh_seed());
    Workload w(c, rng);
    constexpr int64_t kUndescribableBatchStride = int64_t(1) << 39;  // elements: 2^40 bytes of bf16
    w.params.q_batch_stride = w.params.k_batch_stride = kUndescribableBatchStride;
    w.params.v_batch_stride = w.params.out_batch_stride = kUndescribableBatchStride;
    w.poison_outputs();
    ASSERT_EQ(run_forward(handle.get(), w.params), FLASHCORE_STATUS_SUCCESS) << flashcore_last_error_message();
    EXPECT_EQ(differences_from_reference(w), "");
}

// ---------------------------------------------------------------------------
// Handle-dependent API behaviour.
// ---------------------------------------------------------------------------

TEST(ForwardApi, HandleReportsItsDeviceAndLeavesCurrentDeviceAlone) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    int device = -1, current = -1;
    ASSERT_EQ(flashcore_handle_device(handle.get(), &device), FLASHCORE_STATUS_SUCCESS);
    FC_CHECK_CUDA(cudaGetDevice(&current));
    EXPECT_EQ(device, current);
    flashcore_handle other = nullptr;
    int count = 0;
    FC_CHECK_CUDA(cudaGetDeviceCount(&count));
    EXPECT_EQ(flashcore_create_for_device(&other, count), FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(other, nullptr);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("does not exist"), std::string::npos);
}

TEST(ForwardApi, UnknownForcedVariantIsRejectedAtCreate) {
    FC_REQUIRE_GPU();
    flashcore_handle h = nullptr;
    std::string message;
    const flashcore_status status = create_with_env("FLASHCORE_FWD_VARIANT", "largest", &h, &message);
    EXPECT_EQ(status, FLASHCORE_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(h, nullptr);
    EXPECT_NE(message.find("FLASHCORE_FWD_VARIANT is 'largest'"), std::string::npos) << message;
    if (h != nullptr) flashcore_destroy(h);
}

TEST(ForwardApi, BadPersistentCtaCapIsRejectedAtCreate) {
    FC_REQUIRE_GPU();
    expect_env_values_rejected("FLASHCORE_PERSISTENT_CTAS", {"0", "-3", "12x", "100000"}, "1");
}

// FLASHCORE_FWD_VARIANT=sm90 is honoured only where the sm_90a kernels run
// (compute capability 9.0, library built with them); elsewhere handle
// creation says why it cannot be.
TEST(ForwardApi, ForcedSm90PathIsRefusedWhereItCannotRun) {
    FC_REQUIRE_GPU();
    int major = 0, minor = 0;
    ASSERT_TRUE(current_compute_capability(&major, &minor));
    flashcore_handle h = nullptr;
    std::string message;
    const flashcore_status status = create_with_env("FLASHCORE_FWD_VARIANT", "sm90", &h, &message);
    if (status == FLASHCORE_STATUS_SUCCESS) {
        EXPECT_TRUE(major == 9 && minor == 0) << "sm90 accepted on compute capability " << major << "." << minor;
        flashcore_destroy(h);
    } else {
        EXPECT_EQ(status, FLASHCORE_STATUS_UNSUPPORTED);
        EXPECT_EQ(h, nullptr);
        EXPECT_NE(message.find("FLASHCORE_FWD_VARIANT=sm90"), std::string::npos) << message;
        if (major == 9 && minor == 0) {
            EXPECT_NE(message.find("built without"), std::string::npos) << message;
        }
    }
}


// Whether a handle can be created with FLASHCORE_FWD_VARIANT=sm90 set (the
// caller's ScopedEnv): where the sm_90a kernels cannot run, creation fails
// with FLASHCORE_STATUS_UNSUPPORTED, and *why gets the library's message.
bool forced_sm90_path_runs(std::string *why) {
    flashcore_handle probe = nullptr;
    if (flashcore_create(&probe) == FLASHCORE_STATUS_UNSUPPORTED) {
        *why = flashcore_last_error_message();
        return false;
    }
    if (probe != nullptr) flashcore_destroy(probe);
    return true;
}

// The sm_90a kernel counts a CTA's K/V tiles across all its query blocks.
// One CTA (FLASHCORE_PERSISTENT_CTAS=1) with its count started just below
// 2^32 crosses the point where a 32-bit count wraps, with 3 ring stages
// (head_dim 64), which 2^32 is not a multiple of: results must not change.
TEST(ForwardSm90, KvCountCrossing2Pow32) {
    FC_REQUIRE_GPU();
    const ScopedEnv env({{"FLASHCORE_FWD_VARIANT", "sm90"},
                         {"FLASHCORE_PERSISTENT_CTAS", "1"},
                         {"FLASHCORE_TEST_KV_POSITION", "4294967290"}});
    std::string why;
    if (!forced_sm90_path_runs(&why)) GTEST_SKIP() << "no sm_90a kernel here: " << why;
    for (const bool causal : {false, true}) {
        expect_matches_reference(FwdCase{FLASHCORE_DTYPE_FP16, 64, causal, 1, 2, 2, 512, 1536, Layout::kBHSD});
    }
    expect_matches_reference(FwdCase{FLASHCORE_DTYPE_BF16, 128, false, 1, 2, 1, 300, 1100, Layout::kBSHD});
}

// Head dim 64 without a mask runs three consumer warpgroups (192-row
// blocks) where the grid holds at least two waves of them
// (kernels/fwd/sm90/config.cuh, wide_fits): with 3 CTAs these shapes choose
// it, each CTA walking many blocks. Query counts whose 192- and 128-row
// blocks pad alike (1152, 384, 1100: a partial last block) and one where the
// 192-row blocks pad 64 rows more (2048: the last block a third empty), GQA,
// both layouts, key counts that are not multiples of the key tile.
TEST(ForwardSm90, WideConfigurationMatchesReference) {
    FC_REQUIRE_GPU();
    const ScopedEnv env({{"FLASHCORE_FWD_VARIANT", "sm90"}, {"FLASHCORE_PERSISTENT_CTAS", "3"}});
    std::string why;
    if (!forced_sm90_path_runs(&why)) GTEST_SKIP() << "no sm_90a kernel here: " << why;
    expect_matches_reference(FwdCase{FLASHCORE_DTYPE_BF16, 64, false, 2, 4, 2, 1152, 1000, Layout::kBSHD});
    expect_matches_reference(FwdCase{FLASHCORE_DTYPE_FP16, 64, false, 1, 3, 3, 384, 1536, Layout::kBHSD});
    expect_matches_reference(FwdCase{FLASHCORE_DTYPE_BF16, 64, false, 1, 2, 2, 1100, 1100, Layout::kBHSD});
    expect_matches_reference(FwdCase{FLASHCORE_DTYPE_FP16, 64, false, 1, 2, 1, 2048, 900, Layout::kBSHD});
}

// sm_margin changes the sm_90a kernel's grid (SMs - sm_margin persistent
// CTAs, each walking more query blocks), not its arithmetic: with most SMs
// left to other streams, results match the reference, causal and not, with
// GQA and a partial last block. (That the SMs are left free is the plan's,
// which the emulated-GPU tests check, and bench/context_parallel.py's
// per-step timeline measures: a kernel on another stream cannot be seen
// to hold SMs here without timing it. The CTAs a persistent kernel cannot
// place start as the first wave's finish, so a missing margin costs time,
// never a hang.)
TEST(ForwardSm90, SmMarginMatchesReference) {
    FC_REQUIRE_GPU();
    const ScopedEnv env({{"FLASHCORE_FWD_VARIANT", "sm90"}});
    std::string why;
    if (!forced_sm90_path_runs(&why)) GTEST_SKIP() << "no sm_90a kernel here: " << why;
    int device = 0, sms = 0;
    FC_CHECK_CUDA(cudaGetDevice(&device));
    FC_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    for (const bool causal : {false, true}) {
        for (const int margin : {16, sms - 3}) {
            FwdCase c{FLASHCORE_DTYPE_BF16, 64, causal, 1, 4, 2, 640, 700, Layout::kBSHD};  // every build has d64
            c.sm_margin = margin;
            expect_matches_reference(c);
        }
    }
}

TEST(ForwardApi, BadKvPositionIsRejectedAtCreate) {
    FC_REQUIRE_GPU();
    expect_env_values_rejected("FLASHCORE_TEST_KV_POSITION", {"-1", "12x", "99999999999999999999"}, "4294967290");
}

TEST(ForwardApi, RejectedCallsWriteNothing) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    const FwdCase c{FLASHCORE_DTYPE_FP16, 64, false, 1, 4, 4, 100, 100, Layout::kBHSD};
    std::mt19937_64 rng(fresh_seed());
    Workload w(c, rng);
    w.poison_outputs();
    const std::vector<uint16_t> poisoned = w.out_bits();

    flashcore_forward_params bad = w.params;
    bad.num_heads_kv = 3;
    EXPECT_EQ(flashcore_forward(handle.get(), &bad, nullptr, 0, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    bad = w.params;
    bad.head_dim = 100;  // not a multiple of 8
    EXPECT_EQ(flashcore_forward(handle.get(), &bad, nullptr, 0, nullptr), FLASHCORE_STATUS_UNSUPPORTED);
    bad = w.params;
    bad.head_dim_v = 520;
    EXPECT_EQ(flashcore_forward(handle.get(), &bad, nullptr, 0, nullptr), FLASHCORE_STATUS_UNSUPPORTED);
    bad = w.params;
    bad.k = static_cast<const char *>(bad.k) + 2;
    EXPECT_EQ(flashcore_forward(handle.get(), &bad, nullptr, 0, nullptr), FLASHCORE_STATUS_MISALIGNED);
    // Workspace, where the call needs one (two splits; a call that needs none
    // does not look at it: ForwardWorkspace.AnUnneededWorkspaceIsNotLookedAt):
    // NULL, and a misaligned pointer.
    bad = w.params;
    bad.num_splits = 2;
    size_t needed = 0;
    ASSERT_EQ(flashcore_forward_workspace_size(handle.get(), &bad, &needed), FLASHCORE_STATUS_SUCCESS);
    ASSERT_GT(needed, 0u);
    EXPECT_EQ(flashcore_forward(handle.get(), &bad, nullptr, needed, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    char *ws = nullptr;
    FC_CHECK_CUDA(cudaMalloc(&ws, needed + FLASHCORE_ALIGNMENT));
    EXPECT_EQ(flashcore_forward(handle.get(), &bad, ws + 4, needed, nullptr), FLASHCORE_STATUS_MISALIGNED);
    FC_CHECK_CUDA(cudaFree(ws));
    EXPECT_EQ(flashcore_forward(nullptr, &w.params, nullptr, 0, nullptr), FLASHCORE_STATUS_INVALID_ARGUMENT);
    FC_CHECK_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(w.out_bits() == poisoned) << "a rejected call wrote to the output";

    size_t ws_bytes = 1;
    EXPECT_EQ(flashcore_forward_workspace_size(handle.get(), &w.params, &ws_bytes), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(ws_bytes, 0u);
    bad = w.params;
    bad.num_heads_kv = 3;
    EXPECT_EQ(flashcore_forward_workspace_size(handle.get(), &bad, &ws_bytes), FLASHCORE_STATUS_INVALID_ARGUMENT);
    // An empty call (no query rows) is valid and needs no workspace.
    flashcore_forward_params empty = w.params;
    empty.seqlen_q = 0;
    ws_bytes = 1;
    EXPECT_EQ(flashcore_forward_workspace_size(handle.get(), &empty, &ws_bytes), FLASHCORE_STATUS_SUCCESS);
    EXPECT_EQ(ws_bytes, 0u);
}

// Calls on an fp8 cache that break its rules (flashcore.h, kv_dtype and the
// descale fields) are refused with the status the header gives, or, where
// it names none, refused; none writes out or lse. The valid call runs.
// MLA's latent-cache kernel (576 x 512) reads V from K's rows: a v of its
// own is refused as UNSUPPORTED, saying so, before anything is written;
// the same call with v as k's view runs.
TEST(ForwardApi, LatentCacheHeadDimsTakeVAsKsView) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    const FwdCase c{FLASHCORE_DTYPE_BF16, 576, false, 1, 16, 1, 1, 100, Layout::kBSHD, 512};
    std::mt19937_64 rng(fresh_seed());
    Workload w(c, rng);
    w.poison_outputs();
    const std::vector<uint16_t> poisoned = w.out_bits();
    EXPECT_EQ(flashcore_forward(handle.get(), &w.params, nullptr, 0, nullptr), FLASHCORE_STATUS_UNSUPPORTED);
    EXPECT_NE(std::string(flashcore_last_error_message()).find("reads v as the first head_dim_v columns of k's rows"),
              std::string::npos)
        << flashcore_last_error_message();
    flashcore_forward_params strided = w.params;
    strided.v = strided.k;  // k's pointer with v's own strides: not a view
    EXPECT_EQ(flashcore_forward_check(&strided), FLASHCORE_STATUS_UNSUPPORTED);
    FC_CHECK_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(w.out_bits() == poisoned) << "a rejected call wrote to the output";
    flashcore_forward_params view = w.params;
    view.v = view.k;
    view.v_batch_stride = view.k_batch_stride;
    view.v_seq_stride = view.k_seq_stride;
    view.v_head_stride = view.k_head_stride;
    EXPECT_EQ(flashcore_forward(handle.get(), &view, nullptr, 0, nullptr), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
}

TEST(ForwardApi, RefusedFp8KvCallsWriteNothing) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    const FwdCase c =
        FwdCase{FLASHCORE_DTYPE_BF16, 64, false, 2, 4, 2, 100, 300, Layout::kBSHD}.with_fp8_kv(Descale::kPerBatchHead);
    std::mt19937_64 rng(fresh_seed());
    Workload w(c, rng);
    w.poison_outputs();
    const std::vector<uint16_t> poisoned = w.out_bits();
    const float *k_descale = w.params.k_descale;

    struct Refusal {
        const char *what;
        void (*mutate)(flashcore_forward_params &p, const float *k_descale);
        flashcore_status expected;  // SUCCESS: any refusal (flashcore.h names no status)
    };
    const Refusal refusals[] = {
        // Strides of one-byte elements: multiples of 16 (8 is 16 bytes of fp16, not of fp8).
        {"k_seq_stride + 8", [](auto &p, auto) { p.k_seq_stride += 8; }, FLASHCORE_STATUS_MISALIGNED},
        {"v_head_stride + 8", [](auto &p, auto) { p.v_head_stride += 8; }, FLASHCORE_STATUS_MISALIGNED},
        {"k 8 bytes in", [](auto &p, auto) { p.k = static_cast<const char *>(p.k) + 8; }, FLASHCORE_STATUS_MISALIGNED},
        {"k_descale 2 bytes in",
         [](auto &p, const float *d) {
             p.k_descale = reinterpret_cast<const float *>(reinterpret_cast<const char *>(d) + 2);
         },
         FLASHCORE_STATUS_MISALIGNED},
        {"negative k_descale_head_stride", [](auto &p, auto) { p.k_descale_head_stride = -1; },
         FLASHCORE_STATUS_INVALID_ARGUMENT},
        {"negative v_descale_batch_stride", [](auto &p, auto) { p.v_descale_batch_stride = -2; },
         FLASHCORE_STATUS_INVALID_ARGUMENT},
        // q_descale is for fp8 queries only.
        {"q_descale", [](auto &p, const float *d) { p.q_descale = d; }, FLASHCORE_STATUS_INVALID_ARGUMENT},
        // Head dims of an fp8 cache: multiples of 16.
        {"head_dim 40", [](auto &p, auto) { p.head_dim = 40; }, FLASHCORE_STATUS_UNSUPPORTED},
        {"kv_dtype fp32", [](auto &p, auto) { p.kv_dtype = FLASHCORE_DTYPE_FP32; }, FLASHCORE_STATUS_UNSUPPORTED},
        {"kv_dtype 99", [](auto &p, auto) { p.kv_dtype = 99; }, FLASHCORE_STATUS_SUCCESS},
        {"out_dtype fp16 with bf16 q", [](auto &p, auto) { p.out_dtype = FLASHCORE_DTYPE_FP16; },
         FLASHCORE_STATUS_SUCCESS},
        {"out_dtype fp8", [](auto &p, auto) { p.out_dtype = FLASHCORE_DTYPE_FP8_E4M3; }, FLASHCORE_STATUS_SUCCESS},
        // Descale factors without an fp8 cache (k and v then read as bf16).
        {"k_descale with 16-bit K/V", [](auto &p, auto) { p.kv_dtype = 0; }, FLASHCORE_STATUS_SUCCESS},
    };
    for (const Refusal &r : refusals) {
        flashcore_forward_params bad = w.params;
        r.mutate(bad, k_descale);
        const flashcore_status got = flashcore_forward(handle.get(), &bad, nullptr, 0, nullptr);
        if (r.expected == FLASHCORE_STATUS_SUCCESS) {
            EXPECT_NE(got, FLASHCORE_STATUS_SUCCESS) << r.what;
        } else {
            EXPECT_EQ(got, r.expected) << r.what << ": " << flashcore_last_error_message();
        }
        EXPECT_EQ(flashcore_forward_check(&bad), got) << r.what << ": the check agrees with the call";
    }
    FC_CHECK_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(w.out_bits() == poisoned) << "a refused call wrote to the output";
    EXPECT_EQ(w.check_untouched(), "");

    // Explicit defaults: out_dtype = dtype, per-tensor factors given as
    // strides 0.
    flashcore_forward_params explicit_defaults = w.params;
    explicit_defaults.out_dtype = FLASHCORE_DTYPE_BF16;
    explicit_defaults.k_descale_batch_stride = explicit_defaults.k_descale_head_stride = 0;
    explicit_defaults.num_splits = 1;
    EXPECT_EQ(flashcore_forward(handle.get(), &explicit_defaults, nullptr, 0, nullptr), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    FC_CHECK_CUDA(cudaDeviceSynchronize());
}

// fp8 queries (dtype FLASHCORE_DTYPE_FP8_E4M3): off compute capability 9.0
// (or without the sm_90a kernels) a valid call is refused as UNSUPPORTED,
// saying why, and writes nothing; on 9.0, calls that break the rules of
// fp8 queries are refused with the status the rule gives (checked by
// flashcore_forward_check too) and write nothing, and the valid call runs.
TEST(ForwardApi, RefusedFp8PrefillCallsWriteNothing) {
    FC_REQUIRE_GPU();
    UniqueHandle handle = make_handle();
    ASSERT_TRUE(handle);
    const FwdCase c = FwdCase{FLASHCORE_DTYPE_FP8_E4M3, 64, true, 2, 4, 2, 200, 300, Layout::kBSHD}.with_fp8_q(
        Descale::kPerBatchHead);
    std::mt19937_64 rng(fresh_seed());
    Workload w(c, rng);
    w.poison_outputs();
    const std::vector<uint16_t> poisoned = w.out_bits();
    std::string why;
    if (!fp8_prefill_runs_here(handle.get(), w.params, &why)) {
        EXPECT_EQ(flashcore_forward(handle.get(), &w.params, nullptr, 0, nullptr), FLASHCORE_STATUS_UNSUPPORTED);
        FC_CHECK_CUDA(cudaDeviceSynchronize());
        EXPECT_TRUE(w.out_bits() == poisoned) << "a refused call wrote to the output";
        GTEST_SKIP() << "GPU test skipped: " << why;
    }

    struct Refusal {
        const char *what;
        void (*mutate)(flashcore_forward_params &p);
        flashcore_status expected;
    };
    const Refusal refusals[] = {
        {"softcap", [](auto &p) { p.softcap = 30.f; }, FLASHCORE_STATUS_UNSUPPORTED},
        {"kv_dtype fp16", [](auto &p) { p.kv_dtype = FLASHCORE_DTYPE_FP16; }, FLASHCORE_STATUS_UNSUPPORTED},
        {"kv_dtype bf16", [](auto &p) { p.kv_dtype = FLASHCORE_DTYPE_BF16; }, FLASHCORE_STATUS_UNSUPPORTED},
        {"out_dtype fp16", [](auto &p) { p.out_dtype = FLASHCORE_DTYPE_FP16; }, FLASHCORE_STATUS_UNSUPPORTED},
        {"out_dtype e4m3", [](auto &p) { p.out_dtype = FLASHCORE_DTYPE_FP8_E4M3; }, FLASHCORE_STATUS_UNSUPPORTED},
        // e4m3 strides and pointers: whole 16-byte vectors (16 elements).
        {"q_seq_stride + 8", [](auto &p) { p.q_seq_stride += 8; }, FLASHCORE_STATUS_MISALIGNED},
        {"k_head_stride + 8", [](auto &p) { p.k_head_stride += 8; }, FLASHCORE_STATUS_MISALIGNED},
        {"q 8 bytes in", [](auto &p) { p.q = static_cast<const char *>(p.q) + 8; }, FLASHCORE_STATUS_MISALIGNED},
        // Head dims: multiples of 16 that an fp8 kernel covers.
        {"head_dim 40", [](auto &p) { p.head_dim = 40; }, FLASHCORE_STATUS_UNSUPPORTED},
        {"head_dim 512", [](auto &p) { p.head_dim = 512; }, FLASHCORE_STATUS_UNSUPPORTED},
        {"negative q_descale_head_stride", [](auto &p) { p.q_descale_head_stride = -1; },
         FLASHCORE_STATUS_INVALID_ARGUMENT},
        {"q_descale strides without q_descale",
         [](auto &p) {
             p.q_descale = nullptr;
             p.q_descale_batch_stride = 2;
         },
         FLASHCORE_STATUS_INVALID_ARGUMENT},
    };
    for (const Refusal &r : refusals) {
        flashcore_forward_params bad = w.params;
        r.mutate(bad);
        EXPECT_EQ(flashcore_forward(handle.get(), &bad, nullptr, 0, nullptr), r.expected)
            << r.what << ": " << flashcore_last_error_message();
        EXPECT_EQ(flashcore_forward_check(&bad), r.expected) << r.what << ": the check agrees with the call";
    }
    FC_CHECK_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(w.out_bits() == poisoned) << "a refused call wrote to the output";
    EXPECT_EQ(w.check_untouched(), "");

    // kv_dtype and out_dtype named, no split: runs.
    flashcore_forward_params named = w.params;
    named.kv_dtype = FLASHCORE_DTYPE_FP8_E4M3;
    named.out_dtype = FLASHCORE_DTYPE_BF16;
    named.num_splits = 1;
    EXPECT_EQ(flashcore_forward(handle.get(), &named, nullptr, 0, nullptr), FLASHCORE_STATUS_SUCCESS)
        << flashcore_last_error_message();
    FC_CHECK_CUDA(cudaDeviceSynchronize());
}


// ---------------------------------------------------------------------------
// The shared memory of smaller GPUs (FLASHCORE_TEST_SMEM_PER_BLOCK, which
// the handle plans every call with): sm_86's and sm_89's 99 KiB, where only
// the large tiles fit at head dims 96 and up, and an A100's 163 KiB, where
// no key split fits at 192 x 128 and nothing but the large tiles at 256.
// Every valid call runs on a kernel within the limit (a kernel above it
// would be refused as UNSUPPORTED at the launch; no call may be INTERNAL),
// ragged ones (packed and paged tensors) included; fp8 queries, whose only
// kernels need more than 99 KiB, are refused as UNSUPPORTED, saying so.
// ---------------------------------------------------------------------------

struct SmemLimit {
    const char *name;
    const char *bytes;  // FLASHCORE_TEST_SMEM_PER_BLOCK
};
constexpr SmemLimit kSm86SmemLimit{"sm86", "101376"};  // 99 KiB: sm_86, sm_89
constexpr SmemLimit kA100SmemLimit{"a100", "166912"};  // 163 KiB: sm_80

// Whether the current device lets a block have `bytes` of shared memory
// (FLASHCORE_TEST_SMEM_PER_BLOCK may only lower its limit); *why otherwise.
bool device_allows_smem(const char *bytes, std::string *why) {
    int device = 0, optin = 0;
    FC_CHECK_CUDA(cudaGetDevice(&device));
    FC_CHECK_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (std::strtoll(bytes, nullptr, 10) <= optin) return true;
    *why = "device " + std::to_string(device) + " allows " + std::to_string(optin) + " bytes of shared memory per block, below " +
           bytes;
    return false;
}

struct SmemLimitCase {
    SmemLimit limit;
    FwdCase c;
};

class ForwardSmemLimitTest : public testing::TestWithParam<SmemLimitCase> {};

TEST_P(ForwardSmemLimitTest, MatchesFloat64Reference) {
    FC_REQUIRE_GPU();
    std::string why;
    if (!device_allows_smem(GetParam().limit.bytes, &why)) GTEST_SKIP() << "GPU test skipped: " << why;
    const ScopedEnv env({{"FLASHCORE_TEST_SMEM_PER_BLOCK", GetParam().limit.bytes}});
    expect_matches_reference(GetParam().c);
}

// Per head dim (every kernel's), dtype and mask: a packed (varlen) prefill
// with GQA and seqused_k, and a chunked prefill over a paged cache (pages of
// 16, 48, 64 and 256 keys in turn) with GQA; per head dim, with the dtype
// and mask alternating: packed decode rows with GQA heads packed into the
// tiles, a forced 3-way split and a softcap, a paged call with a window,
// and a dense call.
std::vector<SmemLimitCase> smem_limit_cases() {
    struct HeadDims {
        int qk, v;
    };
    const HeadDims head_dims[] = {{32, 32}, {64, 64}, {96, 96}, {128, 128}, {192, 128}, {256, 256}};
    const int page_sizes[] = {16, 48, 64, 256};
    std::vector<FwdCase> cases;
    size_t turn = 0;
    for (const HeadDims &d : head_dims) {
        const int dv = d.v == d.qk ? 0 : d.v;
        for (flashcore_dtype dtype : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
            for (bool causal : {false, true}) {
                cases.push_back(FwdCase{dtype, d.qk, causal, 1, 4, 2, 1, 1, Layout::kBSHD, dv}
                                    .with_varlen_q({1, 130, 257})
                                    .with_varlen_k({40, 200, 257})
                                    .with_seqused_k({33, 200, 190}));
                cases.push_back(FwdCase{dtype, d.qk, causal, 2, 4, 2, 100, 600, Layout::kBHSD, dv}
                                    .with_seqused_k({600, 129})
                                    .with_pages(page_sizes[turn++ % 4]));
            }
        const flashcore_dtype dtype = d.qk % 64 == 0 ? FLASHCORE_DTYPE_BF16 : FLASHCORE_DTYPE_FP16;
        const bool causal = d.qk >= 128;
        cases.push_back(FwdCase{dtype, d.qk, causal, 1, 8, 2, 1, 1, Layout::kPadded, dv}
                            .with_varlen_q({1, 5, 40})
                            .with_varlen_k({300, 64, 500})
                            .with_splits(3)
                            .with_softcap(30.f, 1.f));
        cases.push_back(FwdCase{dtype, d.qk, !causal, 3, 4, 1, 64, 700, Layout::kBSHD, dv}
                            .with_seqused_k({700, 1, 333})
                            .with_pages(64)
                            .with_window(200, 0));
        cases.push_back(FwdCase{dtype, d.qk, !causal, 2, 4, 2, 200, 300, Layout::kBSHD, dv});
        // Audit item 1 of issue 59, as reported: bf16, B2, Sq 128, H8,
        // cu_seqlens_q with total_seqlen_q 200 (INTERNAL at 6b7ad35 under
        // an A100's limit at d256 and under sm_86's at d96-256).
        cases.push_back(FwdCase{FLASHCORE_DTYPE_BF16, d.qk, false, 2, 8, 8, 128, 128, Layout::kBSHD, dv}
                            .with_varlen_q({128, 72}));
    }
    // The wide kernels: only their 16-row tiles fit 99 KiB, and at 576 x 512
    // an A100's 163 KiB too.
    cases.push_back(FwdCase{FLASHCORE_DTYPE_BF16, 576, false, 2, 128, 1, 1, 500, Layout::kBSHD, 512}
                        .with_latent_v()
                        .with_seqused_k({500, 77})
                        .with_pages(64));
    cases.push_back(FwdCase{FLASHCORE_DTYPE_FP16, 512, true, 1, 4, 2, 200, 300, Layout::kBSHD}.with_varlen_q({200, 60}));
    std::vector<SmemLimitCase> limited;
    for (const SmemLimit &limit : {kSm86SmemLimit, kA100SmemLimit})
        for (const FwdCase &c : cases) limited.push_back({limit, c});
    return limited;
}

INSTANTIATE_TEST_SUITE_P(SmemLimits, ForwardSmemLimitTest, testing::ValuesIn(smem_limit_cases()),
                         [](const testing::TestParamInfo<SmemLimitCase> &info) {
                             return std::string(info.param.limit.name) + "_" + case_name(info.param.c);
                         });

// The status and message of a workspace query for params on a handle
// created under the caller's environment.
flashcore_status workspace_query(const flashcore_forward_params &params, std::string *message) {
    UniqueHandle handle = make_handle();
    if (!handle) return FLASHCORE_STATUS_INTERNAL;
    size_t bytes = 0;
    const flashcore_status status = flashcore_forward_workspace_size(handle.get(), &params, &bytes);
    *message = status == FLASHCORE_STATUS_SUCCESS ? "" : flashcore_last_error_message();
    return status;
}

// fp8 prefill runs on the sm_90a kernels only: under 99 KiB (below every
// fp8 kernel's shared memory) a valid call is refused as UNSUPPORTED,
// naming the limit, and writes nothing; under an A100's 163 KiB head dim 64
// (about 129 KiB) runs and 128 (about 209 KiB) is refused.
TEST(ForwardSmemLimits, Fp8PrefillAboveTheLimitIsUnsupported) {
    FC_REQUIRE_GPU();
    const FwdCase d64 = FwdCase{FLASHCORE_DTYPE_FP8_E4M3, 64, true, 2, 4, 2, 200, 300, Layout::kBSHD}.with_fp8_q(
        Descale::kPerBatchHead);
    FwdCase d128 = d64;
    d128.head_dim = 128;
    int major = 0, minor = 0;
    if (!current_compute_capability(&major, &minor) || major != 9 || minor != 0) {
        GTEST_SKIP() << "GPU test skipped: fp8 queries run on compute capability 9.0 GPUs only";
    }
    std::mt19937_64 rng(fresh_seed());
    Workload w64(d64, rng), w128(d128, rng);
    {
        const ScopedEnv env({{"FLASHCORE_TEST_SMEM_PER_BLOCK", kSm86SmemLimit.bytes}});
        for (Workload *w : {&w64, &w128}) {
            SCOPED_TRACE(case_name(w->c));
            std::string message;
            const flashcore_status status = workspace_query(w->params, &message);
            if (message.find("built without") != std::string::npos) GTEST_SKIP() << "GPU test skipped: " << message;
            EXPECT_EQ(status, FLASHCORE_STATUS_UNSUPPORTED) << message;
            EXPECT_NE(message.find("shared memory"), std::string::npos) << message;
            EXPECT_NE(message.find(kSm86SmemLimit.bytes), std::string::npos) << message;
            UniqueHandle handle = make_handle();
            ASSERT_TRUE(handle);
            w->poison_outputs();
            const std::vector<uint16_t> poisoned = w->out_bits();
            EXPECT_EQ(flashcore_forward(handle.get(), &w->params, nullptr, 0, nullptr), FLASHCORE_STATUS_UNSUPPORTED)
                << flashcore_last_error_message();
            FC_CHECK_CUDA(cudaDeviceSynchronize());
            EXPECT_TRUE(w->out_bits() == poisoned) << "a refused call wrote to the output";
        }
    }
    const ScopedEnv env({{"FLASHCORE_TEST_SMEM_PER_BLOCK", kA100SmemLimit.bytes}});
    std::string message;
    EXPECT_EQ(workspace_query(w128.params, &message), FLASHCORE_STATUS_UNSUPPORTED) << message;
    EXPECT_NE(message.find(kA100SmemLimit.bytes), std::string::npos) << message;
    expect_matches_reference(d64);
}

// FLASHCORE_FWD_VARIANT pins a variant only where it fits the handle's
// shared memory and serves the call; elsewhere the call is planned as if
// unpinned, and runs. sm90 likewise: calls whose sm_90a kernel does not fit
// run on the portable kernel.
TEST(ForwardSmemLimits, PinnedVariantsAboveTheLimitGiveWay) {
    FC_REQUIRE_GPU();
    std::string why;
    if (!device_allows_smem(kSm86SmemLimit.bytes, &why)) GTEST_SKIP() << "GPU test skipped: " << why;
    const FwdCase dense{FLASHCORE_DTYPE_BF16, 128, true, 2, 8, 2, 300, 500, Layout::kBSHD};
    const FwdCase packed = FwdCase{FLASHCORE_DTYPE_FP16, 256, false, 1, 4, 2, 1, 1, Layout::kBSHD}
                               .with_varlen_q({1, 100, 200})
                               .with_varlen_k({64, 300, 200});
    const FwdCase paged =
        FwdCase{FLASHCORE_DTYPE_BF16, 96, true, 2, 8, 2, 8, 900, Layout::kBSHD}.with_seqused_k({900, 17}).with_pages(16);
    for (const char *variant : {"large", "keysplit", "keysplit4", "decode", "sm90"}) {
        SCOPED_TRACE(variant);
        const ScopedEnv env({{"FLASHCORE_FWD_VARIANT", variant}, {"FLASHCORE_TEST_SMEM_PER_BLOCK", kSm86SmemLimit.bytes}});
        if (std::string(variant) == "sm90" && !forced_sm90_path_runs(&why)) continue;
        for (const FwdCase &c : {dense, packed, paged}) {
            SCOPED_TRACE(case_name(c));
            expect_matches_reference(c);
        }
    }
}

// A limit below every supported GPU's, under which even the large tiles do
// not fit at head dim 256 (96 KiB): UNSUPPORTED, naming what they need, for
// dense and ragged calls alike; head dim 32's large tiles (24 KiB) still run.
TEST(ForwardSmemLimits, NoKernelWithinTheLimitIsUnsupportedNotInternal) {
    FC_REQUIRE_GPU();
    const ScopedEnv env({{"FLASHCORE_TEST_SMEM_PER_BLOCK", "49152"}});
    std::mt19937_64 rng(fresh_seed());
    const FwdCase dense{FLASHCORE_DTYPE_FP16, 256, false, 1, 2, 2, 100, 100, Layout::kBSHD};
    for (const FwdCase &c : {dense, dense.with_varlen_q({50, 100}).with_varlen_k({50, 100})}) {
        SCOPED_TRACE(case_name(c));
        Workload w(c, rng);
        std::string message;
        EXPECT_EQ(workspace_query(w.params, &message), FLASHCORE_STATUS_UNSUPPORTED) << message;
        EXPECT_NE(message.find("49152"), std::string::npos) << message;
        EXPECT_NE(message.find("shared memory"), std::string::npos) << message;
    }
    FwdCase d32 = dense;
    d32.head_dim = 32;
    expect_matches_reference(d32.with_varlen_q({50, 100}).with_varlen_k({50, 100}));
}

}  // namespace
