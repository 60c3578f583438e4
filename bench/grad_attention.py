"""Attention forward + backward beside SDPA and FlexAttention (issue 13's targets). GPU only.

Each implementation's gradients of q, k, v are first checked against float64 autograd of the plain
operator (examples/neptune_ops.py) at a check length (full heads; the float64 scores of L = 16384
would not fit), then fwd+bwd is timed at the target length: median of triton.testing.do_bench, all
peers in one process, peak memory beside it.

    python bench/grad_attention.py [--ops causal_pf global_pf] [--L 16384] [--check-L 1024] [--out F]
                                   [--impls neptune_eq sdpa flex]
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


IMPLS = ("neptune_eq", "sdpa", "flex")


def implementations(case: Case, q, k, v, only=IMPLS) -> dict:
    out = {}
    if "neptune_eq" in only:
        out["neptune_eq"] = _neptune(case, q, k, v)
    for name, build in (("sdpa", sdpa), ("flex", flex)):
        if name in only:
            out[name] = build(case, q, k, v)
    return out


def leaves(case: Case, seed: int = 0) -> list[torch.Tensor]:
    return [x.detach().clone().requires_grad_() for x in case.inputs("cuda", seed=seed)]


def grads(run, xs, g) -> list[torch.Tensor]:
    for x in xs:
        x.grad = None
    run().backward(g)
    return [x.grad for x in xs]


def rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(op: str, L: int, log=print, only=IMPLS) -> dict[str, float]:
    """Each implementation's largest relative gradient error (of q, k, v) against float64 autograd of
    the plain operator at length L; an implementation that is n/a or fails is left out (and logged)."""
    small = Case(op, L)
    xs = leaves(small)
    torch.manual_seed(1)
    g = torch.randn_like(small.fn(*xs))
    ref64 = [x.detach().double().requires_grad_() for x in xs]
    ref = grads(lambda: small.fn(*ref64), ref64, g.double())
    errs = {}
    for name, (fn, extra) in implementations(small, *xs, only).items():
        if fn is None:
            log(f"{op} {name}: n/a ({extra})")
            continue
        try:
            errs[name] = max(rel_err(a, b) for a, b in zip(grads(fn, xs, g), ref))
        except Exception as e:  # one peer failing does not stop the others
            log(f"{op} {name}: failed at L={L}: {str(e)[-1500:]}")
    return errs


def tolerance(name: str) -> float:
    return TOLERANCE["neptune_eq" if name == "neptune_eq" else "peer"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="*", default=PREFILL)
    ap.add_argument("--L", type=int, default=16384)
    ap.add_argument("--check-L", type=int, default=1024)
    ap.add_argument("--out", default=None)
    ap.add_argument("--impls", nargs="*", default=list(IMPLS), choices=IMPLS, help="which to check and time")
    ap.add_argument("--tune", action="store_true", help="prog.tune() neptune_eq's forward and backward first")
    args = ap.parse_args()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d")}
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    log(meta)
    rows = []
    for op in args.ops:
        ok = {}
        for name, err in check(op, args.check_L, log, args.impls).items():
            ok[name] = err <= tolerance(name)
            log(f"{op} {name}: grad rel err {err:.1e} at L={args.check_L} "
                f"({'ok' if ok[name] else 'OVER'} {tolerance(name)})")
        # ---- time at the target length
        case = Case(op, args.L)
        xs = leaves(case)
        g = torch.randn(case.inputs("cuda")[0].shape, device="cuda", dtype=case.dtype)
        for name, (fn, extra) in implementations(case, *xs, args.impls).items():
            if fn is None or not ok.get(name):
                continue
            try:
                t0 = time.time()
                grads(fn, xs, g)  # first call: compiles (neptune_eq: the backward too)
                first = time.time() - t0
                if args.tune and name == "neptune_eq":
                    t0 = time.time()
                    extra.tune(*xs, progress=False)  # (xs require grad: the training kernels too)
                    log(f"  tuned in {time.time() - t0:.0f} s")
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                ms = triton.testing.do_bench(lambda fn=fn, xs=xs, g=g: grads(fn, xs, g), warmup=5, rep=50,
                                             return_mode="median")
                peak = torch.cuda.max_memory_allocated() / 2**30
            except Exception as e:
                log(f"{op} {name}: failed at L={args.L}: {str(e)[-1500:]}")
                continue
            rows.append({"op": op, "L": args.L, "impl": name, "fwd_bwd_ms": ms, "peak_GiB": peak, "first_s": first,
                         "tuned": bool(args.tune and name == "neptune_eq")})
            log(f"{op} L={args.L} {name}: fwd+bwd {ms:.2f} ms, peak {peak:.1f} GiB (first call {first:.0f} s)")
            if name == "neptune_eq":
                log("  forward plan: " + extra.program.alternative.structure)
                log("  " + training_report(extra._first().op.qualname).replace("\n", "\n  "))
        torch.cuda.empty_cache()
        if args.out:  # (after every operator: a run cut short keeps what it measured)
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
