#!/usr/bin/env python3
"""Compare flashcore with FlashAttention 3 and PyTorch's fused attention backends on one GPU.

flashcore is called through its public C API via the project's ctypes package
(bindings/python, ``import flashcore``; the shared library is found through
FLASHCORE_LIBRARY, which --library sets). PyTorch's scaled_dot_product_attention
is pinned to one backend at a time (flash, efficient, cuDNN) with
torch.nn.attention.sdpa_kernel. FlashAttention 3 ("fa3") is optional: it comes
from the third-party fa3-fwd wheel (forward only, bf16/fp8 kernels only, so fp16
cases are n/a for it), never vendored here; when it cannot be imported it is
left out with the import error shown once. Every backend sees the same input
tensors and is timed the same way:

  * K calls, rotating over the buffer sets, are captured in one
    torch.cuda.CUDAGraph; the graph is replayed twice to warm up, then R times,
    each replay between two CUDA events; the time per call is the median replay
    time / K. K is chosen so a replay lasts ~5 ms (at most --graph-calls calls,
    rounded up to a whole number of passes over the buffer sets); R so that the
    replays take about --budget-ms.
  * Inputs are rotated over enough buffer sets to exceed twice the L2 cache, so
    small shapes are not timed from L2 only (--buffers 1 times them warm).

FLOPs are 2*B*Hq*(D + Dv)*(visible query/key pairs), D being the head dim of
q and k and Dv that of v and out (--head-dim-v; 2*D for Q*K^T and 2*Dv for P*V
per pair), which is the usual 4*B*Hq*D*pairs when Dv == D. The pairs: Sq*Sk
without a mask; with the causal mask (aligned bottom-right, as in flashcore.h
and FlashAttention >= 2.1) the pairs actually visible, S(S+1)/2 when Sq == Sk.
Decode cases (a decode preset, or seqlen_q <= 16) are judged on DRAM bandwidth:
they also report the K/V bytes read per second, B*Hkv*Sk*(D + Dv)*2 / time, in
TB/s instead of TFLOP/s, and flashcore's fraction of the copy bandwidth
measured in the same run (fc/copy; a 1 GiB copy by an elementwise kernel timed
the same way, bytes read plus written per second). Issue 64's cache-length twin,
flashcore-seqlens (attention_with_kvcache with cache_seqlens, every count Sk,
on the same tensors), and flashcore-fp8kv join the default backends when only
decode presets are selected; seqlens = its time over the dense call's.

Causal with Sq != Sk: PyTorch's is_causal aligns the mask top-left, so those
cases call the flash kernel directly with a bottom-right mask
(aten._scaled_dot_product_flash_attention with is_causal, which flash reads as
bottom-right), the efficient kernel likewise (aten._efficient_attention_forward
with custom_mask_type 2, as torch.nn.attention.bias.causal_lower_right does)
when Hq == Hkv, and otherwise (efficient with GQA, cuDNN) pass SDPA an explicit
bottom-right additive mask [Sq, Sk], built once per case outside the timed
calls (only for Sq < Sk: with Sq > Sk whole rows see no key). With Sq == 1 the
bottom-right mask hides nothing, so SDPA gets is_causal=False. GQA (Hq != Hkv):
SDPA gets enable_gqa=True (K/V are passed with their Hkv heads; no
repeat_interleave), the direct flash call and FA3 and flashcore take the Hkv
heads natively. The table's notes say which path each backend took.

Once per case, every backend's output is compared with the flash backend's
output (max abs diff); when flash cannot run the case (it needs Dv == D), with
the efficient backend's, else with an fp32 reference when the score matrix is
small enough. Backends that refuse a case (e.g. flash with Dv != D) are reported
n/a with the reason. fc/peer is flashcore's speedup over the best of FA3, cuDNN
and PyTorch's flash backend for that case.

fp8 (e4m3) prefill, issue 36, opt-in: --backends flashcore-fp8,fa3-fp8 (the
default with --preset fp8-prefill, whose cases are B16 H16 S2k, B4 H16 S8k and
B2 H16 S16k at d64 and d128, and B8 H16 S4k at d256; bf16 by default). Both get
the case's q, k and v cast to float8_e4m3fn with one float32 descale factor per
tensor (amax / 448), cast once per buffer set before anything is timed and
shared by the two: flashcore-fp8 calls flashcore.attention(q8, k8, v8,
q_descale=, k_descale=, v_descale=) with one-element factors, fa3-fp8 FA3's
flash_attn_func(q8, k8, v8, q_descale=, k_descale=, v_descale=) with them as
[B, Hkv] float32 arrays; both give bf16 out. Same FLOPs as the 16-bit cases.
They are never anyone's peer: the table adds fp8 fc/fa3 (flashcore-fp8's
TFLOP/s over fa3-fp8's), whether that meets the target (>= 1.05: met or
missed) and flashcore-fp8's max abs diff from the reference backend run on the
dequantized e4m3 inputs (a sanity check; bench/fp8_error.py measures the error
against float64).

Gradients, opt-in: --backward times each backend's backward pass alone (dq, dk, dv from dout; the forward that
gives it out and lse runs once per buffer set, untimed), --train a training step: the forward (keeping lse) and
then the backward on the same inputs, both in the timed call (issue 37's measure: flashcore's step at least 1.05x
cuDNN's; default presets the hopper-backward group). flashcore is flashcore.attention(return_lse=True) and the
operator torch.ops.flashcore.backward, in its default and its deterministic mode (flashcore-det); the SDPA
backends are the forward pinned as above, on inputs that require grad, and its attention's autograd node called
on dout (no autograd engine); fa3 is n/a (the fa3-fwd wheel is forward only). TFLOP/s count
BACKWARD_FLOPS_PER_FORWARD_FLOP (2.5) times the forward's flops for the backward, one more for a training step.
Every backend's gradients (set 0) are checked against the reference backend's.

Issue 61's model shapes, --preset models-2026 (named only; bf16, bshd and causal by default): gpt-oss 120B
(64/8 heads, d64, learnable sinks; prefill 8k at B1 and B2 and decode against an 8k cache at B8 and B64, each with a
window of 128 keys, window=(128, 0), and full causal) and Llama 4 Scout (40/8 heads, d128, attention_chunk 8192;
prefill 16k and 32k). flashcore gets window=, attention_chunk= and sinks= (float32 [Hq]); the peers are those that
take the features: FlashAttention 4 (fa4: window_size, learnable_sink, forward and backward; no chunks), FA3
(attention_chunk and window_size where the wheel's functions take them; no sinks), SDPA's efficient and cuDNN
backends with an explicit mask (no sinks), and gpt-oss's eager PyTorch attention (eager: the sink as an extra score
column; forward only); a backend that cannot take a case is n/a with the reason. Visible pairs are counted row by
row (key_range), and every output (gradients and dsinks with --backward/--train) is checked against an fp32
reference computed in blocks (masked_reference). Two flashcore twins measure issue 61's overheads: flashcore-nosinks
(the same call without sinks; sinks cost = time ratio - 1, target <= 3%) and flashcore-causal (a chunked case's
chunks as a batch of plain causal sequences, a view of the same tensors: chunk/key = time per visible pair over
the twin's, target <= 1.1).

Issue 61's DeepSeek-V3 MLA decode, --preset deepseek-mla (also in models-2026; named only; bf16, bshd): one query row
per sequence against a latent cache of one K/V "head" per token, 576 values (the 512 latent dims, then the 64 rope
dims); queries of 576 dims (the absorbed form), V the first 512 columns of the same cache rows (head_dim 576,
head_dim_v 512, heads_kv 1; v is a view of k, the same storage). B 64 and 128, Hq 16 and 128, caches of 4k and 32k.
Every backend gets softmax_scale (128+64)^-0.5 (the scale of the un-absorbed model's 192-dim q.k). TB/s counts the
cache once, B*Sk*576*2 bytes (K and V are the same bytes; one byte per element for e4m3). flashcore is the same
binding call on a paged cache (attention_with_kvcache, pages of 64 keys: the cache's own storage as the pool, the
pages in order); FA3 its qv path, flash_attn_with_kvcache(q = the rope dims, k_cache = the cache's rope columns,
v_cache = its latent columns, qv = the latent dims of q), contiguous (the wheel has no paged kernels). e4m3, the
default backends with only these presets: flashcore-fp8kv (the cache cast once, one descale factor for K and V) and
fa3-fp8 (q, qv and the cache cast to e4m3). Outputs are checked against the fp32 reference computed in blocks.
Forward only: --backward and --train leave these presets out. A library without (576, 512) kernels fails these cases
with its own message (n/a in the table), which counts as flashcore failing a case others ran where FA3 ran it.

Run ``python3 bench/compare.py --help`` for the options. Exit status: 0 ok, 1 a
flashcore output check failed or flashcore failed a case others ran
(flashcore-fp8 included: a case fa3-fp8 ran, at issue 36's head dims 64, 128
and 256), 2 no GPU, PyTorch or flashcore package, or a bad command line.
"""

import argparse
import dataclasses
import functools
import importlib
import inspect
import json
import math
import os
import re
import statistics
import sys
import warnings
from pathlib import Path

from e4m3 import quantize_e4m3

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as _torch_error:  # reported by main(); --help still works
    torch = None
    _TORCH_IMPORT_ERROR = _torch_error

REPO = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Preset:
    """One benchmark shape. heads_kv 0 means heads (MHA); seqlen_k 0 means seqlen_q."""
    name: str
    batch: int
    heads: int
    seqlen_q: int
    head_dim: int
    head_dim_v: int
    heads_kv: int = 0
    seqlen_k: int = 0
    kind: str = "prefill"  # "prefill", "decode" (judged on K/V bandwidth) or "chunk" (chunked prefill)
    # Issue 61's model features (the models-2026 presets): a sliding window (left, right) as flashcore.attention's
    # window=, Llama 4's attention_chunk, gpt-oss's learnable sinks (one float32 logit per query head). Presets with
    # any of them are causal only (--mask none skips them) and default to bf16 and the bshd layout, the models' own.
    window: tuple = None
    attention_chunk: int = 0
    sinks: bool = False
    # DeepSeek's MLA on a latent cache (issue 61, item 5): V is the first head_dim_v columns of the K cache (the same
    # storage, read once), the other head_dim - head_dim_v columns the rope dims; softmax_scale MLA_SOFTMAX_SCALE.
    # Decode, causal only, bf16 and bshd by default, as the model presets with features.
    mla: bool = False
    # Issue 61's head dim 512 (Gemma-family models): named only, as the other model presets.
    d512: bool = False

    @property
    def features(self):
        return self.window is not None or self.attention_chunk > 0 or self.sinks

    @property
    def model(self):
        """Issue 61's model presets: those with a window, chunks or sinks, DeepSeek's MLA and head dim 512 (named
        only)."""
        return self.features or self.mla or self.d512

    @property
    def kv_heads(self):
        return self.heads_kv or self.heads

    @property
    def keys(self):
        return self.seqlen_k or self.seqlen_q

    @property
    def shape(self):
        """BxH[/Hkv]xS[/Sk]xD[/Dv], as --help and --list print it."""
        heads = f"{self.heads}" if self.kv_heads == self.heads else f"{self.heads}/{self.kv_heads}"
        seq = f"{self.seqlen_q}" if self.keys == self.seqlen_q else f"{self.seqlen_q}/{self.keys}"
        dims = f"{self.head_dim}" if self.head_dim_v == self.head_dim else f"{self.head_dim}/{self.head_dim_v}"
        features = feature_suffix(self.window, self.attention_chunk, self.sinks, ",") + (",latent" if self.mla else "")
        return f"{self.batch}x{heads}x{seq}x{dims}" + features


def feature_suffix(window, attention_chunk, sinks, sep=" "):
    """The model features of a preset or case as its label shows them: ' win128' (window (128, 0); 'win128+4' for
    (128, 4)), ' chunk8192', ' sinks'."""
    parts = []
    if window is not None:
        parts.append(f"win{window[0]}" + ("" if window[1] == 0 else f"+{window[1]}"))
    if attention_chunk:
        parts.append(f"chunk{attention_chunk}")
    if sinks:
        parts.append("sinks")
    return "".join(sep + part for part in parts)


# The presets from mission to tput-8k-d32 are kPresets in flashcore_bench.cpp: keep them in step. Issue 37's
# GQA and odd-length shapes and the decode and chunked-prefill presets (issue 13's serving shapes) are
# compare.py's own; flashcore_bench reaches them with --batch/--heads/--heads-kv/--seqlen-q/--seqlen-k.
PRESETS = [
    Preset("mission", 1, 8, 512, 64, 64),
    Preset("short", 1, 8, 256, 64, 64),
    Preset("long", 1, 8, 1024, 64, 64),
    Preset("tput-2k-d64", 16, 16, 2048, 64, 64),
    Preset("tput-8k-d64", 4, 16, 8192, 64, 64),
    Preset("tput-16k-d64", 2, 16, 16384, 64, 64),
    Preset("tput-2k-d128", 16, 16, 2048, 128, 128),
    Preset("tput-8k-d128", 4, 16, 8192, 128, 128),
    Preset("tput-16k-d128", 2, 16, 16384, 128, 128),
    # Issue 12's head dims: 96 (also with 32 heads at 4k), DeepSeek-style 192/128, 256 and 32.
    Preset("tput-2k-d96", 16, 16, 2048, 96, 96),
    Preset("tput-8k-d96", 4, 16, 8192, 96, 96),
    Preset("tput-4k-h32-d96", 4, 32, 4096, 96, 96),
    Preset("tput-2k-d192", 16, 16, 2048, 192, 128),
    Preset("tput-8k-d192", 4, 16, 8192, 192, 128),
    Preset("tput-2k-d256", 16, 16, 2048, 256, 256),
    Preset("tput-8k-d256", 4, 16, 8192, 256, 256),
    Preset("tput-4k-d256", 4, 16, 4096, 256, 256),  # issue 34's d256 backward target
    Preset("tput-4k-b8-d256", 8, 16, 4096, 256, 256),  # issue 36's d256 fp8 prefill target
    Preset("tput-2k-d32", 16, 16, 2048, 32, 32),
    Preset("tput-8k-d32", 4, 16, 8192, 32, 32),
    # Issue 37's Hopper backward targets besides the tput presets: GQA (32 query heads over 8 K/V heads, dK and
    # dV summed over each group) and a length that no tile divides (partial last query and key blocks).
    Preset("gqa-4k-d128", 4, 32, 4096, 128, 128, heads_kv=8),
    Preset("odd-3k-d128", 8, 16, 3000, 128, 128),
    # Issue 62's batch-1 backward target (one long sequence: few key blocks per head to spread over the SMs).
    Preset("b1-4k-h32-d128", 1, 32, 4096, 128, 128),
    # Issue 13's serving shapes, head_dim 128. Decode: one query row per sequence against a K/V cache of
    # seqlen_k rows (--seqlen-q 2..16 for speculative decoding), GQA ratios 4 (32/8), 1 (32/32) and 8 (64/8).
    Preset("decode-b8-8k", 8, 32, 1, 128, 128, heads_kv=8, seqlen_k=8192, kind="decode"),
    Preset("decode-b1-32k", 1, 32, 1, 128, 128, heads_kv=8, seqlen_k=32768, kind="decode"),
    Preset("decode-b1-128k", 1, 32, 1, 128, 128, heads_kv=8, seqlen_k=131072, kind="decode"),
    Preset("decode-b64-1k", 64, 32, 1, 128, 128, heads_kv=8, seqlen_k=1024, kind="decode"),
    Preset("decode-b16-4k", 16, 32, 1, 128, 128, heads_kv=8, seqlen_k=4096, kind="decode"),
    Preset("decode-b1-8k-mha", 1, 32, 1, 128, 128, heads_kv=32, seqlen_k=8192, kind="decode"),
    Preset("decode-b4-16k-gqa4", 4, 32, 1, 128, 128, heads_kv=8, seqlen_k=16384, kind="decode"),
    Preset("decode-b4-16k-gqa8", 4, 64, 1, 128, 128, heads_kv=8, seqlen_k=16384, kind="decode"),
    # Issue 64's: head dim 64 (16 query heads over 2 K/V heads), and batch 64 with 32 query heads over 4.
    Preset("decode-b16-4k-d64", 16, 16, 1, 64, 64, heads_kv=2, seqlen_k=4096, kind="decode"),
    Preset("decode-b64-1k-gqa8", 64, 32, 1, 128, 128, heads_kv=4, seqlen_k=1024, kind="decode"),
    # Chunked prefill: a chunk of new queries against the keys cached so far plus its own (bottom-right causal).
    Preset("chunk-256-2k", 1, 32, 256, 128, 128, heads_kv=8, seqlen_k=2048, kind="chunk"),
    Preset("chunk-512-4k", 1, 32, 512, 128, 128, heads_kv=8, seqlen_k=4096, kind="chunk"),
    Preset("chunk-1k-16k", 1, 32, 1024, 128, 128, heads_kv=8, seqlen_k=16384, kind="chunk"),
    # Issue 61's model shapes (compare.py's own; causal only, bf16 and bshd unless --dtype/--layout say otherwise).
    # gpt-oss 120B attention: 64 query heads over 8 K/V heads, head dim 64, a learnable sink per query head, its
    # layers alternating a sliding window of 128 keys (window (128, 0) with causal) and full causal attention.
    # Prefill of 8k tokens, and decode steps against an 8k cache.
    Preset("gptoss-8k-win128", 1, 64, 8192, 64, 64, heads_kv=8, window=(128, 0), sinks=True),
    Preset("gptoss-8k", 1, 64, 8192, 64, 64, heads_kv=8, sinks=True),
    Preset("gptoss-8k-b2-win128", 2, 64, 8192, 64, 64, heads_kv=8, window=(128, 0), sinks=True),
    Preset("gptoss-8k-b2", 2, 64, 8192, 64, 64, heads_kv=8, sinks=True),
    Preset("gptoss-decode-b8-8k-win128", 8, 64, 1, 64, 64, heads_kv=8, seqlen_k=8192, kind="decode", window=(128, 0),
           sinks=True),
    Preset("gptoss-decode-b8-8k", 8, 64, 1, 64, 64, heads_kv=8, seqlen_k=8192, kind="decode", sinks=True),
    Preset("gptoss-decode-b64-8k-win128", 64, 64, 1, 64, 64, heads_kv=8, seqlen_k=8192, kind="decode",
           window=(128, 0), sinks=True),
    Preset("gptoss-decode-b64-8k", 64, 64, 1, 64, 64, heads_kv=8, seqlen_k=8192, kind="decode", sinks=True),
    # Llama 4 Scout's attention: 40 query heads over 8 K/V heads, head dim 128, chunked attention (chunks of 8192
    # positions, causal inside each): prefill of 16k and 32k tokens.
    Preset("llama4-16k-chunk8k", 1, 40, 16384, 128, 128, heads_kv=8, attention_chunk=8192),
    Preset("llama4-32k-chunk8k", 1, 40, 32768, 128, 128, heads_kv=8, attention_chunk=8192),
    # DeepSeek-V3's MLA decode on the latent cache (issue 61, item 5): one K/V "head" of 576 values per token (512
    # latent dims, then 64 rope dims), queries of 576 dims, V the cache's first 512 columns (mla: the same storage).
    # 16 query heads (the 128 over 8 GPUs) and 128 (one GPU), batch 64 and 128, caches of 4k and 32k.
    Preset("mla-b64-h16-4k", 64, 16, 1, 576, 512, heads_kv=1, seqlen_k=4096, kind="decode", mla=True),
    Preset("mla-b64-h16-32k", 64, 16, 1, 576, 512, heads_kv=1, seqlen_k=32768, kind="decode", mla=True),
    Preset("mla-b64-h128-4k", 64, 128, 1, 576, 512, heads_kv=1, seqlen_k=4096, kind="decode", mla=True),
    Preset("mla-b64-h128-32k", 64, 128, 1, 576, 512, heads_kv=1, seqlen_k=32768, kind="decode", mla=True),
    Preset("mla-b128-h16-4k", 128, 16, 1, 576, 512, heads_kv=1, seqlen_k=4096, kind="decode", mla=True),
    Preset("mla-b128-h16-32k", 128, 16, 1, 576, 512, heads_kv=1, seqlen_k=32768, kind="decode", mla=True),
    Preset("mla-b128-h128-4k", 128, 128, 1, 576, 512, heads_kv=1, seqlen_k=4096, kind="decode", mla=True),
    Preset("mla-b128-h128-32k", 128, 128, 1, 576, 512, heads_kv=1, seqlen_k=32768, kind="decode", mla=True),
    # Head dim 512 (issue 61, item 4; Gemma-family models): a causal prefill of 4k tokens, 16 query heads over 8 K/V
    # heads, and decode steps of 32 sequences against 8k caches.
    Preset("d512-4k", 1, 16, 4096, 512, 512, heads_kv=8, d512=True),
    Preset("d512-decode-b32-8k", 32, 16, 1, 512, 512, heads_kv=8, seqlen_k=8192, kind="decode", d512=True),
]
PRESET_NAMES = [p.name for p in PRESETS]
# The model presets (issue 61) run only when named (alone or through a group below): they need a library and
# binding with sinks= and attention_chunk= (and, for MLA, kernels for head dims (576, 512)), and the default run's
# timings stay comparable with earlier ones.
MODEL_PRESET_NAMES = [p.name for p in PRESETS if p.model]
MLA_PRESET_NAMES = [p.name for p in PRESETS if p.mla]
PRESET_GROUPS = {  # --preset accepts these names too
    "decode": [p.name for p in PRESETS if p.kind == "decode" and not p.model],
    "chunk": [p.name for p in PRESETS if p.kind == "chunk"],
    "serving": [p.name for p in PRESETS if p.kind != "prefill" and not p.model],
    # Issue 34's backward targets (flashcore_bench has the same group); --backward's default.
    "backward-targets": ["tput-2k-d64", "tput-8k-d64", "tput-2k-d128", "tput-8k-d128", "tput-4k-d256"],
    # Issue 37's targets, the Hopper backward against cuDNN's (a training step, --train, at least 1.05x
    # cuDNN's), and issue 62's additions: batch 1 (1x32x4k d128) and d96 (4x32x4k); --train's default.
    # compare.py's only.
    "hopper-backward": ["tput-2k-d64", "tput-8k-d64", "tput-16k-d64", "tput-2k-d128", "tput-8k-d128",
                        "tput-16k-d128", "tput-4k-b8-d256", "gqa-4k-d128", "odd-3k-d128", "b1-4k-h32-d128",
                        "tput-4k-h32-d96"],
    # Issue 63's Hopper forward targets (its table's cases), against the best of FA3, FA4 and cuDNN.
    "hopper-forward": ["tput-2k-d64", "tput-8k-d64", "tput-2k-d128", "tput-8k-d128", "tput-16k-d128", "odd-3k-d128",
                       "gqa-4k-d128", "b1-4k-h32-d128", "tput-2k-d256", "tput-4k-h32-d96"],
    # Issue 36's fp8 (e4m3) prefill targets. Named in --preset, it also makes the fp8 backends (FP8_BACKENDS)
    # the default --backends and bf16 the default --dtype.
    "fp8-prefill": ["tput-2k-d64", "tput-8k-d64", "tput-16k-d64", "tput-2k-d128", "tput-8k-d128", "tput-16k-d128",
                    "tput-4k-b8-d256"],
    # Issue 61's model shapes: gpt-oss (sinks, alternating window 128 and full causal) and Llama 4 (chunks of 8192).
    "gpt-oss-prefill": [n for n in MODEL_PRESET_NAMES if n.startswith("gptoss-8k")],
    "gpt-oss-decode": [n for n in MODEL_PRESET_NAMES if n.startswith("gptoss-decode")],
    "gpt-oss": [n for n in MODEL_PRESET_NAMES if n.startswith("gptoss-")],
    "llama4": [n for n in MODEL_PRESET_NAMES if n.startswith("llama4-")],
    # DeepSeek-V3's MLA decode on the latent cache (576/512, one K/V head), FA3's qv path as the peer.
    "deepseek-mla": [n for n in MODEL_PRESET_NAMES if n.startswith("mla-")],
    # Head dim 512's prefill and decode (the wide kernels; no FA3/FA4 kernel at this head dim).
    "d512": [n for n in MODEL_PRESET_NAMES if n.startswith("d512-")],
    "models-2026": MODEL_PRESET_NAMES,
}
FP8_PRESET_GROUP = "fp8-prefill"
# Cases with at most this many query rows count as decode (K/V bandwidth, FA3's KV-cache entry point).
DECODE_MAX_SEQLEN_Q = 16
# DeepSeek's MLA (the mla presets): every backend gets this softmax_scale, that of the un-absorbed model's q.k over
# 128 + 64 dims (DeepSeek-V3 multiplies it by YaRN's mscale^2 for its long context; one constant either way), so that
# their outputs agree; flashcore's paged form uses pages of MLA_PAGE_SIZE keys.
MLA_SOFTMAX_SCALE = (128 + 64) ** -0.5
MLA_PAGE_SIZE = 64

SDPA_BACKENDS = ("flash", "efficient", "cudnn")
ALL_BACKENDS = ("flashcore", "fa3") + SDPA_BACKENDS
# Named only when asked for (--backends): flashcore on the case's K/V quantized to e4m3 (issue 36's
# quantized KV cache), q and out in the case's dtype, one descale factor per tensor. Judged on its time
# beside flashcore's on the 16-bit cache (fp8kv/16-bit in the notes) and its K/V bytes read per second.
FP8_KV_BACKEND = "flashcore-fp8kv"
# Named only when asked for (--backends, or the fp8-prefill preset group's default): fp8 (e4m3) prefill, issue
# 36. q, k and v are each cast to e4m3 with one descale factor per tensor (amax / 448), once per buffer set and
# outside the timed calls, the cast shared by both backends; out is bf16. flashcore-fp8 is flashcore.attention
# with q_descale/k_descale/v_descale (one element each), fa3-fp8 FlashAttention 3's e4m3 forward,
# flash_attn_func with the same factors as [B, Hkv] float32 arrays (the shape FA3 checks). Same flops as the
# 16-bit cases; judged by fp8 fc/fa3 = flashcore-fp8's TFLOP/s over fa3-fp8's (target FP8_TARGET).
FP8_FC_BACKEND, FP8_FA3_BACKEND = FP8_BACKENDS = ("flashcore-fp8", "fa3-fp8")
FORWARD_BACKENDS = ALL_BACKENDS + (FP8_KV_BACKEND,) + FP8_BACKENDS
# Issue 36: flashcore's fp8 prefill at least this much faster than FlashAttention 3's.
FP8_TARGET = 1.05
# The head dims (D, Dv) issue 36 gives e4m3 queries kernels for. flashcore-fp8 failing a case with other head
# dims is n/a in the table as any failure, but not "flashcore failed a case others ran" (exit status 1): the
# library says UNSUPPORTED there by design.
FP8_HEAD_DIMS = ((64, 64), (128, 128), (256, 256))
# Backends that read e4m3 K/V: decode cases' TB/s count one byte per K/V element.
ONE_BYTE_KV_BACKENDS = (FP8_KV_BACKEND,) + FP8_BACKENDS
# The fp8-KV output against the 16-bit inputs' reference: the quantization error (e4m3 keeps 3 mantissa
# bits) comes on top of the kernel's own; loose, a sanity check.
FP8_KV_TOLERANCE = 1e-1
# The fp8 prefill backends' output against the reference backend's on the dequantized e4m3 inputs (q*q_descale,
# ...; in the case's dtype), so the cast's own error is left out but P's in e4m3 (FA3 casts P for the P*V
# product) is in: up to ~1/16 of a large v value in rows that see a few keys. Loose, a sanity check against gross
# errors (a descale ignored, the wrong head); bench/fp8_error.py measures the error against float64.
FP8_TOLERANCE = 2e-1
# FlashAttention 4 (the flash-attn-4 package, flash_attn.cute.interface.flash_attn_func; forward and backward on
# sm90 and sm100), opt-in (a default only for the model presets): the peer of gpt-oss's sinks (learnable_sink)
# and windows; it has no attention_chunk.
FA4_BACKEND = "fa4"
FA4_DISTRIBUTION = "flash-attn-4"
# gpt-oss's own PyTorch reference, forward only, for cases with sinks (no fused peer but FA4 takes them): scores in
# the case's dtype, the mask added, each head's sink logit as one more column, softmax, the column dropped, times V;
# in slices of query rows so that a slice's scores stay under EAGER_SLICE_BYTES.
EAGER_BACKEND = "eager"
EAGER_SLICE_BYTES = 1 << 30
# Issue 61's overhead twins, flashcore on the case without one feature: flashcore-nosinks is the same call without
# sinks (sinks cost = flashcore's time / its time - 1; target: at most SINKS_COST_TARGET, forward and backward);
# flashcore-causal runs a chunked case (Sq = Sk, a whole number of chunks, bshd) as plain causal attention over its
# chunks taken as a batch of sequences, a view of the same tensors: the same visible pairs, so chunk/causal =
# (flashcore's time / its pairs) / (the twin's time / its pairs) is the cost per visited key (target: at most
# CHUNK_PER_KEY_TARGET). Neither is anyone's peer.
NOSINKS_BACKEND, CAUSAL_BACKEND = OVERHEAD_BACKENDS = ("flashcore-nosinks", "flashcore-causal")
SINKS_COST_TARGET = 0.03
CHUNK_PER_KEY_TARGET = 1.1
FORWARD_BACKENDS += (FA4_BACKEND, EAGER_BACKEND) + OVERHEAD_BACKENDS
# Issue 64's twin: a decode case's cache-length form, flashcore.attention_with_kvcache with cache_seqlens (every
# sequence's count Sk, an int32 [B] made once) on the same tensors as [B, S, H, D] views, beside the dense call.
# seqlens/dense = its time over flashcore's, target at most SEQLENS_TARGET. Never anyone's peer.
SEQLENS_BACKEND = "flashcore-seqlens"
SEQLENS_TARGET = 1.02
FORWARD_BACKENDS += (SEQLENS_BACKEND,)
# The default --backends when every selected preset is a decode step (issue 64's serving presets): the dense
# call's peers, the cache-length form and the e4m3 cache beside flashcore's.
DECODE_BACKENDS = ALL_BACKENDS + (SEQLENS_BACKEND, FP8_KV_BACKEND)
# Decode cases are judged against the copy bandwidth measured in the same run (issue 64): a copy of COPY_BYTES into
# another buffer (both far past the L2) by an elementwise kernel (torch.neg on bf16: 16-byte vectors; the
# runtime's device-to-device memcpy reached only 2.7 TB/s on an H200, against 4.27 for this and 4.38 for a read
# alone), timed as the kernels are, its bytes read and written per second.
COPY_BYTES = 1 << 30
# The default --backends with only MLA presets: flashcore and FA3's qv path, in bf16 and in e4m3 (flashcore on the
# cache cast to e4m3, q bf16; FA3 on q, qv and the cache cast to e4m3, the only fp8 form it has).
MLA_BACKENDS = ("flashcore", FP8_KV_BACKEND, "fa3", FP8_FA3_BACKEND)
# --backward and --train: flashcore's backward in its default and its deterministic mode, beside the others'.
# Their default; fa4 and the overhead twins are opt-in (but for the model presets, model_backends).
DEFAULT_BACKWARD_BACKENDS = ("flashcore", "flashcore-det", "fa3") + SDPA_BACKENDS
BACKWARD_BACKENDS = DEFAULT_BACKWARD_BACKENDS + (FA4_BACKEND,) + OVERHEAD_BACKENDS
# flashcore's own variants: never another backend's peer, and their failures and bad outputs are flashcore's.
OWN_BACKENDS = ("flashcore", "flashcore-det", FP8_FC_BACKEND, SEQLENS_BACKEND) + OVERHEAD_BACKENDS
# The backward pass's flops, by the convention of FlashAttention's benchmarks (and issue 34's anchors):
# 2.5 times the forward's (five matrix products of the forward's size to its two).
BACKWARD_FLOPS_PER_FORWARD_FLOP = 2.5
# The flops of one timed call per mode, in forward flops: --train's training step is the forward and the backward.
FLOPS_PER_FORWARD_FLOP = {"forward": 1.0, "backward": BACKWARD_FLOPS_PER_FORWARD_FLOP,
                          "train": 1.0 + BACKWARD_FLOPS_PER_FORWARD_FLOP}
# Loose, as TOLERANCE: the largest gradient difference from the reference's, over its largest value.
BACKWARD_TOLERANCE = {"fp16": 2e-2, "bf16": 4e-2}
# fc/peer: flashcore against the best of these (FlashAttention 3, cuDNN, PyTorch's flash backend, and
# FlashAttention 4 where asked for).
PEERS = ("fa3", "cudnn", "flash", FA4_BACKEND)
# FlashAttention 3 comes from this third-party wheel (never vendored): pip install fa3-fwd==0.0.3.
FA3_DISTRIBUTION = "fa3-fwd"
# flashcore.h: FLASHCORE_MAX_NUM_SPLITS.
MAX_NUM_SPLITS = 128
# The output every backend is checked against: the first of these that runs the case, else fp32.
REFERENCES = ("flash", "efficient")
# Loose: a sanity check against gross errors, not an accuracy test.
TOLERANCE = {"fp16": 2e-2, "bf16": 4e-2}
MAX_FP32_REFERENCE_BYTES = 2 << 30


class Unsupported(Exception):
    """A backend that cannot run a case."""


class NotApplicable(Unsupported):
    """A backend that by design does not cover a case (e.g. FA3's wheel and fp16): n/a, not a failure."""


@dataclasses.dataclass
class Case:
    name: str
    batch: int
    num_heads_q: int
    num_heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    head_dim_v: int
    dtype: str
    causal: bool
    layout: str
    kind: str = "prefill"
    window: tuple = None  # issue 61's features, as Preset's
    attention_chunk: int = 0
    sinks: bool = False
    mla: bool = False  # DeepSeek's latent cache: v is k[..., :head_dim_v] (the same storage), as Preset's

    @property
    def softmax_scale(self):
        """The scale every backend gets: MLA_SOFTMAX_SCALE for MLA, else None (each backend's 1/sqrt(head_dim))."""
        return MLA_SOFTMAX_SCALE if self.mla else None

    @property
    def features(self):
        """Whether the case has a window, chunks or sinks (issue 61): checked against the fp32 reference computed in
        blocks (masked_reference), flashcore's backward through its autograd node, SDPA only through a mask."""
        return self.window is not None or self.attention_chunk > 0 or self.sinks

    @property
    def masked(self):
        """Whether a window or chunks mask the case beyond causal (SDPA needs an explicit mask)."""
        return self.window is not None or self.attention_chunk > 0

    @property
    def decode(self):
        """Decode-like: judged on K/V bandwidth; FA3 runs through flash_attn_with_kvcache."""
        return self.kind == "decode" or self.seqlen_q <= DECODE_MAX_SEQLEN_Q

    def keys_read(self):
        """Keys of one sequence that some query row sees: Sk, but for a window or chunks (a windowed decode step
        reads its window's keys only)."""
        if not self.masked:
            return self.seqlen_k
        return keys_seen(self.seqlen_q, self.seqlen_k, self.causal, self.window, self.attention_chunk)

    def kv_bytes(self):
        """Bytes of K and V one call reads: B*Hkv*Sk*(D + Dv) elements of 2 bytes (the keys some row sees, for a
        window or chunks); for MLA the latent cache once, B*Hkv*Sk*D (V is the same bytes as K's first Dv)."""
        width = self.head_dim if self.mla else self.head_dim + self.head_dim_v
        return 2 * self.batch * self.num_heads_kv * self.keys_read() * width

    @property
    def label(self):
        heads = f"{self.num_heads_q}"
        if self.num_heads_kv != self.num_heads_q:
            heads += f"/{self.num_heads_kv}"
        seq = f"{self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"{self.seqlen_q}/{self.seqlen_k}"
        mask = "causal" if self.causal else "full"
        dims = f"{self.head_dim}" if self.head_dim_v == self.head_dim else f"{self.head_dim}/{self.head_dim_v}"
        return (f"{self.name} B{self.batch} H{heads} S{seq} D{dims} {self.dtype} {mask}"
                + feature_suffix(self.window, self.attention_chunk, self.sinks) + (" latent" if self.mla else ""))

    @property
    def torch_dtype(self):
        return torch.float16 if self.dtype == "fp16" else torch.bfloat16

    def set_bytes(self):
        """q, k, v and out of one buffer set, in bytes (for MLA, v is a view of k)."""
        rows_q = self.batch * self.num_heads_q * self.seqlen_q
        rows_kv = self.batch * self.num_heads_kv * self.seqlen_k
        if self.mla:
            return 2 * (rows_q * (self.head_dim + self.head_dim_v) + rows_kv * self.head_dim)
        return 2 * (rows_q + rows_kv) * (self.head_dim + self.head_dim_v)

    def read_bytes(self):
        """Bytes one call reads and writes: q, out and the K/V of the keys some row sees (kv_bytes)."""
        return 2 * self.batch * self.num_heads_q * self.seqlen_q * (self.head_dim + self.head_dim_v) + self.kv_bytes()

    def fp8_set_bytes(self):
        """The e4m3 copies of q, k and v of one buffer set and a bf16 out, in bytes (what an fp8 call touches)."""
        rows_q = self.batch * self.num_heads_q * self.seqlen_q
        rows_kv = self.batch * self.num_heads_kv * self.seqlen_k
        kv_width = self.head_dim if self.mla else self.head_dim + self.head_dim_v  # MLA: one e4m3 cache, V a view
        return rows_q * (self.head_dim + 2 * self.head_dim_v) + rows_kv * kv_width


def key_range(i, sq, sk, causal, window=None, attention_chunk=0):
    """(first, last): the keys query row i sees, as flashcore.h defines the masks, all aligned bottom-right on
    row i's diagonal key d = i + Sk - Sq: causal keeps j <= d; a window (left, right) d - left <= j <= d + right (-1:
    unbounded on that side); chunks of attention_chunk keys the chunk of d, floor(d / chunk) * chunk <= j < that
    + chunk (floor division: a negative d's chunk holds no key). last < first when the row sees no key. i may be an
    int or an integer torch tensor of rows (then first and last are tensors of its shape)."""
    d = i + (sk - sq)
    if isinstance(i, int):
        higher, lower, floor_div = max, min, (lambda a, b: a // b)
        lo, hi = 0, sk - 1
    else:
        higher, lower = torch.maximum, torch.minimum
        floor_div = lambda a, b: torch.div(a, b, rounding_mode="floor")  # noqa: E731
        lo, hi = torch.zeros_like(d), torch.full_like(d, sk - 1)
    if causal:
        hi = lower(hi, d)
    if window is not None:
        left, right = window
        if left >= 0:
            lo = higher(lo, d - left)
        if right >= 0:
            hi = lower(hi, d + right)
    if attention_chunk:
        start = floor_div(d, attention_chunk) * attention_chunk
        lo = higher(lo, start)
        hi = lower(hi, start + (attention_chunk - 1))
    return lo, hi


@functools.lru_cache(maxsize=None)
def visible_pairs(sq, sk, causal, window=None, attention_chunk=0):
    """Query/key pairs the mask lets through for one head (bottom-right causal; with a window or chunks, row by
    row from key_range, exactly)."""
    if window is not None or attention_chunk:
        return sum(max(0, hi - lo + 1) for lo, hi in (key_range(i, sq, sk, causal, window, attention_chunk)
                                                      for i in range(sq)))
    if not causal:
        return sq * sk
    if sk >= sq:
        return sq * sk - sq * (sq - 1) // 2
    return sk * (sk + 1) // 2  # the first Sq - Sk rows see no key


@functools.lru_cache(maxsize=None)
def keys_seen(sq, sk, causal, window=None, attention_chunk=0):
    """How many keys of one sequence some query row sees (the union of the rows' ranges)."""
    ranges = sorted(r for r in (key_range(i, sq, sk, causal, window, attention_chunk) for i in range(sq))
                    if r[1] >= r[0])
    count, end = 0, -1
    for lo, hi in ranges:
        if hi > end:
            count += hi - max(lo, end + 1) + 1
            end = hi
    return count


def case_pairs(c):
    """The visible query/key pairs of one head of case c."""
    return visible_pairs(c.seqlen_q, c.seqlen_k, c.causal, getattr(c, "window", None), getattr(c, "attention_chunk", 0))


def attention_flops(c):
    """2*D flops per visible pair for Q*K^T and 2*Dv for P*V (4*D when Dv == D)."""
    return 2.0 * c.batch * c.num_heads_q * (c.head_dim + c.head_dim_v) * case_pairs(c)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Time flashcore against FlashAttention 3 (optional, from the fa3-fwd wheel) and PyTorch "
        "SDPA's flash, efficient and cuDNN backends (CUDA-graph replay, same inputs) and print one table.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="presets (BxH[/Hkv]xSq[/Sk]xD[/Dv]): " + ", ".join(f"{p.name} ({p.shape})" for p in PRESETS)
        + "; groups: " + ", ".join(f"{g} ({len(names)} presets)" for g, names in PRESET_GROUPS.items()),
    )
    sel = p.add_argument_group("cases (default: every preset, fp16 and bf16, causal and not)")
    sel.add_argument("--preset", action="append", metavar="NAME[,NAME]",
                     help="presets to run (repeatable); also the groups " + ", ".join(PRESET_GROUPS)
                     + f" ({FP8_PRESET_GROUP}: issue 36's fp8 prefill targets; naming it makes "
                     + ",".join(FP8_BACKENDS) + " the default --backends and bf16 the default --dtype; "
                     "backward-targets and hopper-backward: issues 34's and 37's backward targets; models-2026: "
                     "issue 61's gpt-oss (sinks, window 128 or full causal) and Llama 4 (chunks of 8192) shapes and "
                     "deepseek-mla (DeepSeek-V3 MLA decode on a latent cache, D576/512 with V the cache's first 512 "
                     "columns, FA3's qv path as the peer; forward only: left out with --backward and --train), "
                     "which run only when named)")
    sel.add_argument("--dtype", help="fp16, bf16 or both, comma separated (default: both; bf16 with --preset "
                     f"{FP8_PRESET_GROUP} and for the model presets); the fp8 backends cast these inputs to e4m3")
    sel.add_argument("--mask", default="both", choices=("none", "causal", "both"),
                     help="default both; the model presets are causal only")
    sel.add_argument("--layout", choices=("bhsd", "bshd"),
                     help="storage of the inputs; SDPA gets [B,H,S,D] views of the same memory (default: bhsd; bshd "
                     "for the model presets)")
    for flag, what in (("batch", "batch size"),
                       ("heads", "query heads; key/value heads follow at the preset's ratio (the same number for "
                        "MHA presets) unless --heads-kv"),
                       ("heads-kv", "key/value heads (GQA)"), ("seqlen", "query and key length"),
                       ("seqlen-q", f"query length (1..{DECODE_MAX_SEQLEN_Q} with a decode preset: speculative "
                        "decoding; any case with at most that many rows counts as decode)"),
                       ("seqlen-k", "key length"),
                       ("head-dim", "head dimension of q and k (and of v and out unless --head-dim-v)"),
                       ("head-dim-v", "head dimension of v and out (default: --head-dim if given, else the "
                        "preset's)")):
        sel.add_argument("--" + flag, type=positive_int, metavar="N",
                         help=what + "; overrides that field of every selected preset")
    run = p.add_argument_group("timing")
    run.add_argument("--backends",
                     help="comma list from " + ", ".join(FORWARD_BACKENDS) + " (with --backward or --train: from "
                     + ", ".join(BACKWARD_BACKENDS) + ") (default: " + ", ".join(ALL_BACKENDS) + "; with --preset "
                     f"{FP8_PRESET_GROUP}: " + ", ".join(FP8_BACKENDS) + "; with only model presets (models-2026): "
                     "flashcore, the overhead twins and the peers that take their features; with only MLA presets "
                     "(deepseek-mla): " + ", ".join(MLA_BACKENDS) + "; fa3 and fa3-fp8 are left "
                     "out, with the reason, when its wheel cannot be imported). Opt-in: " + FP8_KV_BACKEND + " (K/V "
                     "cast to e4m3), " + " and ".join(FP8_BACKENDS) + " (q, k and v cast to e4m3, per tensor, once per "
                     f"buffer set; bf16 out; fp8 fc/fa3 = {FP8_FC_BACKEND} TFLOP/s / {FP8_FA3_BACKEND}'s, target >= "
                     f"{FP8_TARGET}), {FA4_BACKEND} (FlashAttention 4, flash_attn.cute; n/a where not importable), "
                     f"{EAGER_BACKEND} (gpt-oss's PyTorch attention with sinks, forward only), {NOSINKS_BACKEND} "
                     f"(flashcore without the case's sinks: sinks cost, target <= +{100 * SINKS_COST_TARGET:g}%%) and "
                     f"{CAUSAL_BACKEND} (flashcore, plain causal over the case's chunks as a batch: chunk/key, "
                     f"target <= {CHUNK_PER_KEY_TARGET:g}x)")
    modes = run.add_mutually_exclusive_group()
    modes.add_argument("--backward", dest="mode", action="store_const", const="backward",
                       help="time the backward pass (dq, dk, dv from out, lse and dout) instead of the forward: each "
                       "backend's backward alone (flashcore: the operator flashcore::backward, default and "
                       "deterministic modes; SDPA: its attention node's backward), TFLOP/s = "
                       f"{FLOPS_PER_FORWARD_FLOP['backward']:g} x the forward's flops / time; default presets: "
                       "backward-targets")
    modes.add_argument("--train", dest="mode", action="store_const", const="train",
                       help="time a training step instead of the forward: the forward (keeping lse) and then the "
                       "backward as --backward's, on the same inputs, in one timed call (flashcore: "
                       "flashcore.attention(return_lse=True) then flashcore::backward; SDPA: the forward on inputs "
                       "that require grad, then its attention node's backward), TFLOP/s = "
                       f"{FLOPS_PER_FORWARD_FLOP['train']:g} x the forward's flops / time (issue 37: flashcore at "
                       "least 1.05x cuDNN); default presets: hopper-backward")
    p.set_defaults(mode="forward")
    run.add_argument("--num-splits", type=num_splits_arg, metavar="N",
                     help="flashcore and flashcore-fp8 only: split-KV parts (1 never split, "
                     f"2..{MAX_NUM_SPLITS} forced, 0 the library's heuristic, which is also the default); passed as "
                     "flashcore.attention(num_splits=N)")
    run.add_argument("--budget-ms", type=float, default=200.0,
                     help="GPU time of the timed replays, per backend and case (default 200)")
    run.add_argument("--graph-calls", type=positive_int, default=20, help="calls per graph, at most (before rounding)")
    run.add_argument("--buffers", type=positive_int, help="buffer sets to rotate (default: > 2x L2)")
    run.add_argument("--seed", type=int, default=1234)
    run.add_argument("--no-check", action="store_true", help="skip the output comparison")
    out = p.add_argument_group("output and setup")
    out.add_argument("--json", metavar="PATH", help="write all results as JSON")
    out.add_argument("--plot", metavar="PATH", help="write a PNG of TFLOP/s against sequence length (needs matplotlib)")
    out.add_argument("--library", metavar="PATH", help="libflashcore.so to load (sets FLASHCORE_LIBRARY)")
    out.add_argument("--list", action="store_true",
                     help="print the cases the other options select (shapes, decode or not, K/V bytes, the FA3 "
                     "entry point) and exit; needs no GPU or PyTorch")
    out.add_argument("--serving", metavar="KIND[,KIND]",
                     help="also run issue 16's serving comparisons (bench/serving_cases.py): varlen (ragged causal "
                     "prefill vs FA3 varlen), paged (paged decode vs the same call on a contiguous cache and FA3 "
                     "kv-cache decode), window (32k causal with a 4096-key window vs a plain causal 4k prefill); "
                     "bf16. Without --preset, only these run")
    out.add_argument("--varlen-head-dims", metavar="D[,D]", default="128",
                     help="head dims of --serving varlen's case, each its own row (default 128; the sm_90a kernels "
                     "also have 64 and 256)")
    out.add_argument("--extra", action="append", default=[], metavar="NAME=MODULE:FUNC",
                     help="hook for another kernel: FUNC(q, k, v, causal, softmax_scale) on [B,H,S,D] tensors "
                     "(v: [B,H,S,Dv]), bottom-right causal mask, returning [B,H,S,Dv]; timed like the others "
                     "(repeatable)")
    args = p.parse_args(argv)

    # --backward and --train share the gradient machinery: buffer sets with dout, the gradient check, the table.
    args.gradients = args.mode != "forward"
    fp8_group = FP8_PRESET_GROUP in [n for item in (args.preset or []) for n in item.split(",")]
    fp8_defaults = fp8_group and not args.gradients
    args.dtypes = split_choices(p, "--dtype", args.dtype or ("bf16" if fp8_defaults else "fp16,bf16"),
                                ("fp16", "bf16"))
    if args.gradients:
        for flag, given in (("--serving", args.serving), ("--extra", args.extra),
                            ("--num-splits", args.num_splits is not None)):
            if given:
                p.error(f"{flag} is a forward option, not taken with --{args.mode}")
    default_presets = {"forward": [n for n in PRESET_NAMES if n not in MODEL_PRESET_NAMES],
                       "backward": PRESET_GROUPS["backward-targets"],
                       "train": PRESET_GROUPS["hopper-backward"]}[args.mode]
    names = [n for item in (args.preset or [",".join(default_presets)]) for n in item.split(",") if n]
    names = [m for n in names for m in PRESET_GROUPS.get(n, [n])]
    for n in names:
        if n not in PRESET_NAMES:
            p.error(f"unknown preset {n!r}; choose from {', '.join(PRESET_NAMES)} or a group "
                    f"({', '.join(PRESET_GROUPS)})")
    if args.gradients:  # the MLA presets are decode steps, forward only (FA3's wheel has no backward either)
        mla_names = [n for n in names if n in MLA_PRESET_NAMES]
        names = [n for n in names if n not in MLA_PRESET_NAMES]
        if mla_names and not names:
            p.error(f"the MLA presets ({', '.join(dict.fromkeys(mla_names))}) are forward only (decode); "
                    f"--{args.mode} leaves them out")
    args.preset_names = names if (args.preset or not args.serving) else []
    known = BACKWARD_BACKENDS if args.gradients else FORWARD_BACKENDS
    models = [pr for pr in PRESETS if pr.name in args.preset_names and pr.model]
    decode_only = all(pr.kind == "decode" and not pr.model for pr in PRESETS if pr.name in args.preset_names)
    if models and len(models) == len(set(args.preset_names)):
        default = model_backends(models, args.mode)
    elif decode_only and args.preset_names and not args.gradients:
        default = DECODE_BACKENDS
    else:
        default = DEFAULT_BACKWARD_BACKENDS if args.gradients else FP8_BACKENDS if fp8_defaults else ALL_BACKENDS
    args.backend_list = split_choices(p, "--backends", args.backends or ",".join(default), known)
    args.serving_kinds = []
    if args.serving:
        from serving_cases import SERVING_KINDS
        args.serving_kinds = split_choices(p, "--serving", args.serving, SERVING_KINDS)
    try:
        args.varlen_head_dims = [int(d) for d in args.varlen_head_dims.split(",")]
    except ValueError:
        p.error(f"--varlen-head-dims {args.varlen_head_dims!r}: expected head dims such as 64,128")
    if any(d <= 0 or d % 8 or d > 256 for d in args.varlen_head_dims):
        p.error(f"--varlen-head-dims {args.varlen_head_dims}: each a multiple of 8 up to 256")
    args.extras = []
    for spec in args.extra:
        name, sep, target = spec.partition("=")
        if not sep or ":" not in target or not name:
            p.error(f"--extra {spec!r}: expected NAME=MODULE:FUNC")
        args.extras.append((name, target))
    if args.budget_ms <= 0:
        p.error("--budget-ms must be > 0")
    try:
        if not build_cases(args) and not args.serving_kinds:
            if args.mask == "none" and any(n in MODEL_PRESET_NAMES for n in args.preset_names):
                p.error("no case selected: the model presets (window, chunks, sinks or MLA) are causal only, and "
                        "--mask none leaves them out")
            p.error("no preset selected")
    except ValueError as e:
        p.error(str(e))
    return args


def model_backends(presets, mode):
    """The default --backends when only model presets are selected: flashcore, the overhead twins that apply, and
    the peers that take some selected preset's features (fa4: sinks and windows; fa3: windows and chunks, not sinks;
    efficient and cudnn: a mask, not sinks; eager: sinks, forward only). Only MLA presets: MLA_BACKENDS (bf16 and
    e4m3); MLA among others: theirs, fa3 (the MLA peer) added where missing."""
    mla = [pr for pr in presets if pr.mla]
    presets = [pr for pr in presets if not pr.mla]
    if not presets:
        return list(MLA_BACKENDS)
    names = feature_backends(presets, mode)
    if mla and mode == "forward" and "fa3" not in names:
        names.append("fa3")
    return names


def feature_backends(presets, mode):
    """model_backends for presets with a window, chunks or sinks."""
    sinks = any(pr.sinks for pr in presets)
    plain = any(not pr.sinks for pr in presets)
    chunks = any(pr.attention_chunk for pr in presets)
    names = ["flashcore"] + [NOSINKS_BACKEND] * sinks + [CAUSAL_BACKEND] * chunks + [FA4_BACKEND]
    if mode == "forward":
        names += ["fa3"] * plain + ["efficient", "cudnn"] * plain + [EAGER_BACKEND] * sinks
    else:
        names += ["efficient", "cudnn"] * plain
    return names


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def num_splits_arg(text):
    value = int(text)
    if not 0 <= value <= MAX_NUM_SPLITS:
        raise argparse.ArgumentTypeError(f"expected 0 (heuristic), 1 (never split) or 2..{MAX_NUM_SPLITS}, got {text}")
    return value


def split_choices(parser, flag, text, allowed):
    items = [t for t in text.split(",") if t]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        parser.error(f"{flag}: expected a comma list from {', '.join(allowed)}, got {text!r}")
    return list(dict.fromkeys(items))


def build_cases(args):
    """The cases, in the order of PRESETS, each selected preset × dtype × mask.

    Overrides: --seqlen sets both lengths, --seqlen-q/--seqlen-k one each; --heads keeps the preset's
    query/key-value head ratio (MHA presets stay MHA) unless --heads-kv is given. ValueError on a
    --heads that the preset's ratio does not divide. The model presets (window, chunks or sinks) are
    causal only and, unless --dtype and --layout are given, bf16 and bshd; so are the MLA presets, which keep
    their one K/V head under --heads (unless --heads-kv) and need head_dim_v < head_dim (ValueError)."""
    masks = {"none": [False], "causal": [True], "both": [False, True]}[args.mask]
    cases = []
    for p in PRESETS:
        if p.name not in args.preset_names:
            continue
        name = p.name
        hq = args.heads or p.heads
        if args.heads_kv:
            hkv = args.heads_kv
        elif p.mla:  # the latent cache's one K/V head, whatever --heads
            hkv = p.kv_heads
        else:
            ratio = p.heads // p.kv_heads
            if hq % ratio:
                raise ValueError(f"--heads {hq}: preset {name} has {p.heads}/{p.kv_heads} heads (ratio {ratio}); "
                                 "give --heads-kv too")
            hkv = hq // ratio
        fields = dict(name=name, batch=args.batch or p.batch, num_heads_q=hq, num_heads_kv=hkv,
                      seqlen_q=args.seqlen_q or args.seqlen or p.seqlen_q,
                      seqlen_k=args.seqlen_k or args.seqlen or p.keys,
                      head_dim=args.head_dim or p.head_dim,
                      head_dim_v=args.head_dim_v or args.head_dim or p.head_dim_v,
                      layout=args.layout or ("bshd" if p.model else "bhsd"), kind=p.kind,
                      window=p.window, attention_chunk=p.attention_chunk, sinks=p.sinks, mla=p.mla)
        if p.mla and not 0 < fields["head_dim_v"] < fields["head_dim"]:
            raise ValueError(f"preset {name}: the MLA latent cache needs 0 < head_dim_v < head_dim (V is the cache's "
                             f"first head_dim_v columns, the rope dims the rest), got {fields['head_dim']}/"
                             f"{fields['head_dim_v']}")
        dtypes = ["bf16"] if p.model and not getattr(args, "dtype", None) else args.dtypes
        for dtype in dtypes:
            for causal in masks:
                if causal or not p.model:
                    cases.append(Case(dtype=dtype, causal=causal, **fields))
    return cases


# ---------------------------------------------------------------------------
# Backends: each is fn(q, k, v) -> out on tensors stored in the case's layout
# ---------------------------------------------------------------------------


def import_flashcore(library):
    """The project's ctypes package, from bindings/python when not installed."""
    if library:
        os.environ["FLASHCORE_LIBRARY"] = str(Path(library).resolve())
    elif "FLASHCORE_LIBRARY" not in os.environ:
        built = REPO / "build" / "src" / "libflashcore.so"
        if built.exists():
            os.environ["FLASHCORE_LIBRARY"] = str(built)
    try:
        return importlib.import_module("flashcore")
    except ImportError:
        for extra in (REPO / "bindings" / "python", REPO / "bindings" / "python" / "src"):
            if extra.is_dir() and str(extra) not in sys.path:
                sys.path.insert(0, str(extra))
        return importlib.import_module("flashcore")


def to_bhsd(t, layout):
    return t.transpose(1, 2) if layout == "bshd" else t


def bottom_right_bias(c, device):
    """Additive [1, 1, Sq, Sk] mask in the case's dtype: 0 where query i sees key j (j <= i + Sk - Sq), else -inf.

    For SDPA backends without a bottom-right causal flag; built once per case, outside the timed calls."""
    keep = torch.ones(c.seqlen_q, c.seqlen_k, dtype=torch.bool, device=device).tril(c.seqlen_k - c.seqlen_q)
    bias = torch.zeros(c.seqlen_q, c.seqlen_k, dtype=c.torch_dtype, device=device)
    return bias.masked_fill(~keep, float("-inf")).view(1, 1, c.seqlen_q, c.seqlen_k)


def sdpa_with_mask(pinned, c, bias, gqa_kwargs):
    """fn(q, k, v): SDPA pinned to one backend with an explicit additive mask (built once, outside the timed
    calls)."""
    def run(q, k, v):
        with sdpa_kernel([pinned]):
            return F.scaled_dot_product_attention(to_bhsd(q, c.layout), to_bhsd(k, c.layout), to_bhsd(v, c.layout),
                                                  attn_mask=bias, **gqa_kwargs)
    return run


def sdpa_backend(name, c, cache=None):
    """fn(q, k, v) for PyTorch SDPA pinned to one backend, bottom-right causal; fn.how says how it is called.
    A window or chunks (issue 61) go in as an explicit additive mask (feature_bias; cache: the case's dict, so
    that its backends share one), which PyTorch's flash kernel does not take; sinks are n/a (SDPA has none)."""
    pinned = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "cudnn": SDPBackend.CUDNN_ATTENTION}[name]
    gqa = c.num_heads_q != c.num_heads_kv
    gqa_kwargs = {"enable_gqa": True} if gqa else {}
    gqa_how = "; GQA: enable_gqa=True (K/V passed with their Hkv heads, no repeat_interleave)" if gqa else ""
    scale = getattr(c, "softmax_scale", None)  # MLA's; None elsewhere (SDPA's 1/sqrt(D), nothing passed)
    scale_kwargs = {} if scale is None else {"scale": scale}
    if scale is not None:
        gqa_kwargs.update(scale_kwargs)
        gqa_how += f"; scale={scale:.6g} (MLA)"
    if getattr(c, "features", False):
        if c.sinks:
            raise NotApplicable(f"{name}: SDPA has no learnable sinks (the {EAGER_BACKEND} backend is their PyTorch "
                                "fallback)")
        if name == "flash":
            raise NotApplicable("flash: PyTorch's flash kernel takes no mask (a window or chunks need one)")
        run = sdpa_with_mask(pinned, c, feature_bias(c, cache), gqa_kwargs)
        run.how = ("F.scaled_dot_product_attention with an explicit additive mask [1,1,Sq,Sk] (the window and "
                   "chunks, bottom-right, built once per case)" + gqa_how)
        return run
    # A bottom-right causal mask over one query row hides no key: same as no mask.
    causal = c.causal and c.seqlen_q > 1
    causal_how = ": causal with Sq=1 hides no key" if c.causal and not causal else ""

    if causal and c.seqlen_q != c.seqlen_k:
        # is_causal would align the mask top-left: call the kernels with a bottom-right mask.
        if name == "flash":
            def run(q, k, v):
                qb, kb, vb = (to_bhsd(t, c.layout) for t in (q, k, v))
                return torch.ops.aten._scaled_dot_product_flash_attention(qb, kb, vb, 0.0, True, **scale_kwargs)[0]
            run.how = ("aten._scaled_dot_product_flash_attention(is_causal=True): bottom-right causal"
                       + ("; GQA: native in the kernel (K/V with their Hkv heads)" if gqa else ""))
            return run
        if name == "efficient" and not gqa:
            def run(q, k, v):
                qs, ks, vs = (to_bhsd(t, c.layout).transpose(1, 2) for t in (q, k, v))  # [B,S,H,D] views
                out = torch.ops.aten._efficient_attention_forward(
                    qs, ks, vs, None, None, None, None, None, 0.0, 2, **scale_kwargs)[0]  # 2: causal from bottom right
                return out.transpose(1, 2)
            run.how = "aten._efficient_attention_forward(custom_mask_type=2): bottom-right causal"
            return run
        if c.seqlen_q > c.seqlen_k:
            raise Unsupported(f"{name}: no bottom-right causal kernel for seqlen_q > seqlen_k"
                              + (" with GQA" if gqa else "") + " (an explicit mask would leave rows with no key)")
        run = sdpa_with_mask(pinned, c, bottom_right_bias(c, "cuda"), gqa_kwargs)
        run.how = ("F.scaled_dot_product_attention with an explicit bottom-right additive mask [1,1,Sq,Sk] "
                   "(is_causal is top-left)" + gqa_how)
        return run

    def run(q, k, v):
        with sdpa_kernel([pinned]):
            return F.scaled_dot_product_attention(to_bhsd(q, c.layout), to_bhsd(k, c.layout),
                                                  to_bhsd(v, c.layout), is_causal=causal, **gqa_kwargs)
    run.how = f"F.scaled_dot_product_attention(is_causal={causal}{causal_how})" + gqa_how
    return run


def accepts_keyword(fn, name):
    """Whether fn takes the keyword argument name (True when its signature cannot be read)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def flashcore_backend(fc, c, num_splits=None, sinks=None, twin=None, deterministic=False):
    """flashcore.attention (the binding sizes and allocates the split-KV workspace); num_splits only when given.
    Issue 61's features as flashcore_features gives them (sinks: a float32 [Hq] tensor, made by make_sinks when
    None); twin: one of OVERHEAD_BACKENDS (the case without its sinks, or its chunks as a batch of plain
    sequences). deterministic: the forward's flag for the backward pass (flashcore-det through autograd)."""
    kwargs = {} if num_splits is None else {"num_splits": num_splits}
    if twin:
        twin_check(c, twin)
    features = flashcore_features(fc, c, sinks, twin)
    kwargs.update(features)
    if deterministic:
        kwargs["deterministic"] = True
    gqa_how = "; GQA: native" if c.num_heads_q != c.num_heads_kv else ""
    if getattr(c, "mla", False):
        call, how = flashcore_mla_call(fc, c, kwargs)

        def run(q, k, v):  # v is k[..., :Dv]: the call takes it from k, as the same storage
            return call(q, k)
        run.how = how + gqa_how
        return run
    if twin == CAUSAL_BACKEND:
        def run(q, k, v):
            out = fc.attention(*(as_chunk_batch(t, c) for t in (q, k, v)), causal=c.causal, layout="bshd", **kwargs)
            return to_bhsd(out.view(c.batch, c.seqlen_q, c.num_heads_q, c.head_dim_v), "bshd")
        run.how = (f"flashcore.attention(causal={c.causal}, layout='bshd'{features_how(features)}) on the chunks as a "
                   f"batch of {c.batch * (c.seqlen_q // c.attention_chunk)} sequences of {c.attention_chunk} (views)"
                   + gqa_how)
        return run

    def run(q, k, v):
        return to_bhsd(fc.attention(q, k, v, causal=c.causal, layout=c.layout, **kwargs), c.layout)
    run.how = (f"flashcore.attention(layout={c.layout!r}"
               + (f", num_splits={num_splits}" if num_splits is not None else "") + features_how(features)
               + (", deterministic=True" if deterministic else "") + "), workspace allocated by the binding" + gqa_how)
    return run


def flashcore_mla_call(fc, c, kwargs):
    """(call, how) for flashcore on an MLA case: call(q, k, **more) -> out [B, Hq, Sq, Dv], k the latent cache (the
    case's layout, 16-bit or e4m3) and v its first Dv columns (a view: the same storage), softmax_scale
    MLA_SOFTMAX_SCALE, kwargs and more passed on. Paged where the case allows (bshd, Sk a multiple of
    MLA_PAGE_SIZE): flashcore.attention_with_kvcache with a block table over pages of MLA_PAGE_SIZE keys, the cache's
    own storage taken as the page pool, sequence b's pages in order (pool page b * Sk / page + p), so the paged
    addressing is timed on the same bytes as the other backends read, not a shuffled pool's locality; else
    flashcore.attention on the contiguous cache. The block table is made here, once per case."""
    dv, scale = c.head_dim_v, c.softmax_scale
    kwargs = dict(kwargs, softmax_scale=scale)
    shown = "".join(f", {key}={value!r}" for key, value in kwargs.items() if key != "softmax_scale")
    view = f"v = k[..., :{dv}] (the cache's latent columns, the same storage), softmax_scale={scale:.6g}"
    paged = (c.layout == "bshd" and c.seqlen_k % MLA_PAGE_SIZE == 0
             and hasattr(fc, "attention_with_kvcache") and accepts_keyword(fc.attention_with_kvcache, "block_table"))
    if not paged:
        def call(q, k, **more):
            return to_bhsd(fc.attention(q, k, k[..., :dv], causal=c.causal, layout=c.layout, **kwargs, **more),
                           c.layout)
        why = ("its layout is not bshd" if c.layout != "bshd" else f"Sk is not a multiple of {MLA_PAGE_SIZE}"
               if c.seqlen_k % MLA_PAGE_SIZE else "the binding has no attention_with_kvcache(block_table=)")
        return call, (f"flashcore.attention(layout={c.layout!r}{shown}) on the contiguous latent cache, {view} (not "
                      f"paged: {why})")
    pages = c.seqlen_k // MLA_PAGE_SIZE
    table = torch.arange(c.batch * pages, dtype=torch.int32, device="cuda").view(c.batch, pages)

    def call(q, k, **more):
        pool = k.view(c.batch * pages, MLA_PAGE_SIZE, c.num_heads_kv, c.head_dim)
        out = fc.attention_with_kvcache(q, pool, pool[..., :dv], block_table=table, causal=c.causal, **kwargs, **more)
        return to_bhsd(out, "bshd")
    return call, (f"flashcore.attention_with_kvcache(block_table=[B, Sk/{MLA_PAGE_SIZE}]{shown}): paged, pages of "
                  f"{MLA_PAGE_SIZE} keys, the cache's own storage as the pool with each sequence's pages in order, "
                  f"{view}; the whole cache, no cache_seqlens")


def flashcore_seqlens_backend(fc, c, num_splits=None):
    """fn(q, k, v): a decode case's cache-length form (issue 64), flashcore.attention_with_kvcache on the case's
    tensors as [B, S, H, D] views with cache_seqlens an int32 [B] of Sk each, made here, outside the timed calls:
    the same work as the dense call, told each sequence's count."""
    if not c.decode:
        raise NotApplicable(f"{SEQLENS_BACKEND}: decode cases only (a cache-length call)")
    if c.features or getattr(c, "mla", False):
        raise NotApplicable(f"{SEQLENS_BACKEND}: not wired for windows, chunks, sinks or MLA")
    if not hasattr(fc, "attention_with_kvcache"):
        raise Unsupported(f"{SEQLENS_BACKEND}: the binding has no attention_with_kvcache")
    seqlens = torch.full((c.batch,), c.seqlen_k, dtype=torch.int32, device="cuda")
    kwargs = {} if num_splits is None else {"num_splits": num_splits}

    def bshd(t):
        return t if c.layout == "bshd" else t.transpose(1, 2)

    def run(q, k, v):
        return to_bhsd(fc.attention_with_kvcache(bshd(q), bshd(k), bshd(v), seqlens, causal=c.causal, **kwargs),
                       "bshd")
    run.how = (f"flashcore.attention_with_kvcache(cache_seqlens=int32 [B] of {c.seqlen_k}"
               + (f", num_splits={num_splits}" if num_splits is not None else "") + ") on [B, S, H, D] views"
               + (" (of the bhsd tensors)" if c.layout != "bshd" else ""))
    return run


def flashcore_fp8_kv_backend(fc, c):
    """fn(q, k, v): flashcore.attention on k and v quantized to e4m3 (per tensor) once per buffer set,
    outside the timed calls (a cache is written once and read by every decode step). MLA: the latent cache cast
    once, one factor for K and V (V is its first Dv columns, the same e4m3 bytes), flashcore_mla_call's call."""
    quantized = {}
    if getattr(c, "mla", False):
        call, how = flashcore_mla_call(fc, c, {})

        def run(q, k, v):
            if k.data_ptr() not in quantized:
                quantized[k.data_ptr()] = quantize_e4m3(k)
            k8, descale = quantized[k.data_ptr()]
            return call(q, k8, k_descale=descale, v_descale=descale)
        run.how = (how + "; the cache cast to torch.float8_e4m3fn once per buffer set with one descale factor "
                   "(amax / 448), k_descale = v_descale; q in the case's dtype")
        return run

    def run(q, k, v):
        key = (k.data_ptr(), v.data_ptr())
        if key not in quantized:
            quantized[key] = quantize_e4m3(k) + quantize_e4m3(v)
        k8, k_descale, v8, v_descale = quantized[key]
        return to_bhsd(fc.attention(q, k8, v8, causal=c.causal, layout=c.layout, k_descale=k_descale,
                                    v_descale=v_descale), c.layout)
    run.how = (f"flashcore.attention(layout={c.layout!r}, k_descale=, v_descale=) on K/V cast to "
               "torch.float8_e4m3fn with one descale factor per tensor (amax / 448), cast once per buffer set")
    return run


def fp8_set(cache, c, q, k, v):
    """The buffer set q, k, v cast to e4m3 for the fp8 prefill backends, each tensor with one descale factor
    (quantize_e4m3), cast on first use and kept in cache (one dict per case, shared by those backends, so both
    read the same e4m3 tensors and each set is cast once, before anything is timed). A namespace: q, k, v
    (torch.float8_e4m3fn, the case's shapes and layout), q_descale, k_descale, v_descale (float32, one element
    each) and descales_bh, the three factors as contiguous float32 [B, Hkv] arrays (the form FA3 checks). MLA: the
    latent cache k is cast once and v is its first Dv columns (a view of the e4m3 cache, k's factor)."""
    key = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    entry = cache.get(key)
    if entry is None:
        if getattr(c, "mla", False):
            (q8, qd), (k8, kd) = quantize_e4m3(q), quantize_e4m3(k)
            v8, vd = k8[..., :c.head_dim_v], kd
        else:
            (q8, qd), (k8, kd), (v8, vd) = (quantize_e4m3(t) for t in (q, k, v))
        per_head = tuple(d.expand(c.batch, c.num_heads_kv).contiguous() for d in (qd, kd, vd))
        entry = cache[key] = argparse.Namespace(q=q8, k=k8, v=v8, q_descale=qd, k_descale=kd, v_descale=vd,
                                                descales_bh=per_head)
    return entry


def dequantized(entry, dtype, mla_dv=None):
    """(q, k, v) of an fp8_set entry as the values the kernels compute on, e4m3 * descale, in dtype. mla_dv: an MLA
    case's head_dim_v, v then being the dequantized cache's first mla_dv columns (a view, as the inputs')."""
    if mla_dv:
        q, k = ((t.float() * d).to(dtype) for t, d in ((entry.q, entry.q_descale), (entry.k, entry.k_descale)))
        return q, k, k[..., :mla_dv]
    return tuple((t.float() * d).to(dtype) for t, d in ((entry.q, entry.q_descale), (entry.k, entry.k_descale),
                                                         (entry.v, entry.v_descale)))


def flashcore_fp8_backend(fc, c, cache=None, num_splits=None):
    """fn(q, k, v): flashcore.attention on q, k and v cast to e4m3 (fp8_set: per tensor, once per buffer set,
    outside the timed calls) with q_descale, k_descale and v_descale; bf16 out (issue 36's fp8 prefill)."""
    cache = {} if cache is None else cache
    kwargs = {} if num_splits is None else {"num_splits": num_splits}
    if getattr(c, "mla", False):
        call, how = flashcore_mla_call(fc, c, kwargs)

        def run(q, k, v):
            e = fp8_set(cache, c, q, k, v)
            return call(e.q, e.k, q_descale=e.q_descale, k_descale=e.k_descale, v_descale=e.v_descale)
        run.how = (how + "; q and the cache cast to torch.float8_e4m3fn (one descale factor each, amax / 448; "
                   "v_descale = k_descale), cast once per buffer set; bf16 out")
        return run

    def run(q, k, v):
        e = fp8_set(cache, c, q, k, v)
        return to_bhsd(fc.attention(e.q, e.k, e.v, causal=c.causal, layout=c.layout, q_descale=e.q_descale,
                                    k_descale=e.k_descale, v_descale=e.v_descale, **kwargs), c.layout)
    run.how = (f"flashcore.attention(layout={c.layout!r}, q_descale=, k_descale=, v_descale="
               + (f", num_splits={num_splits}" if kwargs else "") + ") on q, k and v cast to torch.float8_e4m3fn "
               "with one float32 descale factor per tensor (amax / 448, one-element tensors), cast once per buffer "
               "set; bf16 out allocated by the binding" + ("; GQA: native" if c.num_heads_q != c.num_heads_kv else ""))
    return run


def fa3_fp8_backend(fa3, c, cache=None):
    """fn(q, k, v) for FlashAttention 3's e4m3 forward: flash_attn_func on [B, S, H, D] views of q, k and v cast
    to e4m3 (fp8_set, the same tensors flashcore-fp8 gets) with q_descale, k_descale, v_descale as float32
    [B, Hkv] arrays; bf16 out, returned as [B, H, Sq, Dv]. flash_attn_func for decode-like cases too."""
    if fa3 is None:
        raise Unsupported(f"{FP8_FA3_BACKEND}: the fa3-fwd wheel is not importable")
    cache = {} if cache is None else cache
    if getattr(c, "mla", False):
        return fa3_mla_backend(fa3, c, FP8_FA3_BACKEND, cache)

    def bshd(t):
        return t if c.layout == "bshd" else t.transpose(1, 2)

    def run(q, k, v):
        e = fp8_set(cache, c, q, k, v)
        q_descale, k_descale, v_descale = e.descales_bh
        out = fa3.flash_attn_func(bshd(e.q), bshd(e.k), bshd(e.v), causal=c.causal, q_descale=q_descale,
                                  k_descale=k_descale, v_descale=v_descale)
        return first_output(out).transpose(1, 2)
    run.how = (f"flash_attn_func(causal={c.causal}, q_descale=, k_descale=, v_descale=) on [B,S,H,D] views of the "
               "e4m3 q, k and v flashcore-fp8 gets, the descale factors as contiguous float32 [B, Hkv] arrays "
               "(each the tensor's one factor); FA3's default, no split"
               + ("; GQA: native (K/V with their Hkv heads)" if c.num_heads_q != c.num_heads_kv else ""))
    return run


def import_fa3():
    """FlashAttention 3's entry points from the fa3-fwd wheel: a namespace, or raises (ImportError mostly)."""
    import fa3_fwd_config, sys; sys.modules["flash_attn_config"] = fa3_fwd_config  # noqa: E401,E702
    from fa3_fwd_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    try:
        from importlib.metadata import version
        fa3_version = version(FA3_DISTRIBUTION)
    except Exception:  # the version is for the report only
        fa3_version = None
    return argparse.Namespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func,
                              flash_attn_with_kvcache=flash_attn_with_kvcache, version=fa3_version)


def first_output(result):
    """FA3's out: its functions return out, or (out, lse, ...) when asked for the log-sum-exp."""
    return result[0] if isinstance(result, (tuple, list)) else result


def fa3_backend(fa3, c):
    """fn(q, k, v) for FlashAttention 3 on [B, S, H, D] views of the case's tensors; returns [B, H, Sq, Dv]."""
    if fa3 is None:
        raise Unsupported("fa3: the fa3-fwd wheel is not importable")
    if c.dtype != "bf16":
        raise NotApplicable(f"fa3: not applicable to {c.dtype}: the fa3-fwd wheel has bf16 and fp8 kernels only")
    if getattr(c, "mla", False):
        return fa3_mla_backend(fa3, c, "fa3")

    def bshd(t):
        return t if c.layout == "bshd" else t.transpose(1, 2)

    gqa_how = "; GQA: native (K/V with their Hkv heads)" if c.num_heads_q != c.num_heads_kv else ""
    entry = fa3.flash_attn_with_kvcache if c.decode else fa3.flash_attn_func
    features = fa3_features(entry, c)
    feature_how = "".join(f", {key}={value!r}" for key, value in features.items())
    if c.decode:
        def run(q, k, v):  # q [B,Sq,Hq,D]; the caches [B,Sk,Hkv,D], all Sk rows used
            out = fa3.flash_attn_with_kvcache(bshd(q), bshd(k), bshd(v), causal=c.causal, num_splits=0, **features)
            return first_output(out).transpose(1, 2)
        run.how = (f"flash_attn_with_kvcache(causal={c.causal}{feature_how}, num_splits=0: its split-KV heuristic)"
                   + gqa_how)
    else:
        def run(q, k, v):
            return first_output(fa3.flash_attn_func(bshd(q), bshd(k), bshd(v), causal=c.causal,
                                                    **features)).transpose(1, 2)
        run.how = f"flash_attn_func(causal={c.causal}{feature_how})" + gqa_how
    return run


def fa3_mla_backend(fa3, c, name, fp8_cache=None):
    """fn(q, k, v) for FlashAttention 3's MLA path on an MLA case, returning [B, H, Sq, Dv]: with the latent dims
    first and the rope dims last in both q and the cache rows, FA3 gets q = q's rope dims, qv = its latent dims,
    k_cache = the cache's rope columns and v_cache its latent columns ([B, S, H, d] views, last dims contiguous), so
    its scores q.k_cache + qv.v_cache are the whole 576-dim q.k, and its out P.v_cache; softmax_scale
    MLA_SOFTMAX_SCALE (FA3's own default would be 1/sqrt(576)). flash_attn_with_kvcache(num_splits=0) for decode,
    flash_attn_func otherwise; the contiguous cache (the wheel has no paged kernels). fp8_cache: the fa3-fp8 form,
    q, qv and the cache cast to e4m3 (fp8_set; FA3 takes q and k of one dtype), descales as [B, Hkv] arrays."""
    entry = fa3.flash_attn_with_kvcache if c.decode else fa3.flash_attn_func
    if not accepts_keyword(entry, "qv"):
        raise NotApplicable(f"{name}: this {FA3_DISTRIBUTION} wheel's {entry.__name__} has no qv= (FA3's MLA path)")
    dv, scale = c.head_dim_v, c.softmax_scale
    extra = {"num_splits": 0} if c.decode else {}

    def bshd(t):
        return t if c.layout == "bshd" else t.transpose(1, 2)

    def run(q, k, v):  # v is k[..., :Dv]: its latent columns are taken from k, the same storage
        descales = {}
        if fp8_cache is not None:
            e = fp8_set(fp8_cache, c, q, k, v)
            q, k = e.q, e.k
            descales = dict(zip(("q_descale", "k_descale", "v_descale"), e.descales_bh))
        qb, kb = bshd(q), bshd(k)
        out = entry(qb[..., dv:], kb[..., dv:], kb[..., :dv], qv=qb[..., :dv], softmax_scale=scale, causal=c.causal,
                    **extra, **descales)
        return first_output(out).transpose(1, 2)
    rope = c.head_dim - dv
    run.how = (f"{entry.__name__}(q = q[..., {dv}:] (the {rope} rope dims), k_cache = cache[..., {dv}:], v_cache = "
               f"cache[..., :{dv}] (the latent columns), qv = q[..., :{dv}], softmax_scale={scale:.6g}, "
               f"causal={c.causal}" + (", num_splits=0: its split-KV heuristic" if c.decode else "")
               + "), [B,S,H,d] views of the contiguous cache (the wheel has no paged kernels), the whole cache (no "
               "cache_seqlens)"
               + ("; q, qv and the cache cast to torch.float8_e4m3fn (one descale factor each, amax / 448, as "
                  "contiguous float32 [B, Hkv] arrays; v_descale = k_descale), cast once per buffer set"
                  if fp8_cache is not None else "")
               + ("; GQA: native (K/V with their Hkv heads)" if c.num_heads_q != c.num_heads_kv else ""))
    return run


def fa3_features(entry, c):
    """FA3's keyword arguments for a case's window and chunks (window_size, attention_chunk: FlashAttention's
    conventions, which flashcore's follow); NotApplicable for sinks (FA3 has none) or an argument this wheel's
    entry point lacks."""
    if c.sinks:
        raise NotApplicable("fa3: FlashAttention 3 has no learnable sinks (FA4's learnable_sink is their peer)")
    features = {}
    if c.window is not None:
        features["window_size"] = tuple(c.window)
    if c.attention_chunk:
        features["attention_chunk"] = c.attention_chunk
    missing = [key for key in features if not accepts_keyword(entry, key)]
    if missing:
        raise NotApplicable(f"fa3: this {FA3_DISTRIBUTION} wheel's {entry.__name__} has no "
                            + " or ".join(f"{key}=" for key in missing))
    return features


def make_sinks(c, seed):
    """gpt-oss's learnable sinks for case c: one float32 logit per query head, log(the mean keys a row sees) plus
    N(0, 1), so that a sink takes a sizeable share of its rows' softmax and a kernel that drops it fails the check."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed + 61)
    mean_keys = max(1.0, case_pairs(c) / c.seqlen_q)
    return math.log(mean_keys) + torch.randn(c.num_heads_q, device="cuda", dtype=torch.float32, generator=gen)


def flashcore_features(fc, c, sinks, twin=None):
    """flashcore.attention's keyword arguments for the case's window, chunks and sinks (the causal twin drops the
    chunks, the nosinks twin the sinks); Unsupported where the binding lacks one (it predates issue 61)."""
    features = {}
    if c.window is not None:
        features["window"] = tuple(c.window)
    if c.attention_chunk and twin != CAUSAL_BACKEND:
        features["attention_chunk"] = c.attention_chunk
    if c.sinks and twin != NOSINKS_BACKEND:
        features["sinks"] = sinks if sinks is not None else make_sinks(c, 0)
    missing = [key for key in features if not accepts_keyword(fc.attention, key)]
    if missing:
        raise Unsupported(f"flashcore: the binding at {getattr(fc, '__file__', '?')} has no "
                          + " or ".join(f"{key}=" for key in missing) + " in attention() (issue 61)")
    return features


def features_how(features):
    """How flashcore_features' or fa4's arguments are shown in the notes."""
    shown = {key: "float32 [Hq]" if key in ("sinks", "learnable_sink") else repr(value)
             for key, value in features.items()}
    return "".join(f", {key}={value}" for key, value in shown.items())


def as_chunk_batch(t, c):
    """A bshd tensor [B, S, H, D] of a chunked case as [B * S / chunk, chunk, H, D]: its chunks as a batch of
    sequences (a view)."""
    return t.view(c.batch * (c.seqlen_q // c.attention_chunk), c.attention_chunk, t.shape[2], t.shape[3])


def twin_check(c, twin):
    """NotApplicable where an overhead twin has no meaning for case c."""
    if twin == NOSINKS_BACKEND and not c.sinks:
        raise NotApplicable(f"{twin}: the case has no sinks")
    if twin == CAUSAL_BACKEND:
        if not c.attention_chunk:
            raise NotApplicable(f"{twin}: the case has no chunks")
        if c.seqlen_q != c.seqlen_k or c.seqlen_q % c.attention_chunk:
            raise NotApplicable(f"{twin}: needs Sq = Sk and a whole number of chunks (its chunks as a batch)")
        if c.layout != "bshd":
            raise NotApplicable(f"{twin}: needs --layout bshd (where a sequence's chunks are a batch by a view)")


def import_fa4():
    """FlashAttention 4's flash_attn_func (flash_attn.cute.interface, from the flash-attn-4 package): a namespace,
    or raises (ImportError mostly)."""
    try:
        from flash_attn.cute.interface import flash_attn_func
    except ImportError:
        from flash_attn.cute import flash_attn_func
    try:
        from importlib.metadata import version
        fa4_version = version(FA4_DISTRIBUTION)
    except Exception:  # the version is for the report only
        fa4_version = None
    return argparse.Namespace(flash_attn_func=flash_attn_func, version=fa4_version)


def fa4_backend(fa4, c, sinks=None):
    """fn(q, k, v) for FlashAttention 4's flash_attn_func on [B, S, H, D] views of the case's tensors, returning
    [B, H, Sq, Dv]: causal, window_size (None for an unbounded side), learnable_sink (float32 [Hq]); decode-like
    cases with num_splits=0 (its split-KV heuristic). No attention_chunk: n/a for chunked cases."""
    if fa4 is None:
        raise Unsupported("fa4: FlashAttention 4 (flash_attn.cute, the flash-attn-4 package) is not importable")
    if c.attention_chunk:
        raise NotApplicable("fa4: FlashAttention 4 has no attention_chunk (only a CuTe mask_mod, not wired here)")
    features = {}
    if c.window is not None:
        features["window_size"] = tuple(None if side < 0 else side for side in c.window)
    if c.sinks:
        features["learnable_sink"] = sinks if sinks is not None else make_sinks(c, 0)
    if c.decode:
        features["num_splits"] = 0
    if getattr(c, "softmax_scale", None) is not None:  # MLA's
        features["softmax_scale"] = c.softmax_scale
    missing = [key for key in features if not accepts_keyword(fa4.flash_attn_func, key)]
    if missing:
        raise NotApplicable("fa4: this flash_attn_func has no " + " or ".join(f"{key}=" for key in missing))

    def bshd(t):
        return t if c.layout == "bshd" else t.transpose(1, 2)

    def run(q, k, v):
        return first_output(fa4.flash_attn_func(bshd(q), bshd(k), bshd(v), causal=c.causal,
                                                **features)).transpose(1, 2)
    run.how = (f"flash_attn.cute flash_attn_func(causal={c.causal}{features_how(features)})"
               + (" (num_splits=0: its split-KV heuristic)" if c.decode else "")
               + ("; GQA: native (K/V with their Hkv heads)" if c.num_heads_q != c.num_heads_kv else ""))
    return run


def mask_keep(c, device, rows=None):
    """Bool [len(rows), Sk]: where query row i sees key j, from key_range (rows: a tensor of rows, default all)."""
    rows = torch.arange(c.seqlen_q, device=device) if rows is None else rows
    lo, hi = key_range(rows, c.seqlen_q, c.seqlen_k, c.causal, c.window, c.attention_chunk)
    keys = torch.arange(c.seqlen_k, device=device)
    return (keys >= lo[:, None]) & (keys <= hi[:, None])


def feature_bias(c, cache=None):
    """Additive [1, 1, Sq, Sk] mask in the case's dtype (0 where a row sees a key, -inf elsewhere) for a case with a
    window or chunks, built once per case (cache: a dict shared by its backends) outside the timed calls, in blocks
    of rows (a 32k case's is 2 GiB). Unsupported where a row sees no key (SDPA would give NaN there)."""
    cache = {} if cache is None else cache
    if "bias" not in cache:
        bias = torch.empty(c.seqlen_q, c.seqlen_k, dtype=c.torch_dtype, device="cuda")
        empty_rows = 0
        for r0 in range(0, c.seqlen_q, 4096):
            keep = mask_keep(c, "cuda", torch.arange(r0, min(c.seqlen_q, r0 + 4096), device="cuda"))
            empty_rows += int((~keep.any(dim=1)).sum())
            bias[r0:r0 + keep.shape[0]] = torch.where(keep, 0.0, float("-inf")).to(c.torch_dtype)
        cache["bias"] = (bias.view(1, 1, c.seqlen_q, c.seqlen_k), empty_rows)
    bias, empty_rows = cache["bias"]
    if empty_rows:
        raise Unsupported(f"{empty_rows} query row(s) see no key: an explicit mask would give NaN there")
    return bias


def eager_backend(c, sinks=None, cache=None):
    """fn(q, k, v): gpt-oss's PyTorch reference attention with sinks (its model's torch sdpa): scores Q K^T *
    scale in the case's dtype, the mask added (feature_bias; none where nothing is hidden), each head's sink logit
    appended as one more column, softmax, the column dropped, times V; GQA by taking each K/V head's query heads
    as more rows. In slices of query rows, each slice's scores under EAGER_SLICE_BYTES. Forward only; cases with
    sinks only (those without have SDPA's masked kernels)."""
    if not c.sinks:
        raise NotApplicable(f"{EAGER_BACKEND}: the sinks' fallback; this case has none (SDPA's kernels take its mask)")
    sinks = sinks if sinks is not None else make_sinks(c, 0)
    hides = c.masked or (c.causal and c.seqlen_q > 1)
    bias = feature_bias(c, cache).view(c.seqlen_q, c.seqlen_k) if c.masked else (
        bottom_right_bias(c, "cuda").view(c.seqlen_q, c.seqlen_k) if hides else None)
    b, hq, hkv, sq, sk = c.batch, c.num_heads_q, c.num_heads_kv, c.seqlen_q, c.seqlen_k
    group, scale = hq // hkv, 1.0 / math.sqrt(c.head_dim)
    rows_per_slice = min(sq, max(1, EAGER_SLICE_BYTES // (2 * b * hq * (sk + 1))))
    sink_column = sinks.to(c.torch_dtype).view(1, hq, 1, 1)

    def run(q, k, v):
        qb, kb, vb = (to_bhsd(t, c.layout) for t in (q, k, v))
        out = torch.empty(b, hq, sq, c.head_dim_v, dtype=c.torch_dtype, device=q.device)
        for r0 in range(0, sq, rows_per_slice):
            rows = min(sq, r0 + rows_per_slice) - r0
            qg = qb[:, :, r0:r0 + rows].reshape(b, hkv, group * rows, c.head_dim)
            scores = (qg @ kb.transpose(-1, -2)).view(b, hq, rows, sk) * scale
            if bias is not None:
                scores = scores + bias[r0:r0 + rows]
            scores = torch.cat([scores, sink_column.expand(b, hq, rows, 1)], dim=-1)
            weights = torch.softmax(scores, dim=-1)[..., :-1]
            out[:, :, r0:r0 + rows] = (weights.reshape(b, hkv, group * rows, sk) @ vb).view(b, hq, rows, -1)
        return out
    run.how = (f"eager PyTorch (gpt-oss's reference): scores in {c.dtype}, "
               + ("an additive mask [Sq, Sk], " if bias is not None else "")
               + f"the sink as one more score column, softmax, the column dropped, @ V; slices of {rows_per_slice} "
               "query rows")
    return run


def extra_backend(target, c):
    module, _, attr = target.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    scale = getattr(c, "softmax_scale", None)  # MLA's; None elsewhere

    def run(q, k, v):
        return fn(to_bhsd(q, c.layout), to_bhsd(k, c.layout), to_bhsd(v, c.layout), c.causal, scale)
    run.how = f"{target}(q, k, v, causal={c.causal}, softmax_scale={scale}) on [B,H,S,D] tensors"
    return run


def reference_fp32(c, q, k, v):
    """Plain fp32 attention, for when the flash backend cannot run a case."""
    qb, kb, vb = (to_bhsd(t, c.layout).float() for t in (q, k, v))
    group = c.num_heads_q // c.num_heads_kv
    if group > 1:
        kb, vb = kb.repeat_interleave(group, dim=1), vb.repeat_interleave(group, dim=1)
    scores = (qb @ kb.transpose(-1, -2)) / math.sqrt(c.head_dim)  # head_dim of q and k, as SDPA
    if c.causal:
        keep = torch.ones(c.seqlen_q, c.seqlen_k, dtype=torch.bool, device=q.device)
        scores = scores.masked_fill(~keep.tril(c.seqlen_k - c.seqlen_q), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see no key give 0, as flashcore does
    return probs @ vb


# masked_reference's blocks: a block's fp32 scores (query heads of one K/V head x rows x keys) at most this.
REFERENCE_BLOCK_BYTES = 512 << 20


def masked_reference(c, q, k, v, sinks=None, dout=None):
    """fp32 attention with the case's masks (key_range: causal, window, chunks) and sinks, for issue 61's cases:
    computed one batch entry, K/V head and block of query rows at a time, over the keys those rows see, so that
    any size fits (REFERENCE_BLOCK_BYTES). Masked scores are a large negative number rather than -inf and the
    probabilities are multiplied by the mask, so that a row that sees no key gives 0 (and, with a sink, the sink
    takes its whole softmax), as flashcore.h defines it, without NaN. Returns out [B, Hq, Sq, Dv]; with dout (the
    case's layout) (out, [dq, dk, dv] as [B, H, S, D], plus dsinks [Hq] with sinks), by autograd through each
    block. Also the MLA cases' reference (their softmax_scale; v a view of k, read as the kernels read it)."""
    qb, kb, vb = (to_bhsd(t, c.layout) for t in (q, k, v))
    group = c.num_heads_q // c.num_heads_kv
    scale = getattr(c, "softmax_scale", None) or 1.0 / math.sqrt(c.head_dim)  # MLA's, else SDPA's default
    rows_per_block = max(1, REFERENCE_BLOCK_BYTES // (4 * group * c.seqlen_k))
    out = torch.zeros(c.batch, c.num_heads_q, c.seqlen_q, c.head_dim_v, dtype=torch.float32, device=q.device)
    grads = None
    if dout is not None:
        dout = to_bhsd(dout, c.layout)
        grads = [torch.zeros(t.shape, dtype=torch.float32, device=q.device) for t in (qb, kb, vb)]
        if sinks is not None:
            grads.append(torch.zeros(c.num_heads_q, dtype=torch.float32, device=q.device))
    for r0 in range(0, c.seqlen_q, rows_per_block):
        r1 = min(c.seqlen_q, r0 + rows_per_block)
        lo, hi = key_range(torch.arange(r0, r1, device=q.device), c.seqlen_q, c.seqlen_k, c.causal, c.window,
                           c.attention_chunk)
        k0, k1 = max(0, int(lo.min())), min(c.seqlen_k, int(hi.max()) + 1)
        if k1 <= k0:
            continue  # no row of the block sees a key: out 0, no gradient
        keys = torch.arange(k0, k1, device=q.device)
        keep = (keys >= lo[:, None]) & (keys <= hi[:, None])
        for b in range(c.batch):
            for h in range(c.num_heads_kv):
                heads = slice(h * group, (h + 1) * group)
                leaves = [qb[b, heads, r0:r1].float(), kb[b, h, k0:k1].float(), vb[b, h, k0:k1].float()]
                if sinks is not None:
                    leaves.append(sinks[heads].float())
                if grads is not None:
                    leaves = [x.detach().requires_grad_() for x in leaves]
                with torch.set_grad_enabled(grads is not None):
                    scores = torch.where(keep, (leaves[0] @ leaves[1].transpose(0, 1)) * scale, -1e30)
                    if sinks is not None:
                        scores = torch.cat([scores, leaves[3].view(group, 1, 1).expand(group, r1 - r0, 1)], dim=-1)
                    probs = torch.softmax(scores, dim=-1)[..., :k1 - k0] * keep
                    block = probs @ leaves[2]
                out[b, heads, r0:r1] = block.detach()
                if grads is not None:
                    block_grads = torch.autograd.grad(block, leaves, dout[b, heads, r0:r1].float())
                    grads[0][b, heads, r0:r1] += block_grads[0]
                    grads[1][b, h, k0:k1] += block_grads[1]
                    grads[2][b, h, k0:k1] += block_grads[2]
                    if sinks is not None:
                        grads[3][heads] += block_grads[3]
    return out if grads is None else (out, grads)


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


def clamp_count(x, lo, hi):
    if not x >= lo:  # also NaN
        return lo
    return hi if x >= hi else int(round(x))


def timed_calls(call, n, start):
    """Mean ms of n back-to-back calls on the current stream."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for i in range(n):
        call(start + i)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / n


def measure(call, nsets, budget_ms, max_graph_calls):
    """Median µs per call from CUDA-graph replays; call(i) runs on buffer set i % nsets."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as graph capture wants
        t_ms = timed_calls(call, 3, 0)
        t_ms = timed_calls(call, clamp_count(50.0 / t_ms, 3, 1000), 3)
    torch.cuda.current_stream().wait_stream(side)

    calls = min(max_graph_calls, clamp_count(math.ceil(5.0 / t_ms), 1, 1 << 20))
    calls = -(-calls // nsets) * nsets

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    replay_ms = timed_calls(lambda _: graph.replay(), 2, 0)  # warm-up, sizes the timed run
    replays = clamp_count(budget_ms / replay_ms, 5, 200)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    events[0].record()
    for i in range(replays):
        graph.replay()
        events[i + 1].record()
    events[-1].synchronize()
    per_call_us = [1000.0 * events[i].elapsed_time(events[i + 1]) / calls for i in range(replays)]
    del graph
    return statistics.median(per_call_us), calls, replays


def copy_bandwidth(args):
    """TB/s of a copy of COPY_BYTES by an elementwise kernel (bytes read plus bytes written, per second), timed as
    the kernels are (measure): the ceiling decode cases are judged against, measured in the same run (less memory
    where the GPU has less free)."""
    free, _ = torch.cuda.mem_get_info()
    nbytes = min(COPY_BYTES, free // 4) // 2 * 2
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    us, _, _ = measure(lambda i: torch.neg(src, out=dst), 1, args.budget_ms, args.graph_calls)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (us * 1e6)


def buffer_sets(c, args, set_factor=1, read_bytes=None):
    """Buffer sets to rotate over: enough to exceed twice the L2 (each call
    touching read_bytes of its set, by default all of it), as many as half
    the free memory holds (a set: c.set_bytes() times set_factor)."""
    if args.buffers:
        return args.buffers
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(props, "L2_cache_size", 0) or 60 * 10**6
    free, _ = torch.cuda.mem_get_info()
    set_bytes = set_factor * c.set_bytes()
    want = math.ceil(2 * l2 / (read_bytes or set_bytes))
    fit = int(0.5 * free // set_bytes)
    return max(1, min(want, fit, 64))


def make_inputs(c, nsets, seed):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    def shape(heads, seqlen, width):
        return (c.batch, heads, seqlen, width) if c.layout == "bhsd" else (c.batch, seqlen, heads, width)

    shapes = (shape(c.num_heads_q, c.seqlen_q, c.head_dim), shape(c.num_heads_kv, c.seqlen_k, c.head_dim),
              shape(c.num_heads_kv, c.seqlen_k, c.head_dim_v))
    if getattr(c, "mla", False):  # q and the latent cache k; v is k's first Dv columns, a view of the same storage
        sets = [tuple(torch.randn(shape, device="cuda", dtype=c.torch_dtype, generator=gen) for shape in shapes[:2])
                for _ in range(nsets)]
        return [(q, k, k[..., :c.head_dim_v]) for q, k in sets]
    return [tuple(torch.randn(shape, device="cuda", dtype=c.torch_dtype, generator=gen) for shape in shapes)
            for _ in range(nsets)]


def short_error(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def probe(fn, inputs):
    """One eager call on set 0: the output, or Unsupported with the reason."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn(*inputs[0])
            torch.cuda.synchronize()
            return out
        except Exception as e:  # any failure means: this backend cannot run this case
            raise Unsupported(short_error(e) + dispatch_reason(caught)) from e


def dispatch_reason(caught):
    """PyTorch's warnings that say why the pinned backend declined, if any."""
    texts = [str(w.message).split("(Triggered internally")[0].strip() for w in caught]
    texts = [t.splitlines()[0] for t in texts if t and "has been runtime disabled" not in t]
    return f" ({' '.join(texts)[:240]})" if texts else ""


def case_dict(c):
    """A case's fields for its result (JSON): an MLA case's with its softmax_scale; the others' without the mla
    field, as before it was added."""
    result = dataclasses.asdict(c)
    if c.mla:
        result["softmax_scale"] = c.softmax_scale
    else:
        del result["mla"]
    return result


def run_case(c, backends, fc, args, fa3=None, fa4=None):
    """Time every backend on one case; a dict ready for JSON."""
    fp8 = [n for n in backends if n in FP8_BACKENDS]
    # With fp8 backends, each set also has e4m3 copies of q, k and v (at most half its bytes), and an fp8 call
    # touches fewer bytes than a 16-bit one: enough sets that the fp8 calls also exceed twice the L2. A window or
    # chunks: a call reads q, out and the keys some row sees (a windowed decode step, its window's).
    nsets = (buffer_sets(c, args, 1.5, c.fp8_set_bytes()) if fp8 else
             buffer_sets(c, args, read_bytes=c.read_bytes()) if c.masked else buffer_sets(c, args))
    inputs = make_inputs(c, nsets, args.seed)
    result = case_dict(c)
    result.update(flops=attention_flops(c), decode=c.decode, kv_bytes=c.kv_bytes(), buffer_sets=nsets, backends={},
                  reference=None)
    # Issue 61's features: one sinks tensor per case, shared by every backend; one explicit mask, shared by SDPA's
    # backends and eager; the fp32 reference computed in blocks (any size).
    sinks = make_sinks(c, args.seed) if c.sinks else None
    masks = {}

    reference = nosinks_reference = None
    if not args.no_check and (c.features or c.mla):  # MLA too: (576, 512) with v a view of k, any size
        reference = masked_reference(c, *inputs[0], sinks)
        result["reference"] = "fp32"
        if c.sinks and NOSINKS_BACKEND in backends:  # the twin's own: the same case without sinks
            nosinks_reference = masked_reference(c, *inputs[0])
    elif not args.no_check:
        for name in REFERENCES:
            try:
                reference = probe(sdpa_backend(name, c), inputs).float()
                result["reference"] = name
                break
            except Unsupported:
                continue
        if reference is None and c.batch * c.num_heads_q * c.seqlen_q * c.seqlen_k * 4 <= MAX_FP32_REFERENCE_BYTES:
            reference = reference_fp32(c, *inputs[0])
            result["reference"] = "fp32"

    # The fp8 backends' e4m3 inputs: every set cast once, here, outside the timed calls; their outputs are checked
    # against the reference backend's on the dequantized e4m3 values of set 0 (the cast's own error left out).
    fp8_cache, fp8_reference = {}, None
    if fp8:
        result["fp8_reference"] = None
        for q, k, v in inputs:
            fp8_set(fp8_cache, c, q, k, v)
        if result["reference"] is not None:
            dq_inputs = [dequantized(fp8_set(fp8_cache, c, *inputs[0]), c.torch_dtype, c.mla and c.head_dim_v)]
            try:
                if c.mla:
                    fp8_reference = masked_reference(c, *dq_inputs[0])
                elif result["reference"] == "fp32":
                    fp8_reference = reference_fp32(c, *dq_inputs[0])
                else:
                    fp8_reference = probe(sdpa_backend(result["reference"], c), dq_inputs).float()
                result["fp8_reference"] = f"{result['reference']} on the dequantized e4m3 inputs"
            except Unsupported:
                pass
            del dq_inputs

    for name in backends:
        entry = {"us": None, "tflops": None, "tbps": None, "max_abs_diff": None, "check_ok": None, "error": None,
                 "not_applicable": False, "how": None}
        result["backends"][name] = entry
        try:
            if c.features and name in (FP8_KV_BACKEND,) + FP8_BACKENDS + tuple(dict(args.extras)):
                raise NotApplicable(f"{name}: not wired for windows, chunks or sinks (issue 61's cases)")
            if name == "flashcore" or name in OVERHEAD_BACKENDS:
                if fc is None:
                    raise Unsupported("flashcore package not loaded")
                fn = flashcore_backend(fc, c, getattr(args, "fc_num_splits", None), sinks,
                                       None if name == "flashcore" else name)
            elif name == FA4_BACKEND:
                fn = fa4_backend(fa4, c, sinks)
            elif name == SEQLENS_BACKEND:
                if fc is None:
                    raise Unsupported("flashcore package not loaded")
                fn = flashcore_seqlens_backend(fc, c, getattr(args, "fc_num_splits", None))
            elif name == EAGER_BACKEND:
                fn = eager_backend(c, sinks, masks)
            elif name == FP8_KV_BACKEND:
                if fc is None:
                    raise Unsupported("flashcore package not loaded")
                fn = flashcore_fp8_kv_backend(fc, c)
                probe(fn, inputs[:1])  # quantizes set 0 outside the timed calls
                for i in range(1, nsets):
                    fn(*inputs[i])
            elif name == FP8_FC_BACKEND:
                if fc is None:
                    raise Unsupported("flashcore package not loaded")
                fn = flashcore_fp8_backend(fc, c, fp8_cache, getattr(args, "fc_num_splits", None))
            elif name == FP8_FA3_BACKEND:
                fn = fa3_fp8_backend(fa3, c, fp8_cache)
            elif name == "fa3":
                fn = fa3_backend(fa3, c)
            elif name in SDPA_BACKENDS:
                fn = sdpa_backend(name, c, masks)
            else:
                fn = extra_backend(dict(args.extras)[name], c)
            entry["how"] = getattr(fn, "how", None)
            out = probe(fn, inputs)
            if name in FP8_BACKENDS and out.dtype != torch.bfloat16:
                raise Unsupported(f"{name}: output of dtype {out.dtype}; e4m3 queries give bf16 out (issue 36)")
            expected = (fp8_reference if name in FP8_BACKENDS else nosinks_reference if name == NOSINKS_BACKEND
                        else reference)
            if expected is not None:
                entry["max_abs_diff"] = (out.float() - expected).abs().max().item()
                tolerance = (FP8_TOLERANCE if name in FP8_BACKENDS else FP8_KV_TOLERANCE if name == FP8_KV_BACKEND
                             else TOLERANCE[c.dtype])
                entry["check_ok"] = bool(entry["max_abs_diff"] <= tolerance)  # False for NaN too
            del out
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                us, calls, replays = measure(lambda i: fn(*inputs[i % nsets]), nsets, args.budget_ms,
                                             args.graph_calls)
            entry.update(us=us, tflops=result["flops"] / (us * 1e6), calls_per_graph=calls, replays=replays)
            if c.decode:
                kv_bytes = result["kv_bytes"] // 2 if name in ONE_BYTE_KV_BACKENDS else result["kv_bytes"]  # e4m3
                entry["tbps"] = kv_bytes / (us * 1e6)  # bytes / (us * 1e-6 s) / 1e12
        except Exception as e:  # one backend failing must not stop the others
            entry["error"] = str(e) if isinstance(e, Unsupported) else short_error(e)
            entry["not_applicable"] = isinstance(e, NotApplicable)
            torch.cuda.synchronize()
    del inputs, reference, nosinks_reference, fp8_cache, fp8_reference, sinks, masks
    torch.cuda.empty_cache()
    summarize(result)
    return result


# ---------------------------------------------------------------------------
# --backward: each backend's backward pass alone; --train: the forward and the backward in one call
# ---------------------------------------------------------------------------

# A buffer set for the backward holds dout and the forward's out and lse beside q, k and v, and each call
# writes dq, dk and dv (flashcore also its fp32 dQ workspace): about twice a forward set. A training step
# writes out and lse instead of reading them: the same.
BACKWARD_SET_FACTOR = 2
# Autograd nodes of views between an attention output and the attention's own node: their backward is run
# once per forward, to give the attention node the gradient of its own output (outside the timed calls with
# --backward; inside them with --train, where the transposes found here launch no kernel).
VIEW_NODE = re.compile(r"^(Transpose|View|UnsafeView|Permute|Alias|Expand|Reshape|Select)Backward")
# Names of the nodes that are an attention's backward (PyTorch's SDPA kernels' and FlashAttention's).
ATTENTION_NODE = re.compile(r"Attention|Attn")


def mode_flops(c, mode):
    """The flops of one timed call: the forward's, the backward pass's or a training step's."""
    return FLOPS_PER_FORWARD_FLOP[mode] * attention_flops(c)


def make_douts(c, nsets, seed):
    """The gradient of out for each buffer set, in the case's layout."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    shape = ((c.batch, c.num_heads_q, c.seqlen_q, c.head_dim_v) if c.layout == "bhsd"
             else (c.batch, c.seqlen_q, c.num_heads_q, c.head_dim_v))
    return [torch.randn(shape, device="cuda", dtype=c.torch_dtype, generator=gen) for _ in range(nsets)]


def attention_node(out, dout, pattern=ATTENTION_NODE):
    """(node, grad): the autograd node of the attention under out and the
    gradient of its own output, dout carried back through the view nodes on
    the way (once, outside the timed calls). Raises Unsupported where the
    node found is no attention's (a forward-only kernel's NotImplemented)."""
    node, grad = out.grad_fn, dout
    while node is not None and VIEW_NODE.match(node.name()):
        result = node(grad)
        grad = result[0] if isinstance(result, (tuple, list)) else result
        node = node.next_functions[0][0]
    if node is None or not pattern.search(node.name()):
        raise Unsupported("no backward: the output's autograd node is %s" % (None if node is None else node.name()))
    return node, grad


def node_arguments(node, grad):
    """The arguments to call an attention node with: grad, and None for each of its other outputs where the node is
    a Python autograd.Function's (FlashAttention 4's and flashcore's return (out, lse) and take a gradient for
    each); PyTorch's own nodes take grad alone."""
    forward_cls = getattr(node, "_forward_cls", None)
    if forward_cls is None:
        return (grad,)
    params = list(inspect.signature(forward_cls.backward).parameters.values())[1:]  # after ctx
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return (grad,)
    return (grad,) + (None,) * (len(params) - 1)


def leaf_gradients(node, arguments, leaves):
    """The gradients of leaves (q, k, v and sinks as the forward got them, through views or not) from one call of
    the attention node: each of the node's outputs goes back through the view nodes between it and its leaf (a
    transpose, a reshape of the chunks: no kernel), so it comes in its leaf's shape. None for a leaf the node has
    no edge to."""
    if callable(node):  # PyTorch's own (C++) nodes: one output per edge
        outputs = node(*arguments)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        pairs = zip(node.next_functions, outputs)
    else:  # a Python autograd.Function's: apply() gives one output per forward input; those that require grad,
        # in order, are the edges that have a node (the others' are (None, 0); non-tensor inputs have none)
        outputs = node.apply(*arguments)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        pairs = zip([e for e in node.next_functions if e[0] is not None],
                    [g for g, needed in zip(outputs, node.needs_input_grad) if needed])
    found = {}
    for (edge, _), grad in pairs:
        while edge is not None and grad is not None and not hasattr(edge, "variable"):
            if not VIEW_NODE.match(edge.name()):
                edge = None
                break
            result = edge(grad)
            grad = result[0] if isinstance(result, (tuple, list)) else result
            edge = edge.next_functions[0][0]
        if edge is not None and grad is not None:
            found[id(edge.variable)] = grad
    return [found.get(id(leaf)) for leaf in leaves]


def autograd_runner(name, c, fc, fa4, inputs, douts, sinks):
    """backward_runner for issue 61's cases (any backend) and FlashAttention 4 (any case): the forward on leaves
    that require grad (q, k, v per buffer set, and the case's sinks), its attention node found under out
    (attention_node) and called on dout directly, without autograd's engine, as for SDPA's backends; the gradients
    come back to their leaves through the views between (leaf_gradients). call(i) returns (dq, dk, dv) as
    [B, H, S, D] views, and dsinks for a case with sinks."""
    sink_leaf = None
    if c.sinks and name != NOSINKS_BACKEND:
        sink_leaf = (sinks if sinks is not None else make_sinks(c, 0)).detach().clone().requires_grad_()
    if name.startswith("flashcore"):
        if fc is None:
            raise Unsupported("flashcore package not loaded")
        twin = name if name in OVERHEAD_BACKENDS else None
        forward_fn = flashcore_backend(fc, c, None, sink_leaf, twin, deterministic=name == "flashcore-det")
        pattern = re.compile(r".")  # whichever node the binding's autograd formula is
    elif name == FA4_BACKEND:
        forward_fn = fa4_backend(fa4, c, sink_leaf)
        pattern = ATTENTION_NODE
    elif name == "fa3":
        raise NotApplicable("fa3: the fa3-fwd wheel computes the forward only")
    elif name in SDPA_BACKENDS:
        forward_fn = sdpa_backend(name, c)
        pattern = ATTENTION_NODE
    else:
        raise NotApplicable(f"{name}: no backward here")
    leaves = [[x.detach().requires_grad_() for x in qkv] for qkv in inputs]

    def forward(i):
        """(node, arguments, out): the forward on set i recorded by autograd, its attention node and the arguments
        to call it with; out goes along so that the forward's whole graph lives until its node has run."""
        with torch.enable_grad():
            out = forward_fn(*leaves[i])
        node, grad = attention_node(out, to_bhsd(douts[i], c.layout), pattern)
        return node, node_arguments(node, grad), out

    def backward(i, node, arguments, _out):
        wanted = leaves[i] + ([sink_leaf] if sink_leaf is not None else [])
        grads = leaf_gradients(node, arguments, wanted)
        missing = [what for what, g in zip(("q", "k", "v", "sinks"), grads) if g is None]
        if missing:
            raise Unsupported(f"{name}: no gradient for {', '.join(missing)} from {node.name()}")
        return tuple(to_bhsd(g, c.layout) for g in grads[:3]) + tuple(grads[3:])
    first = forward(0)
    how = (f"{forward_fn.how}, on leaves that require grad" + (" (sinks too)" if sink_leaf is not None else "")
           + f"; its autograd node {first[0].name()} called on dout")
    return forward, backward, first, how


def as_bhsd_gradient(g, like_bhsd):
    """A gradient as a [B, H, S, D] view: node gradients come in the shape of
    the kernel's own inputs, [B, H, S, D] or [B, S, H, D] views."""
    if tuple(g.shape) == tuple(like_bhsd.shape):
        return g
    return g.transpose(1, 2)


def backward_runner(name, c, fc, fa3, inputs, douts, train=False, sinks=None, fa4=None):
    """call(i): the backend's backward pass on buffer set i, returning
    (dq, dk, dv) as [B, H, S, D] views (and dsinks where the case has
    sinks). The forward that gives it out (and the lse) runs here, once per
    set, untimed; with train, in call(i), before the backward (a training
    step). call.how says how. Issue 61's cases and FlashAttention 4 take
    autograd_runner's route."""
    if getattr(c, "features", False) or name in (FA4_BACKEND,) + OVERHEAD_BACKENDS:
        if name in OVERHEAD_BACKENDS:
            twin_check(c, name)
        forward, backward, first, how = autograd_runner(name, c, fc, fa4, inputs, douts, sinks)
    elif name.startswith("flashcore"):
        if fc is None:
            raise Unsupported("flashcore package not loaded")
        deterministic = name == "flashcore-det"
        fc.register_torch_ops()

        def forward(i):
            q, k, v = inputs[i]
            return fc.attention(q, k, v, causal=c.causal, layout=c.layout, return_lse=True)

        def backward(i, out, lse):
            q, k, v = inputs[i]
            grads = torch.ops.flashcore.backward(douts[i], q, k, v, out, lse, None, None, None, None, None, c.layout,
                                                 c.causal, None, None, 0.0, deterministic)
            return tuple(to_bhsd(g, c.layout) for g in grads[:3])  # dq, dk, dv (then dsinks: none here)
        how = (f"torch.ops.flashcore.backward(layout={c.layout!r}, deterministic={deterministic}) on the out and "
               "lse of flashcore.attention(return_lse=True); dq, dk, dv and the dQ workspace from torch's allocator")
        first = forward(0)
    else:
        forward_fn = fa3_backend(fa3, c) if name == "fa3" else sdpa_backend(name, c)
        leaves = [[x.detach().requires_grad_() for x in qkv] for qkv in inputs]
        likes = [[to_bhsd(x, c.layout) for x in qkv] for qkv in inputs]

        def forward(i):
            """(node, grad, out): the forward on set i recorded by autograd, its attention node and the gradient
            of that node's output (attention_node); out goes along so that the forward's whole graph lives until
            its node has run."""
            with torch.enable_grad():
                out = forward_fn(*leaves[i])
            return attention_node(out, to_bhsd(douts[i], c.layout)) + (out,)

        def backward(i, node, grad, _out):
            grads = node(grad)
            return tuple(as_bhsd_gradient(g, x) for g, x in zip(grads[:3], likes[i]))
        try:  # set 0's forward also says whether there is a backward to time (fa3-fwd's output has none)
            first = forward(0)
        except Unsupported as e:
            raise (NotApplicable if name == "fa3" else Unsupported)(f"{name}: {e}") from None
        how = f"{forward_fn.how}; its autograd node {first[0].name()} called on dout"

    if train:
        def call(i):
            return backward(i, *forward(i))
        call.how = "the forward, then " + how + ", both in the timed call"
    else:
        saved = [first] + [forward(i) for i in range(1, len(inputs))]

        def call(i):
            return backward(i, *saved[i])
        call.how = how
    return call


def reference_gradients(c, fc, fa3, inputs, douts, sinks=None):
    """(name, [dq, dk, dv] in fp32) of buffer set 0: the first of REFERENCES
    that runs the case, else autograd through reference_fp32 when its score
    matrix fits; (None, None) otherwise. Issue 61's cases: masked_reference's
    (fp32, in blocks, any size), dsinks added where the case has sinks."""
    if getattr(c, "features", False):
        return "fp32", masked_reference(c, *inputs[0], sinks, douts[0])[1]
    for name in REFERENCES:
        try:
            with torch.no_grad():
                try:
                    runner = backward_runner(name, c, fc, fa3, inputs[:1], douts[:1])
                except Exception as e:  # its forward, run here, cannot take the case (SDPA's past head dim 256)
                    raise Unsupported(short_error(e)) from e
                grads = probe(runner, [(0,)])
            return name, [g.float() for g in grads]
        except Unsupported:
            continue
    if c.batch * c.num_heads_q * c.seqlen_q * c.seqlen_k * 4 > MAX_FP32_REFERENCE_BYTES:
        return None, None
    leaves = [x.detach().float().requires_grad_() for x in inputs[0]]
    with torch.enable_grad():
        out = reference_fp32(c, *leaves)
        grads = torch.autograd.grad(out, leaves, to_bhsd(douts[0], c.layout).float())
    return "fp32", [to_bhsd(g, c.layout) for g in grads]


def run_backward_case(c, backends, fc, args, fa3=None, fa4=None):
    """--backward (args.mode "backward"): time every backend's backward pass on one case; --train ("train"): its
    training step. A dict ready for JSON."""
    nsets = buffer_sets(c, args, BACKWARD_SET_FACTOR)
    inputs = make_inputs(c, nsets, args.seed)
    douts = make_douts(c, nsets, args.seed + 1)
    sinks = make_sinks(c, args.seed) if c.sinks else None
    result = case_dict(c)
    result.update(flops=mode_flops(c, args.mode), forward_flops=attention_flops(c), decode=False,
                  kv_bytes=c.kv_bytes(), buffer_sets=nsets, backends={}, reference=None)
    reference = nosinks_reference = None
    if not args.no_check:
        result["reference"], reference = reference_gradients(c, fc, fa3, inputs, douts, sinks)
        if c.sinks and NOSINKS_BACKEND in backends:  # the twin's own: the same case without sinks
            nosinks_reference = reference_gradients(dataclasses.replace(c, sinks=False), fc, fa3, inputs, douts)[1]

    for name in backends:
        entry = {"us": None, "tflops": None, "tbps": None, "max_abs_diff": None, "max_rel_diff": None,
                 "check_ok": None, "error": None, "not_applicable": False, "how": None}
        result["backends"][name] = entry
        try:
            call = backward_runner(name, c, fc, fa3, inputs, douts, args.mode == "train", sinks, fa4)
            entry["how"] = call.how
            with torch.no_grad():
                grads = probe(call, [(0,)])
                expected = nosinks_reference if name == NOSINKS_BACKEND else reference
                if expected is not None:
                    if [tuple(g.shape) for g in grads] != [tuple(r.shape) for r in expected]:
                        raise Unsupported(f"{name}: gradients of shapes {[list(g.shape) for g in grads]}")
                    diffs = [(g.float() - r).abs().max().item() for g, r in zip(grads, expected)]
                    scale = max(r.abs().max().item() for r in expected[:3]) or 1.0
                    entry["max_abs_diff"] = max(diffs[:3])
                    entry["max_rel_diff"] = entry["max_abs_diff"] / scale
                    if len(expected) > 3:  # dsinks, against its own largest value (a sum over all of a head's rows)
                        entry["dsinks_rel_diff"] = diffs[3] / (expected[3].abs().max().item() or 1.0)
                        entry["max_rel_diff"] = max(entry["max_rel_diff"], entry["dsinks_rel_diff"])
                    entry["check_ok"] = bool(entry["max_rel_diff"] <= BACKWARD_TOLERANCE[c.dtype])  # NaN: False
                del grads
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    us, calls, replays = measure(lambda i: call(i % nsets), nsets, args.budget_ms, args.graph_calls)
            entry.update(us=us, tflops=result["flops"] / (us * 1e6), calls_per_graph=calls, replays=replays)
        except Exception as e:  # one backend failing must not stop the others
            entry["error"] = str(e) if isinstance(e, Unsupported) else short_error(e)
            entry["not_applicable"] = isinstance(e, NotApplicable)
            torch.cuda.synchronize()
        finally:
            call = None
            torch.cuda.empty_cache()
    del inputs, douts, reference, nosinks_reference, sinks
    torch.cuda.empty_cache()
    summarize(result)
    fc_us, det_us = (result["backends"].get(n, {}).get("us") for n in ("flashcore", "flashcore-det"))
    result["deterministic_cost"] = det_us / fc_us - 1.0 if fc_us and det_us else None
    return result


def overheads(result):
    """Issue 61's overhead ratios of one case, from flashcore's time and its twins' (None without both):
    sinks_cost = flashcore's time / flashcore-nosinks' - 1 (target: at most SINKS_COST_TARGET), and
    chunk_per_key = (flashcore's time / its visible pairs) / (flashcore-causal's time / its visible pairs), the
    cost per visited key of chunked attention over plain causal (target: at most CHUNK_PER_KEY_TARGET)."""
    us = {n: result["backends"].get(n, {}).get("us") for n in ("flashcore",) + OVERHEAD_BACKENDS}
    if NOSINKS_BACKEND in result["backends"]:
        cost = us["flashcore"] / us[NOSINKS_BACKEND] - 1.0 if us["flashcore"] and us[NOSINKS_BACKEND] else None
        result["sinks_cost"] = cost
        result["sinks_cost_target_met"] = None if cost is None else bool(cost <= SINKS_COST_TARGET)
    if CAUSAL_BACKEND in result["backends"]:
        ratio = None
        if us["flashcore"] and us[CAUSAL_BACKEND]:
            chunk, window = result["attention_chunk"], result.get("window")
            window = None if window is None else tuple(window)
            pairs = visible_pairs(result["seqlen_q"], result["seqlen_k"], result["causal"], window, chunk)
            twin_pairs = (result["seqlen_q"] // chunk) * visible_pairs(chunk, chunk, result["causal"], window)
            ratio = (us["flashcore"] / pairs) / (us[CAUSAL_BACKEND] / twin_pairs)
        result["chunk_per_key"] = ratio
        result["chunk_target_met"] = None if ratio is None else bool(ratio <= CHUNK_PER_KEY_TARGET)


def summarize(result):
    """best_other/ratio_to_best (every other backend), best_peer/ratio_to_best_peer (FA3, cuDNN, flash),
    ratio_to_flash (PyTorch's flash backend, the backward targets' anchor), check_ok."""
    others = {n: e["tflops"] for n, e in result["backends"].items() if e["tflops"]}
    fc_tflops = others.pop("flashcore", None)
    others.pop("flashcore-det", None)  # flashcore's own deterministic mode is no other backend
    for name in OVERHEAD_BACKENDS:  # nor flashcore without a feature (issue 61's overheads, below)
        others.pop(name, None)
    overheads(result)
    fp8_tflops = others.pop(FP8_KV_BACKEND, None)  # nor flashcore on a quantized cache
    seqlens_tflops = others.pop(SEQLENS_BACKEND, None)  # nor its cache-length form (issue 64)
    if SEQLENS_BACKEND in result["backends"]:
        ratio = fc_tflops / seqlens_tflops if fc_tflops and seqlens_tflops else None
        result["seqlens_ratio"] = ratio  # its time over the dense call's
        result["seqlens_target_met"] = None if ratio is None else bool(ratio <= SEQLENS_TARGET)
    # Time on the e4m3 cache over time on the 16-bit one (issue 36: at most 0.55 for decode).
    result["fp8kv_time_ratio"] = fc_tflops / fp8_tflops if fc_tflops and fp8_tflops else None
    # The fp8 prefill backends are judged against each other only (issue 36), never as the 16-bit ones' peers.
    fc8, fa8 = (others.pop(n, None) for n in FP8_BACKENDS)
    if any(n in result["backends"] for n in FP8_BACKENDS) and not result.get("mla"):  # MLA: decode, no fp8 target
        result["fp8_ratio"] = fc8 / fa8 if fc8 and fa8 else None
        result["fp8_target_met"] = None if result["fp8_ratio"] is None else bool(result["fp8_ratio"] >= FP8_TARGET)
    result["ratio_to_flash"] = fc_tflops / others["flash"] if fc_tflops and others.get("flash") else None
    peers = {n: t for n, t in others.items() if n in PEERS}
    result["best_other"] = max(others, key=others.get) if others else None
    result["ratio_to_best"] = fc_tflops / others[result["best_other"]] if fc_tflops and others else None
    result["best_peer"] = max(peers, key=peers.get) if peers else None
    result["ratio_to_best_peer"] = fc_tflops / peers[result["best_peer"]] if fc_tflops and peers else None
    result["check_ok"] = result["backends"].get("flashcore", {}).get("check_ok")
    return result


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def fmt_cell(entry, width, decode):
    """us and TFLOP/s, or for decode cases us and the K/V read bandwidth in TB/s."""
    if entry["tflops"] is None:
        return "n/a".center(width)
    rate = f"{entry['tbps']:6.2f}" if decode else f"{entry['tflops']:6.1f}"
    return f"{entry['us']:9.1f} {rate}".rjust(width)


# The twins' overhead columns, shown where that backend is asked for: (backend, title, the target under it, the
# result's value and target-met keys, the value's format, the target as the notes say it). Issue 61's sinks cost
# and chunk/key, issue 64's seqlens/dense.
OVERHEAD_COLUMNS = (
    (NOSINKS_BACKEND, "sinks cost", f"<=+{100 * SINKS_COST_TARGET:g}%", "sinks_cost", "sinks_cost_target_met",
     lambda x: f"{100 * x:+.1f}%",
     f"issue 61 target (flashcore's time / {NOSINKS_BACKEND}'s - 1 <= +{100 * SINKS_COST_TARGET:g}%)"),
    (CAUSAL_BACKEND, "chunk/key", f"<={CHUNK_PER_KEY_TARGET:g}x", "chunk_per_key", "chunk_target_met",
     lambda x: f"{x:.3f}x",
     "issue 61 target (chunked attention's time per visited key / plain causal's "
     f"({CAUSAL_BACKEND}) <= {CHUNK_PER_KEY_TARGET:g})"),
    (SEQLENS_BACKEND, "seqlens", f"<={SEQLENS_TARGET:g}x", "seqlens_ratio", "seqlens_target_met",
     lambda x: f"{x:.3f}x",
     f"issue 64 target (the cache-length form's time / the dense call's ({SEQLENS_BACKEND}) <= {SEQLENS_TARGET:g})"),
)


def overhead_header(backends):
    """The overhead columns' two header parts (names, targets) for the backends asked for."""
    columns = [(title, target) for name, title, target, *_ in OVERHEAD_COLUMNS if name in backends]
    return ("".join(f"{title:>10} | " for title, _ in columns), "".join(f"{target:>10} | " for _, target in columns))


def overhead_cells(r, backends):
    """A row's overhead columns: sinks cost (+x.x%), chunk/key and seqlens (x.xxx x), '!' past the target, n/a
    without both times."""
    cells = ""
    for name, _, _, value_key, met_key, show, _ in OVERHEAD_COLUMNS:
        if name not in backends:
            continue
        value, met = r.get(value_key), r.get(met_key)
        text = "n/a" if value is None else show(value)
        cells += f"{text + ('' if value is None or met else ' !'):>10} | "
    return cells


def print_header(backends, label_width, cell, decode=False, backward=False, fp8=False):
    """The table's two header lines; backward gives the gradient modes' columns (--backward, --train), fp8 adds
    the fp8 prefill columns (fp8 fc/fa3, target, fc8 diff) after fc/peer, issue 61's twins their overhead columns
    (sinks cost, chunk/key) before the check."""
    names = " | ".join(n.center(cell) for n in backends)
    unit = "us      TB/s" if decode else "us   TFLOP/s"
    units = " | ".join(unit.rjust(cell) for _ in backends)
    over_names, over_units = overhead_header(backends)
    if backward:
        print(f"{'case':<{label_width}} | {names} | {'fc/flash':>8} | {'fc/peer':>12} | {'det cost':>8} | "
              f"{over_names}{'reldiff':>9} | ref")
        print(f"{'':<{label_width}} | {units} | {'':>8} | {'(best peer)':>12} | {'':>8} | {over_units}"
              f"{'vs ref':>9} |")
        return
    fp8_names = f"{'fp8 fc/fa3':>10} | {'target':>6} | {'fc8 diff':>9} | " if fp8 else ""
    fp8_units = f"{'':>10} | {f'>={FP8_TARGET:g}':>6} | {'vs ref':>9} | " if fp8 else ""
    copy_name, copy_unit = (f"{'fc/copy':>8} | ", f"{'':>8} | ") if decode else ("", "")
    print(f"{'case':<{label_width}} | {names} | {'fc/best':>8} | {'fc/peer':>12} | {copy_name}{fp8_names}"
          f"{over_names}{'maxdiff':>9} | ref")
    print(f"{'':<{label_width}} | {units} | {'':>8} | {'(best peer)':>12} | {copy_unit}{fp8_units}{over_units}"
          f"{'vs ref':>9} |")


def fp8_cells(r):
    """The fp8 prefill columns of a row: flashcore-fp8's TFLOP/s over fa3-fp8's, whether that meets FP8_TARGET,
    flashcore-fp8's max abs diff from the reference on the dequantized inputs ('!' beyond FP8_TOLERANCE)."""
    ratio = r.get("fp8_ratio")
    met = r.get("fp8_target_met")
    entry = r["backends"].get(FP8_FC_BACKEND, {})
    diff = entry.get("max_abs_diff")
    check = "n/a" if diff is None else f"{diff:.2e}" + ("" if entry.get("check_ok") else " !")
    return (f"{f'{ratio:.3f}x' if ratio else 'n/a':>10} | {'n/a' if met is None else 'met' if met else 'missed':>6} | "
            f"{check:>9} | ")


def print_row(r, backends, label_width, cell, backward=False, fp8=False):
    cells = " | ".join(fmt_cell(r["backends"][n], cell, r["decode"]) for n in backends)
    first = r["ratio_to_flash"] if backward else r["ratio_to_best"]
    ratio = f"{first:.2f}x" if first else "n/a"
    peer = f"{r['ratio_to_best_peer']:.2f}x {r['best_peer']}" if r["ratio_to_best_peer"] else "n/a"
    diff = r["backends"].get("flashcore", {}).get("max_rel_diff" if backward else "max_abs_diff")
    check = "n/a" if diff is None else f"{diff:.2e}" + ("" if r["check_ok"] else " !")
    det = ""
    if backward:
        cost = r.get("deterministic_cost")
        det = (f"{100 * cost:+7.1f}%" if cost is not None else "n/a".rjust(8)) + " | "
    fp8_part = fp8_cells(r) if fp8 else ""
    copy_part = ""
    if r["decode"] and not backward:
        fraction = r.get("fc_copy_fraction")
        copy_part = f"{'n/a' if fraction is None else f'{100 * fraction:.0f}%':>8} | "
    print(f"{r['label']:<{label_width}} | {cells} | {ratio:>8} | {peer:>12} | {det}{copy_part}{fp8_part}"
          f"{overhead_cells(r, backends)}{check:>9} | {r['reference'] or '-'}", flush=True)


def print_notes(results, backends, backward=False):
    """How each backend was called and its reasons for n/a, each once (n/a: digits ignored); outputs off the
    reference."""
    seen = set()
    for kind, field in (("how", "how"), ("n/a", "error")):
        for n in backends:
            for r in results:
                text = r["backends"][n][field]
                key = (kind, n, text if kind == "how" else re.sub(r"\d+", "#", text or ""))
                if text and key not in seen:
                    seen.add(key)
                    print(f"  {kind:<4} {n}: {text}  [first: {r['label']}]")
    for r in results:
        if r.get("fp8kv_time_ratio"):
            e = r["backends"][FP8_KV_BACKEND]
            rate = f", {e['tbps']:.2f} TB/s of e4m3 K/V" if e.get("tbps") else ""
            print(f"  fp8kv/16-bit time {r['fp8kv_time_ratio']:.3f}{rate}: {r['label']}")
    fp8_rows = [r for r in results if "fp8_ratio" in r]
    if fp8_rows:
        judged = [r for r in fp8_rows if r["fp8_ratio"] is not None]
        met = [r for r in judged if r["fp8_target_met"]]
        worst = min(judged, key=lambda r: r["fp8_ratio"]) if judged else None
        print(f"  fp8 prefill target ({FP8_FC_BACKEND} TFLOP/s / {FP8_FA3_BACKEND}'s >= {FP8_TARGET}): met in "
              f"{len(met)} of {len(judged)} case(s) with both"
              + (f"; lowest {worst['fp8_ratio']:.3f}x: {worst['label']}" if worst else "")
              + (f"; {len(fp8_rows) - len(judged)} case(s) without both" if len(judged) < len(fp8_rows) else ""))
    for name, _, _, key, met_key, show, target in OVERHEAD_COLUMNS:
        rows = [r for r in results if key in r]
        judged = [r for r in rows if r[key] is not None]
        if name in backends and judged:
            worst = max(judged, key=lambda r: r[key])
            print(f"  {target}: met in {sum(bool(r[met_key]) for r in judged)} of {len(judged)} "
                  f"case(s); highest {show(worst[key])}: {worst['label']}")
    for r in results:
        for n in backends:
            e = r["backends"][n]
            if n == "flashcore" or e["check_ok"] is not False:
                continue
            if backward:
                print(f"  !    {n}: gradients differ from the {r['reference']} reference's by {e['max_rel_diff']:.2e} "
                      f"of their largest value (tolerance {BACKWARD_TOLERANCE[r['dtype']]:.0e}): {r['label']}")
            elif n in FP8_BACKENDS:
                print(f"  !    {n}: output differs from the {r['reference']} reference on the dequantized e4m3 "
                      f"inputs by {e['max_abs_diff']:.2e} (tolerance {FP8_TOLERANCE:.0e}): {r['label']}")
            else:
                tolerance = FP8_KV_TOLERANCE if n == FP8_KV_BACKEND else TOLERANCE[r["dtype"]]
                print(f"  !    {n}: output differs from the {r['reference']} reference by {e['max_abs_diff']:.2e} "
                      f"(tolerance {tolerance:.0e}): {r['label']}")


def write_plot(results, backends, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"compare.py: matplotlib not available, no plot written to {path}", file=sys.stderr)
        return
    decode = [r for r in results if r["decode"]]
    results = [r for r in results if not r["decode"]]
    if decode:
        print(f"compare.py: the plot leaves out the {len(decode)} decode case(s) (judged in TB/s; see the table or "
              "--json)", file=sys.stderr)
    models = [r for r in results if r.get("window") is not None or r.get("attention_chunk") or r.get("sinks")]
    results = [r for r in results if r not in models]
    if models:
        print(f"compare.py: the plot leaves out the {len(models)} case(s) with a window, chunks or sinks (issue 61; "
              "see the table or --json)", file=sys.stderr)
    if not results:
        print(f"compare.py: no prefill case to plot, no plot written to {path}", file=sys.stderr)
        return
    head_dims = sorted({(r["head_dim"], r["head_dim_v"]) for r in results})
    variants = sorted({(r["dtype"], r["causal"]) for r in results})
    fig, axes = plt.subplots(len(variants), len(head_dims), squeeze=False,
                             figsize=(6.0 * len(head_dims), 3.8 * len(variants)))
    for row, (dtype, causal) in enumerate(variants):
        for col, hd in enumerate(head_dims):
            ax = axes[row][col]
            rows = sorted((r for r in results if (r["head_dim"], r["head_dim_v"]) == hd and r["dtype"] == dtype
                           and r["causal"] == causal), key=lambda r: (r["seqlen_k"], r["seqlen_q"]))
            for name in backends:
                pts = [(r["seqlen_k"], r["backends"][name]["tflops"]) for r in rows
                       if r["backends"][name]["tflops"]]
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker="o", label=name, linewidth=2.0 if name == "flashcore" else 1.2)
            ax.set_xscale("log", base=2)
            dims = f"{hd[0]}" if hd[0] == hd[1] else f"{hd[0]}, head_dim_v {hd[1]}"
            ax.set_title(f"head_dim {dims}, {dtype}, {'causal' if causal else 'no mask'}", fontsize=10)
            ax.set_xlabel("sequence length (keys)")
            ax.set_ylabel("TFLOP/s")
            ax.grid(True, alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def environment(fc, fa3=None, fa4=None):
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    fc_version, fc_head_dims = None, None
    if fc is not None:  # the loaded library's version, else the package's
        library_version = getattr(fc, "library_version", None)
        fc_version = library_version() if callable(library_version) else getattr(fc, "__version__", None)
        supported = getattr(fc, "supported_head_dims", None)  # flashcore >= 0.2
        fc_head_dims = [list(pair) for pair in supported()] if callable(supported) else None
    return {
        "device": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "flashcore": None if fc_version is None else str(fc_version),
        "flashcore_head_dims": fc_head_dims,
        "flashcore_library": os.environ.get("FLASHCORE_LIBRARY"),
        "fa3": None if fa3 is None else f"{FA3_DISTRIBUTION} {fa3.version or '(version unknown)'}",
        "fa4": None if fa4 is None else f"{FA4_DISTRIBUTION} {fa4.version or '(version unknown)'}",
    }


def fa3_entry_point(c):
    """The FA3 function a case calls (for --list; fa3_backend decides the same way)."""
    if c.dtype != "bf16":
        return "n/a (fp16)"
    if c.sinks:
        return "n/a (no sinks)"
    entry = "flash_attn_with_kvcache" if c.decode else "flash_attn_func"
    if c.mla:
        return entry + "(qv=)"
    if c.attention_chunk:
        return entry + "(attention_chunk=), if the wheel has it"
    return entry + ("(window_size=)" if c.window is not None else "")


def fa4_entry_point(c, mode="forward"):
    """What FlashAttention 4 runs for a case (for --list; fa4_backend and autograd_runner decide the same way)."""
    if c.attention_chunk:
        return "n/a (no attention_chunk)"
    args = ["window_size="] * (c.window is not None) + ["learnable_sink="] * c.sinks + ["softmax_scale="] * c.mla
    if c.decode and mode == "forward":
        args.append("num_splits=0")
    return "flash_attn_func(" + ", ".join(args) + ")" + (" + its backward" if mode != "forward" else "")


def fp8_entry_points(c):
    """Which fp8 prefill backends are expected to run a case (for --list)."""
    if (c.head_dim, c.head_dim_v) in FP8_HEAD_DIMS:
        return ", ".join(FP8_BACKENDS)
    return f"{FP8_FA3_BACKEND} ({FP8_FC_BACKEND}: head dims " + ", ".join(str(d) for d, _ in FP8_HEAD_DIMS) + " only)"


def list_cases(cases, mode="forward", fp8=False, fa4=False):
    """--list: the selected cases, without a GPU (the GFLOP of one call in mode: the forward, the backward pass or
    a training step; with fp8, what the fp8 prefill backends run; with fa4, what FlashAttention 4 runs)."""
    gradients = mode != "forward"
    width = max(len(c.label) for c in cases)
    fa3_width = max(len(fa3_entry_point(c)) for c in cases) if fa4 and not gradients else 27
    print(f"{'case':<{width}} | {'kind':<7} | decode | {'K/V MiB':>9} | {'GFLOP':>10} | "
          + (f"{'fa3':<{fa3_width}} | fa4" if fa4 else "fa3") + (" | fp8" if fp8 else ""))
    for c in cases:
        fa3 = "n/a (fa3-fwd: forward only)" if gradients else fa3_entry_point(c)
        print(f"{c.label:<{width}} | {c.kind:<7} | {'yes' if c.decode and not gradients else 'no':<6} | "
              f"{c.kv_bytes() / 2**20:9.1f} | {mode_flops(c, mode) / 1e9:10.2f} | "
              + (f"{fa3:<{fa3_width}} | {fa4_entry_point(c, mode)}" if fa4 else fa3)
              + (f" | {fp8_entry_points(c)}" if fp8 else ""))
    print(f"{len(cases)} case(s)" + {"forward": "", "backward": ", backward pass",
                                      "train": ", training step (forward and backward)"}[mode])


def mla_note(backends, listing=False):
    """What the MLA cases measure and how each backend takes them (printed once, with --list too)."""
    forms = {FP8_KV_BACKEND: "the cache in e4m3, q in the case's dtype", FP8_FC_BACKEND: "q and the cache in e4m3",
             FP8_FA3_BACKEND: "q, qv and the cache in e4m3"}
    fp8 = [f"{n} ({form})" for n, form in forms.items() if n in backends]
    return ("DeepSeek MLA cases (latent): one K/V head of D values per token, V its first Dv columns (a view of the "
            f"same storage); softmax_scale {MLA_SOFTMAX_SCALE:.6g} = (128+64)^-0.5 for every backend; "
            + ("K/V MiB" if listing else "TB/s") + " counts the cache once, B*Hkv*Sk*D*2 bytes (B*Sk*576*2: K and V "
            "are the same bytes; one byte per element for e4m3); flashcore paged (attention_with_kvcache, pages of "
            f"{MLA_PAGE_SIZE} in order over the cache's own storage), FA3 through its qv path (q and k_cache: the "
            "rope dims, qv and v_cache: the latent dims) on the contiguous cache"
            + (f"; e4m3: {', '.join(fp8)}, each tensor cast once per buffer set with one descale factor (the "
               "cache's for K and V)" if fp8 else "")
            + ("" if listing else "; checked against an fp32 reference computed in blocks"))


def cuda_torch_missing(prog):
    """Whether PyTorch or a CUDA device it sees is missing, said on stderr
    as `prog` where it is (the benchmark scripts then exit with 2)."""
    if torch is None:
        print(f"{prog}: PyTorch is needed: {_TORCH_IMPORT_ERROR}", file=sys.stderr)
        return True
    if not torch.cuda.is_available():
        print(f"{prog}: no CUDA device visible to PyTorch", file=sys.stderr)
        return True
    return False


def main(argv=None):
    args = parse_args(argv)
    cases = build_cases(args)
    # The fp8 prefill columns: whenever an fp8 prefill backend was asked for (n/a where one could not run), but for
    # MLA cases alone (decode: issue 36's fp8 prefill target does not apply).
    fp8 = (not args.gradients and any(n in args.backend_list for n in FP8_BACKENDS)
           and not (cases and all(c.mla for c in cases)))
    if args.list:
        if cases:
            list_cases(cases, args.mode, fp8, FA4_BACKEND in args.backend_list)
            if fp8:
                print("backends: " + ", ".join(args.backend_list) + f"; fp8 fc/fa3 target >= {FP8_TARGET}")
            elif any(c.features or c.mla for c in cases):
                print("backends: " + ", ".join(args.backend_list))
            if any(c.mla for c in cases):
                print(mla_note(args.backend_list, listing=True))
        for kind in args.serving_kinds:
            dims = f", head dims {','.join(map(str, args.varlen_head_dims))}" if kind == "varlen" else ""
            print(f"serving comparison: {kind} (bench/serving_cases.py){dims}")
        return 0
    if cuda_torch_missing("compare.py"):
        return 2

    fc = None
    if any(n.startswith("flashcore") for n in args.backend_list):  # flashcore, -det, -fp8kv, -fp8
        try:
            fc = import_flashcore(args.library)
        except Exception as e:
            print(f"compare.py: cannot import the flashcore package ({short_error(e)}); build the library and "
                  "point FLASHCORE_LIBRARY (or --library) at libflashcore.so, or leave flashcore out of --backends",
                  file=sys.stderr)
            return 2
    # 0 (the heuristic) is the binding's default, num_splits=None: passed on only when 1..MAX_NUM_SPLITS.
    args.fc_num_splits = args.num_splits or None
    if args.num_splits is not None:
        if fc is None:
            print("compare.py: --num-splits applies to flashcore only, which is not in --backends; ignored",
                  file=sys.stderr)
        elif not accepts_keyword(fc.attention, "num_splits"):
            print(f"compare.py: the flashcore binding at {getattr(fc, '__file__', '?')} has no num_splits= in "
                  f"attention() (it predates split-KV); --num-splits {args.num_splits} ignored, flashcore runs "
                  "with its default", file=sys.stderr)
            args.fc_num_splits = None
        elif not args.num_splits:
            print("compare.py: --num-splits 0: flashcore chooses per call (the binding's default, num_splits=None)")

    fa3 = None
    backend_list = list(args.backend_list)
    fa3_names = [n for n in backend_list if n in ("fa3", FP8_FA3_BACKEND)]
    if fa3_names:
        try:
            fa3 = import_fa3()
        except Exception as e:  # optional: shown once, then left out of the table
            print(f"compare.py: {' and '.join(fa3_names)} skipped: cannot import FlashAttention 3 from the "
                  f"{FA3_DISTRIBUTION} wheel ({short_error(e)}); install it with python3 -m pip install --no-deps "
                  ".deps/wheels/*.whl", file=sys.stderr)
            for n in fa3_names:
                backend_list.remove(n)
    fa4 = None
    if FA4_BACKEND in backend_list:
        try:
            fa4 = import_fa4()
        except Exception as e:  # optional: kept in the table, n/a with this reason
            print(f"compare.py: {FA4_BACKEND} is n/a: cannot import FlashAttention 4 (flash_attn.cute, the "
                  f"{FA4_DISTRIBUTION} package): {short_error(e)}", file=sys.stderr)
    backends = backend_list + [name for name, _ in args.extras]
    if not backends:
        print("compare.py: no backend left to run", file=sys.stderr)
        return 2

    env = environment(fc, fa3, fa4)
    print(f"{env['device']} (sm_{env['compute_capability'].replace('.', '')}, {env['multiprocessors']} SMs), "
          f"torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, flashcore {env['flashcore']}"
          + (f", {env['fa3']}" if env["fa3"] else "") + (f", {env['fa4']}" if env["fa4"] else ""))
    if env["flashcore_head_dims"]:
        print("flashcore kernels for (head_dim, head_dim_v): "
              + ", ".join(f"{d}" if d == dv else f"{d}/{dv}" for d, dv in env["flashcore_head_dims"]))
    if args.fc_num_splits is not None:
        print(f"flashcore num_splits={args.fc_num_splits}")
    if args.gradients:
        what = {"backward": "backward pass alone (dq, dk, dv from dout, q, k, v, out and lse)",
                "train": "training step (the forward with its lse, then dq, dk, dv from dout, in one call)"}[args.mode]
        print(f"{what}: us per call: median over CUDA-graph replays; TFLOP/s = {FLOPS_PER_FORWARD_FLOP[args.mode]:g} "
              "x 2*B*Hq*(D+Dv)*visible pairs (the forward's flops); fc/flash = flashcore TFLOP/s / PyTorch's flash "
              "backend's, fc/peer = the same over the best of " + ", ".join(PEERS) + " (>1: flashcore faster); "
              "det cost = flashcore-det's time over flashcore's, - 1; reldiff: flashcore's largest gradient "
              "difference from the ref(erence) backend's, over the reference's largest value")
    else:
        print("us per call: median over CUDA-graph replays; TFLOP/s = 2*B*Hq*(D+Dv)*visible pairs; decode cases "
              "show TB/s = K/V bytes read (B*Hkv*Sk*(D+Dv)*2) per second instead; fc/best = flashcore TFLOP/s / "
              "best other backend's, fc/peer = the same over the best of " + ", ".join(PEERS) + " (>1: flashcore "
              "faster); maxdiff: flashcore's output against the ref(erence) backend's")
        if fp8:
            print(f"fp8 prefill: {' and '.join(FP8_BACKENDS)} get the case's q, k and v cast to e4m3 (one descale "
                  "factor per tensor, amax / 448; cast once per buffer set, not timed), bf16 out, same flops; fp8 "
                  f"fc/fa3 = {FP8_FC_BACKEND} TFLOP/s / {FP8_FA3_BACKEND}'s, target >= {FP8_TARGET} (met or missed); "
                  f"fc8 diff: {FP8_FC_BACKEND}'s output against the ref(erence) backend's on the dequantized e4m3 "
                  f"inputs ('!' beyond {FP8_TOLERANCE:g}, a sanity check; bench/fp8_error.py measures the error)")
    if any(c.features for c in cases):
        print("issue 61's cases (window, chunks, sinks): visible pairs counted row by row (the window's and chunks' "
              "keys only; TB/s counts the K/V of the keys some row sees); checked against an fp32 reference "
              "computed in blocks, with the sinks" + (" (and their gradient)" if args.gradients else ""))
        if any(n in backends for n in OVERHEAD_BACKENDS):
            print(f"overheads: sinks cost = flashcore's time / {NOSINKS_BACKEND}'s (the same call without sinks) - 1, "
                  f"target <= +{100 * SINKS_COST_TARGET:g}%; chunk/key = (flashcore's time / its visible pairs) / "
                  f"({CAUSAL_BACKEND}'s / its pairs), {CAUSAL_BACKEND} being plain causal attention over the case's "
                  f"chunks as a batch of sequences (the same keys per query), target <= {CHUNK_PER_KEY_TARGET:g}; "
                  "'!' past a target")
    if any(c.mla for c in cases):
        print(mla_note(backends))
    copy_tbps = None
    if not args.gradients and any(c.decode for c in cases):
        copy_tbps = copy_bandwidth(args)
        print(f"copy bandwidth, measured now: {copy_tbps:.2f} TB/s (a {COPY_BYTES >> 20} MiB copy by an elementwise "
              "kernel, bytes read + written per second); fc/copy: flashcore's K/V TB/s over it")
    label_width = max([len(c.label) for c in cases] or [0])
    cell = 16
    results = []
    for i, c in enumerate(cases):
        if args.gradients:
            if i == 0:
                print_header(backends, label_width, cell, backward=True)
            r = run_backward_case(c, backends, fc, args, fa3, fa4)
        else:
            if i == 0 or c.decode != cases[i - 1].decode:
                if i:
                    print()
                print_header(backends, label_width, cell, c.decode, fp8=fp8)
            r = run_case(c, backends, fc, args, fa3, fa4)
            if c.decode and copy_tbps:
                r["copy_tbps"] = copy_tbps
                for entry in r["backends"].values():
                    entry["copy_fraction"] = entry["tbps"] / copy_tbps if entry.get("tbps") else None
                r["fc_copy_fraction"] = r["backends"].get("flashcore", {}).get("copy_fraction")
        r["label"] = c.label
        results.append(r)
        print_row(r, backends, label_width, cell, args.gradients, fp8)
    print_notes(results, backends, args.gradients)
    if copy_tbps:
        print(f"copy bandwidth at the end: {copy_bandwidth(args):.2f} TB/s (at the start: {copy_tbps:.2f}; "
              "fc/copy uses the start's)")
    serving = []
    if args.serving_kinds:
        from serving_cases import run_serving
        serving = run_serving(args.serving_kinds, fc, fa3 if "fa3" in backend_list else None, measure, args)

    if args.json:
        doc = {"tool": "bench/compare.py", "environment": env,
               "settings": {"mode": args.mode,
                            "backward_flops": f"{BACKWARD_FLOPS_PER_FORWARD_FLOP} x the forward's flops",
                            "train_flops": f"{FLOPS_PER_FORWARD_FLOP['train']} x the forward's flops",
                            "budget_ms": args.budget_ms, "max_graph_calls": args.graph_calls, "seed": args.seed,
                            "tolerance": BACKWARD_TOLERANCE if args.gradients else TOLERANCE,
                            "num_splits": args.num_splits,
                            "num_splits_passed": args.fc_num_splits, "peers": list(PEERS),
                            "flops": "2*B*Hq*(D+Dv)*visible_pairs (4*B*Hq*D*visible_pairs when Dv == D); causal: "
                                     "bottom-right mask, S(S+1)/2 pairs if Sq == Sk; a window or chunks: counted row "
                                     "by row",
                            "issue61": {"sinks_cost": f"flashcore us / {NOSINKS_BACKEND} us - 1",
                                        "sinks_cost_target": SINKS_COST_TARGET,
                                        "chunk_per_key": f"(flashcore us / visible pairs) / ({CAUSAL_BACKEND} us / "
                                                         "its visible pairs)",
                                        "chunk_per_key_target": CHUNK_PER_KEY_TARGET},
                            "tbps": "decode cases: B*Hkv*Sk*(D+Dv)*2 bytes of K/V / time, in 1e12 bytes/s (half "
                                    "that for the e4m3 K/V of " + ", ".join(ONE_BYTE_KV_BACKENDS) + ")",
                            "fp8": {"backends": list(FP8_BACKENDS), "target": FP8_TARGET,
                                    "ratio": f"fp8_ratio = {FP8_FC_BACKEND} TFLOP/s / {FP8_FA3_BACKEND}'s; "
                                             "fp8_target_met = fp8_ratio >= target",
                                    "quantization": "q, k and v each cast to float8_e4m3fn with one float32 descale "
                                                    "factor per tensor (amax / 448), once per buffer set, untimed; "
                                                    "bf16 out",
                                    "tolerance": FP8_TOLERANCE,
                                    "check": "max abs diff against the reference backend on the dequantized e4m3 "
                                             "inputs of buffer set 0"}},
               "results": results, "serving": serving}
        if any(c.mla for c in cases):
            doc["settings"]["mla"] = {"softmax_scale": MLA_SOFTMAX_SCALE, "page_size": MLA_PAGE_SIZE,
                                      "tbps": "B*Hkv*Sk*D*2 bytes: the latent cache once (V is its first Dv "
                                              "columns, the same bytes), half that for e4m3"}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"JSON written to {args.json}")
    if args.plot:
        what = {"forward": "forward", "backward": "backward pass", "train": "training step"}[args.mode]
        write_plot(results, backends, args.plot, f"{env['device']}: flashcore vs FA3 and PyTorch SDPA backends, {what}")

    ours = [n for n in OWN_BACKENDS if n in backends]
    bad_check = [f"{r['label']} ({n})" for r in results for n in ours if r["backends"][n]["check_ok"] is False]

    def others_ran(r, n):
        """Whether n failing case r is flashcore failing a case others ran: for flashcore-fp8, fa3-fp8 ran
        and the head dims are issue 36's (others are UNSUPPORTED by design)."""
        if n != FP8_FC_BACKEND:
            return bool(r["best_other"])
        return (bool(r["backends"].get(FP8_FA3_BACKEND, {}).get("tflops"))
                and (r["head_dim"], r["head_dim_v"]) in FP8_HEAD_DIMS)
    fc_failed = [f"{r['label']} ({n})" for r in results for n in ours
                 if r["backends"][n]["error"] and not r["backends"][n]["not_applicable"] and others_ran(r, n)]
    for label in bad_check:
        print(f"compare.py: flashcore output differs from the reference beyond tolerance: {label}", file=sys.stderr)
    for label in fc_failed:
        print(f"compare.py: flashcore failed a case other backends ran: {label}", file=sys.stderr)
    return 1 if bad_check or fc_failed else 0


if __name__ == "__main__":
    sys.exit(main())
