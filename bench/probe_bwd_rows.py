"""Probe (issue 13): the saved backward's key-side kernel (dK and dV, two fp32 [rows, head_dim]
accumulators) at the schedule rule's 64 rows / 4 warps / 2 stages against 128 rows / 8 warps / 3 stages,
on every operator given, in alternating rounds (whole backward, do_bench medians, L = 16384), with each
variant's registers and spills. Both variants compute the same sums (checked: max |difference|).

With --edits, also the generated source of that kernel with tl.exp in place of tl.exp2 (the scale
unfolded) and without the unmasked loop's select of rows whose softmax sum is 0, at both schedules
(session 38's probe_dq_edits --kernel dkdv: 9.5 ms generated, 8.0 with both edits, at 64 rows).

    python bench/probe_bwd_rows.py --ops causal_pf global_pf [--edits] [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import Case, saved_backward


def feed_for(back) -> dict:
    """Timing inputs: saved row statistics small and positive (the row sums at least 1)."""
    out = {}
    for n, s in back.inputs.items():
        shape = tuple(back.axes[a] for a in s.axes)
        t = (torch.randn(shape, device="cuda") * (0.1 if n.startswith("saved") else 1)).abs()
        out[n] = t.to(getattr(torch, s.dtype)) + (1 if n == "saved_1" else 0)
    return out


def as_exp(src: str) -> str:
    """exp2(s·c·log₂e − lse·log₂e) back as exp(s·c − lse): the row factor and the folded scale unfolded
    in the exponents' own lines (tA = tl.exp2(tB), tB = (tS − tR[None, :]), tS = (d · c), tR = (x · log₂e))."""
    lines = src.split("\n")
    defs = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"\s+(\w+) = ", ln))}
    for ln in list(lines):
        m = re.search(r"tl\.exp2\((t\d+)\)", ln)
        if not m or m.group(1) not in defs:
            continue
        d = re.search(r"= \((t\d+) - (t\d+)\[None, :\]\)", lines[defs[m.group(1)]])
        if not d:
            continue
        s_i, r_i = defs[d.group(1)], defs[d.group(2)]
        lines[s_i] = re.sub(r"\* (\d\.\d+)\)", lambda c: f"* {float(c.group(1)) / 1.4426950408889634!r})", lines[s_i])
        lines[r_i] = re.sub(r"= \((x\d+) \* 1\.4426950408889634\)", r"= \1", lines[r_i])
    return "\n".join(lines).replace("tl.exp2(", "tl.exp(")


def no_row_check(src: str) -> str:
    """The unmasked loop's per-element select of a row test (`where(m[None, :], t, 0.0)`) dropped."""
    return re.sub(r"(p\d+) = tl\.where\((m\d+)\[None, :\], (t\d+), 0\.0\)", r"\1 = \3", src)


def _in_kernel(src: str, name: str, edit) -> str:
    """`edit` applied to kernel `name`'s function alone (the other kernels as generated)."""
    i = src.index(f"def {name}(")
    j = src.find("@triton.jit", i)
    j = len(src) if j < 0 else j
    return src[:i] + edit(src[i:j]) + src[j:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="*", default=["causal_pf"])
    ap.add_argument("--L", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--edits", action="store_true")
    a = ap.parse_args()
    for op in a.ops:
        c = Case(op, a.L)
        back, comp = saved_backward(c.fn, *c.inputs("cpu"))
        base = list(comp._schedules("cuda"))
        print(op, comp.alternative.structure, flush=True)
        for i, s in enumerate(base):
            print("  default", i, {x: t for x, t in s.tiles.items() if t > 1}, s.num_warps, s.num_stages, flush=True)
        ki = next((i for i, s in enumerate(base) if s.num_warps == 4 and s.num_stages == 2
                   and any(t == 64 for x, t in s.tiles.items() if x in comp.plan.kernels[i].grid)), None)
        if ki is None:
            print("  no kernel at 64 rows / 4 warps / 2 stages", flush=True)
            continue
        s0 = base[ki]
        row = next(x for x in comp.plan.kernels[ki].grid if s0.tiles.get(x) == 64)
        wide = replace(s0, tiles={**s0.tiles, row: 128}, num_warps=8, num_stages=3)
        feed = feed_for(back)
        variants = {}
        for label, sched in (("64 rows w4 s2", s0), ("128 rows w8 s3", wide)):
            edits = {"": None}
            if a.edits:
                edits |= {" exp": as_exp, " no-row": no_row_check, " exp no-row": lambda t: as_exp(no_row_check(t))}
            for suffix, edit in edits.items():
                p = comp.pin(comp.choice)
                p.schedules["cuda"] = [*base[:ki], sched, *base[ki + 1:]]
                if edit is not None:
                    src, ks = p.lowered("cuda")
                    text = _in_kernel(src, ks[ki].name, edit)
                    if text == src:
                        print(f"  {label}{suffix}: the edit changed nothing", flush=True)
                        continue
                    p._modules[("src", "cuda")] = (text, [replace(k, source=text) for k in ks])
                variants[label + suffix] = p
        outs = {}
        for name, p in variants.items():
            try:
                outs[name] = p.run(feed)
            except Exception as e:  # a schedule Triton cannot compile is a result too
                print(f"  {name}: FAIL {type(e).__name__}: {str(e)[:120]}", flush=True)
        ref = outs[next(iter(outs))]
        for name, out in outs.items():
            diff = max(float((out[k].float() - ref[k].float()).abs().max()) for k in ref)
            runners = variants[name].launcher("cuda")._runners.values()
            ck = [(getattr(r, "n_regs", None), getattr(r, "n_spills", None))
                  for r in runners if getattr(r, "name", "").endswith(f"_k{ki}")]
            print(f"  {name}: kernel k{ki} registers/spills {ck}, max |diff| {diff:.3g}", flush=True)
        times = {n: [] for n in outs}
        for _ in range(a.rounds):
            for name in outs:
                p = variants[name]
                times[name].append(triton.testing.do_bench(lambda p=p, feed=feed: p.run(feed), warmup=50, rep=300,
                                                           return_mode="median"))
        for name, ts in times.items():
            print(f"  {op} {name:22s} " + "  ".join(f"{t:.3f}" for t in ts) + " ms", flush=True)


if __name__ == "__main__":
    main()
