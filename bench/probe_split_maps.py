"""The maps programs of a split training (neptune_eq.grad_prologue) of a bench/sweep_unseen.py row on this
machine: each kernel's plan, schedule and prediction beside its measured time (torch profiler, one
step of the maps backward alone, fed random cotangents).

    python bench/probe_split_maps.py "qk_norm_causal fwd+bwd"
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_unseen as S
from host_profile import kernel_times

import neptune_eq
from neptune_eq import autograd
from neptune_eq.runtime import compile_ir


def main() -> None:
    row = next(r for r in S.ROWS if r.name.startswith(sys.argv[1]))
    xs = row.make("cuda", torch.Generator(device="cuda").manual_seed(0), False)
    prog = neptune_eq.compile(row.fn, *xs)
    program = prog.program.program
    wrt = [n for k, n in enumerate(program.inputs) if k not in row.buffers]
    t = autograd._derive(program, wrt)
    if t.prologue is None:
        print("not split")
        return
    maps = t.prologue[1]
    comp = compile_ir(maps.program, prog.program.compilation.options)
    print(comp.explain())
    for s in comp._schedules("cuda"):
        print("  ", s.tiles, s.num_warps, s.num_stages)
    by = dict(zip(program.inputs, xs))
    feed = {n: by[n].reshape(maps.program.input_shape(n)) if n in by else
            torch.randn(maps.program.input_shape(n), device="cuda", dtype=getattr(torch, spec.dtype))
            for n, spec in maps.program.inputs.items()}
    comp.run(feed)
    for name, us, n in kernel_times(lambda: comp.run(feed)):
        print(f"  {us:9.1f}  x{n}  {name}", flush=True)


if __name__ == "__main__":
    main()
