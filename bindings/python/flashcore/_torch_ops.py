"""flashcore's forward as a PyTorch operator, flashcore::forward: a
torch.library.custom_op with a fake (meta) implementation, so that
torch.compile and torch.export trace calls of flashcore.attention (and of
attention_varlen, attention_with_kvcache, sdpa, flash_attn_func) into their
graphs, and CUDA graphs capture them.

Nothing here imports torch: the operator is registered when flashcore is
imported after torch, else on first use (register_torch_ops()). Eager calls
do not go through it: they call the library directly, which is faster
(_planning.prepare and _launch.launch); the operator's implementation is
that same call."""

import sys

from ._arguments import _layout, _options
from ._launch import launch
from ._modes import refuse_grad
from ._planning import prepare

OPERATOR = "flashcore::forward"
_registered = []


def register_torch_ops():
    """Registers the torch operator flashcore::forward (once; needs torch)
    and returns it; torch.ops.flashcore.forward is then the same operator.

    flashcore::forward(q, k, v, seqused_k, cu_seqlens_q, cu_seqlens_k,
    block_table, max_seqlen_q, max_seqlen_k, layout, causal, softmax_scale,
    num_splits, window, softcap, return_lse) -> (out, lse) is
    flashcore.attention's forward with every option spelled out (window a
    list [left, right] or None), on torch's current stream; lse is an empty
    tensor unless return_lse. It has no autograd formula."""
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
                num_splits: Optional[int], window: Optional[List[int]], softcap: float,
                return_lse: bool) -> Tuple[Tensor, Tensor]:
        options = (causal, softmax_scale, num_splits, None if window is None else tuple(window), softcap)
        # detach: the callers (traced_forward) refused or detached inputs that require grad already.
        call = prepare(q, k, v, layout, options, None, None, return_lse, None, None, True, seqused_k=seqused_k,
                       cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, cu_seqlens_k=cu_seqlens_k,
                       max_seqlen_k=max_seqlen_k, block_table=block_table)
        result = launch(call)
        return result if return_lse else (result, result.new_empty((0,), dtype=torch.float32))

    @forward.register_fake
    def _(q, k, v, seqused_k, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k, layout, causal,
          softmax_scale, num_splits, window, softcap, return_lse):
        # The options are checked while tracing (they are constants), the arrays when the call runs.
        _layout(layout)
        _options(causal, softmax_scale, num_splits, None if window is None else tuple(window), softcap)
        out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))
        return out, q.new_empty(lse_shape(q, cu_seqlens_q, layout, return_lse), dtype=torch.float32)

    _registered.append(forward)
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
    causal, softmax_scale, num_splits, window, softcap = options
    if window is not None and (not isinstance(window, (tuple, list)) or len(window) != 2
                               or _not_int(window[0]) or _not_int(window[1])):
        return True
    return ((not isinstance(layout, str) and _not_int(layout)) or (num_splits is not None and _not_int(num_splits))
            or (softmax_scale is not None and _not_real(softmax_scale)) or _not_real(softcap))


def _refuse_options(layout, options):
    """Raises attention's error for the layout and options (what
    _unconvertible found: a TypeError or an InvalidArgumentError of
    flashcore's), or returns where they pass (a NumPy scalar, say)."""
    _layout(layout)
    _options(*options)


# Under torch.compile, run as it is, outside the trace: Dynamo cannot build
# the exception in traced code. The values it is called with are constants.
_refuse_options._dynamo_marked_constant = True


def traced_forward(q, k, v, *, layout, options, out, lse, return_lse, stream, workspace, detach, seqused_k=None,
                   cu_seqlens_q=None, max_seqlen_q=None, cu_seqlens_k=None, max_seqlen_k=None, block_table=None):
    """_attention._forward while torch.compile or torch.export traces: the
    call as flashcore::forward. out= and lse= are copied into (an operator
    that writes its arguments would need them functionalized anyway)."""
    if stream is not None:
        raise TypeError("stream= is not taken under torch.compile: flashcore::forward runs on torch's current "
                        "stream (put the compiled call under torch.cuda.stream(...) instead)")
    if workspace is not None:
        raise TypeError("workspace= is not taken under torch.compile: flashcore::forward allocates its workspace "
                        "from torch's caching allocator")
    if _unconvertible(layout, options):
        _refuse_options(layout, options)
    _ensure_registered()
    torch = sys.modules["torch"]
    if refuse_grad(q, k, v, detach):
        q, k, v = q.detach(), k.detach(), v.detach()
    causal, softmax_scale, num_splits, window, softcap = options
    result, result_lse = torch.ops.flashcore.forward(
        q, k, v, seqused_k, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k, _layout_name(layout),
        bool(causal), None if softmax_scale is None else float(softmax_scale), num_splits,
        None if window is None else [int(window[0]), int(window[1])], float(softcap),
        bool(return_lse) or lse is not None)
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
    torch = sys.modules["torch"]
    batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    return torch.full((batch,), count, dtype=torch.int32, device=q.device)
