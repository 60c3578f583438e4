"""Probe (session 63): a plain matrix product kernel run as the vendor's GEMM (lower/library.py) against
the generated Triton GEMM of the same plan, beside torch.mm at the GEMM's shape, torch.compile and
Liger-Kernel, forward and forward + backward, in one process. GPU only.

    python bench/probe_library_gemm.py [--out results.json] [--only rms_fwd ln_fwd rms_train]

Each implementation is checked against float64 before it is timed (median of triton.testing.do_bench);
`neptune_eq` is the default compile, `neptune_eq[generated]` the same with Options(library_gemm=False).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beyond.programs import EPS, layernorm_matmul, rmsnorm_matmul, rmsnorm_matmul_math

import neptune_eq

M, K, N = 4096, 8192, 8192


def _inputs(g, affine: int):
    x = torch.randn(M, K, generator=g, device="cuda").bfloat16()
    vecs = [(1 - i + 0.1 * torch.randn(K, generator=g, device="cuda")).bfloat16() for i in range(affine)]
    W = (torch.randn(K, N, generator=g, device="cuda") * K ** -0.5).bfloat16()
    return (x, *vecs, W)


def _liger(name):
    from liger_kernel.transformers import functional as lf

    if name.startswith("ln"):
        return lambda x, g, b, W: torch.mm(lf.liger_layer_norm(x, g, b, EPS), W)
    return lambda x, w, W: torch.mm(lf.liger_rms_norm(x, w, EPS, in_place=False), W)


def rel(a, b) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def _time(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=300, return_mode="median")


def case(name: str, rows: list, reverse: bool = False, rounds: int = 3) -> None:
    fn = layernorm_matmul if name.startswith("ln") else rmsnorm_matmul
    train = name.endswith("train")
    xs = _inputs(torch.Generator(device="cuda").manual_seed(0), 2 if name.startswith("ln") else 1)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    leaves64 = [x.double().requires_grad_(train) for x in xs]
    out64 = (fn if fn is layernorm_matmul else rmsnorm_matmul_math)(*leaves64)  # (no float32 casts)
    if train:
        out64.backward(dy.double())
    ref = [leaf.grad for leaf in leaves64] if train else [out64.detach()]
    del out64, leaves64
    impls = {"neptune_eq": neptune_eq.compile(fn, *xs),
             "neptune_eq[generated]": neptune_eq.compile(fn, *xs, library_gemm=False),
             "compile": torch.compile(fn), "eager": fn}
    try:
        impls["liger"] = _liger(name)
    except Exception as e:  # no Liger here
        print(f"liger: not available ({e!r})", flush=True)
    if not train:
        a, W = xs[0], xs[-1]
        impls["torch.mm (ceiling)"] = lambda x, *rest, a=a, W=W: a @ W
    steps = {}
    for label, f in (reversed(impls.items()) if reverse else impls.items()):
        leaves = [x.detach().clone().requires_grad_(train) for x in xs]

        def step(f=f, leaves=leaves):
            for leaf in leaves:
                leaf.grad = None
            y = f(*leaves)
            if train:
                y.backward(dy)
            return y

        try:
            y = step()
            got = [leaf.grad for leaf in leaves] if train else [y]
            err = 0.0 if label.startswith("torch.mm") else max(rel(g, r) for g, r in zip(got, ref))
        except Exception as e:  # one implementation failing does not stop the others
            print(f"{name} {label}: failed {str(e)[-1500:]}", flush=True)
            continue
        if not err < 2e-2:
            print(f"{name} {label}: WRONG (rel err {err:.2e}), not timed", flush=True)
            rows.append({"case": name, "impl": label, "rel_err": err})
            continue
        steps[label] = (step, err)
        if label.startswith("neptune_eq"):
            print(f"    {label}: " + f.explain().split("\n", 1)[0][:300], flush=True)
    # rounds of every implementation in turn: the GEMMs' times drift by up to 10 % between runs of the
    # same code (clocks), so each round's medians are compared within the round
    times = {label: [] for label in steps}
    for _ in range(rounds):
        for label, (step, _) in steps.items():
            times[label].append(_time(step))
    for label, (_, err) in steps.items():
        ts = sorted(times[label])
        rows.append({"case": name, "impl": label, "ms": ts[len(ts) // 2], "rounds_ms": times[label], "rel_err": err})
        print(f"{name:10s} {label:24s} {ts[len(ts) // 2] * 1e3:9.1f} µs (rounds "
              + " ".join(f"{t * 1e3:.0f}" for t in times[label]) + f")  rel err {err:.1e}", flush=True)
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=["rms_fwd", "ln_fwd", "rms_train"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--reverse", action="store_true", help="time the implementations in reverse order")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every implementation in turn (median)")
    args = ap.parse_args()
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "shape": [M, K, N]}
    print(env, flush=True)
    rows: list = []
    for name in args.only:
        case(name, rows, args.reverse, args.rounds)
    if args.out:
        Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
