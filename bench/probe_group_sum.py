"""The group sum of grouped-query attention's regrouped backward (neptune_eq/regroup.py): dK and dV summed
over the member axis from per-query-head fp32 partials. The whole backward program is timed with that
kernel's schedule varied (key rows per program, warps), without programmatic dependent launch so that
the profiler's per-kernel times are the kernels' own; every variant's gradients are compared with the
default's first. GPU only.

    python bench/probe_group_sum.py [--batch 2 --heads 32 --kv 8 --L 2048 --d 128]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
import torch.nn.functional as F
import triton.testing

import neptune_eq
import neptune_eq.lower.launch as launch
from neptune_eq import autograd
from neptune_eq.kernel_terms import inner_axes
from neptune_eq.lower.launch import Launcher, load_module
from neptune_eq.lower.triton import write_module
from neptune_eq.regroup import regroup
from neptune_eq.runtime import compile_ir


def gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    for name, v in (("batch", 2), ("heads", 32), ("kv", 8), ("L", 2048), ("d", 128)):
        ap.add_argument(f"--{name}", type=int, default=v)
    a = ap.parse_args()
    launch._has_grid_dependency_control = lambda: False  # (each kernel timed alone)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(a.batch, a.heads, a.L, a.d, generator=g, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(a.batch, a.kv, a.L, a.d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    program = neptune_eq.compile(gqa, q, k, v).program.program
    p2, rg = regroup(program)
    t = autograd._derive(p2, ["q", "k", "v"])
    inputs = {n: rg.split(n, x.reshape(program.input_shape(n))) for n, x in zip(program.inputs, (q, k, v))}
    written = compile_ir(t.forward).run(inputs, {"out0": torch.bfloat16})
    back = t.saved.program
    feed = dict(inputs) | {n: written[n] for n in (*t.saved.saved.outputs, *t.saved.saved.stats)}
    for c in t.saved.cotangents.values():
        feed[c] = torch.randn(back.input_shape(c), generator=g, device="cuda", dtype=torch.bfloat16)
    alt = compile_ir(back).alternative
    plan, base = alt.plan, list(alt.schedules)
    ki = next(i for i, kp in enumerate(plan.kernels) if not inner_axes(kp, plan)
              and any(p.axis == rg.member for p in kp.passes()))
    print(f"backward: {alt.structure}; group sum = kernel {plan.kernels[ki].name}: {base[ki]}", flush=True)
    rows = next(x for x in plan.kernels[ki].grid if base[ki].tiles.get(x, 1) == 1 and back.axes[x] >= 64)
    variants = [("default", base[ki])]
    for r in (4, 16, 64):
        for w in (4, 8):
            variants.append((f"{rows} x{r} w{w}", replace(base[ki], tiles={**base[ki].tiles, rows: r}, num_warps=w)))
    want = None
    for label, s in variants:
        scheds = list(base)
        scheds[ki] = s
        src, ks = write_module(plan, back, scheds, "cuda", "probe_" + "".join(c if c.isalnum() else "_" for c in label))
        run = Launcher(back, plan, ks, load_module(src, None))
        out = run(feed)
        if want is None:
            want = out
        err = max(((out[n].float() - want[n].float()).norm() / want[n].float().norm()).item() for n in want)
        ms = triton.testing.do_bench(lambda run=run: run(feed), warmup=25, rep=200, return_mode="median")
        print(f"  {label:16s} backward {ms * 1e3:8.1f} us  (rel diff from default {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
