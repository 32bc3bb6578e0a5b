"""The backward pass: backward_params and check_backward_params (the
low-level calls, as forward_params and check_params are the forward's),
and gradients(), the body of the torch operator flashcore::backward, which
the autograd formula of flashcore::forward calls (_torch_ops): it takes
the gradient of out and gives those of q, k and v (and of sinks, where
asked). A repeated call is
served by the compiled path (_fastcall.c's backward(), without running
Python); the others are planned and queued as the forward's calls are
(_plan.prepare_backward, _plan.launch_backward), and their plan is
then given to the compiled path for the next such call."""

import sys
from typing import Optional, Tuple, Union

from . import _ffi, _plan
from ._arrays import Array
from ._library import BACKWARD_PARAMS_FROM, library, struct_ref
from ._plan import backward_in_full, launch_backward, prepare_backward

# The C API's alignment of pointers and strides, in bytes.
ALIGNMENT = _ffi.FLASHCORE_ALIGNMENT

def backward_params(q: Array, k: Array, v: Array, out: Array, dout: Array, lse: Array, dq: Array, dk: Array,
                    dv: Array, *, causal: bool = False, softmax_scale: Optional[float] = None,
                    layout: Union[str, int] = "bhsd", window: Optional[Tuple[int, int]] = None,
                    softcap: float = 0.0, seqused_k: Optional[Array] = None, cu_seqlens_q: Optional[Array] = None,
                    cu_seqlens_k: Optional[Array] = None, max_seqlen_q: Optional[int] = None,
                    max_seqlen_k: Optional[int] = None, deterministic: bool = False, attention_chunk: int = 0,
                    sinks: Optional[Array] = None, dsinks: Optional[Array] = None,
                    sm_margin: int = 0) -> "_ffi.flashcore_backward_params":
    """A flashcore.BackwardParams for these arrays (pointers, sizes,
    strides), for Handle.backward_workspace_size, Handle.backward and
    check_backward_params. q, k, v, out and lse are the forward call's
    (lse required: the forward's return_lse), with its options (causal,
    softmax_scale, layout, window, softcap, seqused_k, cu_seqlens_q/_k,
    max_seqlen_q/_k, attention_chunk, sinks and sm_margin as for attention()
    and attention_varlen()); dout is the gradient of out, and dq, dk and dv
    receive those of q, k and v (each of its tensor's shape and q's dtype,
    any strides the C API takes); dsinks, where given (a float32 [Hq]
    array; it needs sinks), receives that of sinks. deterministic:
    bitwise-identical dq from run to run (dk and dv are either way). The
    arrays must outlive every use of the result."""
    arrays = (q, k, v, out, dout, lse, dq, dk, dv, seqused_k, cu_seqlens_q, cu_seqlens_k, sinks, dsinks)
    params, _ = backward_in_full(arrays, layout, (causal, softmax_scale, window, softcap, attention_chunk, sm_margin),
                                 deterministic, max_seqlen_q, max_seqlen_k)
    return params

def check_backward_params(params: "_ffi.flashcore_backward_params") -> None:
    """flashcore_backward_check: raises what flashcore_backward would for
    these parameters (a flashcore.BackwardParams) before looking at the
    GPU."""
    lib = library()
    lib.check(lib.cdll.flashcore_backward_check(struct_ref(params, _ffi.flashcore_backward_params, "params",
                                                           BACKWARD_PARAMS_FROM)))

def _readable(torch, x):
    """x as the C API reads a tensor (head_dim contiguous, the other strides
    multiples of ALIGNMENT bytes, the address aligned), else a contiguous
    copy of it. Autograd hands the backward whatever gradient the next
    operation gave: the expanded ones of a sum(), a slice of a larger
    one."""
    step = max(ALIGNMENT // x.element_size(), 1)
    shape, strides = x.shape, x.stride()
    if (x.data_ptr() % ALIGNMENT == 0 and (strides[-1] == 1 or shape[-1] <= 1)
            and all(stride % step == 0 or size <= 1 for size, stride in zip(shape[:-1], strides[:-1]))):
        return x
    return x.clone(memory_format=torch.contiguous_format)  # a fresh, aligned allocation (contiguous() may keep x)

def gradient_like(torch, x, packed):
    """A tensor for x's gradient: x's shape, dtype and (dense) strides.
    Packed tensors' rows outside every sequence are not written by the
    library, and get no gradient: zeros."""
    return torch.zeros_like(x) if packed else torch.empty_like(x)

def _no_compiled_path():
    return False

# () -> the compiled path's module (_fastpath.load), or False where there is
# none: flashcore._attention's, set when it is imported (the one module both
# directions use).
compiled_path = _no_compiled_path

def gradients(dout, q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout,
              causal, softmax_scale, window, softcap, deterministic, attention_chunk=0, sinks=None,
              compute_dsinks=False, sm_margin=0):
    """(dq, dk, dv, dsinks) for the gradient dout of a forward call's out
    (flashcore::backward's implementation): torch tensors on one CUDA
    device, the forward's q, k, v, out, lse and sinks, queued on torch's
    current stream. dsinks, the gradient of sinks, is a new float32 [Hq]
    tensor with compute_dsinks (which needs sinks), else None.
    deterministic: the call's, or'ed with
    torch.are_deterministic_algorithms_enabled() as the backward runs.
    sm_margin: the SMs the call leaves to kernels on other streams (the
    forward's, or a ring step's own). (Positional: flashcore::backward's
    arguments, in its order.)"""
    if compute_dsinks and sinks is None:
        raise ValueError("compute_dsinks needs sinks: the gradient of sinks is that of the forward call's sinks")
    fast = compiled_path()
    if fast:
        grads = fast.backward(dout, q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, layout, causal, softmax_scale, window, softcap, deterministic,
                              attention_chunk, sinks, compute_dsinks, sm_margin)
        if grads is not None:
            return grads
    torch = sys.modules["torch"]
    given = dout
    dout = _readable(torch, dout)
    dq = gradient_like(torch, q, cu_seqlens_q is not None)
    dk = gradient_like(torch, k, cu_seqlens_k is not None)
    dv = gradient_like(torch, v, cu_seqlens_k is not None)
    # Written whole by the library (a sum over every row of each head).
    dsinks = torch.empty_like(sinks) if compute_dsinks else None
    deterministic = bool(deterministic) or torch.are_deterministic_algorithms_enabled()
    params, plan = prepare_backward((q, k, v, out, dout, lse, dq, dk, dv, seqused_k, cu_seqlens_q, cu_seqlens_k,
                                     sinks, dsinks), layout,
                                    (causal, softmax_scale, window, softcap, attention_chunk, sm_margin),
                                    deterministic, max_seqlen_q, max_seqlen_k)
    launch_backward(params, plan)
    if plan.empty and dsinks is not None:
        dsinks.zero_()  # no rows (batch_size 0): the library writes nothing, and the sum over none is 0
    if fast and dout is given and not plan.empty:
        _plan.remember_backward(fast, (dout, q, k, v, out, lse, seqused_k, cu_seqlens_q, cu_seqlens_k,
                                           max_seqlen_q, max_seqlen_k, layout, causal, softmax_scale, window,
                                           softcap, deterministic, attention_chunk, sinks, compute_dsinks, sm_margin),
                                   plan)
    return dq, dk, dv, dsinks
