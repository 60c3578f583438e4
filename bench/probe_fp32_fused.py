"""Probe (session 66): why float32 attention's fused kernel ran at 1.5 % of the FMA pipe (300 ms against
SDPA's 6, examples/decode_attention.py's prefill, 1 × 32 heads × 4096², d 128, session 65) and what runs
it well. Times schedule variants of the one-kernel plan — tiles, warps, and the float32 product's
precision (IEEE on the FMA pipe, TF32×3 on the tensor cores, as SDPA's float32 kernel multiplies) —
with ptxas's registers and spills, each checked against float64 first; SDPA and eager beside them.

    python bench/probe_fp32_fused.py [--out rows.json] [--variants i,j,w,s,prec ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_fp32_attention import _example

from neptune_eq.lower.launch import Launcher, load_module
from neptune_eq.lower.triton import write_module
from neptune_eq.runtime import compile_ir

# (ptxas of triton 3.6 for sm_90, on the CPU host: IEEE products spill at a loop tile of 64 whatever the rows
# and warps, and past 8 score values a thread; TF32x3 fits 128 × 32 in 8 warps and 64 × 32 in 4)
VARIANTS = ["128,64,8,2,ieee", "32,32,4,2,ieee", "64,32,8,2,ieee", "128,32,16,2,ieee", "64,16,4,2,ieee",
            "128,16,8,2,ieee", "32,16,4,2,ieee", "16,32,4,2,ieee", "64,32,8,3,ieee", "64,32,16,2,ieee",
            "128,32,8,2,tf32x3", "64,32,4,2,tf32x3", "128,32,8,3,tf32x3", "64,32,8,2,tf32x3",
            "128,64,8,2,tf32x3", "64,64,8,2,tf32x3", "128,64,16,2,tf32x3", "128,32,16,2,tf32x3",
            "128,64,8,2,tf32", "64,64,4,2,tf32"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--variants", nargs="*", default=VARIANTS)
    a = ap.parse_args()
    head = f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}"
    print(head, flush=True)
    program = _example("decode_attention", "prefill")
    prog = compile_ir(program)
    fused = min((x for x in prog.alternatives if len(x.plan.kernels) == 1), key=lambda x: x.cost.time)
    p = prog.pin(fused.id)
    base = p._schedules("cuda")[0]
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = {n: torch.randn(*(program.axes[x] for x in s.axes), device="cuda", generator=g)
          for n, s in program.inputs.items()}
    q, k, v = xs["q"], xs["k"], xs["v"]
    scale = 1 / 32 ** 0.5  # (the example's own scale)
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) * scale, -1) @ v.double()
    flops = 4 * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
    rows = {"device": head, "rows": []}

    def record(label, f, extra=None):
        err = float((f().double() - ref).norm() / ref.norm())
        ms = triton.testing.do_bench(f, warmup=5, rep=60, return_mode="median")
        row = {"impl": label, "ms": ms, "tflops": flops / ms / 1e9, "rel_err": err, **(extra or {})}
        print(json.dumps(row), flush=True)
        rows["rows"].append(row)

    for spec in a.variants:
        i, j, w, s, prec = spec.split(",")
        sc = replace(base, tiles={**base.tiles, "i": int(i), "j": int(j)}, num_warps=int(w), num_stages=int(s),
                     input_precision=prec)
        try:
            src, ks = write_module(p.plan, program, [sc], "cuda", "probe")
            launcher = Launcher(program, p.plan, ks, load_module(src))
            compiled: list = []
            launcher(xs, None, compiled)
            extra = {"regs": getattr(compiled[0], "n_regs", None), "spills": getattr(compiled[0], "n_spills", None)}
            record(f"fused {spec}", lambda la=launcher: la(xs)["o"], extra)
        except Exception as e:  # a variant that does not compile is recorded, not fatal
            print(f"fused {spec} failed: {repr(e)[:200]}", flush=True)
    one = min((x for x in prog.alternatives if len(x.plan.kernels) == 1), key=lambda x: x.cost.time)
    for alt in [*prog.alternatives[:3], *([one] if one.id >= 3 else [])]:
        pinned = prog.pin(alt.id)
        record(f"alternative {alt.id}: {alt.structure[:50]} [{alt.kind[:70]}]", lambda p=pinned: p.run(xs)["o"],
               {"predicted_ms": alt.cost.time * 1e3})
    record("SDPA", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale))
    record("eager", lambda: torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
