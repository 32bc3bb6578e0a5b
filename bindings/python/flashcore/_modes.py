"""The modes of torch that decide how a call runs: whether torch.compile or
torch.export is tracing it (the call is then the torch operator
flashcore::forward, _torch_ops), and grad mode with inputs that require
grad (refused: flashcore computes the forward pass only). Nothing here
imports torch."""

import os
import sys

from ._arrays import is_torch
from ._errors import NoBackwardError

DETACH_ENV = "FLASHCORE_DETACH"


def tracing() -> bool:
    """Whether torch.compile or torch.export is tracing the calling code
    (never where torch is not imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def refuse_grad(q, k, v, detach):
    """Raises NoBackwardError where q, k or v is a torch tensor that requires
    grad while grad mode is on: the result would silently have no gradient
    path. detach=True, or FLASHCORE_DETACH=1 in the environment, says the
    caller knows (inference code that leaves requires_grad on). Returns
    whether an input requires grad that detach lets through."""
    culprits = [name for name, x in (("q", q), ("k", k), ("v", v)) if is_torch(x) and x.requires_grad]
    if not culprits or not sys.modules["torch"].is_grad_enabled():
        return False
    if detach or os.environ.get(DETACH_ENV) == "1":
        return True
    _raise_no_backward(tuple(culprits))


def _raise_no_backward(culprits):
    raise NoBackwardError(
        "%s %s grad, but flashcore computes the forward pass only: the result would have no gradient path. Run "
        "inference under torch.no_grad() or torch.inference_mode(), pass detach=True (or set %s=1) to compute "
        "from the values alone, or train with torch.nn.functional.scaled_dot_product_attention"
        % (culprits[0] if len(culprits) == 1 else "%s and %s" % (", ".join(culprits[:-1]), culprits[-1]),
           "requires" if len(culprits) == 1 else "require", DETACH_ENV))


# Dynamo cannot build the exception in traced code, but raises it from
# there (inside its own error, the message kept) where the function is run
# at trace time: the mark torch.compiler.assume_constant_result sets, set
# here without importing torch.
_raise_no_backward._dynamo_marked_constant = True
