"""The map after a split-K combine runs on the partial kernel's tile (space.plan_variants): time that
kernel's schedule at other row tiles and warps for a sweep row (its chosen plan, the other kernels as
chosen), each checked against float64 first. GPU only.

    python bench/probe_combine_tiles.py "batch_norm_1d 65536" --axis i --tiles 32 64 128 256 --warps 4 8
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweeps import row_named

import neptune_eq
from neptune_eq.frontend.compiled import CompiledFunction
from neptune_eq.verify import rel_err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("row")
    ap.add_argument("--axis", required=True)
    ap.add_argument("--tiles", type=int, nargs="+", required=True)
    ap.add_argument("--warps", type=int, nargs="+", default=[4])
    a = ap.parse_args()
    row = row_named(a.row)
    xs = row.make("cuda", torch.Generator(device="cuda").manual_seed(0), False)
    ref = row.fn(*(x.double() if x.is_floating_point() else x for x in xs))
    prog = neptune_eq.compile(row.fn, *xs)
    base = prog.program.pin(0)
    chosen = list(base.alternative.schedules)
    k = len(chosen) - 1  # the last kernel: the combine and its map
    print(f"{row.name}: {base.alternative.structure}; last kernel {chosen[k].tiles} w{chosen[k].num_warps}")
    for t in a.tiles:
        for w in a.warps:
            run_prog = base.pin(0)
            run_prog.schedules["cuda"] = [*chosen[:k], replace(chosen[k].with_tiles(**{a.axis: t}), num_warps=w)]
            run = CompiledFunction(prog.captured, run_prog)
            err, _ = rel_err(run(*xs), ref)
            ms = triton.testing.do_bench(lambda run=run: run(*xs), warmup=25, rep=200, return_mode="median")
            print(f"  {a.axis} {t:4d} w{w}: {ms * 1e3:8.1f} us  err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
