"""Attention forward + backward beside SDPA and FlexAttention (issue 13's targets). GPU only.

Each implementation's gradients of q, k, v are first checked against float64 autograd of the plain
operator (examples/neptune_ops.py) at a check length (full heads; the float64 scores of L = 16384
would not fit), then fwd+bwd is timed at the target length: median of triton.testing.do_bench, all
peers in one process, peak memory beside it.

    python bench/grad_attention.py [--ops causal_pf global_pf] [--L 16384] [--check-L 1024] [--out F]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.testing
from cases import HEADS, TOLERANCE, Case
from peers import flex, sdpa

import neptune_eq
from neptune_eq.autograd import training_report

PREFILL = [op for op in HEADS if op.endswith("_pf")]


def _neptune(case: Case, q, k, v):
    prog = neptune_eq.compile(case.fn, q, k, v)
    return (lambda: prog(q, k, v)), prog


def _impls(case: Case, q, k, v) -> dict:
    out = {}
    run, prog = _neptune(case, q, k, v)
    out["neptune_eq"] = (run, prog)
    for name, build in (("sdpa", sdpa), ("flex", flex)):
        fn, note = build(case, q, k, v)
        out[name] = (fn, note)
    return out


def _leaves(case: Case, seed: int = 0):
    return [x.detach().clone().requires_grad_() for x in case.inputs("cuda", seed=seed)]


def _grads(run, leaves, g):
    for x in leaves:
        x.grad = None
    run().backward(g)
    return [x.grad for x in leaves]


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="*", default=PREFILL)
    ap.add_argument("--L", type=int, default=16384)
    ap.add_argument("--check-L", type=int, default=1024)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d")}
    print(meta, flush=True)
    rows = []
    for op in args.ops:
        # ---- check at the check length against float64 autograd of the plain operator
        small = Case(op, args.check_L)
        leaves = _leaves(small)
        torch.manual_seed(1)
        g = torch.randn_like(small.fn(*leaves))
        ref64 = [x.detach().double().requires_grad_() for x in leaves]
        ref = _grads(lambda f=small.fn, xs=ref64: f(*xs), ref64, g.double())
        ok = {}
        for name, (fn, extra) in _impls(small, *leaves).items():
            if fn is None:
                print(f"{op} {name}: n/a ({extra})", flush=True)
                continue
            try:
                err = max(_rel(a, b) for a, b in zip(_grads(fn, leaves, g), ref))
            except Exception as e:  # one peer failing does not stop the others
                print(f"{op} {name}: failed at L={args.check_L}: {str(e)[-1500:]}", flush=True)
                continue
            tol = TOLERANCE["neptune_eq" if name == "neptune_eq" else "peer"]
            ok[name] = err <= tol
            print(f"{op} {name}: grad rel err {err:.1e} at L={args.check_L} ({'ok' if ok[name] else 'OVER'} {tol})",
                  flush=True)
        del ref64, ref
        # ---- time at the target length
        case = Case(op, args.L)
        leaves = _leaves(case)
        g = torch.randn(case.inputs("cuda")[0].shape, device="cuda", dtype=case.dtype)
        for name, (fn, extra) in _impls(case, *leaves).items():
            if fn is None or not ok.get(name):
                continue
            try:
                t0 = time.time()
                _grads(fn, leaves, g)  # first call: compiles (neptune_eq: the backward too)
                first = time.time() - t0
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                ms = triton.testing.do_bench(lambda fn=fn, xs=leaves, g=g: _grads(fn, xs, g), warmup=5, rep=50,
                                             return_mode="median")
                peak = torch.cuda.max_memory_allocated() / 2**30
            except Exception as e:
                print(f"{op} {name}: failed at L={args.L}: {str(e)[-1500:]}", flush=True)
                continue
            row = {"op": op, "L": args.L, "impl": name, "fwd_bwd_ms": ms, "peak_GiB": peak, "first_s": first}
            rows.append(row)
            print(f"{op} L={args.L} {name}: fwd+bwd {ms:.2f} ms, peak {peak:.1f} GiB (first call {first:.0f} s)",
                  flush=True)
            if name == "neptune_eq":
                prog = extra
                print("  forward plan:", prog.program.alternative.structure, flush=True)
                print("  " + training_report(prog._first().op.qualname).replace("\n", "\n  "), flush=True)
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
