"""Per-tensor e4m3 quantization, shared by the benchmarks that time e4m3 inputs (compare.py,
serving_cases.py, paged_layouts.py): one place for the factor's rule, so each bench quantizes the same
bytes. torch is imported where it is used, as the benches import it only when they run."""

# e4m3's largest finite value: the per-tensor descale factor is amax / this, so the tensor's largest
# element lands on the format's largest.
E4M3_MAX = 448.0


def descale_for(amax):
    """The float32 descale factor of values whose largest magnitude is amax (a tensor, any shape):
    amax / 448, an all-zero group getting float32's smallest normal rather than 0, so dividing by it
    stays finite."""
    import torch
    return (amax.float() / E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny)


def quantize_e4m3(t):
    """(e4m3 tensor, its float32 descale factor as a 1-element tensor): one factor for the whole tensor
    (descale_for), as vLLM's per-tensor k_scale and v_scale."""
    import torch
    descale = descale_for(t.abs().amax()).reshape(1)
    return (t.float() / descale).to(torch.float8_e4m3fn), descale
