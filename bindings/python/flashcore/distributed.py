"""Attention across GPUs: context parallelism on torch.distributed (NCCL).

Each rank holds a slice of the sequence (q, k and v of the same tokens); the
K/V slices travel around the ranks and each rank's partial results, one per
slice of keys, are combined with flashcore.merge_states (the (out, lse)
merge of flashcore_merge_states). Two algorithms:

  ring_attention        K/V pass from rank to rank (rank r sends to r + 1
                        and receives from r - 1), one slice a step, beside
                        the attention on the slice in hand: each step's
                        kernels leave sm_margin SMs to NCCL's, whose
                        transfer of the next slice is queued first
                        (docs/context-parallelism.md); no rank ever holds
                        more than two K/V slices. For long prefill and
                        training-length sequences.
  all_gather_attention  every rank gathers all K/V at once, then attends:
                        one collective, more memory; for decode and short
                        contexts, where a ring's steps would each be too
                        short to hide a transfer.

Sharding. Without a causal mask any split of the sequence into equal
slices, one per rank in rank order, works. With one, a contiguous split
would leave the first rank (whose queries see few keys) idle while the last
works: causal calls take the load-balanced "zig-zag" split instead. The
sequence is cut into 2 x world_size chunks and rank r holds chunks r and
2 x world_size - 1 - r, concatenated; every rank then does the same work.
shard() and unshard() convert between a full sequence and these slices.

ring_attention is differentiable: with q, k or v requiring grad, the
backward pass runs the ring again with flashcore's backward (each step's dq
stays on its rank; the dK and dV of each slice travel with it and end on
the rank that holds it). Keep NVLink multicast off on shared hosts
(NCCL_NVLS_ENABLE=0).

The planning functions (zigzag_chunks, ring_schedule, shard, unshard) and
emulate_ring_attention, which runs the whole algorithm for N virtual ranks
in one process, need neither NCCL nor a GPU to be imported; the attention
itself runs on CUDA tensors.
"""

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

from ._errors import InvalidArgumentError, UnsupportedError

__all__ = [
    "RING_SM_MARGIN",
    "RingStep",
    "all_gather_attention",
    "emulate_ring_attention",
    "emulate_ring_gradients",
    "ring_attention",
    "ring_schedule",
    "shard",
    "unshard",
    "zigzag_chunks",
]


# SMs each ring step's kernels leave to NCCL's, whose transfer of the next
# K/V slice (and in the backward, of the dK/dV accumulators) then runs beside
# the step's attention (ring_attention's sm_margin). A margin costs the
# attention its share of the SMs for the whole step; 2 SMs carry a 128k
# prefill's transfer within the step. On 2 H200s the transfer it hides is
# 1% of the call, and margins of 0, 1 and 2 measured alike within run-to-run
# noise, 8 and more slower (docs/log/context-parallelism.md, 2026-11-30);
# on 4, where the wait was 7% of a step, it is the margin's to gain.
RING_SM_MARGIN = 2

# ---------------------------------------------------------------------------
# Planning (no GPU, no NCCL)
# ---------------------------------------------------------------------------

def zigzag_chunks(rank: int, world_size: int) -> Tuple[int, int]:
    """The two chunks (of 2 x world_size) of the sequence that `rank` holds
    under the causal (zig-zag) split: (rank, 2 x world_size - 1 - rank)."""
    _check_rank(rank, world_size)
    return rank, 2 * world_size - 1 - rank


class RingStep(NamedTuple):
    """What a rank computes at one step of the ring.

    source: the rank whose K/V slice is in hand.
    query_rows: "all" the rank's queries, or "second" its second chunk only
        (zig-zag: the first chunk sees none of the slice).
    key_rows: "all" the slice's keys, or "first" its first chunk only.
    causal: whether the step needs the causal mask (only the rank's own
        slice does: every other slice is wholly before or wholly after each
        query chunk that uses it)."""
    source: int
    query_rows: str
    key_rows: str
    causal: bool


def ring_schedule(rank: int, world_size: int, causal: bool) -> List[RingStep]:
    """The ring's steps for `rank`: at step i it holds the K/V slice of rank
    (rank - i) mod world_size. Causal calls assume the zig-zag split.

    With rank r holding chunks (r, 2N-1-r) and the slice of rank s holding
    chunks (s, 2N-1-s), N = world_size:
      s == r: both chunks against both, causally (the concatenated local
          sequence's plain causal mask is the global one);
      s < r: chunk s precedes both query chunks, chunk 2N-1-s follows both:
          all queries against the slice's first chunk, no mask;
      s > r: both of the slice's chunks follow chunk r and precede chunk
          2N-1-r: the second query chunk against the whole slice, no mask.
    """
    _check_rank(rank, world_size)
    steps = []
    for i in range(world_size):
        source = (rank - i) % world_size
        if not causal:
            steps.append(RingStep(source, "all", "all", False))
        elif source == rank:
            steps.append(RingStep(source, "all", "all", True))
        elif source < rank:
            steps.append(RingStep(source, "all", "first", False))
        else:
            steps.append(RingStep(source, "second", "all", False))
    return steps


def _seq_dim(layout: str) -> int:
    if layout == "bhsd":
        return 2
    if layout == "bshd":
        return 1
    raise InvalidArgumentError("layout must be 'bhsd' or 'bshd', not %r" % (layout,))


def shard(x: Any, rank: int, world_size: int, *, causal: bool, layout: str = "bhsd") -> Any:
    """Rank `rank`'s slice of the full-sequence tensor x ([B, H, S, D], or
    [B, S, H, D] with layout="bshd"): the zig-zag pair of chunks for causal
    calls (S a multiple of 2 x world_size), else the rank-th of world_size
    equal slices (S a multiple of world_size). Returns a new contiguous
    tensor."""
    dim = _seq_dim(layout)
    _check_rank(rank, world_size)  # (before torch is imported: arguments are checked first)
    import torch
    pieces = 2 * world_size if causal else world_size
    if x.shape[dim] % pieces != 0:
        raise InvalidArgumentError("the sequence (%d) must split into %d equal chunks (%s, world_size %d)" % (
            x.shape[dim], pieces, "zig-zag: 2 x world_size" if causal else "world_size", world_size))
    chunks = x.chunk(pieces, dim=dim)
    if not causal:
        return chunks[rank].contiguous()
    first, second = zigzag_chunks(rank, world_size)
    return torch.cat([chunks[first], chunks[second]], dim=dim).contiguous()


def _shards(x: Any, world_size: int, causal: bool, layout: str) -> List[Any]:
    """Every rank's shard of x, in rank order."""
    return [shard(x, r, world_size, causal=causal, layout=layout) for r in range(world_size)]


def unshard(slices: Sequence[Any], *, causal: bool, layout: str = "bhsd") -> Any:
    """The full-sequence tensor from every rank's slice, in rank order (the
    inverse of shard)."""
    import torch
    dim = _seq_dim(layout)
    world_size = len(slices)
    if not causal:
        return torch.cat(list(slices), dim=dim)
    chunks = [None] * (2 * world_size)
    for rank, piece in enumerate(slices):
        first, second = zigzag_chunks(rank, world_size)
        chunks[first], chunks[second] = piece.chunk(2, dim=dim)
    return torch.cat(chunks, dim=dim)


def _heads(t, layout: str) -> int:
    return t.shape[1] if layout == "bhsd" else t.shape[2]


def _pack(k, v):
    """K and V as one contiguous buffer: a slice's one message a step."""
    import torch
    return torch.cat([k.reshape(-1), v.reshape(-1)]).contiguous()


def _unpack(buffer, k, v):
    """Views of buffer (as _pack made it, or its gradients) shaped like k
    and v."""
    return buffer[:k.numel()].view(k.shape), buffer[k.numel():].view(v.shape)


def _is_whole(value) -> bool:
    """An int that is not a bool (True is 1 to isinstance, not a rank)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_rank(rank: int, world_size: int) -> None:
    if not (_is_whole(world_size) and world_size >= 1):
        raise InvalidArgumentError("world_size must be an int >= 1, not %r" % (world_size,))
    if not (_is_whole(rank) and 0 <= rank < world_size):
        raise InvalidArgumentError("rank must be an int in [0, %d), not %r" % (world_size, rank))


# ---------------------------------------------------------------------------
# One step, and the merge (one GPU)
# ---------------------------------------------------------------------------

class _Partials:
    """Each step's (out, lse) for the rank's queries, stacked for one
    merge_states at the end. Rows a step does not compute keep out = 0 and
    lse = -inf, which the merge gives no weight."""

    def __init__(self, q, v, steps: int, layout: str):
        import torch
        dim = _seq_dim(layout)
        b, s, h = q.shape[0], q.shape[dim], _heads(q, layout)
        out_shape = list(q.shape)
        out_shape[-1] = v.shape[-1]
        self.out = torch.zeros([steps] + out_shape, dtype=q.dtype, device=q.device)
        self.lse = torch.full((steps, b, h, s), float("-inf"), dtype=torch.float32, device=q.device)
        self.dim = dim

    def merge(self, return_lse: bool):
        from ._merge import merge_states
        layout = "bhsd" if self.dim == 2 else "bshd"
        return merge_states(self.out, self.lse, layout=layout, return_lse=return_lse)


def _half(x, which: str, dim: int):
    if which == "all":
        return x
    first, second = x.chunk(2, dim=dim)
    return first if which == "first" else second


def _run_step(step: RingStep, q, k, v, partials: _Partials, index: int, softmax_scale, layout: str,
              sm_margin: int = 0) -> None:
    """Attention of this rank's queries against the K/V slice in hand, as
    `step` says, into partials[index], leaving sm_margin SMs to other
    streams."""
    from ._attention import attention
    dim = partials.dim
    q_rows = _half(q, step.query_rows, dim)
    out_rows = _half(partials.out[index], step.query_rows, dim)
    k_rows = _half(k, step.key_rows, dim)
    v_rows = _half(v, step.key_rows, dim)
    _, lse = attention(q_rows, k_rows, v_rows, causal=step.causal, softmax_scale=softmax_scale, layout=layout,
                       out=out_rows, return_lse=True, sm_margin=sm_margin)
    _half(partials.lse[index], step.query_rows, 2).copy_(lse)


def _check_tensors(q, k, v, layout: str, causal: bool, differentiable: bool = False) -> None:
    import torch
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError("%s must be a torch.Tensor (flashcore.distributed runs on torch.distributed)"
                                       % name)
        if not differentiable and t.requires_grad and torch.is_grad_enabled():
            raise UnsupportedError("%s requires grad: this function has no backward pass (ring_attention has one; "
                                   "emulate_ring_gradients computes the ring's gradients); run it under "
                                   "torch.no_grad() or pass detached tensors" % name)
    dim = _seq_dim(layout)
    if k.shape[dim] != q.shape[dim] or v.shape[dim] != q.shape[dim]:
        raise InvalidArgumentError("q, k and v must hold the same tokens on each rank (sequence lengths %d, %d, %d)"
                                   % (q.shape[dim], k.shape[dim], v.shape[dim]))
    if causal and q.shape[dim] % 2 != 0:
        raise InvalidArgumentError("a causal call takes the zig-zag split (two equal chunks a rank; see shard()): "
                                   "the local sequence (%d) must be even" % q.shape[dim])


# ---------------------------------------------------------------------------
# Across ranks
# ---------------------------------------------------------------------------

def _group_info(group):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError("torch.distributed is not initialised: call "
                                   "torch.distributed.init_process_group('nccl') first")
    return dist.get_rank(group), dist.get_world_size(group)


def _neighbours(group, rank: int, world_size: int) -> Tuple[int, int]:
    """The global ranks a ring over `group` sends to (rank + 1) and receives
    from (rank - 1)."""
    import torch.distributed as dist
    to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    return to_global((rank + 1) % world_size), to_global((rank - 1) % world_size)


def ring_attention(q: Any, k: Any, v: Any, group: Any = None, *, causal: bool = False,
                   softmax_scale: Optional[float] = None, layout: str = "bhsd",
                   return_lse: bool = False, sm_margin: int = RING_SM_MARGIN) -> Union[Any, Tuple[Any, Any]]:
    """Attention of this rank's queries against every rank's keys, with K/V
    passed around a ring over `group` (default: the world), one slice a
    step.

    q, k, v: this rank's slice ([B, H, S_local, D], or [B, S_local, H, D]
        with layout="bshd"), as flashcore.attention takes them (GQA,
        D != Dv); CUDA tensors on the rank's device. Causal calls take the
        zig-zag split (shard()); the others any equal split in rank order.
        Every rank must pass the same shapes.
    causal: the causal mask over the whole (unsharded) sequence.
    Returns this rank's out (q's shape with v's head dim, q's dtype), and
    its float32 lse [B, H, S_local] with return_lse.

    sm_margin: SMs each step's kernels leave to NCCL (the attention's
        sm_margin, as flashcore.attention takes it): the transfer of the
        next slice is queued before the step's attention and runs beside
        it on those SMs (the forward's last step, with no transfer beside
        it, takes every SM). 0 queues each transfer after the step's
        attention instead, so that nothing runs beside it (the attention
        then holds every SM, and a transfer queued first would take SMs that
        its persistent CTAs wait for). The default is RING_SM_MARGIN.

    Each of the world_size steps is one flashcore.attention call on the
    slice in hand (ring_schedule says which rows and keys) while NCCL sends
    that slice on and receives the next; the steps' results are merged
    once at the end with flashcore.merge_states. Differentiable: where q, k
    or v requires grad (and grad mode is on), out's backward pass runs the
    ring again with flashcore's backward (the same sm_margin, each step's
    transfers beside its kernels) and returns this rank's dq, dk and dv;
    the lse has no gradient.
    """
    import torch
    # _ring checks the tensors (inside the autograd Function's forward too,
    # where grad mode is off).
    _check_sm_margin(sm_margin)
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v)):
        out, lse = _ring_function().apply(q, k, v, group, causal, softmax_scale, layout, sm_margin)
        return (out, lse) if return_lse else out
    return _ring(q, k, v, group, causal, softmax_scale, layout, return_lse, None, sm_margin)


def _check_sm_margin(sm_margin) -> None:
    """An int >= 0 (the library checks that it leaves an SM)."""
    if not (_is_whole(sm_margin) and sm_margin >= 0):
        raise InvalidArgumentError("sm_margin must be an int >= 0 (SMs each ring step leaves to NCCL; 0: transfers "
                                   "after each step's attention), not %r" % (sm_margin,))


_RING_FUNCTION = None


def _ring_function():
    """ring_attention's torch.autograd.Function (made on first use: the
    module imports without torch)."""
    global _RING_FUNCTION
    if _RING_FUNCTION is None:
        import torch

        class RingAttention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, group, causal, softmax_scale, layout, sm_margin):
                out, lse = _ring(q, k, v, group, causal, softmax_scale, layout, True, None, sm_margin)
                ctx.save_for_backward(q, k, v, out, lse)
                ctx.options = (group, causal, softmax_scale, layout, sm_margin)
                ctx.mark_non_differentiable(lse)
                return out, lse

            @staticmethod
            def backward(ctx, dout, _dlse):
                q, k, v, out, lse = ctx.saved_tensors
                dq, dk, dv = _ring_backward(q, k, v, out, lse, dout.contiguous(), *ctx.options)
                return dq, dk, dv, None, None, None, None, None

        _RING_FUNCTION = RingAttention
    return _RING_FUNCTION


def _exchange(group, send, receive, send_to, recv_from):
    """Queues the send of each buffer in `send` to send_to and the receive
    of the one at the same place in `receive` (of its size) from recv_from,
    pair by pair (one batch: NCCL runs them together, on its own stream,
    after what the current stream has queued so far); returns the works to
    wait for."""
    import torch.distributed as dist
    ops = []
    for out, into in zip(send, receive):
        ops += [dist.P2POp(dist.isend, out, send_to, group), dist.P2POp(dist.irecv, into, recv_from, group)]
    return dist.batch_isend_irecv(ops)


def _wait(works) -> None:
    """Makes the current stream wait for the works (NCCL: without blocking
    the host), if any. Each work is waited for once: a second wait on a
    finished gloo work never returns."""
    for work in works or ():
        work.wait()


def _ring(q, k, v, group, causal, softmax_scale, layout, return_lse, timeline, sm_margin=RING_SM_MARGIN):
    """ring_attention; timeline (a list, or None) gets per step the CUDA
    events (step start, attention done, next slice received) on the current
    stream, for bench/context_parallel.py's per-step timeline."""
    import torch
    import torch.distributed as dist
    _check_tensors(q, k, v, layout, causal)
    rank, world_size = _group_info(group)
    steps = ring_schedule(rank, world_size, causal)
    partials = _Partials(q, v, world_size, layout)
    # K and V travel as one buffer (one message a step), double-buffered:
    # the next slice arrives in one while the other is in use.
    kv = _pack(k, v)
    spare = torch.empty_like(kv)
    send_to, recv_from = _neighbours(group, rank, world_size)
    # With a margin, each transfer is queued before the step's attention and
    # runs beside it on the SMs the attention leaves. Without one it is
    # queued after: the attention kernel holds every SM while it runs (one
    # persistent CTA each), and a transfer queued first whose peer was not
    # ready yet kept SMs spinning under it, which then ran up to twice as
    # long (4 H200s, 128k causal: step 0 took 25 ms against 13).
    beside = sm_margin > 0
    with torch.no_grad():
        for index, step in enumerate(steps):
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if timeline is not None else None
            if marks:
                marks[0].record()
            more = index + 1 < world_size
            works = _exchange(group, [kv], [spare], send_to, recv_from) if more and beside else None
            _run_step(step, q, *_unpack(kv, k, v), partials, index, softmax_scale, layout,
                      sm_margin if works else 0)
            if marks:
                marks[1].record()
            if more and not beside:
                works = _exchange(group, [kv], [spare], send_to, recv_from)
            if more:
                _wait(works)
                kv, spare = spare, kv
            if marks:
                marks[2].record()
                timeline.append(marks)
        return partials.merge(return_lse)


def _step_grads(step: RingStep, q, k, v, out, lse, dout, dq, softmax_scale, layout: str, sm_margin: int = 0):
    """One step's gradients (flashcore's backward over the rows and keys
    `step` names, with the whole call's out and lse: P and dO.O are those
    of the merged result, leaving sm_margin SMs to other streams): dq's
    added into the float32 accumulator dq (the rank's queries); returns
    the slice's (dk, dv) as _add_slice_grads takes them."""
    from ._backward import gradients
    dim = _seq_dim(layout)
    rows = lambda t: _half(t, step.query_rows, dim)
    lse_rows = _half(lse, step.query_rows, 2).contiguous()
    dq_step, dk_step, dv_step, _ = gradients(rows(dout), rows(q), _half(k, step.key_rows, dim),
                                             _half(v, step.key_rows, dim), rows(out), lse_rows, None, None, None,
                                             None, None, layout, step.causal, softmax_scale, None, 0.0, False,
                                             sm_margin=sm_margin)
    rows(dq).add_(dq_step)
    return dk_step, dv_step


def _add_slice_grads(step: RingStep, grads, dk, dv, layout: str) -> None:
    """Adds a step's (dk, dv) (_step_grads') into the float32 accumulators
    dk, dv of the slice in hand."""
    dim = _seq_dim(layout)
    _half(dk, step.key_rows, dim).add_(grads[0])
    _half(dv, step.key_rows, dim).add_(grads[1])


def _ring_backward(q, k, v, out, lse, dout, group, causal, softmax_scale, layout, sm_margin=RING_SM_MARGIN):
    """ring_attention's backward: the ring again, each step adding its dq
    into the rank's and its dK, dV into the float32 accumulators that travel
    with the slice; after the last step one more hop brings each slice's
    accumulators to the rank that holds the slice.

    With a margin, the transfers run beside the kernels: the next K/V slice
    is queued before the step's backward, and the accumulators of the slice
    in hand (which the previous rank sent after its step) are waited for
    only once the step's gradients are computed, then sent on beside the
    next step. Without one, each step's transfers are queued after it."""
    import torch
    rank, world_size = _group_info(group)
    steps = ring_schedule(rank, world_size, causal)
    send_to, recv_from = _neighbours(group, rank, world_size)
    beside = sm_margin > 0
    with torch.no_grad():
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = _pack(k, v)
        spare = torch.empty_like(kv)
        # The accumulators of the slice in hand, and the buffer the next
        # slice's arrive in: dkv starts as the rank's own slice's (step 0).
        dkv = torch.zeros(kv.numel(), dtype=torch.float32, device=kv.device)
        dspare = torch.empty_like(dkv)
        grads_works = None  # the accumulators' transfer in flight
        for index, step in enumerate(steps):
            more = index + 1 < world_size
            kv_works = _exchange(group, [kv], [spare], send_to, recv_from) if more and beside else None
            grads = _step_grads(step, q, *_unpack(kv, k, v), out, lse, dout, dq, softmax_scale, layout, sm_margin)
            if index > 0:
                _wait(grads_works)  # the previous rank's accumulators of this slice, now in dspare
                dkv, dspare = dspare, dkv
            _add_slice_grads(step, grads, *_unpack(dkv, k, v), layout)
            if more and not beside:
                # One batch, waited for below with the next slice.
                kv_works, grads_works = _exchange(group, [dkv, kv], [dspare, spare], send_to, recv_from), None
            elif world_size > 1:
                grads_works = _exchange(group, [dkv], [dspare], send_to, recv_from)
            if more:
                _wait(kv_works)
                kv, spare = spare, kv
        if world_size > 1:
            _wait(grads_works)  # the last hop: this rank's slice's accumulators, in dspare
            dkv = dspare
        dk, dv = _unpack(dkv, k, v)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def all_gather_attention(q: Any, k: Any, v: Any, group: Any = None, *, causal: bool = False,
                         softmax_scale: Optional[float] = None, layout: str = "bhsd",
                         return_lse: bool = False) -> Union[Any, Tuple[Any, Any]]:
    """As ring_attention, but every rank first gathers all K/V (one
    all_gather over `group`), then attends: causal calls (zig-zag split) as
    two flashcore.attention calls, one per query chunk, against the keys
    up to its end; the others as one call. No merge. For decode and short
    contexts, where a ring's step is too short to be worth its transfer."""
    import torch
    import torch.distributed as dist
    _check_tensors(q, k, v, layout, causal)
    rank, world_size = _group_info(group)
    with torch.no_grad():
        kv = _pack(k, v)
        gathered = torch.empty((world_size, kv.numel()), dtype=kv.dtype, device=kv.device)
        dist.all_gather_into_tensor(gathered, kv, group=group)
        k_slices, v_slices = zip(*(_unpack(gathered[r], k, v) for r in range(world_size)))
        k_full = unshard(k_slices, causal=causal, layout=layout)
        v_full = unshard(v_slices, causal=causal, layout=layout)
        return _attend_gathered(q, k_full, v_full, rank, world_size, causal, softmax_scale, layout, return_lse)


def _attend_gathered(q, k_full, v_full, rank, world_size, causal, softmax_scale, layout, return_lse):
    import torch
    from ._attention import attention
    dim = _seq_dim(layout)
    if not causal:
        return attention(q, k_full, v_full, softmax_scale=softmax_scale, layout=layout, return_lse=return_lse)
    # Zig-zag: query chunk c (of 2 x world_size) sees keys [0, (c + 1) x
    # chunk), causally; attention's bottom-right alignment puts its last
    # query on its last key.
    chunk = q.shape[dim] // 2
    out_shape = list(q.shape)
    out_shape[-1] = v_full.shape[-1]
    out = torch.empty(out_shape, dtype=q.dtype, device=q.device)
    lse = None
    if return_lse:
        lse = torch.empty((q.shape[0], _heads(q, layout), q.shape[dim]), dtype=torch.float32, device=q.device)
    for half, c in enumerate(zigzag_chunks(rank, world_size)):
        keys = (c + 1) * chunk
        q_rows = q.narrow(dim, half * chunk, chunk)
        result = attention(q_rows, k_full.narrow(dim, 0, keys), v_full.narrow(dim, 0, keys), causal=True,
                           softmax_scale=softmax_scale, layout=layout, out=out.narrow(dim, half * chunk, chunk),
                           return_lse=return_lse)
        if return_lse:
            lse.narrow(2, half * chunk, chunk).copy_(result[1])
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------
# The algorithm for N virtual ranks in one process (tests, and a check of a
# setup before it goes to several GPUs)
# ---------------------------------------------------------------------------

def emulate_ring_attention(q: Any, k: Any, v: Any, world_size: int, *, causal: bool = False,
                           softmax_scale: Optional[float] = None, layout: str = "bhsd",
                           return_lse: bool = False) -> Union[Any, Tuple[Any, Any]]:
    """ring_attention's arithmetic for world_size virtual ranks on one GPU:
    the full-sequence q, k, v are sharded (shard()), each virtual rank runs
    its ring_schedule against the others' slices and merges its partial
    results with merge_states, and the ranks' outputs are put back in
    sequence order (unshard()). The same steps and merge as across GPUs,
    without the transfers: the result is what world_size GPUs compute."""
    import torch
    _check_tensors(q, k, v, layout, False)
    with torch.no_grad():
        qs, ks, vs = (_shards(t, world_size, causal, layout) for t in (q, k, v))
        _check_tensors(qs[0], ks[0], vs[0], layout, causal)
        outs, lses = [], []
        for rank in range(world_size):
            steps = ring_schedule(rank, world_size, causal)
            partials = _Partials(qs[rank], vs[rank], world_size, layout)
            for index, step in enumerate(steps):
                _run_step(step, qs[rank], ks[step.source], vs[step.source], partials, index, softmax_scale, layout)
            result = partials.merge(return_lse=True)
            outs.append(result[0])
            lses.append(result[1])
        out = unshard(outs, causal=causal, layout=layout)
        if not return_lse:
            return out
        return out, unshard(lses, causal=causal, layout="bhsd")


def emulate_ring_gradients(q: Any, k: Any, v: Any, dout: Any, world_size: int, *, causal: bool = False,
                           softmax_scale: Optional[float] = None, layout: str = "bhsd") -> Tuple[Any, Any, Any]:
    """The gradients (dq, dk, dv) of ring_attention for the output gradient
    dout, for world_size virtual ranks on one GPU: the forward of
    emulate_ring_attention, then each virtual rank's backward steps (the
    same as ring_attention's backward, without the transfers), back in
    sequence order."""
    import torch
    _check_tensors(q, k, v, layout, False)
    with torch.no_grad():
        out, lse = emulate_ring_attention(q, k, v, world_size, causal=causal, softmax_scale=softmax_scale,
                                          layout=layout, return_lse=True)
        qs, ks, vs, outs, douts = (_shards(t, world_size, causal, layout) for t in (q, k, v, out, dout))
        lses = _shards(lse, world_size, causal, "bhsd")
        dqs, dks, dvs = ([torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in ts]
                         for ts in (qs, ks, vs))
        for rank in range(world_size):
            for step in ring_schedule(rank, world_size, causal):
                s = step.source
                grads = _step_grads(step, qs[rank], ks[s], vs[s], outs[rank], lses[rank], douts[rank], dqs[rank],
                                    softmax_scale, layout)
                _add_slice_grads(step, grads, dks[s], dvs[s], layout)
        return tuple(unshard([g.to(t.dtype) for g in gs], causal=causal, layout=layout)
                     for gs, t in ((dqs, q), (dks, k), (dvs, v)))
