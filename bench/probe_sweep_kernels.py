"""Where the time of a bench/sweep_unseen.py row goes: the chosen plan's kernels by device time (torch
profiler, fwd or fwd+bwd as the row says), and for forward rows every alternative of the cost model
(untuned) timed beside its prediction, each checked against float64 first.

    python bench/probe_sweep_kernels.py "cross_entropy 8192" "kl_log_target" [--alternatives 12]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_unseen as S
from host_profile import kernel_times

import neptune_eq
from neptune_eq.frontend.compiled import CompiledFunction
from neptune_eq.verify import rel_err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--alternatives", type=int, default=10)
    a = ap.parse_args()
    for want in a.rows:
        row = next(r for r in S.ROWS if r.name.startswith(want))
        g = torch.Generator(device="cuda").manual_seed(0)
        xs = row.make("cuda", g, False)
        prog = neptune_eq.compile(row.fn, *xs)
        print(f"== {row.name}: {prog.alternatives[0].structure}", flush=True)
        if row.backward:
            def step(prog=prog, xs=xs, buffers=row.buffers):
                # (no copies: S._leaves clones; buffers such as RoPE's cos and sin need no gradient)
                leaves = tuple(x.detach().requires_grad_(x.is_floating_point() and k not in buffers)
                               for k, x in enumerate(xs))
                out = prog(*leaves)
                out.backward(torch.ones_like(out))
        else:
            def step(prog=prog, xs=xs):
                with torch.no_grad():
                    prog(*xs)
        ms = triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")
        print(f"   step {ms * 1e3:.1f} us; kernels (us per step, launches):", flush=True)
        for name, us, n in kernel_times(step):
            print(f"     {us:9.1f}  x{n}  {name}", flush=True)
        if row.backward or a.alternatives <= 0:
            continue
        ref = row.fn(*(x.double() if x.is_floating_point() else x for x in xs))
        base = prog.program.pin(0)
        for alt in base.alternatives[:a.alternatives]:
            run = CompiledFunction(prog.captured, base.pin(alt.id))
            err, nonfinite = rel_err(run(*xs), ref)
            err = math.inf if nonfinite else err
            t = triton.testing.do_bench(lambda run=run, xs=xs: run(*xs), warmup=25, rep=200, return_mode="median")
            print(f"   #{alt.id:3d} predicted {alt.cost.time * 1e6:8.1f} us measured {t * 1e3:8.1f} us "
                  f"err {err:.1e}  {alt.structure}", flush=True)


if __name__ == "__main__":
    main()
