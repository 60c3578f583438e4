"""Host time of a training step of a bench/sweep_unseen.py row, piece by piece: the forward without
grad (bound launches), the forward with grad (the training custom op), its backward, and for scale a
do-nothing torch.library custom op and a do-nothing autograd.Function. GPU only; steps issued back to
back with the GPU idle between timings (perf_counter around issue, synchronised before and after).

    python bench/probe_step_host.py "attention fwd+bwd" "rms_norm fwd+bwd"
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_unseen as S
from host_profile import one_call_us

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


def probe(row: S.Row) -> None:
    xs = row.make("cuda", torch.Generator(device="cuda").manual_seed(0), False)
    prog = neptune_eq.compile(row.fn, *xs)
    leaves = tuple(x.detach().requires_grad_(x.is_floating_point()) for x in xs)

    def nograd():
        with torch.no_grad():
            prog(*xs)

    def fwd():
        return prog(*leaves)

    out = fwd()
    g = torch.ones_like(out)

    def bwd():
        fwd().backward(g)

    t = {"forward, no grad": host_us(nograd), "forward with grad": host_us(fwd),
         "forward + backward": host_us(bwd),
         "empty custom op": host_us(lambda: _nothing([xs[0]])),
         "empty autograd.Function": host_us(lambda: _Nothing.apply(leaves[0]))}
    print(f"== {row.name}: host µs per call (median): " + ", ".join(f"{k} {v:.0f}" for k, v in t.items()),
          flush=True)


def main() -> None:
    for want in sys.argv[1:]:
        probe(next(r for r in S.ROWS if r.name.startswith(want)))


if __name__ == "__main__":
    main()
