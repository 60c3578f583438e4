"""Where a call's host time goes: per-call host time of the compiled function (fast path, and the
checked path it takes on a new layout) beside SDPA, and a cProfile of the fast path.

    python bench/host_profile.py gqa_dc 32768

Host time is measured with calls issued back to back (the GPU only shows when it is the slower
side); the profile lists the Python functions by their own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from cases import Case  # noqa: E402
from peers import PEERS  # noqa: E402


def host_us(thunk, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        thunk()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / calls * 1e6


def one_call_us(thunk) -> float:
    """Host µs of one call of `thunk` issued on an idle GPU (synchronised before and after)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    thunk()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6


def kernel_times(thunk, reps: int = 20) -> list[tuple[str, float, int]]:
    """(kernel, device µs per call, launches per call) of the CUDA kernels `reps` calls of `thunk`
    run (torch.profiler), L2 flushed before each call, slowest first; one call first to warm up."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    thunk()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            thunk()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    rows = [(e.key, e.device_time_total / reps, e.count // reps) for e in prof.key_averages()
            if e.device_type == cuda]
    return sorted(rows, key=lambda r: -r[1])


def schedule_times(compiled, alt_id: int, schedules, feed: dict, label: str, reps: int = 5):
    """kernel_times of alternative `alt_id` of `compiled` run on `feed` with `schedules` (its kernels'),
    or None, printed with `label`, where Triton refuses them (a tile that does not fit is a result too)."""
    prog = compiled.pin(alt_id)
    prog.schedules["cuda"] = list(schedules)
    try:
        return kernel_times(lambda: prog.run(feed), reps=reps)
    except Exception as e:  # (any compile or launch failure of the schedule)
        print(f"{label}: failed {type(e).__name__}: {str(e)[:200]}", flush=True)
        return None


def profile_calls(thunk, calls: int, top: int, sort: str = "tottime") -> None:
    """cProfile of `calls` calls of `thunk`, the functions by their own time (or by `sort`)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        thunk()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats(sort).print_stats(top)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("op")
    ap.add_argument("L", type=int)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--profile", choices=["bound", "checked"], default="bound", help="which path cProfile follows")
    args = ap.parse_args(argv)
    from neptune_eq.frontend import capture

    case = Case(args.op, args.L)
    q, k, v = case.inputs("cuda")
    fn = capture(case.fn, q, k, v).compile()
    fn(q, k, v)  # compiles, checks and binds this layout
    checked = fn.compiled.run
    captured = fn.captured
    rows = {
        "neptune_eq (bound)": lambda: fn(q, k, v),
        "neptune_eq (checked path)": lambda: captured.outputs(checked(captured.inputs(q, k, v), fn._out_dtypes)),
    }
    for name in ("sdpa",):
        thunk, _ = PEERS[name](case, q, k, v)
        if thunk is not None:
            rows[name] = thunk
    for name, thunk in rows.items():
        thunk()
        print(f"{case.label} {name}: host {host_us(thunk, args.calls):.1f} µs/call")
    path = rows[f"neptune_eq ({args.profile}{' path' if args.profile == 'checked' else ''})"]
    profile_calls(path, args.calls, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
