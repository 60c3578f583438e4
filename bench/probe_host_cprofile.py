"""Where the time of a sweep row's step goes (bench/sweep_unseen.py, sweep_fresh.py, sweep_third.py):
for neptune_eq and the eager peer, do_bench's median beside the host time of a step (50 steps queued
without a sync) and the CUDA kernels a step launches (torch.profiler); a step whose median is near
its host time is bound by the host. With --profile, cProfile of neptune_eq's step (100 steps). GPU only.

    python bench/probe_host_cprofile.py "torch_layer_norm fwd+bwd" "rope_gqa fwd+bwd" [--profile]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_unseen as S
from sweeps import row_named


def _step(built, ref: S.Reference):
    if ref.gout is None:
        return lambda: built(*ref.xs)

    def step():
        leaves = S._leaves(ref.xs, True, ref.buffers)
        out = built(*leaves)
        out.backward(ref.gout.to(out.dtype))
    return step


def probe(name: str, profile: bool) -> None:
    row = row_named(name)
    ref = S.reference(row, "cuda", dry=False)
    for impl, build in S._implementations(row, ref.xs, {"eager"}):
        fn = _step(build(), ref)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        med = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        host = (time.perf_counter() - t0) / 50 * 1e3
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        kernels = sorted((e for e in prof.key_averages() if e.device_time_total > 0),
                         key=lambda e: -e.device_time_total)
        gpu = sum(e.device_time_total for e in kernels) / 10 / 1e3
        print(f"{row.name} | {impl}: do_bench {med:.4f} ms, host {host:.4f} ms a step, kernels {gpu:.4f} ms a step")
        if ref.gout is not None:
            print(f"    host by phase (ms a step): {_phases(build(), ref)}")
        for e in kernels[:12]:
            print(f"    {e.count // 10:3d}× {e.device_time_total / e.count:9.1f} µs  {e.key[:110]}")
        if profile and impl == "neptune_eq":
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(100):
                fn()
            pr.disable()
            torch.cuda.synchronize()
            for order in ("tottime", "cumulative"):
                pstats.Stats(pr, stream=sys.stdout).sort_stats(order).print_stats(45)


def _phases(built, ref: S.Reference, n: int = 50) -> str:
    """Host time of a training step's parts: making the leaves, the forward call, the backward."""
    spent = [0.0, 0.0, 0.0]
    for k in range(n + 5):
        t0 = time.perf_counter()
        leaves = S._leaves(ref.xs, True, ref.buffers)
        t1 = time.perf_counter()
        out = built(*leaves)
        t2 = time.perf_counter()
        out.backward(ref.gout.to(out.dtype))
        t3 = time.perf_counter()
        if k >= 5:
            spent = [a + b for a, b in zip(spent, (t1 - t0, t2 - t1, t3 - t2))]
    torch.cuda.synchronize()
    return ", ".join(f"{what} {t / n * 1e3:.3f}" for what, t in zip(("leaves", "forward", "backward"), spent))


if __name__ == "__main__":
    for name in (a for a in sys.argv[1:] if a != "--profile"):
        probe(name, "--profile" in sys.argv)
