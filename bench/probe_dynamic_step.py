"""Where a dynamic function's training step spends the time a static compile's does not (issue 14:
bench/dynamic_training.py measured causal attention at L 3000 1.58× and the causal-LM loss at 1500
1.73× a static compile's step, H200, 2026-12-05). For each program, beside a static compile at the same
length: host µs of a forward with grad and of forward + backward issued on an idle GPU, device µs per
kernel (torch.profiler, L2 flushed), the step's do_bench median, and cProfile's top functions over
steps. GPU only.

    python bench/probe_dynamic_step.py causal_attention:3000 causal_lm_loss:1500
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dynamic_training as T
from host_profile import kernel_times, one_call_us

import neptune_eq


def host_us(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    return statistics.median(one_call_us(fn) for _ in range(n))


def probe(name: str, L: int) -> None:
    import triton.testing as tt

    fn, make, wrt, _ = T.programs(False)[name]
    dyn = neptune_eq.compile(fn, *make(L - T.OFFSET, "cuda"), dynamic=True)
    T.step(dyn, make(L - T.OFFSET, "cuda"), wrt)
    xs = make(L, "cuda")
    static = neptune_eq.compile(fn, *xs)
    for label, f in (("static", static), ("dynamic", dyn)):
        leaves = [x.detach().requires_grad_(k in wrt) for k, x in enumerate(xs)]
        out = f(*leaves)
        g = torch.ones_like(out)
        row = {"forward with grad": host_us(lambda f=f, leaves=leaves: f(*leaves)),
               "forward + backward": host_us(lambda f=f, leaves=leaves, g=g: f(*leaves).backward(g)),
               "step do_bench": 1e3 * tt.do_bench(lambda f=f: T.step(f, xs, wrt), warmup=25, rep=200,
                                                  return_mode="median")}
        print(f"== {name} L {L} {label}: " + ", ".join(f"{k} {v:.0f} µs" for k, v in row.items()), flush=True)
        for key, us, n in kernel_times(lambda f=f: T.step(f, xs, wrt), 10):
            print(f"   {us:9.1f} µs  ×{n}  {key[:90]}")
        pr = cProfile.Profile()
        torch.cuda.synchronize()
        pr.enable()
        for _ in range(20):
            T.step(f, xs, wrt)
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
        print(s.getvalue(), flush=True)


def main() -> None:
    for arg in sys.argv[1:]:
        name, L = arg.split(":")
        probe(name, int(L))


if __name__ == "__main__":
    main()
