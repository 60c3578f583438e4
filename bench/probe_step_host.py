"""Host time of a training step of a sweep row (bench/sweeps.py), piece by piece: the forward without
grad (bound launches), the forward with grad (the training custom op), its backward, eager PyTorch's
step, and for scale a do-nothing torch.library custom op and a do-nothing autograd.Function; with
--profile, a cProfile of neptune_eq's steps (functions by their own time). GPU only; each call issued
with the GPU idle (perf_counter around issue, synchronised before and after).

    python bench/probe_step_host.py "attention fwd+bwd" "rms_norm fwd+bwd" [--profile 25]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_profile import one_call_us, profile_calls
from sweeps import row_named

import neptune_eq


def host_us(fn, n: int = 30) -> float:
    """Median host µs of one call issued on an idle GPU (host_profile.one_call_us), after 3 warm-up calls."""
    for _ in range(3):
        fn()
    return statistics.median(one_call_us(fn) for _ in range(n))


@torch.library.custom_op("probe_host::nothing", mutates_args=())
def _nothing(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(xs[0])]


@_nothing.register_fake
def _(xs):
    return [torch.empty_like(xs[0])]


class _Nothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        return g


def _python_backward_us(step, n: int = 30) -> float:
    """Median µs a step spends inside neptune_eq's Python backward (autograd._Eager.backward), the
    rest of the backward's host time being the autograd engine's (its device thread, the GIL)."""
    from neptune_eq import autograd as A

    inner = A._Eager.backward
    spent = []

    def timed(ctx, *grads):
        t0 = time.perf_counter()
        try:
            return inner(ctx, *grads)
        finally:
            spent.append((time.perf_counter() - t0) * 1e6)

    A._Eager.backward = staticmethod(timed)
    try:
        for _ in range(n):
            step()
            torch.cuda.synchronize()
    finally:
        A._Eager.backward = staticmethod(inner)
    return statistics.median(spent) if spent else float("nan")


def probe(row, top: int) -> None:
    xs = row.make("cuda", torch.Generator(device="cuda").manual_seed(0), False)
    prog = neptune_eq.compile(row.fn, *xs)
    leaves = tuple(x.detach().requires_grad_(x.is_floating_point() and k not in row.buffers)
                   for k, x in enumerate(xs))

    def nograd():
        with torch.no_grad():
            prog(*xs)

    def fwd():
        return prog(*leaves)

    out = fwd()
    g = torch.ones_like(out)

    def bwd():
        fwd().backward(g)

    def eager():
        out = row.fn(*leaves)
        out.backward(torch.ones_like(out))

    def empty_step():
        _Nothing.apply(leaves[0]).backward(torch.ones_like(leaves[0]))

    t = {"forward, no grad": host_us(nograd), "forward with grad": host_us(fwd),
         "forward + backward": host_us(bwd), "eager forward + backward": host_us(eager),
         "empty custom op": host_us(lambda: _nothing([xs[0]])),
         "empty autograd.Function": host_us(lambda: _Nothing.apply(leaves[0])),
         "empty autograd.Function + backward": host_us(empty_step)}
    inside = _python_backward_us(bwd)
    t["of which in the Python backward"] = inside
    print(f"== {row.name}: host µs per call (median): " + ", ".join(f"{k} {v:.0f}" for k, v in t.items()),
          flush=True)
    if top:
        profile_calls(bwd, 50, top, "cumulative")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--profile", type=int, default=0, help="cProfile the steps, this many functions by cumulative time")
    a = ap.parse_args()
    for want in a.rows:
        probe(row_named(want), a.profile)


if __name__ == "__main__":
    main()
