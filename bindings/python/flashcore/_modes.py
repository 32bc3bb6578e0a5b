"""The modes of torch that decide how a call runs: whether torch.compile or
torch.export is tracing it, and whether it must be differentiable (grad
mode on, an input that requires grad): either way the call is the torch
operator flashcore::forward (_torch_ops), whose autograd formula is the
backward pass. Nothing here imports torch."""

import os
import sys

from ._arrays import is_torch

DETACH_ENV = "FLASHCORE_DETACH"


# The torch module once a call has seen it imported. A global, which dynamo
# reads as a constant: a sys.modules lookup that dynamo traces fails
# ("dictionary changed size during iteration") when an import elsewhere
# changes sys.modules meanwhile, as torch.compile's own lazy imports do.
_torch = sys.modules.get("torch")


def _torch_module():
    """torch, if it is imported (looked up until it is)."""
    global _torch
    if _torch is None:
        _torch = sys.modules.get("torch")
    return _torch


def tracing() -> bool:
    """Whether torch.compile or torch.export is tracing the calling code
    (never where torch is not imported)."""
    torch = _torch if _torch is not None else _torch_module()
    return torch is not None and torch.compiler.is_compiling()


def requires_grad(q, k, v):
    """Whether q, k or v is a torch tensor that requires grad while grad mode
    is on: what autograd would differentiate."""
    for x in (q, k, v):
        if is_torch(x) and x.requires_grad:
            return _torch_module().is_grad_enabled()
    return False


def wants_grad(q, k, v, detach):
    """Whether the call must give a result autograd can differentiate
    (requires_grad()), unless detach=True, or FLASHCORE_DETACH=1 in the
    environment, says to compute from the values alone (inference code that
    leaves requires_grad on, and wants neither the graph nor the lse that
    a differentiable call keeps for the backward pass)."""
    if detach or not requires_grad(q, k, v):
        return False
    return os.environ.get(DETACH_ENV) != "1"
