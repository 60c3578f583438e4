"""A folded backward against its two-kernel plan on the GPU (extract/fold_rows.py): for a norm's and a
bias-activation's backward program, the cost model's best folded and best unfolded alternative, each
checked against float64 and timed (median of do_bench) with its prediction; then the whole training
step of Gemma's RMSNorm, ours beside torch.compile's.

    python bench/probe_fold_rows.py [--rows 16384] [--width 2304]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_fourth import gemma_rms_norm

import neptune_eq
from neptune_eq import dsl as ne
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir
from neptune_eq.verify import rel_err

DEV = ["cuda"]  # (--device cpu: a dry run in the interpreter, at small sizes)


def norm_backward(m: int, n: int):
    """Gemma RMSNorm's saved backward: rs = Σ_d x² saved, weight 1 + w, dx in bf16."""
    P = ne.program("norm_backward")
    i, d = P.axes(i=m, d=n)
    x, w = P.input("x", i, d, dtype="bfloat16"), P.input("w", d, dtype="bfloat16")
    g, rs = P.input("g", i, d, dtype="bfloat16"), P.input("rs", i)
    r = ne.rsqrt(rs * (1.0 / n) + 1e-6)
    s = ne.sum(g * (w + 1.0) * x, d)
    P.output("dx", g * (w + 1.0) * r - s * r * r * r * (1.0 / n) * x, (i, d), dtype="bfloat16")
    P.output("dw", ne.sum(g * x * r, i), (d,))
    return P.build()


def norm_reference(xs):
    x, w, g = (xs[k].double() for k in ("x", "w", "g"))
    n = x.shape[-1]
    r = torch.rsqrt((x * x).sum(-1, keepdim=True) / n + 1e-6)
    s = (g * (w + 1) * x).sum(-1, keepdim=True)
    return {"dx": g * (w + 1) * r - s * r ** 3 / n * x, "dw": (g * x * r).sum(0)}


def norm_inputs(m, n, gen):
    xs = {"x": torch.randn(m, n, generator=gen, device=DEV[0]).bfloat16(),
          "w": (0.1 * torch.randn(n, generator=gen, device=DEV[0])).bfloat16(),
          "g": torch.randn(m, n, generator=gen, device=DEV[0]).bfloat16()}
    xs["rs"] = (xs["x"].float() ** 2).sum(-1)
    return xs


def bias_act_backward(m: int, n: int):
    """The backward of tanh(x + b) in bf16: dx (a map) and db (a column sum) of one g."""
    P = ne.program("bias_act_backward")
    i, d = P.axes(i=m, d=n)
    x, b = P.input("x", i, d, dtype="bfloat16"), P.input("b", d, dtype="bfloat16")
    dy = P.input("dy", i, d, dtype="bfloat16")
    t = ne.tanh(x + b)
    P.output("dx", dy * (1.0 - t * t), (i, d), dtype="bfloat16")
    P.output("db", ne.sum(dy * (1.0 - t * t), i), (d,))
    return P.build()


def bias_act_reference(xs):
    gx = xs["dy"].double() * (1 - torch.tanh(xs["x"].double() + xs["b"].double()) ** 2)
    return {"dx": gx, "db": gx.sum(0)}


def bias_act_inputs(m, n, gen):
    return {"x": torch.randn(m, n, generator=gen, device=DEV[0]).bfloat16(),
            "b": torch.randn(n, generator=gen, device=DEV[0]).bfloat16(),
            "dy": torch.randn(m, n, generator=gen, device=DEV[0]).bfloat16()}


def _folded(alt) -> bool:
    return alt.plan.folded


def compare(name, program, inputs, reference) -> None:
    prog = compile_ir(program, Options(fold_rows=True))
    want = reference(inputs)
    picks = [next((a for a in prog.alternatives if _folded(a)), None),
             next((a for a in prog.alternatives if not _folded(a)), None)]
    print(f"== {name}: chosen #{prog.alternatives[0].id} {prog.alternatives[0].structure}", flush=True)
    for alt in picks:
        if alt is None:
            continue
        run = prog.pin(alt.id)
        try:
            got = run.run(inputs)
        except Exception as e:  # (Triton may refuse a kernel: said, the other still timed)
            print(f"   #{alt.id:3d} {'folded  ' if _folded(alt) else 'unfolded'} FAILED {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200]}  {alt.structure}", flush=True)
            continue
        errs = {k: rel_err(got[k], want[k]) for k in want}
        ms = triton.testing.do_bench(lambda run=run: run.run(inputs), warmup=25, rep=200, return_mode="median")
        print(f"   #{alt.id:3d} {'folded  ' if _folded(alt) else 'unfolded'} predicted {alt.cost.time * 1e6:7.1f} us "
              f"measured {ms * 1e3:7.1f} us  err {errs}  {alt.structure}", flush=True)


def training_step(m: int, n: int, gen) -> None:
    x = torch.randn(m, n, generator=gen, device=DEV[0]).bfloat16()
    w = (0.1 * torch.randn(n, generator=gen, device=DEV[0])).bfloat16()
    gy = torch.randn(m, n, generator=gen, device=DEV[0]).bfloat16()
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    gemma_rms_norm(xd, wd).backward(gy.double())
    steps = (("neptune_eq", neptune_eq.compile(gemma_rms_norm, x, w)),
             ("neptune_eq fold_rows", neptune_eq.compile(gemma_rms_norm, x, w, fold_rows=True)),
             ("torch.compile", torch.compile(gemma_rms_norm)))
    for label, fn in steps:
        xl, wl = x.detach().requires_grad_(), w.detach().requires_grad_()

        def step(fn=fn, xl=xl, wl=wl):
            xl.grad = wl.grad = None
            fn(xl, wl).backward(gy)

        try:
            step()
        except Exception as e:
            print(f"   gemma_rms_norm fwd+bwd {label:20s} FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        errs = (rel_err(xl.grad, xd.grad)[0], rel_err(wl.grad, wd.grad)[0])
        ms = triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")
        print(f"   gemma_rms_norm fwd+bwd {label:20s} {ms * 1e3:7.1f} us  grad errs x {errs[0]:.1e} w {errs[1]:.1e}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--width", type=int, default=2304)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    DEV[0] = a.device
    gen = torch.Generator(device=DEV[0]).manual_seed(0)
    name = torch.cuda.get_device_name() if a.device == "cuda" else a.device
    print(name, "torch", torch.__version__, "triton", triton.__version__, flush=True)
    compare(f"norm backward {a.rows}x{a.width}", norm_backward(a.rows, a.width),
            norm_inputs(a.rows, a.width, gen), norm_reference)
    compare(f"bias-tanh backward {a.rows}x{2 * a.width}", bias_act_backward(a.rows, 2 * a.width),
            bias_act_inputs(a.rows, 2 * a.width, gen), bias_act_reference)
    training_step(a.rows, a.width, gen)


if __name__ == "__main__":
    main()
