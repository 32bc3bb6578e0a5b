"""flashcore.attention, attention_varlen and attention_with_kvcache, with
forward_params, check_params and supported_head_dims beside them: the
public entry points of a forward call, and the way each call takes
(_forward): under torch.compile, and where the result must be
differentiable, the torch operator (_torch_ops), whose autograd formula is
the backward pass; for a repeated call on torch tensors the compiled path
(_plan's compiled path); else the Python path (_plan.forward). Each takes
the call's arrays as one tuple, in _plan.POINTER_FIELDS order, and every
one of them launches from the call's one plan."""

import ctypes
import numbers
import sys
from typing import Any, List, Optional, Tuple, Union

from . import _backward, _ffi, _plan, _torch_ops
from ._arrays import Array, describe, is_cupy, is_torch, shape_of
from ._errors import InvalidArgumentError, InvalidArgumentTypeError
from ._fields import fits
from ._library import library, struct_ref
from ._params import (LAYOUT_AXES, _batch_from_cu_seqlens, _build, _descales, _layout, _options, _sequences,
                      _softmax_scale)
from ._plan import describe_first, full
from ._torch_ops import operator_forward, traced_full_int32, tracing, wants_grad


# The compiled path (_plan.load): None until torch is imported and it was
# looked for, then the configured module, or False where there is none.
_fast = None
# tracing(), which attention() asks on every call: torch.compiler.is_compiling
# itself once _fast is loaded (without tracing()'s lookups).
_is_compiling = tracing


def _load_fast():
    """_fast, looked for once torch is imported."""
    global _fast, _is_compiling
    fast = _plan.load(_plan.torch_api(), _plan._kept_workspaces)
    if fast:
        _is_compiling = sys.modules["torch"].compiler.is_compiling
    _fast = fast
    return fast


def _compiled_path():
    """_fast, looked for on first use: the compiled path both directions
    take (_backward.gradients asks it too)."""
    return _fast if _fast is not None else _load_fast()


_backward.compiled_path = _compiled_path


def forward_params(q: Array, k: Array, v: Array, out: Optional[Array] = None, *, lse: Optional[Array] = None,
                   causal: bool = False, softmax_scale: Optional[float] = None, layout: Union[str, int] = "bhsd",
                   num_splits: Optional[int] = None, window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
                   seqused_k: Optional[Array] = None, cu_seqlens_q: Optional[Array] = None,
                   cu_seqlens_k: Optional[Array] = None, max_seqlen_q: Optional[int] = None,
                   max_seqlen_k: Optional[int] = None, block_table: Optional[Array] = None,
                   q_descale: Optional[Array] = None, k_descale: Optional[Array] = None,
                   v_descale: Optional[Array] = None, attention_chunk: int = 0,
                   sinks: Optional[Array] = None, sm_margin: int = 0) -> "_ffi.flashcore_forward_params":
    """A flashcore.ForwardParams for these arrays (pointers, sizes, strides),
    for the low-level calls: Handle.workspace_size, Handle.forward,
    check_params. The arrays must outlive every use of the result.
    num_splits, window, softcap, seqused_k, float8_e4m3fn k and v (or q, k
    and v: dtype FP8_E4M3, kv_dtype 0, out_dtype BF16, out bfloat16), the
    descales, attention_chunk, sinks and sm_margin as for attention();
    cu_seqlens_q/max_seqlen_q and cu_seqlens_k/max_seqlen_k as for
    attention_varlen() (each side packed on its own: q and out, or k and v,
    are then [total, H, D] whatever the layout); block_table as for
    attention_with_kvcache(), k and v then page pools [num_pages,
    page_size, Hkv, D] (layout="bshd") or [num_pages, Hkv, page_size, D]."""
    layout = _layout(layout)
    options = _options(causal, softmax_scale, num_splits, window, softcap, attention_chunk, sm_margin)
    infos = [None if a is None else describe(a, name)
             for a, name in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"), (sinks, "sinks"))]
    seqs = _sequences(0, seqused_k=seqused_k, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                      cu_seqlens_k=cu_seqlens_k, max_seqlen_k=max_seqlen_k, block_table=block_table)
    return _build(library(), *infos[:5], layout, options, seqs, _descales(0, q_descale, k_descale, v_descale),
                  infos[5])


def supported_head_dims() -> List[Tuple[int, int]]:
    """The (head_dim, head_dim_v) pairs this build of the library has kernels
    of its own for (flashcore_supported_head_dims), in increasing order, e.g.
    [(32, 32), (64, 64), (96, 96), (128, 128), (192, 128), (256, 256),
    (512, 512), (576, 512)]; (576, 512) is DeepSeek MLA's latent cache, whose
    v must be a view of k (v = k[..., :512]).

    Other head dims run too: q/k's head_dim and v's head_dim_v, both
    multiples of 8, run on the first listed pair whose two dims are both at
    least theirs (80 runs on (96, 96), (64, 128) on (128, 128)). A call no
    listed pair covers raises UnsupportedError."""
    return library().supported_head_dims()


def check_params(params: "_ffi.flashcore_forward_params") -> None:
    """flashcore_forward_check: raises what flashcore_forward would for these
    parameters (a flashcore.ForwardParams) before looking at the GPU."""
    lib = library()
    lib.check(lib.cdll.flashcore_forward_check(struct_ref(params, _ffi.flashcore_forward_params, "params",
                                                          "from flashcore.forward_params()")))


def _forward(arrays, layout, options, return_lse, stream, workspace, detach, max_seqlen_q=None, max_seqlen_k=None,
             seqused_k_name="seqused_k", fast_asked=False, deterministic=False):
    """What attention, attention_varlen and attention_with_kvcache share:
    the call's arrays in _plan.POINTER_FIELDS order (None where not given),
    its options (causal, softmax_scale, num_splits, window, softcap,
    attention_chunk, sm_margin) as the caller gave them, and the rest of
    its arguments. Under torch.compile (or torch.export), and where the
    result must be differentiable (wants_grad), the torch operator
    flashcore::forward, which comes back here below autograd; else the
    compiled path where it serves the call (fast_asked: the caller asked it
    already, and it handed the call back); else the Python path
    (_plan.forward), which gives the compiled path the call's plan.
    (Positional: keywords cost host time on every call.)"""
    differentiable = None
    if not tracing():
        q, k, v, sinks = arrays[0], arrays[1], arrays[2], arrays[12]
        fast = _fast if _fast is not None else _load_fast()
        if (fast and not fast_asked and stream is None and workspace is None and arrays[4] is None
                and arrays[6] is None and arrays[7] is None and arrays[8] is None):
            result = fast.call(q, k, v, arrays[3], arrays[5], arrays[9], arrays[10], arrays[11], sinks, layout,
                               options, return_lse)
            if result is not None:
                return result
        # (Before planning: a differentiable call is planned below autograd, by _forward_below_autograd.)
        if not wants_grad(q, k, v, detach, sinks):
            return _plan.forward(arrays, layout, options, return_lse, max_seqlen_q, max_seqlen_k, stream, workspace,
                                 seqused_k_name, fast)
        differentiable = True
    return operator_forward(arrays, layout, options, return_lse, stream, workspace, detach, max_seqlen_q,
                            max_seqlen_k, deterministic, differentiable)


def _forward_below_autograd(arrays, max_seqlen_q, max_seqlen_k, layout, options, return_lse):
    """flashcore::forward's implementation (_torch_ops.forward_below_autograd),
    which EagerAttention's forward is too: the call as _forward makes it
    (arrays without out and lse), below autograd (grad mode off, the result
    without a gradient path). The compiled path first (a repeated call);
    else q, k, v and sinks without their requires_grad, so that the call's
    plan is the one a plain call has, which the compiled path is then
    given."""
    q, k, v, sinks = arrays[0], arrays[1], arrays[2], arrays[12]
    if arrays[6] is None and arrays[7] is None and arrays[8] is None:
        fast = _compiled_path()
        if fast:
            result = fast.call(q, k, v, None, arrays[5], arrays[9], arrays[10], arrays[11], sinks, layout, options,
                               return_lse)
            if result is not None:
                return result
    if q.requires_grad or k.requires_grad or v.requires_grad or sinks is not None and sinks.requires_grad:
        arrays = ((q.detach(), k.detach(), v.detach()) + arrays[3:12]
                  + (None if sinks is None else sinks.detach(),))
    return _forward(arrays, layout, options, return_lse, None, None, False, max_seqlen_q, max_seqlen_k, "seqused_k",
                    True)


_torch_ops.forward_below_autograd = _forward_below_autograd


def _pytorch_names(q, k, layout, causal, softmax_scale, is_causal, scale):
    """causal and softmax_scale with PyTorch's spellings taken in: scale is
    softmax_scale; is_causal is causal where the two agree (Sq == Sk: top-left
    and bottom-right alignment are one mask), refused where they do not."""
    if scale is not None:
        if softmax_scale is not None:
            raise TypeError("pass softmax_scale or scale (PyTorch's name for it), not both")
        if not tracing():  # (traced, it may be symbolic: flashcore::forward checks it as softmax_scale)
            _softmax_scale(scale, "scale")  # refused under the name it was given
        softmax_scale = scale
    if is_causal is not None:
        if causal:
            raise TypeError("pass causal or is_causal, not both (causal is bottom-right aligned, PyTorch's "
                            "is_causal top-left)")
        if is_causal:
            axis = LAYOUT_AXES[_layout(layout)][2]
            sq, sk = _shape_of(q, "q")[axis], _shape_of(k, "k")[axis]
            if sq != sk:
                raise InvalidArgumentError(
                    "is_causal (PyTorch's name) masks top-left aligned, flashcore's causal bottom-right, and with "
                    "Sq = %d != Sk = %d the two differ: call flashcore.sdpa(q, k, v, is_causal=True) for PyTorch's "
                    "mask, or pass causal=True for FlashAttention's" % (sq, sk))
        causal = bool(is_causal)
    return causal, softmax_scale


def _shape_of(x, name):
    """x's shape, which must be 4-D."""
    shape = shape_of(x, name)
    if len(shape) != 4:
        raise InvalidArgumentError("%s must be 4-D, got shape %s" % (name, list(shape)))
    return shape


def attention(q: Array, k: Array, v: Array, *, causal: bool = False, softmax_scale: Optional[float] = None,
              out: Optional[Array] = None, return_lse: bool = False, stream: Any = None, layout: Union[str, int] = "bhsd",
              lse: Optional[Array] = None, workspace: Optional[Array] = None, num_splits: Optional[int] = None,
              window: Optional[Tuple[int, int]] = None, softcap: float = 0.0, seqused_k: Optional[Array] = None,
              detach: bool = False, is_causal: Optional[bool] = None, scale: Optional[float] = None,
              deterministic: bool = False, q_descale: Optional[Array] = None, k_descale: Optional[Array] = None,
              v_descale: Optional[Array] = None, attention_chunk: int = 0, sinks: Optional[Array] = None,
              sm_margin: int = 0) -> Union[Array, Tuple[Array, Array]]:
    """Fused scaled-dot-product attention, like
    torch.nn.functional.scaled_dot_product_attention(q, k, v):

        out = softmax(cap(softmax_scale * q @ k^T) [+ causal/window/chunk mask]) @ v

    (cap is the identity unless softcap is set; with sinks, each head's sink
    logit joins the softmax's denominator).

    q: [B, Hq, Sq, D]; k: [B, Hkv, Sk, D]; v: [B, Hkv, Sk, Dv] with Hq a
    multiple of Hkv (grouped-query attention); float16 or bfloat16 (k and v
    also float8_e4m3fn: quantized K/V; or q, k and v all float8_e4m3fn:
    fp8 queries; both below), on one CUDA device. out is [B, Hq, Sq, Dv],
    of q's dtype (bfloat16 for fp8 queries). D (head_dim) and Dv (head_dim_v)
    may differ, e.g. 192 and 128; see supported_head_dims() for the pairs
    this build has kernels for and which others run. Any storage order works
    as long as the last dimension is contiguous: strides are read from the
    arrays. layout="bshd" takes FlashAttention's [B, S, H, D] shapes instead
    (out is then [B, Sq, Hq, Dv]). Shapes alone cannot always tell [B, S,
    H, D] tensors given with the default layout from [B, H, S, D] ones;
    where the head counts then do not fit, the error says to pass
    layout="bshd".

    causal: bottom-right aligned mask: query i sees key j iff
        j <= i + Sk - Sq; rows that see no key give 0 (and lse -inf).
    softmax_scale: None for 1 / sqrt(D).
    scale, is_causal: PyTorch's names, taken in as softmax_scale and
        causal: scale is softmax_scale; is_causal=True is causal=True where
        Sq == Sk, and refused otherwise (PyTorch's mask is then top-left
        aligned: flashcore.sdpa implements it).
    window: sliding window (local attention), FlashAttention's window_size:
        None (the default) for none, or a pair (left, right) of ints, each
        -1 (unbounded on that side) or >= 0: query i sees key j only where
        i + Sk - Sq - left <= j <= i + Sk - Sq + right (bottom-right
        aligned, as causal). (0, 0) sees the diagonal key only; (left, 0)
        is causal with a window of left keys back. causal=True is right = 0,
        so with it right must be -1 or 0. Rows that see no key give 0 (and
        lse -inf).
    softcap: logit softcapping (Gemma 2): with softcap > 0 each score
        s = softmax_scale * q.k becomes softcap * tanh(s / softcap) before
        the mask and the softmax (lse is of the capped scores); 0 (the
        default) for none. A finite real >= 0.
    seqused_k: per-sequence key counts (FlashAttention's seqused_k, its
        kv-cache call's cache_seqlens): None for none, or an int32 CUDA array
        of shape [B]. Sequence b then attends to its first seqused_k[b] keys
        of k and v (whose Sk is the cache's capacity); causal and the window
        align to that count, a count of 0 gives 0 (and lse -inf), and keys
        past it may hold anything, NaN included. Read on the GPU: each value
        should be in [0, Sk] and is clamped into it.
    out: where to write the result (q's shape with v's last dimension, q's
        dtype; any strides the C API accepts). Allocated with q's framework
        when None.
    return_lse: also return the float32 [B, Hq, Sq] log-sum-exp of each
        row's scaled (capped), masked scores: the result is then (out, lse).
    lse: where to write that log-sum-exp (contiguous float32 [B, Hq, Sq]);
        allocated when return_lse is set and lse is None.
    stream: where to queue the work: a torch.cuda.Stream, a cupy Stream, an
        object with __cuda_stream__ or a cudaStream_t as an int. None: the
        current stream of q's framework (for other arrays, the producer's
        __cuda_array_interface__ stream, else the legacy default stream).
    workspace: device memory for the library's scratch space (a CUDA array);
        allocated with q's framework when needed and None. Only calls that
        split their keys (num_splits) need one.
    num_splits: split-KV. None (the default) lets the library choose from
        the grid, the GPU's SM count and Sk (it splits calls too small to
        fill the GPU, such as decoding); 1 never splits; N (2 up to
        flashcore.MAX_NUM_SPLITS) splits the keys each query block sees into
        exactly N parts, computed in parallel and merged (the same math as
        merge_states). Results are deterministic for a given num_splits;
        different num_splits round differently.
    attention_chunk: chunked attention, as Llama 4's and FlashAttention 3's
        attention_chunk: 0 (the default) is off; a chunk length > 0 lets
        query i see key j only where j and i's diagonal key i + Sk - Sq
        (aligned as causal is) lie in the same chunk [c * attention_chunk,
        (c + 1) * attention_chunk). It combines with causal and window (a
        key must pass every mask); Llama 4 uses causal=True with 8192. Key
        tiles outside a query block's chunks are skipped, not computed.
        Rows that see no key give 0 (and lse -inf, or the sink with
        sinks). An int; the library refuses one < 0.
    sinks: learnable attention sinks, as gpt-oss's (FlashAttention 4's
        learnable_sink): None (the default), or a float32 CUDA array of
        shape [Hq], one logit per query head, on q's device. Head h's
        sinks[h], in the units of the scaled (capped) scores, joins the
        softmax's denominator of each of h's rows and attends to nothing:
            out = sum_j exp(s_j) v_j / (exp(sinks[h]) + sum_j exp(s_j)),
            lse = log(exp(sinks[h]) + sum_j exp(s_j)).
        A row that sees no key gives out = 0 and lse = sinks[h]; -inf is no
        sink for that head. Works with every other option (a split-KV call
        counts the sink once, in its merge). Differentiable: a torch
        tensor that requires grad (an nn.Parameter) gets its gradient from
        flashcore_backward, as q, k and v do. Read on the GPU, not
        checked: NaN gives NaN rows.
    sm_margin: SMs the call leaves to kernels on other streams, as
        FlashAttention 3's sm_margin: 0 (the default) uses every SM of the
        device. A context-parallel ring sets it so that the NCCL transfer
        of the next K/V slice runs beside the attention (as
        flashcore.distributed.ring_attention does). The persistent kernels
        (sm_90a's forward) launch at most SMs - sm_margin thread blocks,
        and the split-KV choice counts those SMs only: it changes the
        plan, not the arithmetic (at most another num_splits' rounding).
        A differentiable call's backward pass leaves the same SMs. An int;
        the library refuses one < 0 or one that leaves the device no SM.

    Quantized K/V (an fp8 KV cache, as vLLM's kv_cache_dtype="fp8"): k and
        v may both be float8_e4m3fn (torch.float8_e4m3fn) with float16 or
        bfloat16 q; out has q's dtype. They stand for k_descale * k and
        v_descale * v: the kernels widen each K/V tile to q's dtype on the
        GPU, so the result is that of attention on the dequantized K/V in
        q's dtype. Their head dims must be multiples of 16, and their
        strides (in elements, one byte each) multiples of 16 but for the
        last. Inference only: where q requires grad (grad mode on) the call
        raises UnsupportedError, unless detach=True or torch.no_grad().
        Mixed 16-bit dtypes (float16 q, bfloat16 k) are refused.
    Quantized queries (fp8 prefill, FlashAttention 3's fp8 forward): q, k
        and v all float8_e4m3fn, each with its descale factor; out is
        bfloat16 (an out= of another dtype raises UnsupportedError), lse
        float32 as always. They stand for q_descale * q, k_descale * k and
        v_descale * v, and the result is attention on those dequantized
        values: softmax_scale (None: 1 / sqrt(D)) multiplies the dot
        products of the dequantized q and k, and lse is in the usual units,
        the natural log of sum_j exp(softmax_scale * (q_descale * q) .
        (k_descale * k_j)). The kernels compute Q K^T and P V on e4m3
        values (P rounded to e4m3 for P V, as FlashAttention 3's), so
        expect a relative (L2) error of 1e-2 to 3e-2 against exact
        attention on the dequantized inputs, as FlashAttention 3's:
        several times a 16-bit call's. Runs on sm_90 GPUs (H100, H200)
        only, with head dims (64, 64), (128, 128) and (256, 256);
        elsewhere, and for other head dims, the library raises
        UnsupportedError saying so. causal, window, grouped-query heads,
        lse, num_splits, seqused_k, attention_varlen's packed sequences and
        attention_with_kvcache's caches (contiguous or paged) all work;
        softcap does not (UnsupportedError). Strides (in one-byte
        elements) and head dims must be multiples of 16, as for fp8 K/V.
        16-bit k and v under fp8 q raise UnsupportedError (quantize them
        too, or pass 16-bit q). Inference only, as fp8 K/V: a call to be
        differentiated raises UnsupportedError.
    q_descale, k_descale, v_descale: the descale factors of float8_e4m3fn
        q, k and v (FlashAttention 3's arguments): None (1), or a float32
        CUDA tensor on q's device, of one element (shape [] or [1]: one
        factor for the whole tensor, vLLM's k_scale and v_scale) or of
        shape [B, Hkv] (one per sequence and K/V head, q_descale's too, as
        FlashAttention 3's: the query heads of a group share their K/V
        head's factor; any strides, so an expand()ed one-element tensor
        works). Read on the GPU and not checked: each must be finite and
        > 0. A Python float is refused (the factors are read on the GPU,
        and a tensor made of it would be a hidden allocation and copy per
        call): make the tensor once, torch.tensor([s], device=q.device),
        and pass it to every call. The library refuses k_descale and
        v_descale with 16-bit k and v, and q_descale with 16-bit q.

    Gradients: where q, k, v or sinks is a torch tensor that requires grad
        and grad mode is on, the result is differentiable: autograd
        computes the gradients of q, k, v and sinks with flashcore_backward
        (the call is then the torch operator flashcore::forward, whose
        autograd formula that is, and keeps q, k, v, out, the lse and the
        sinks for the backward pass).
        The returned lse, if asked for, has no gradient. stream= and
        workspace= are not taken then; out= and lse= are copied into.
        Paged caches (attention_with_kvcache's block_table),
        float8_e4m3fn K/V and float8_e4m3fn queries have no backward pass:
        such a call raises UnsupportedError.
    deterministic: the backward pass makes dq bitwise identical from run
        to run (it accumulates in a fixed order, at some cost in speed); dk
        and dv are either way, as is the forward. Also on where
        torch.use_deterministic_algorithms(True) is in effect when the
        backward runs.
    detach: True computes from the values of inputs that require grad,
        the result then without a gradient path (as does
        FLASHCORE_DETACH=1 in the environment): for inference code that
        leaves requires_grad on, which needs neither the autograd graph
        nor the lse kept for it. Under torch.no_grad() or
        torch.inference_mode() no call is differentiated anyway.

    PyTorch tensors, CuPy arrays and any object with __cuda_array_interface__
    or __dlpack__ are accepted; for the last two, out (and lse, workspace when
    needed) must be given. Host (CPU) arrays are refused. Returns without
    waiting for the GPU. Raises flashcore.FlashcoreError subclasses
    (InvalidArgumentError, UnsupportedError, MisalignedError, ...) carrying
    the library's status and message.

    A call whose arrays have the shapes, strides, dtypes and devices of an
    earlier one, with the same options, reuses its checked parameters (only
    the addresses change; the library checks them on every call): a few
    microseconds of host time on torch tensors. Under torch.compile (and
    torch.export) the call is the torch operator flashcore::forward
    (flashcore.register_torch_ops()), traced without a graph break; stream=
    and workspace= are refused there (it runs on torch's current stream and
    allocates from torch's allocator), out= and lse= are copied into.
    """
    if is_causal is not None or scale is not None:
        causal, softmax_scale = _pytorch_names(q, k, layout, causal, softmax_scale, is_causal, scale)
    options = (causal, softmax_scale, num_splits, window, softcap, attention_chunk, sm_margin)
    # A repeated call on torch tensors: the compiled path, first thing (each
    # Python call on the way is host time). Under torch.compile it is never
    # reached: _is_compiling() comes first, and there _forward traces.
    fast_asked = False
    if _fast and stream is None and lse is None and workspace is None and not _is_compiling():
        result = _fast.call(q, k, v, out, seqused_k, q_descale, k_descale, v_descale, sinks, layout, options,
                            return_lse)
        if result is not None:
            return result
        fast_asked = True
    return _forward((q, k, v, out, lse, seqused_k, None, None, None, q_descale, k_descale, v_descale, sinks), layout,
                    options, return_lse, stream, workspace, detach, None, None, "seqused_k", fast_asked, deterministic)


def attention_varlen(q: Array, k: Array, v: Array, cu_seqlens_q: Array, cu_seqlens_k: Array, max_seqlen_q: int,
                     max_seqlen_k: int, *, causal: bool = False, softmax_scale: Optional[float] = None,
                     out: Optional[Array] = None, return_lse: bool = False, stream: Any = None,
                     lse: Optional[Array] = None, workspace: Optional[Array] = None, num_splits: Optional[int] = None,
                     window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
                     seqused_k: Optional[Array] = None, detach: bool = False, deterministic: bool = False,
                     q_descale: Optional[Array] = None, k_descale: Optional[Array] = None,
                     v_descale: Optional[Array] = None, attention_chunk: int = 0,
                     sinks: Optional[Array] = None, sm_margin: int = 0) -> Union[Array, Tuple[Array, Array]]:
    """Attention over a batch of sequences of different lengths packed
    without padding, as FlashAttention's flash_attn_varlen_func:

    q: [total_q, Hq, D]; k: [total_k, Hkv, D]; v: [total_k, Hkv, Dv]; out:
    [total_q, Hq, Dv]: the rows of every sequence, one after another.
    cu_seqlens_q, cu_seqlens_k: int32 CUDA arrays of shape [B + 1], the
        row where each of the B sequences starts in q (in k and v), then
        the end: sequence b's queries are rows cu_seqlens_q[b] to
        cu_seqlens_q[b + 1] - 1. Read on the GPU (clamped into the arrays,
        so wrong offsets give wrong results, never a fault); rows outside
        every sequence are not written.
    max_seqlen_q, max_seqlen_k: ints, the longest query and key sequence;
        they size the grid and the workspace. A sequence longer than its
        max is cut to it.
    causal, window and attention_chunk align to each sequence's own
        lengths: query i of sequence b sees key j <= i + Sk_b - Sq_b with
        causal. A sequence with no keys gives 0 (and lse -inf, or the sink
        with sinks).
    seqused_k: None, or an int32 CUDA array [B]: sequence b then uses only
        the first min(seqused_k[b], its length) of its keys.
    lse: float32 [Hq, total_q] (FlashAttention's varlen layout), returned
        with return_lse as (out, lse).
    k and v may be float8_e4m3fn (a quantized KV cache) with k_descale
        and v_descale of one element or of shape [B, Hkv], as for
        attention(); or q, k and v all float8_e4m3fn (fp8 prefill, sm_90
        only: out bfloat16, q_descale too; no softcap), as for attention().
        B is len(cu_seqlens_q) - 1 for [B, Hkv] descales.

    The other arguments are attention()'s, detach, deterministic,
    attention_chunk, sinks (float32 [Hq]) and sm_margin included; the
    result is differentiable as attention()'s is (the gradients of rows
    outside every sequence are 0), a float8_e4m3fn call's is not.
    """
    return _forward((q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, None, q_descale, k_descale, v_descale,
                     sinks), "bshd", (causal, softmax_scale, num_splits, window, softcap, attention_chunk, sm_margin),
                    return_lse, stream, workspace, detach, max_seqlen_q, max_seqlen_k, "seqused_k", False,
                    deterministic)


def _cache_seqlens_array(count, q, cu_seqlens_q, stream):
    """cache_seqlens given as an int: an int32 [B] CUDA array of it, made
    with q's framework on the call's stream."""
    if isinstance(count, bool) or not isinstance(count, numbers.Integral):
        raise InvalidArgumentTypeError("cache_seqlens must be None, an int or an int32 CUDA array of shape [B], "
                                       "got %s" % type(count).__name__)
    count = fits(int(count), ctypes.c_int32, "cache_seqlens")
    if tracing():
        return traced_full_int32(q, cu_seqlens_q, count)
    qi, s = describe_first(q, "q", stream)
    if not (is_torch(q) or is_cupy(q)):
        raise TypeError("an int cache_seqlens needs torch or cupy inputs; pass an int32 CUDA array instead")
    if cu_seqlens_q is None:
        batch = qi.shape[0]
    else:
        batch = _batch_from_cu_seqlens(describe(cu_seqlens_q, "cu_seqlens_q", s))
    return full(qi, (batch,), "int32", count, s)


def attention_with_kvcache(q: Array, k_cache: Array, v_cache: Array, cache_seqlens: Union[Array, int, None] = None, *,
                           block_table: Optional[Array] = None, cu_seqlens_q: Optional[Array] = None,
                           max_seqlen_q: Optional[int] = None, causal: bool = False,
                           softmax_scale: Optional[float] = None, out: Optional[Array] = None,
                           return_lse: bool = False, stream: Any = None, lse: Optional[Array] = None,
                           workspace: Optional[Array] = None, num_splits: Optional[int] = None,
                           window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
                           detach: bool = False, deterministic: bool = False, q_descale: Optional[Array] = None,
                           k_descale: Optional[Array] = None, v_descale: Optional[Array] = None,
                           attention_chunk: int = 0, sinks: Optional[Array] = None,
                           sm_margin: int = 0) -> Union[Array, Tuple[Array, Array]]:
    """Attention of new queries against a KV cache, as FlashAttention's
    flash_attn_with_kvcache (without appending to the cache or rotary
    embedding), in its [B, S, H, D] storage:

    q: [B, Sq, Hq, D]; k_cache: [B, S_cache, Hkv, D]; v_cache:
    [B, S_cache, Hkv, Dv]; out: [B, Sq, Hq, Dv].
    cache_seqlens: how many keys of each sequence's cache are in use: an
        int32 CUDA array of shape [B], or an int for every sequence (then
        allocated with q's framework), or None for the whole cache. The rows
        past a sequence's count may hold anything, NaN included. causal and
        the window align the queries to the end of each sequence's keys:
        query i of sequence b sees key j <= i + cache_seqlens[b] - Sq.
    block_table: a paged cache (FlashAttention's block_table, vLLM's paged
        attention): None for the contiguous cache above, or an int32 CUDA
        array [B, max_pages] of page indices. k_cache and v_cache are then
        page pools, [num_pages, page_size, Hkv, D] and [num_pages,
        page_size, Hkv, Dv], page_size a multiple of 16: key j of sequence
        b is row j % page_size of page block_table[b, j // page_size]. Each
        sequence holds up to max_pages * page_size keys, of which it uses
        cache_seqlens[b] (all of them without cache_seqlens); only the
        entries of its used pages are read, the others may hold anything.
        Entries are clamped into [0, num_pages) on the GPU. The table's
        rows may be padded (a [:, :max_pages] view of a wider table): only
        its last dimension must be contiguous.
    cu_seqlens_q, max_seqlen_q: queries of different lengths packed without
        padding (chunked prefill), as for attention_varlen: q is then
        [total_q, Hq, D], out [total_q, Hq, Dv], lse [Hq, total_q], and B
        is len(cu_seqlens_q) - 1; query i of sequence b, of Sq_b queries,
        sees key j <= i + cache_seqlens[b] - Sq_b with causal.
    k_cache, v_cache: float8_e4m3fn for a quantized (fp8) cache, contiguous
        or paged, with q float16 or bfloat16 (out has q's dtype);
        k_descale and v_descale are its descale factors, of one element
        (the whole cache) or of shape [B, Hkv], as for attention(). With q
        float8_e4m3fn too (fp8 prefill against an fp8 cache, chunked or
        not; sm_90 only, kernels at head dims 64, 128 and 256 (others run
        on the smallest that covers them), no softcap), out is
        bfloat16 and q_descale q's factors, as for attention().
    The other arguments are attention()'s (layout is "bshd"), detach,
    deterministic, attention_chunk, sinks and sm_margin included: a
    contiguous 16-bit cache's result is differentiable as attention()'s
    is; a paged or float8_e4m3fn one's is not (UnsupportedError where an
    input requires grad, unless detach=True).
    """
    seqused_k = cache_seqlens
    if cache_seqlens is not None and not (is_torch(cache_seqlens) or hasattr(cache_seqlens, "__cuda_array_interface__")
                                          or hasattr(cache_seqlens, "__dlpack__")):
        seqused_k = _cache_seqlens_array(cache_seqlens, q, cu_seqlens_q, stream)
    return _forward((q, k_cache, v_cache, out, lse, seqused_k, cu_seqlens_q, None, block_table, q_descale, k_descale,
                     v_descale, sinks), "bshd",
                    (causal, softmax_scale, num_splits, window, softcap, attention_chunk, sm_margin), return_lse,
                    stream, workspace, detach, max_seqlen_q, None, "cache_seqlens", False, deterministic)
