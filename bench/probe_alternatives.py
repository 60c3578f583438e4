"""Time every alternative of one bench/beyond program at one size whose structure matches a filter
(untuned schedules), beside torch.compile, to see what the cost model's ranking leaves out.

    python3 bench/probe_alternatives.py row_variance M=512 N=262144 --match split rolling --limit 24
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from beyond import programs as P

import neptune_eq
from neptune_eq.frontend.compiled import CompiledFunction


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("dims", nargs="+", help="NAME=extent")
    ap.add_argument("--match", nargs="*", default=[], help="substrings; an alternative matching any is timed")
    ap.add_argument("--limit", type=int, default=24)
    args = ap.parse_args()
    prog_def = P.PROGRAMS[args.program]
    dims = {k: int(v) for k, v in (d.split("=") for d in args.dims)}
    case = P.Case(prog_def, dims)
    xs = case.inputs("cuda")
    want = prog_def.fn(*(x.double() if x.is_floating_point() else x for x in xs))
    prog = neptune_eq.compile(prog_def.fn, *xs)
    compiled = torch.compile(prog_def.fn)
    ms = triton.testing.do_bench(lambda: compiled(*xs), warmup=50, rep=300, return_mode="median")
    print(f"{args.program} {dims} torch.compile {ms * 1e3:.1f} us", flush=True)
    base = prog.program.pin(0)
    timed = 0
    for a in base.alternatives:
        if args.match and not any(m in a.structure for m in args.match):
            continue
        run = CompiledFunction(prog.captured, base.pin(a.id))
        got = run(*xs)
        err = (got.double() - want).abs().max().item()
        ms = triton.testing.do_bench(lambda run=run: run(*xs), warmup=50, rep=300, return_mode="median")
        print(f"#{a.id:3d} predicted {a.cost.time * 1e6:7.1f} us measured {ms * 1e3:7.1f} us err {err:.1e}  "
              f"{a.structure}", flush=True)
        timed += 1
        if timed >= args.limit:
            break


if __name__ == "__main__":
    main()
