"""Probe (session 63): split-K combine loops folding one chunk state a step (as before) against
`combine.COMBINE_UNROLL` chunks a step, in one process. GPU only.

    python bench/probe_combine_unroll.py [--out rows.json]

Cases: the four decode operators at L 16384 and 32768 (split-K over the keys, then the combine), and
RMSNorm -> matmul's training step (its norm weight's gradient is a 64-128 chunk combine). Each compile
of each setting gets its own cache directory (the unroll is a module constant, not in the cache key);
every output is checked against float64 before it is timed (median of triton.testing.do_bench).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beyond.programs import rmsnorm_matmul, rmsnorm_matmul_math
from cases import Case

import neptune_eq
from neptune_eq.lower import combine


def rel(a, b) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def _compiled(fn, xs, unroll: int):
    combine.COMBINE_UNROLL = unroll
    try:
        with tempfile.TemporaryDirectory() as d:
            return neptune_eq.compile(fn, *xs, cache_dir=d)
    finally:
        combine.COMBINE_UNROLL = 8


def decode(op: str, L: int, rows: list) -> None:
    case = Case(op, L)
    xs = case.inputs("cuda")
    ref = case.fn(*(x.double() if x.is_floating_point() else x for x in xs))
    for unroll in (1, 8):
        f = _compiled(case.fn, xs, unroll)
        out = f(*xs)
        err = rel(out, ref)
        if not err < 2e-3:
            print(f"{op} L={L} unroll {unroll}: WRONG {err:.2e}", flush=True)
            continue
        ms = triton.testing.do_bench(lambda f=f: f(*xs), warmup=25, rep=200, return_mode="median")
        rows.append({"case": f"{op} L={L}", "unroll": unroll, "us": ms * 1e3, "rel_err": err})
        print(f"{op:10s} L={L:6d} unroll {unroll}: {ms * 1e3:8.1f} µs  err {err:.1e}", flush=True)


def rms_train(rows: list) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 8192, generator=g, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(8192, generator=g, device="cuda")).bfloat16()
    W = (torch.randn(8192, 8192, generator=g, device="cuda") * 8192 ** -0.5).bfloat16()
    dy = torch.randn(4096, 8192, device="cuda", dtype=torch.bfloat16)
    leaves = [a.double().requires_grad_() for a in (x, w, W)]
    rmsnorm_matmul_math(*leaves).backward(dy.double())
    ref = [a.grad for a in leaves]
    for unroll in (1, 8):
        f = _compiled(rmsnorm_matmul, (x, w, W), unroll)
        ls = [a.detach().clone().requires_grad_() for a in (x, w, W)]

        def step(f=f, ls=ls):
            for a in ls:
                a.grad = None
            f(*ls).backward(dy)

        step()
        err = max(rel(a.grad, r) for a, r in zip(ls, ref))
        ms = triton.testing.do_bench(step, warmup=10, rep=300, return_mode="median")
        rows.append({"case": "rmsnorm_matmul fwd+bwd", "unroll": unroll, "us": ms * 1e3, "rel_err": err})
        print(f"rms_train unroll {unroll}: {ms * 1e3:8.1f} µs  err {err:.1e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(env, flush=True)
    rows: list = []
    for op in ("causal_dc", "alibi_dc", "gqa_dc", "softcap_dc"):
        for L in (16384, 32768):
            decode(op, L, rows)
    rms_train(rows)
    if args.out:
        Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
