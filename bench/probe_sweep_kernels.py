"""Where the time of a sweep row (bench/sweeps.py) goes: the chosen plan's kernels by device time (torch
profiler, fwd or fwd+bwd as the row says), and for forward rows every alternative of the cost model
(untuned) timed beside its prediction, each checked against float64 first; with --variants, every
schedule of the space (neptune_eq/space.py) for each kernel of the chosen plan, the others kept.

    python bench/probe_sweep_kernels.py "cross_entropy 8192" "kl_log_target" [--alternatives 12] [--variants]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_profile import kernel_times
from sweeps import row_named

import neptune_eq
from extract.cost import kernel_cost, priced_at
from neptune_eq.device import H100
from neptune_eq.frontend.compiled import CompiledFunction
from neptune_eq.schedule import plan_schedules
from neptune_eq.space import kernel_variants
from neptune_eq.verify import rel_err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--alternatives", type=int, default=10)
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also torch.compile's kernels of the same step")
    ap.add_argument("--forward", action="store_true", help="time the alternatives of a fwd+bwd row's forward too")
    ap.add_argument("--explain", action="store_true", help="print the compile's explain() after the step (with the "
                                                           "training report of a fwd+bwd row)")
    a = ap.parse_args()
    for want in a.rows:
        row = row_named(want)
        g = torch.Generator(device="cuda").manual_seed(0)
        xs = row.make("cuda", g, False)
        prog = neptune_eq.compile(row.fn, *xs)
        print(f"== {row.name}: {prog.alternatives[0].structure}", flush=True)
        step = _step(prog, row, xs)
        _show("step", step)
        if a.explain:
            print(prog.explain(), flush=True)
        if a.compile:  # torch.compile's kernels for the same step, for comparison
            _show("torch.compile step", _step(torch.compile(row.fn), row, xs))
        if (row.backward and not a.forward) or (a.alternatives <= 0 and not a.variants):
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
        if a.variants:
            _variants(prog, xs, ref)


def _step(fn, row, xs):
    """One call of `fn` on the row's inputs: forward, or forward and backward where the row trains (no
    copies: the inputs are detached into leaves; buffers such as RoPE's cos and sin need no gradient)."""
    def step():
        if not row.backward:
            with torch.no_grad():
                fn(*xs)
            return
        leaves = tuple(x.detach().requires_grad_(x.is_floating_point() and k not in row.buffers)
                       for k, x in enumerate(xs))
        out = fn(*leaves)
        out.backward(torch.ones_like(out))
    return step


def _show(label: str, step) -> None:
    """The step's median time and its CUDA kernels, slowest first."""
    ms = triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")
    print(f"   {label} {ms * 1e3:.1f} us; kernels (us per step, launches):", flush=True)
    for name, us, n in kernel_times(step):
        print(f"     {us:9.1f}  x{n}  {name}", flush=True)


def _variants(prog, xs, ref) -> None:
    """Each kernel of the chosen plan under each schedule of the space, the other kernels as chosen."""
    base = prog.program.pin(0)
    plan, program = base.alternative.plan, base.program
    at = priced_at(program)
    chosen = list(base.alternative.schedules)
    for ki, (k, default) in enumerate(zip(plan.kernels, plan_schedules(plan, program))):
        for v in kernel_variants(k, plan, program, default):
            run_prog = base.pin(0)
            run_prog.schedules["cuda"] = [*chosen[:ki], v.schedule, *chosen[ki + 1:]]
            run = CompiledFunction(prog.captured, run_prog)
            try:
                err, nonfinite = rel_err(run(*xs), ref)
                t = triton.testing.do_bench(lambda run=run: run(*xs), warmup=25, rep=200, return_mode="median")
            except Exception as e:  # (a schedule Triton refuses: said, the others still timed)
                print(f"   {k.name} {v.kind}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            cost = kernel_cost(plan, k, at, v.schedule, H100)
            print(f"   {k.name} {v.kind:44s} predicted {cost.time * 1e6:8.1f} us (kernel) measured {t * 1e3:8.1f} "
                  f"us (program) err {math.inf if nonfinite else err:.1e}  {cost}", flush=True)


if __name__ == "__main__":
    main()
