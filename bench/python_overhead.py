"""Host time of one flashcore.attention call repeated on one shape: what
the Python binding costs the CPU per call (issue 18: at most 10 us on
torch tensors).

Three measurements:

  prepare  everything the call does before it asks for a handle and
           queues the kernel (flashcore._plan.plan_call: reading the
           arrays, the call cache, the options, the params struct, out and
           lse), on __cuda_array_interface__ arrays at made-up device
           addresses with out= given, or on torch CUDA tensors with
           --inputs torch (calls on torch tensors take a quicker path of
           their own, which --mode stub and --mode call time). The library
           is the real one (the first call goes through
           flashcore_forward_params_init and flashcore_forward_check);
           nothing is queued, so it runs on a machine without a GPU.
  stub     flashcore.attention on torch CPU tensors, served as a repeated
           call on CUDA tensors is (the compiled path, flashcore/_fastcall.c,
           and the Python path with FLASHCORE_FASTCALL=0), up to the C call,
           which is replaced by a stub that queues nothing: everything the
           binding does on the host, out's allocation included (from torch's
           CPU allocator here). Then a training step's attention (issue 58):
           torch.autograd.grad(flashcore.attention(q, k, v), (q, k, v), dout)
           on inputs that require grad, the forward and the backward served
           the same way with both C calls stubbed (autograd's own work, the
           allocations of out, lse, dq, dk, dv and the backward's workspace
           included), at the "train" shape; beside it the same step through
           the torch operators (torch.ops.flashcore.forward and its formula,
           the route eager steps took before issue 58) and through a
           torch.autograd.Function whose forward and backward only allocate
           their results (what autograd alone costs). Needs torch, no GPU.
  call     flashcore.attention end to end on torch CUDA tensors (the
           kernel queued on the current stream; out allocated, or given
           with out=), through the compiled path where it is built and
           through the Python path: the host time of calls made in bursts
           short enough (--burst) for the GPU's launch queue to take them
           without blocking, the GPU synchronized between bursts, outside
           the timing. Then the same calls with the C call (flashcore_forward)
           replaced by a stub: the binding's own share. For comparison it
           also times flashcore_forward alone through Handle.forward (params
           built once), torch's own scaled_dot_product_attention and a bare
           torch.empty of the output's size the same way. Needs torch and a
           GPU.

    python3 bench/python_overhead.py                 # prepare, no GPU needed
    python3 bench/python_overhead.py --mode stub     # torch, no GPU needed
    python3 bench/python_overhead.py --mode call     # on a GPU, with torch

Set FLASHCORE_LIBRARY (or install the library). The flashcore package is
the one Python finds (PYTHONPATH, pip), else this checkout's: --mode call
also times an older package that has no flashcore.sdpa (the row is then
left out), for before-and-after numbers. Prints the median and the best
of --repeats runs of --calls calls, in microseconds per call: of wall
time, or with --clock cpu of this process's CPU time (time.process_time),
which on a machine busy with other work counts only this loop's own.
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

try:
    import flashcore
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
    import flashcore
from flashcore import _attention, _plan

# What the timings read (--clock).
clock = time.perf_counter

# A decode step of a grouped-query model: the calls whose kernels are short
# enough that the host's part matters.
SHAPES = {
    "decode": dict(batch=1, heads_q=32, heads_kv=8, seqlen_q=1, seqlen_k=4096, head_dim=64),
    "prefill": dict(batch=1, heads_q=32, heads_kv=8, seqlen_q=1024, seqlen_k=1024, head_dim=64),
    # A small training layer (issue 58's first shape), where the host's part
    # of a step is most of it.
    "train": dict(batch=1, heads_q=8, heads_kv=8, seqlen_q=256, seqlen_k=256, head_dim=64),
}


class DeviceArray:
    """A __cuda_array_interface__ array (version 3) at a given address: what
    Numba and other producers hand over. Never read: nothing is queued."""

    def __init__(self, shape, address):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": "<f2", "data": (address, False),
                                         "strides": None, "version": 3, "stream": None}


def per_call_us(run, calls, repeats):
    """Median and best microseconds per call of `run(calls)` over repeats."""
    run(calls)  # warm-up: the first call takes the full path and fills the cache
    times = []
    for _ in range(repeats):
        times.append(run(calls) / calls * 1e6)
    return statistics.median(times), min(times)


def shapes_of(shape):
    b, hq, hkv, sq, sk, d = (shape[k] for k in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim"))
    return (b, hq, sq, d), (b, hkv, sk, d)


def prepare_runner(q, k, v, out, causal):
    options = (causal, None, None, None, 0.0, 0, 0)

    def run(calls):
        start = clock()
        for _ in range(calls):
            _plan.plan_call((q, k, v, out) + (None,) * (len(_plan.POINTER_FIELDS) - 4), "bhsd", options, False, None, None, None, None)
        return clock() - start

    return run


def measure_prepare(args, shape):
    q_shape, kv_shape = shapes_of(shape)
    if args.inputs == "torch":
        import torch
        q = torch.randn(q_shape, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(kv_shape, device="cuda", dtype=torch.float16) for _ in range(2))
        out = None
    else:
        base, span = 0x7F0000000000, 1 << 34  # 16-byte aligned, far apart; never dereferenced
        q, k, v, out = (DeviceArray(s, base + i * span) for i, s in enumerate((q_shape, kv_shape, kv_shape, q_shape)))
    try:
        timing = per_call_us(prepare_runner(q, k, v, out, args.causal), args.calls, args.repeats)
    except flashcore.InvalidArgumentError as e:
        if args.inputs == "torch":
            raise
        # A GPU's driver is asked about the addresses, which are made up.
        sys.exit("%s\n--inputs cai runs on a machine without a GPU; with one, use --inputs torch or --mode call" % e)
    return [("flashcore prepare (%s)" % args.inputs, timing)]


def burst_runner(torch, one_call, burst):
    """Times `calls` calls in bursts of `burst`, synchronizing in between."""

    def run(calls):
        total = 0.0
        done = 0
        while done < calls:
            n = min(burst, calls - done)
            torch.cuda.synchronize()
            start = clock()
            for _ in range(n):
                one_call()
            total += clock() - start
            done += n
        torch.cuda.synchronize()
        return total

    return run


def measure_call(args, shape):
    import torch
    if not torch.cuda.is_available():
        sys.exit("--mode call needs torch with a CUDA GPU (--mode prepare runs without one)")
    q_shape, kv_shape = shapes_of(shape)
    q = torch.randn(q_shape, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(kv_shape, device="cuda", dtype=torch.float16) for _ in range(2))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    group = shape["heads_q"] != shape["heads_kv"]
    out = torch.empty_like(q)
    cases = [("flashcore.attention", lambda: flashcore.attention(q, k, v, causal=args.causal)),
             ("flashcore.attention(out=)", lambda: flashcore.attention(q, k, v, causal=args.causal, out=out))]
    if hasattr(flashcore, "sdpa"):
        cases.append(("flashcore.sdpa", lambda: flashcore.sdpa(q, k, v, is_causal=args.causal, enable_gqa=group)))
    if hasattr(flashcore, "forward_params"):
        # The library's own share: flashcore_forward called through ctypes on params built once.
        params = flashcore.forward_params(q, k, v, out, causal=args.causal)
        handle = flashcore.get_handle(q.device.index)
        workspace_bytes = handle.workspace_size(params)
        workspace = torch.empty(max(workspace_bytes, 1), dtype=torch.uint8, device=q.device)
        stream = torch.cuda.current_stream().cuda_stream
        cases.append(("flashcore_forward (C)", lambda: handle.forward(params, workspace.data_ptr(), workspace_bytes,
                                                                      stream)))
    cases += [
        ("torch sdpa", lambda: sdpa(q, k, v, is_causal=args.causal, enable_gqa=group)),
        ("torch.empty (out's size)", lambda: torch.empty(q_shape, device="cuda", dtype=torch.float16)),
    ]
    with torch.inference_mode():
        rows = [(name, per_call_us(burst_runner(torch, call, args.burst), args.calls, args.repeats))
                for name, call in cases]
        rows += binding_rows(lambda call: per_call_us(burst_runner(torch, call, args.burst), args.calls,
                                                      args.repeats), cases[:2])
    return rows


def binding_rows(time_call, cases):
    """Rows of the binding's own host time: `cases` (name, call) through
    the Python path (FLASHCORE_FASTCALL=0's), then through each path with
    the C call replaced by a stub (the compiled path: a C function that
    returns success; the Python path: Handle.forward_unchecked, its
    ctypes call, replaced by nothing). Leaves the compiled path as found."""
    rows = []
    compiled = getattr(_attention, "_fast", None)
    if compiled:
        _attention._fast = False
        try:
            rows += [(name + " (Python path)", time_call(call)) for name, call in cases]
        finally:
            _attention._fast = compiled
        _plan.load(_plan.torch_api(), _plan._kept_workspaces, compiled.stub_forward_address())
        compiled.clear()
        try:
            rows += [(name + " w/o C call", time_call(call)) for name, call in cases]
        finally:
            _attention._fast = False  # the Python path's rows below
    handle_type = flashcore.Handle
    if hasattr(handle_type, "forward_unchecked"):
        queue = handle_type.forward_unchecked
        handle_type.forward_unchecked = lambda *unused: None
        try:
            rows += [(name + (" (Python path)" if compiled else "") + " w/o C call", time_call(call))
                     for name, call in cases]
        finally:
            handle_type.forward_unchecked = queue
            if compiled:
                _attention._fast = None  # configured again, with flashcore_forward, by the next call
    return rows


def measure_stub(args, shape):
    """--mode stub: the plans a CUDA call would get, on CPU tensors (the
    params' bytes do not matter: the stub reads none of them)."""
    import torch
    q_shape, kv_shape = shapes_of(shape)
    q = torch.randn(q_shape, dtype=torch.float16)
    k, v = (torch.randn(kv_shape, dtype=torch.float16) for _ in range(2))
    out = torch.empty_like(q)
    options = (args.causal, None, None, None, 0.0, 0, 0)
    api = _plan.torch_api()
    api.current_stream = lambda device: 0  # torch's CUDA calls need a GPU
    api.capturing = lambda: False
    template = bytes(ctypes.sizeof(flashcore._ffi.flashcore_forward_params))

    class FakeHandle:
        value = 1

        def forward_unchecked(self, *unused):
            pass

    flashcore._plan._thread_handles.cache = {0: FakeHandle()}
    _plan._handles[0] = FakeHandle()
    for given in (None, out):
        key = _plan.plan_of((q, k, v, given, None, None, None, None, None), "bhsd", options, False, None, None,
                                None)[0]
        plan = _plan._Plan()
        plan.template, plan.out_like_q, plan.out_shape, plan.lse_shape = template, given is None, None, None
        plan.device, plan.plain_torch, plan.workspace_bytes, plan.torch_device = 0, True, {0: 0}, q.device
        plan.dtype, plan.lse_dtype = q.dtype, torch.float32
        _plan._plans[key] = plan
    cases = [("flashcore.attention", lambda: flashcore.attention(q, k, v, causal=args.causal)),
             ("flashcore.attention(out=)", lambda: flashcore.attention(q, k, v, causal=args.causal, out=out))]
    rows = []
    found = _plan.find()
    compiled = found and _plan.load(api, _plan._kept_workspaces, found.stub_forward_address())
    if compiled:
        _attention._fast = compiled
        for name, call in cases:
            call()  # the Python path's call, which gives the compiled path the plan
            rows.append((name + " (compiled) w/o C call", per_call_us(timed_loop(call), args.calls, args.repeats)))
    _attention._fast = False
    rows += [(name + " (Python path) w/o C call", per_call_us(timed_loop(call), args.calls, args.repeats))
             for name, call in cases]
    rows.append(("torch.empty_like(q) (CPU)", per_call_us(timed_loop(lambda: torch.empty_like(q)), args.calls,
                                                            args.repeats)))
    return rows + measure_stub_training(args, api, FakeHandle, found)


def measure_stub_training(args, api, handle_type, found):
    """--mode stub's training rows: one eager forward+backward through
    autograd on CPU tensors that require grad, the C calls stubbed (the
    backward's plan given to the compiled path as its Python path would
    give it, and kept for the Python path under its key)."""
    import torch
    shape = SHAPES["train"]
    q_shape, kv_shape = shapes_of(shape)
    q = torch.randn(q_shape, dtype=torch.float16).requires_grad_(True)
    k, v = (torch.randn(kv_shape, dtype=torch.float16).requires_grad_(True) for _ in range(2))
    dout = torch.randn(q_shape, dtype=torch.float16)
    causal = args.causal
    options = (causal, None, None, None, 0.0, 0, 0)
    forward_template = bytes(ctypes.sizeof(flashcore._ffi.flashcore_forward_params))
    backward_template = bytes(ctypes.sizeof(flashcore._ffi.flashcore_backward_params))
    backward_workspace = 4 * shape["heads_q"] * shape["head_dim"] * shape["batch"] * shape["seqlen_q"]

    def backward_workspace_size(self, params):
        return backward_workspace

    handle_type.backward_unchecked = lambda self, *unused: None
    handle_type.backward_workspace_size = backward_workspace_size
    # The forward's plan: a differentiable call is planned on q, k and v as
    # they are below autograd (detached), with its lse.
    detached = (q.detach(), k.detach(), v.detach())
    key = _plan.plan_of(detached + (None,) * (len(_plan.POINTER_FIELDS) - 3), "bhsd", options, True, None, None, None)[0]
    plan = _plan._Plan()
    plan.template, plan.out_like_q, plan.out_shape = forward_template, True, None
    plan.lse_shape = (shape["batch"], shape["heads_q"], shape["seqlen_q"])
    plan.device, plan.plain_torch, plan.workspace_bytes, plan.torch_device = 0, True, {0: 0}, q.device
    plan.dtype, plan.lse_dtype = q.dtype, torch.float32
    _plan._plans[key] = plan

    def keep_backward_plan(out, lse):
        """The backward's plan under the key of this step's call (the
        gradients' arrays are fresh each call, with the same key; out is
        saved as the output of the autograd node, which requires grad)."""
        arrays = (q, k, v, out.requires_grad_(True), dout, lse, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        arrays += (None,) * (len(_plan.BACKWARD_POINTER_FIELDS) - len(arrays))
        key = _plan.backward_key(arrays, "bhsd", (causal, None, None, 0.0, 0, 0), False, None, None)[0]
        plan = _plan._BackwardPlan()
        plan.template, plan.empty, plan.device, plan.torch_device = backward_template, False, 0, q.device
        plan.workspace_bytes = backward_workspace
        _plan._backward_plans[key] = plan

    def step():
        torch.autograd.grad(flashcore.attention(q, k, v, causal=causal), (q, k, v), dout)

    def operator_step():
        out, _ = torch.ops.flashcore.forward(q, k, v, None, None, None, None, None, None, "bhsd", causal, None, None,
                                             None, 0.0, True, False)
        torch.autograd.grad(out, (q, k, v), dout)

    class Allocating(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.mark_non_differentiable(lse)
            ctx.set_materialize_grads(False)
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):
            q, k, v, out, lse = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def autograd_alone():
        torch.autograd.grad(Allocating.apply(q, k, v)[0], (q, k, v), dout)

    with torch.no_grad():
        out, lse = flashcore.attention(q.detach(), k.detach(), v.detach(), causal=causal, return_lse=True)
    keep_backward_plan(out, lse)
    name = "train fwd+bwd"
    rows = []
    compiled = found and _plan.load(api, _plan._kept_workspaces, found.stub_forward_address(),
                                        getattr(found, "stub_backward_address", lambda: None)())
    if compiled:
        _attention._fast = compiled
        step()  # the Python paths' calls, which give the compiled path both plans
        rows.append((name + " (compiled) w/o C calls", per_call_us(timed_loop(step), args.calls, args.repeats)))
        rows.append((name + " via torch.ops (compiled)", per_call_us(timed_loop(operator_step), args.calls,
                                                                     args.repeats)))
    _attention._fast = False
    rows.append((name + " (Python path) w/o C calls", per_call_us(timed_loop(step), args.calls, args.repeats)))
    rows.append((name + " via torch.ops (Python)", per_call_us(timed_loop(operator_step), args.calls,
                                                               args.repeats)))
    rows.append(("autograd.Function, allocs only", per_call_us(timed_loop(autograd_alone), args.calls,
                                                              args.repeats)))
    return rows


def timed_loop(one_call):
    def run(calls):
        start = clock()
        for _ in range(calls):
            one_call()
        return clock() - start

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["prepare", "stub", "call"], default="prepare")
    parser.add_argument("--inputs", choices=["cai", "torch"], default="cai",
                        help="prepare's arrays: __cuda_array_interface__ objects (no GPU needed) or torch CUDA tensors")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="decode")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--burst", type=int, default=200, help="calls between two synchronizations (--mode call)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    shape = SHAPES[args.shape]
    lib = flashcore.library()
    print("flashcore package at %s; libflashcore %s (%s); shape %s%s; %d calls x %d"
          % (os.path.dirname(flashcore.__file__), lib.version, lib.path, args.shape, " causal" if args.causal else "",
             args.calls, args.repeats))
    print("clock: %s" % ("this process's CPU time" if args.clock == "cpu" else "wall"))
    measure = {"prepare": measure_prepare, "stub": measure_stub, "call": measure_call}[args.mode]
    rows = measure(args, shape)
    print("%-40s %10s %10s" % ("us per call", "median", "best"))
    for name, (median, best) in rows:
        print("%-40s %10.2f %10.2f" % (name, median, best))


if __name__ == "__main__":
    main()
