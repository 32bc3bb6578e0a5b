"""The modes of torch that decide how a call runs: whether torch.compile or
torch.export is tracing it, and whether it must be differentiable (grad
mode on, an input that requires grad): either way the call is the torch
operator flashcore::forward (_torch_ops), whose autograd formula is the
backward pass. Nothing here imports torch."""

import os

from ._arrays import imported, is_torch

DETACH_ENV = "FLASHCORE_DETACH"


def tracing() -> bool:
    """Whether torch.compile or torch.export is tracing the calling code
    (never where torch is not imported)."""
    torch = imported("torch")  # not sys.modules: see _arrays.imported
    return torch is not None and torch.compiler.is_compiling()


def requires_grad(q, k, v):
    """Whether q, k or v is a torch tensor that requires grad while grad mode
    is on: what autograd would differentiate."""
    torch = imported("torch")
    if torch is None:
        return False
    tensor = torch.Tensor
    for x in (q, k, v):
        if isinstance(x, tensor) and x.requires_grad:
            return torch.is_grad_enabled()
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
