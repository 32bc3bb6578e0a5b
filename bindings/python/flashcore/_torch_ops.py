"""flashcore as PyTorch operators: flashcore::forward and
flashcore::backward, torch.library.custom_op's with fake (meta)
implementations, the backward registered as the forward's autograd
formula (register_autograd): torch.compile and torch.export trace calls of
flashcore.attention (and of attention_varlen, attention_with_kvcache, sdpa,
flash_attn_func) into their graphs, the backward pass included, and CUDA
graphs capture them.

Nothing here imports torch: the operators are registered when flashcore is
imported after torch, else on first use (register_torch_ops()). Eager
calls that need no gradient do not go through them: they call the library
directly, which is faster (the compiled path, or the Python path,
_plan.forward); the forward operator's implementation is that same call.
Eager calls that do need one (an input that requires grad, grad mode on)
take the same autograd formula without the dispatcher: EagerAttention, a
torch.autograd.Function whose forward is the operator's implementation and
whose backward is flashcore::backward's (the compiled path's backward() for
a repeated call), at a fraction of a custom operator's host time per call
(issue 58). Traced calls keep the operators, whose formula calls the same
implementations. tracing() and wants_grad() are the modes of torch that
decide which of those ways a call takes."""

import numbers
import os
import sys

from ._arrays import imported
from ._backward import gradients
from ._errors import InvalidArgumentError, UnsupportedError
from ._params import (DESCALE_NAMES, KV_DTYPES, PAGED_BACKWARD, QUANTIZED_BACKWARD, QUANTIZED_OUT_DTYPE,
                      QUANTIZED_QUERY_BACKWARD, QUANTIZED_QUERY_SOFTCAP, QUERY_DTYPES, _layout, _options,
                      refuse_descale_number)

DETACH_ENV = "FLASHCORE_DETACH"


def tracing() -> bool:
    """Whether torch.compile or torch.export is tracing the calling code
    (never where torch is not imported)."""
    torch = imported("torch")  # not sys.modules: see _arrays.imported
    return torch is not None and torch.compiler.is_compiling()


def requires_grad(q, k, v, sinks=None):
    """Whether q, k, v or sinks is a torch tensor that requires grad while
    grad mode is on: what autograd would differentiate."""
    torch = imported("torch")
    if torch is None:
        return False
    tensor = torch.Tensor
    for x in (q, k, v, sinks):
        if isinstance(x, tensor) and x.requires_grad:
            return torch.is_grad_enabled()
    return False


def wants_grad(q, k, v, detach, sinks=None):
    """Whether the call must give a result autograd can differentiate
    (requires_grad()), unless detach=True, or FLASHCORE_DETACH=1 in the
    environment, says to compute from the values alone (inference code that
    leaves requires_grad on, and wants neither the graph nor the lse that
    a differentiable call keeps for the backward pass)."""
    if detach or not requires_grad(q, k, v, sinks):
        return False
    return os.environ.get(DETACH_ENV) != "1"


OPERATOR = "flashcore::forward"
BACKWARD_OPERATOR = "flashcore::backward"
# flashcore::forward's arguments that have a gradient: q, k and v, its first
# three, and sinks (SINKS_ARGUMENT); the others (the integer arrays, the
# descales and the options) have none.
DIFFERENTIABLE_ARGUMENTS = 3
ATTENTION_CHUNK_ARGUMENT = 20
SINKS_ARGUMENT = 21
# sm_margin, its last: after sinks, so that callers of the schema before it
# keep their positions.
SM_MARGIN_ARGUMENT = 22
# Where sinks is among EagerAttention's inputs (q, k, v, sinks, rest).
EAGER_SINKS_INPUT = 3
_registered = []
# EagerAttention, once registered (register_torch_ops).
_eager = []


def _no_forward(*unused):
    raise RuntimeError("flashcore._attention was not imported: flashcore::forward has no implementation")


# flashcore::forward's implementation, as flashcore._attention sets it when
# imported (its _forward_below_autograd): (arrays, max_seqlen_q,
# max_seqlen_k, layout, options, return_lse) -> out, or (out, lse) with
# return_lse; arrays in _plan.POINTER_FIELDS order, out and lse None.
forward_below_autograd = _no_forward


def _keep_for_backward(ctx, inputs, output, sinks_index):
    """What the autograd formula keeps of a differentiable call (inputs:
    flashcore::forward's arguments, all of them, output its (out, lse)),
    for both routes: the operator's setup_context and
    EagerAttention.forward. sinks_index: where sinks is among the inputs
    the route's autograd sees (needs_input_grad's index). lse has no
    gradient, and none is made for it (no zeros materialized)."""
    (q, k, v, seqused_k, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k, layout, causal,
     softmax_scale, num_splits, window, softcap, return_lse, deterministic) = inputs[:17]
    attention_chunk, sinks = inputs[ATTENTION_CHUNK_ARGUMENT], inputs[SINKS_ARGUMENT]
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, sinks)
    ctx.options = (max_seqlen_q, max_seqlen_k, layout, causal, softmax_scale, window, softcap, deterministic,
                   attention_chunk)
    # The backward leaves the forward's SMs to the other streams too.
    ctx.sm_margin = inputs[SM_MARGIN_ARGUMENT]
    ctx.sinks_index = sinks_index


def _differentiate(ctx, dout, backward):
    """The autograd formula's gradients of flashcore::forward's arguments
    from dout, out's gradient (None where out got none: lse's alone, which
    is not differentiable, makes no gradient), through `backward`:
    flashcore::backward's operator where traced, its implementation
    (_backward.gradients) in eager calls. sinks' gradient is computed
    where sinks needs one, and goes to its place (ctx.sinks_index)."""
    wanted_count = len(ctx.needs_input_grad)  # EagerAttention's 5 inputs, or the operator's arguments
    if dout is None:
        return (None,) * wanted_count
    q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, sinks = ctx.saved_tensors
    needs = ctx.needs_input_grad
    at = ctx.sinks_index
    sinks_needs_grad = sinks is not None and at < wanted_count and needs[at]
    grads = backward(dout, q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, *ctx.options, sinks,
                     sinks_needs_grad, ctx.sm_margin)
    result = [grads[0] if needs[0] else None, grads[1] if needs[1] else None, grads[2] if needs[2] else None]
    result += [None] * (wanted_count - DIFFERENTIABLE_ARGUMENTS)
    if sinks_needs_grad:
        result[at] = grads[3]
    return tuple(result)


def register_torch_ops():
    """Registers the torch operators flashcore::forward and
    flashcore::backward (once; needs torch) and returns the forward one;
    torch.ops.flashcore.forward and torch.ops.flashcore.backward are then
    the same operators.

    flashcore::forward(q, k, v, seqused_k, cu_seqlens_q, cu_seqlens_k,
    block_table, max_seqlen_q, max_seqlen_k, layout, causal, softmax_scale,
    num_splits, window, softcap, return_lse, deterministic=False,
    q_descale=None, k_descale=None, v_descale=None, attention_chunk=0,
    sinks=None, sm_margin=0) -> (out, lse) is flashcore.attention's forward
    with every option spelled out (window a list [left, right] or None), on
    torch's current stream; lse is an empty tensor unless return_lse. k
    and v may be float8_e4m3fn (a quantized KV cache, descaled by k_descale
    and v_descale) under 16-bit q, out then of q's dtype; or q, k and v may
    all be float8_e4m3fn (fp8 prefill, descaled by q_descale, k_descale
    and v_descale), out then bfloat16. sinks: None or float32 [Hq], the
    learnable sinks. Its autograd formula gives the gradients of q, k, v
    and sinks (None for the other arguments) through flashcore::backward,
    from the lse: a call to be differentiated needs return_lse=True
    (flashcore.attention asks for it), no block_table and 16-bit q, k and
    v. lse itself is not differentiable.
    deterministic is for the backward pass (the forward's results are
    deterministic either way); the backward leaves the call's sm_margin
    SMs to other streams too.

    flashcore::backward(dout, q, k, v, out, lse, seqused_k, cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout, causal,
    softmax_scale, window, softcap, deterministic, attention_chunk=0,
    sinks=None, compute_dsinks=False, sm_margin=0) -> (dq, dk, dv, dsinks)
    is flashcore_backward on torch's current stream: the forward call's
    tensors and options, dout the gradient of out; dq, dk and dv are new
    tensors of q's, k's and v's shapes and strides; dsinks, with
    compute_dsinks (which needs sinks), a new float32 [Hq] tensor, the
    gradient of sinks, else an empty one. deterministic is or'ed with
    torch.are_deterministic_algorithms_enabled() when it runs."""
    if _registered:
        return _registered[0]
    import torch
    from typing import List, Optional, Tuple

    Tensor = torch.Tensor

    def lse_shape(q, cu_seqlens_q, layout, return_lse):
        if not return_lse:
            return (0,)
        if cu_seqlens_q is not None:
            return (q.shape[1], q.shape[0])
        if layout == "bshd":
            return (q.shape[0], q.shape[2], q.shape[1])
        return tuple(q.shape[:3])

    @torch.library.custom_op(OPERATOR, mutates_args=())
    def forward(q: Tensor, k: Tensor, v: Tensor, seqused_k: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
                cu_seqlens_k: Optional[Tensor], block_table: Optional[Tensor], max_seqlen_q: Optional[int],
                max_seqlen_k: Optional[int], layout: str, causal: bool, softmax_scale: Optional[float],
                num_splits: Optional[int], window: Optional[List[int]], softcap: float, return_lse: bool,
                deterministic: bool = False, q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                v_descale: Optional[Tensor] = None, attention_chunk: int = 0, sinks: Optional[Tensor] = None,
                sm_margin: int = 0) -> Tuple[Tensor, Tensor]:
        options = (causal, softmax_scale, num_splits, None if window is None else tuple(window), softcap,
                   attention_chunk, sm_margin)
        result = forward_below_autograd((q, k, v, None, None, seqused_k, cu_seqlens_q, cu_seqlens_k, block_table,
                                         q_descale, k_descale, v_descale, sinks), max_seqlen_q, max_seqlen_k, layout,
                                        options, return_lse)
        return result if return_lse else (result, result.new_empty((0,), dtype=torch.float32))

    @forward.register_fake
    def _(q, k, v, seqused_k, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k, layout, causal,
          softmax_scale, num_splits, window, softcap, return_lse, deterministic=False, q_descale=None,
          k_descale=None, v_descale=None, attention_chunk=0, sinks=None, sm_margin=0):
        # The options are checked while tracing (they are constants), the arrays when the call runs.
        _layout(layout)
        _options(causal, softmax_scale, num_splits, None if window is None else tuple(window), softcap,
                 attention_chunk, sm_margin)
        # q's dtype, whatever K/V's (float8_e4m3fn K/V give a 16-bit out),
        # but bfloat16 for float8_e4m3fn queries (as FlashAttention 3's).
        out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],), dtype=_out_dtype(torch, q))
        return out, q.new_empty(lse_shape(q, cu_seqlens_q, layout, return_lse), dtype=torch.float32)

    @torch.library.custom_op(BACKWARD_OPERATOR, mutates_args=())
    def backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                 seqused_k: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                 max_seqlen_q: Optional[int], max_seqlen_k: Optional[int], layout: str, causal: bool,
                 softmax_scale: Optional[float], window: Optional[List[int]], softcap: float,
                 deterministic: bool, attention_chunk: int = 0, sinks: Optional[Tensor] = None,
                 compute_dsinks: bool = False, sm_margin: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        dq, dk, dv, dsinks = gradients(dout, q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, layout, causal, softmax_scale, window, softcap, deterministic,
                                       attention_chunk, sinks, compute_dsinks, sm_margin)
        return dq, dk, dv, q.new_empty((0,), dtype=torch.float32) if dsinks is None else dsinks

    @backward.register_fake
    def _(dout, q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout, causal,
          softmax_scale, window, softcap, deterministic, attention_chunk=0, sinks=None, compute_dsinks=False,
          sm_margin=0):
        # As gradients(): each gradient like its tensor (zeros_like and empty_like give the same strides).
        dsinks = (torch.empty_like(sinks) if compute_dsinks and sinks is not None
                  else q.new_empty((0,), dtype=torch.float32))
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks

    def setup_context(ctx, inputs, output):
        block_table, q, k, v, return_lse = inputs[6], inputs[0], inputs[1], inputs[2], inputs[15]
        if block_table is not None:
            _refuse_unsupported(PAGED_BACKWARD)
        if _quantized_query(torch, q):
            _refuse_unsupported(QUANTIZED_QUERY_BACKWARD)
        if _quantized(torch, k) or _quantized(torch, v):
            _refuse_unsupported(QUANTIZED_BACKWARD)
        if not return_lse:
            raise ValueError("flashcore::forward computes gradients from its lse: call it with return_lse=True "
                             "where q, k, v or sinks requires grad (flashcore.attention does)")
        _keep_for_backward(ctx, inputs, output, SINKS_ARGUMENT)

    def differentiate(ctx, dout, dlse):
        return _differentiate(ctx, dout, torch.ops.flashcore.backward)

    class EagerAttention(torch.autograd.Function):
        """flashcore::forward's autograd formula for eager calls, without
        the dispatcher: its forward is the operator's implementation
        (return_lse=True), its backward flashcore::backward's
        (_backward.gradients), with what the operator's setup_context
        keeps. apply(q, k, v, sinks, rest) takes flashcore::forward's
        arguments, those after v but sinks as one tuple, rest (autograd's
        host time grows with the arguments it inspects, and none of those
        has a gradient; sinks, which may, is its own), checked by
        operator_forward as for the operator."""

        @staticmethod
        def forward(ctx, q, k, v, sinks, rest):
            (seqused_k, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k, layout, causal,
             softmax_scale, num_splits, window, softcap) = rest[:12]
            descales = (rest[14:17] + (None,) * 3)[:3]
            attention_chunk = rest[17] if len(rest) > 17 else 0
            sm_margin = rest[18] if len(rest) > 18 else 0
            options = (causal, softmax_scale, num_splits, None if window is None else tuple(window), softcap,
                       attention_chunk, sm_margin)
            output = forward_below_autograd((q, k, v, None, None, seqused_k, cu_seqlens_q, cu_seqlens_k, block_table)
                                            + descales + (sinks,), max_seqlen_q, max_seqlen_k, layout, options, True)
            _keep_for_backward(ctx, (q, k, v) + rest[:14] + descales + (attention_chunk, sinks, sm_margin), output,
                               EAGER_SINKS_INPUT)
            return output

        @staticmethod
        def backward(ctx, dout, dlse):
            return _differentiate(ctx, dout, gradients)

    forward.register_autograd(differentiate, setup_context=setup_context)
    _registered.append(forward)
    _eager.append(EagerAttention)
    return forward


def _ensure_registered():
    register_torch_ops()
    return True


# Dynamo runs a function marked so at trace time and takes its result as a
# constant, instead of tracing it: registering cannot be traced, and under
# torch.compile the first flashcore call may come before any eager one.
# This is the mark torch.compiler.assume_constant_result sets, set here
# without importing torch.
_ensure_registered._dynamo_marked_constant = True


def _layout_name(layout):
    if isinstance(layout, str):
        return layout.lower()
    return {0: "bhsd", 1: "bshd"}.get(int(layout), str(layout))


# The largest finite float: a Python int beyond it has no float.
_FLOAT_MAX = sys.float_info.max


def _not_int(value):
    return isinstance(value, bool) or not isinstance(value, int)


def _not_real(value):
    return (isinstance(value, bool) or not isinstance(value, (int, float))
            or isinstance(value, int) and not -_FLOAT_MAX <= value <= _FLOAT_MAX)


def _unconvertible(layout, options):
    """Whether flashcore::forward's schema would not take layout and the
    options as they are converted below (int(), float()) unchanged: a layout
    neither a str nor an int, an int option or window bound that is not an
    int (int() would cut 1.5 to 1), a real option that is no real or an int
    beyond any float (float() would raise OverflowError), a bool for either.
    Plain Python that torch.compile traces whether the values are constants
    or symbolic; the values' other checks are the operator's fake
    implementation's, which sees them as they are (attention's checks)."""
    causal, softmax_scale, num_splits, window, softcap, attention_chunk, sm_margin = options
    if window is not None and (not isinstance(window, (tuple, list)) or len(window) != 2
                               or _not_int(window[0]) or _not_int(window[1])):
        return True
    return ((not isinstance(layout, str) and _not_int(layout)) or (num_splits is not None and _not_int(num_splits))
            or (softmax_scale is not None and _not_real(softmax_scale)) or _not_real(softcap)
            or _not_int(attention_chunk) or _not_int(sm_margin))


def _refuse_options(layout, options):
    """Raises attention's error for the layout and options (what
    _unconvertible found: a TypeError or an InvalidArgumentError of
    flashcore's), or returns where they pass (a NumPy scalar, say)."""
    _layout(layout)
    _options(*options)


# Under torch.compile, run as it is, outside the trace: Dynamo cannot build
# the exception in traced code. The values it is called with are constants.
_refuse_options._dynamo_marked_constant = True


def _refuse_unsupported(why):
    """Raises UnsupportedError(why): what a traced or differentiable call
    cannot do (PAGED_BACKWARD, QUANTIZED_BACKWARD, QUANTIZED_QUERY_BACKWARD,
    QUANTIZED_QUERY_SOFTCAP)."""
    raise UnsupportedError(why)


# Under torch.compile, run as it is, outside the trace (Dynamo cannot build
# the exception in traced code). The message is a constant.
_refuse_unsupported._dynamo_marked_constant = True


# (KV_DTYPES, QUERY_DTYPES) as sets of the torch dtypes this torch has, once
# looked up (operator_forward asks on every call).
_fp8 = []


def _fp8_dtypes(torch):
    """The torch dtypes of quantized K/V and of quantized queries."""
    if not _fp8:
        _fp8.append(tuple(frozenset(getattr(torch, name) for name in names if hasattr(torch, name))
                          for names in (KV_DTYPES, QUERY_DTYPES)))
    return _fp8[0]


def _quantized(torch, x):
    """Whether the tensor x holds quantized K/V (a KV_DTYPES dtype)."""
    for name in KV_DTYPES:
        if x.dtype == getattr(torch, name):
            return True
    return False


def _quantized_query(torch, q):
    """Whether the tensor q holds quantized queries (a QUERY_DTYPES dtype:
    fp8 prefill)."""
    for name in QUERY_DTYPES:
        if q.dtype == getattr(torch, name):
            return True
    return False


def _out_dtype(torch, q):
    """The torch dtype of out for queries q: q's, but bfloat16 for fp8
    queries."""
    return getattr(torch, QUANTIZED_OUT_DTYPE) if _quantized_query(torch, q) else q.dtype


def _refuse_quantized_query_dtypes(q_dtype, k_dtype, v_dtype, out_dtype):
    """Raises the error of fp8 queries beside k, v or out of a dtype they
    do not take (dtypes as torch spells them), as the eager call's
    (_params._query_dtypes)."""
    def name(dtype):
        return str(dtype).replace("torch.", "")

    q, k, v = name(q_dtype), name(k_dtype), name(v_dtype)
    if k != v and q in (k, v):
        raise InvalidArgumentError("k has dtype %s but v has %s: with %s queries both must be %s" % (k, v, q, q))
    for which, dtype in (("k", k), ("v", v)):
        if dtype != q:
            raise UnsupportedError("%s has dtype %s but q has %s: fp8 queries take %s k and v only (fp8 prefill: q, "
                                   "k and v all %s, each with its descale); for 16-bit K/V, pass float16 or bfloat16 "
                                   "q" % (which, dtype, q, q, q))
    raise UnsupportedError("out has dtype %s: %s queries give a %s result (as FlashAttention 3's fp8 forward); pass "
                           "a %s out" % (name(out_dtype), q, QUANTIZED_OUT_DTYPE, QUANTIZED_OUT_DTYPE))


# Run as it is under torch.compile, outside the trace, as _refuse_unsupported.
_refuse_quantized_query_dtypes._dynamo_marked_constant = True


def _refuse_not_tensor(value, name, where):
    """Raises the error of a descale factor or of sinks (`name`) that is no
    torch tensor (a Python float, say) given to a call that is the torch
    operator."""
    if isinstance(value, numbers.Number) and name in DESCALE_NAMES:
        refuse_descale_number(value, name)
    raise TypeError("%s must be None or a torch tensor %s, got %s" % (name, where, type(value).__name__))


_refuse_not_tensor._dynamo_marked_constant = True

# Why stream= and workspace= are not taken by an operator call, in its two
# cases: traced, and eager with gradients.
_UNDER_COMPILE = "under torch.compile"
_WITH_GRAD = ("where q, k, v or sinks requires grad (the call is then flashcore::forward's autograd formula, its "
              "backward on torch's current stream)")


def operator_forward(arrays, layout, options, return_lse, stream, workspace, detach, max_seqlen_q, max_seqlen_k,
                     deterministic, differentiable):
    """_attention._forward's call (its arguments: arrays in
    _plan.POINTER_FIELDS order) as flashcore::forward: while torch.compile
    or torch.export traces, and for calls to be differentiated
    (wants_grad). A differentiable call asks the operator for the
    lse, which its autograd formula needs, whether or not the caller
    does; detach=True (or FLASHCORE_DETACH=1) computes from the values of
    inputs that require grad, the result without a gradient path; a
    differentiable call with a paged cache, float8_e4m3fn K/V or
    float8_e4m3fn queries is refused, as are what fp8 queries do not take
    (16-bit K/V, softcap, an out= that is not bfloat16).
    out= and lse= are copied into (an operator that writes its arguments
    would need them functionalized anyway; out then has the gradient path).
    The descales (arrays 9 to 11) and sinks (the last) are torch tensors
    or None. differentiable: wants_grad(q, k, v, detach, sinks) where the
    caller has it.
    Every step here is host time of every eager training call (issue 58):
    torch is looked up once, and the common case's checks come first."""
    q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, block_table = arrays[:9]
    descales, sinks = arrays[9:12], arrays[12]
    torch = imported("torch")
    where = _UNDER_COMPILE if torch.compiler.is_compiling() else _WITH_GRAD
    if stream is not None:
        if where is _UNDER_COMPILE:
            raise TypeError("stream= is not taken under torch.compile: flashcore::forward runs on torch's current "
                            "stream (put the compiled call under torch.cuda.stream(...) instead)")
        raise TypeError("stream= is not taken %s: it runs on torch's current stream, as its backward does (put the "
                        "call under torch.cuda.stream(...) instead)" % where)
    if workspace is not None:
        raise TypeError("workspace= is not taken %s: flashcore::forward allocates its workspace from torch's caching "
                        "allocator" % where)
    if _unconvertible(layout, options):
        _refuse_options(layout, options)
    tensor = torch.Tensor
    descales_given = descales[0] is not None or descales[1] is not None or descales[2] is not None
    if descales_given:
        for x, name in zip(descales, DESCALE_NAMES):
            if x is not None and not isinstance(x, tensor):
                _refuse_not_tensor(x, name, where)
    if sinks is not None and not isinstance(sinks, tensor):
        _refuse_not_tensor(sinks, "sinks", where)
    if not _eager:
        _ensure_registered()  # (run outside the trace under torch.compile, which cannot trace registering)
    if differentiable is None:
        differentiable = wants_grad(q, k, v, detach, sinks)
    quantized_kv, quantized_queries = _fp8_dtypes(torch)
    quantized_query = q.dtype in quantized_queries
    if differentiable:
        if block_table is not None:
            _refuse_unsupported(PAGED_BACKWARD)
        for x, name in ((k, "k"), (v, "v"), (seqused_k, "seqused_k"), (cu_seqlens_q, "cu_seqlens_q"),
                        (cu_seqlens_k, "cu_seqlens_k")):
            if x is not None and not isinstance(x, tensor):
                raise TypeError("gradients are computed for torch tensors: %s is a %s (pass detach=True, or run under "
                                "torch.no_grad(), to compute from the values alone)" % (name, type(x).__name__))
        if quantized_query:
            _refuse_unsupported(QUANTIZED_QUERY_BACKWARD)
        if k.dtype in quantized_kv or v.dtype in quantized_kv:
            _refuse_unsupported(QUANTIZED_BACKWARD)
    elif requires_grad(q, k, v, sinks):
        q, k, v = q.detach(), k.detach(), v.detach()
        sinks = None if sinks is None else sinks.detach()
    causal, softmax_scale, num_splits, window, softcap, attention_chunk, sm_margin = options
    if quantized_query:
        # What the eager call refuses of fp8 queries (_params._query_dtypes,
        # check_quantized_options), refused here too: traced, out= would
        # otherwise be copied into whatever its dtype.
        if k.dtype != q.dtype or v.dtype != q.dtype or out is not None and out.dtype != _out_dtype(torch, q):
            _refuse_quantized_query_dtypes(q.dtype, k.dtype, v.dtype, None if out is None else out.dtype)
        if softcap:
            _refuse_unsupported(QUANTIZED_QUERY_SOFTCAP)
    # The descales, attention_chunk, sinks and sm_margin where given (a call
    # without them is traced as before they existed).
    chunk_sinks_or_margin = attention_chunk or sinks is not None or sm_margin
    rest = (seqused_k, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k, _layout_name(layout),
            bool(causal), None if softmax_scale is None else float(softmax_scale), num_splits,
            None if window is None else [int(window[0]), int(window[1])], float(softcap),
            bool(return_lse) or lse is not None or differentiable, bool(deterministic))
    rest += descales if descales_given or chunk_sinks_or_margin else ()
    if differentiable and where is _WITH_GRAD:
        # Eager differentiable calls: EagerAttention (the same formula, less host time); traced ones: the operator.
        if chunk_sinks_or_margin:
            rest += (int(attention_chunk), int(sm_margin))
        result, result_lse = _eager[0].apply(q, k, v, sinks, rest)
    else:
        if chunk_sinks_or_margin:
            rest += (int(attention_chunk), sinks) + ((int(sm_margin),) if sm_margin else ())
        result, result_lse = torch.ops.flashcore.forward(q, k, v, *rest)
    if out is not None:
        out.copy_(result)
        result = out
    if lse is not None:
        lse.copy_(result_lse)
        result_lse = lse
    return (result, result_lse) if return_lse else result


def traced_full_int32(q, cu_seqlens_q, count):
    """attention_with_kvcache's int cache_seqlens as an int32 [B] tensor,
    while tracing."""
    torch = imported("torch")
    batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    return torch.full((batch,), count, dtype=torch.int32, device=q.device)
