"""flashcore: fused scaled-dot-product attention on NVIDIA GPUs.

A pure-Python binding of the libflashcore C library through ctypes: no
compiler and no particular deep-learning framework are needed to install or
import it, and it works on PyTorch tensors, CuPy arrays and anything with
__cuda_array_interface__ or DLPack.

    import flashcore
    out = flashcore.attention(q, k, v, causal=True)
    out = flashcore.sdpa(q, k, v, is_causal=True)        # torch.nn.functional.scaled_dot_product_attention's
    out = flashcore.flash_attn_func(q, k, v, causal=True)   # FlashAttention's, [B, S, H, D]
    out = flashcore.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)   # packed
    out = flashcore.attention_with_kvcache(q, k_pages, v_pages, cache_seqlens, block_table=block_table)   # paged
    out, lse = flashcore.merge_states(partial_out, partial_lse)   # parts of the keys -> all
    flashcore.supported_head_dims()   # [(head_dim, head_dim_v), ...] of this build

On torch tensors that require grad the results are differentiable:
autograd computes the gradients of q, k and v with the library's backward
pass (flashcore_backward), in eager mode and under torch.compile alike.

The library is looked for inside this package (the flashcore-attention
wheel carries it), then in $FLASHCORE_LIBRARY, then where pkg-config and the
dynamic loader find it (see flashcore.open_library()). The ctypes declarations in flashcore._ffi are generated
from include/flashcore.h.

Under torch.compile and torch.export the calls are the torch operator
flashcore::forward, with flashcore::backward as its autograd formula
(registered at import where torch is imported first, else at the first
traced or differentiated call), traced without graph breaks.
`python -m flashcore` says which library is loaded and what the GPUs run.
"""

__version__ = "0.9.0"

import sys as _sys

from . import _ffi
from ._attention import (attention, attention_varlen, attention_with_kvcache, check_params, forward_params,
                         supported_head_dims)
from ._backward import backward_params, check_backward_params
from ._dropin import flash_attn_func, sdpa
from ._errors import (
    CudaError,
    FlashcoreError,
    InternalError,
    InvalidArgumentError,
    LibraryError,
    MisalignedError,
    NoDeviceError,
    OutOfMemoryError,
    UnsupportedError,
    WorkspaceTooSmallError,
)
from ._library import Library, library, open_library
from ._merge import merge_params, merge_states
from ._plan import Handle, get_handle, release_workspaces
from ._torch_ops import register_torch_ops

Status = _ffi.Status
Dtype = _ffi.Dtype
Layout = _ffi.Layout
ForwardParams = _ffi.flashcore_forward_params
BackwardParams = _ffi.flashcore_backward_params
MergeParams = _ffi.flashcore_merge_params
MAX_NUM_SPLITS = _ffi.FLASHCORE_MAX_NUM_SPLITS
HEADER_VERSION_NUMBER = _ffi.FLASHCORE_VERSION_NUMBER


def library_version() -> str:
    """The loaded library's version string ("MAJOR.MINOR.PATCH")."""
    return library().version


def status_string(status: int) -> str:
    """The library's name for a status (an int), e.g. "invalid argument";
    "unknown status" for an int that is none, one beyond a C int too."""
    return library().status_string(status)


__all__ = [
    "__version__",
    "attention",
    "attention_varlen",
    "attention_with_kvcache",
    "merge_states",
    "sdpa",
    "flash_attn_func",
    "register_torch_ops",
    "forward_params",
    "backward_params",
    "merge_params",
    "check_params",
    "check_backward_params",
    "supported_head_dims",
    "release_workspaces",
    "Handle",
    "get_handle",
    "Library",
    "library",
    "open_library",
    "library_version",
    "status_string",
    "Status",
    "Dtype",
    "Layout",
    "ForwardParams",
    "BackwardParams",
    "MergeParams",
    "MAX_NUM_SPLITS",
    "HEADER_VERSION_NUMBER",
    "FlashcoreError",
    "InvalidArgumentError",
    "UnsupportedError",
    "MisalignedError",
    "WorkspaceTooSmallError",
    "NoDeviceError",
    "CudaError",
    "OutOfMemoryError",
    "InternalError",
    "LibraryError",
]

# torch.ops.flashcore.forward exists as soon as both are imported (a
# program exported with it loads); where torch comes later, the first
# traced call registers it.
if "torch" in _sys.modules:
    register_torch_ops()
