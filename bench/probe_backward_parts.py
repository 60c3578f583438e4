"""Where a training row's backward time goes, plan by plan: after one fwd+bwd step of a sweep row
(bench/sweeps.py), every program the step compiled (the training forward, the chosen backward, the map
backward of a split at computed dot operands) has its cost model's best alternatives timed beside their
predictions, on fresh random inputs, each checked against the program's float64 evaluation first; with
--kernels, the chosen alternative's kernels by device time (torch profiler).

    python bench/probe_backward_parts.py "native_rms_norm_matmul fwd+bwd 4096x4096->4096 bf16" [--alternatives 12]
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
from probe_sweep_kernels import _step
from sweeps import row_named

import neptune_eq
from neptune_eq import autograd
from neptune_eq.reference import evaluate, random_inputs
from neptune_eq.verify import default_tolerance, rel_err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--alternatives", type=int, default=10)
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--only", default="", help="the programs whose key holds this text (e.g. _operands)")
    a = ap.parse_args()
    for want in a.rows:
        row = row_named(want)
        g = torch.Generator(device="cuda").manual_seed(0)
        xs = row.make("cuda", g, False)
        prog = neptune_eq.compile(row.fn, *xs)
        before = set(autograd._RUNNERS)
        _step(prog, row, xs)()  # (one training step: it compiles the programs timed below)
        torch.cuda.synchronize()
        print(f"== {row.name}\n{prog.explain()}", flush=True)
        for key in [k for k in autograd._RUNNERS if k not in before and a.only in k]:
            _parts(key, autograd._RUNNERS[key], a.alternatives, a.kernels)


def _parts(key: str, run, n: int, kernels: bool) -> None:
    program = run.program
    inputs = random_inputs(program, seed=1, device="cuda")
    ref = evaluate(program, {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})
    print(f"-- {key}: {program.name}, {len(run.alternatives)} alternatives", flush=True)
    for alt in run.alternatives[:n]:
        pinned = run.pin(alt.id)
        try:
            got = pinned.run(inputs)
        except Exception as e:
            print(f"   #{alt.id:3d} FAILED {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
            continue
        errs = []
        for o in program.outputs:
            err, bad = rel_err(got[o.name], ref[o.name])
            errs.append(math.inf if bad else err)
        tol = max(default_tolerance(o.dtype) for o in program.outputs)
        if max(errs) > tol:
            print(f"   #{alt.id:3d} WRONG err {max(errs):.1e} > {tol:.0e}: not timed  {alt.structure}", flush=True)
            continue
        t = triton.testing.do_bench(lambda p=pinned: p.run(inputs), warmup=25, rep=200, return_mode="median")
        print(f"   #{alt.id:3d} predicted {alt.cost.time * 1e6:8.1f} us measured {t * 1e3:8.1f} us "
              f"err {max(errs):.1e}  {alt.structure}", flush=True)
        if kernels and alt.id == run.alternatives[0].id:
            for name, us, count in kernel_times(lambda p=pinned: p.run(inputs)):
                print(f"        {us:8.1f} us  ×{count}  {name}", flush=True)


if __name__ == "__main__":
    main()
