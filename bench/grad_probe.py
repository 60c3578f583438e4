"""Forward + backward beside torch (issue 13 probe): each implementation's gradients are checked
against float64 autograd of the plain function first, then fwd+bwd is timed (median of
triton.testing.do_bench) in one process. GPU only.

    python bench/grad_probe.py [--only softmax causal]
"""

from __future__ import annotations

import argparse
import time

import torch
import triton.testing

import neptune_eq
from neptune_eq.autograd import training_report


def softmax(x):
    return torch.softmax(x, -1)


def causal(q, k, v):  # written out: on CUDA, SDPA captures as cuDNN's attention op
    L = q.shape[-2]
    s = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    keep = torch.arange(L, device=q.device)[:, None] >= torch.arange(L, device=q.device)[None]
    return (torch.softmax(s.masked_fill(~keep, float("-inf")), -1).to(q.dtype) @ v)


def rmsnorm_mm(x, w, W):
    return (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w) @ W


CASES = {
    "softmax": (softmax, lambda: (torch.randn(4096, 8192, device="cuda", dtype=torch.float16),)),
    "causal": (causal, lambda: tuple(torch.randn(1, 16, 2048, 64, device="cuda", dtype=torch.float16)
                                    for _ in range(3))),
    "rmsnorm_mm": (rmsnorm_mm, lambda: (torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16),
                                        torch.randn(2048, device="cuda", dtype=torch.bfloat16),
                                        torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) / 45)),
}


def grads(f, xs, g):
    leaves = [x.detach().clone().requires_grad_() for x in xs]
    out = f(*leaves)
    out.backward(g)
    return [x.grad for x in leaves]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=list(CASES))
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, time.strftime("%Y-%m-%d"))
    for name in args.only:
        fn, make = CASES[name]
        torch.manual_seed(0)
        xs = make()
        g = torch.randn_like(fn(*xs))
        ref = grads(fn, [x.double() for x in xs], g.double())
        t0 = time.time()
        prog = neptune_eq.compile(fn, *xs)
        peers = {"neptune_eq": prog, "eager": fn, "compile": torch.compile(fn)}
        for label, f in peers.items():
            try:
                got = grads(f, xs, g)
                err = max(rel(a, b) for a, b in zip(got, ref))
                leaves = [x.detach().clone().requires_grad_() for x in xs]

                def step(f=f, leaves=leaves, g=g):
                    out = f(*leaves)
                    out.backward(g)

                ms = triton.testing.do_bench(step, warmup=10, rep=100, return_mode="median")
                extra = f" (first call incl. compile {time.time() - t0:.0f} s)" if label == "neptune_eq" else ""
                print(f"{name} {label}: fwd+bwd {ms * 1e3:.0f} us, grad rel err {err:.1e}{extra}", flush=True)
            except Exception as e:  # one peer failing does not stop the others
                print(f"{name} {label}: failed {str(e)[-3000:]}", flush=True)
        print("  forward plan:", prog.program.alternative.structure, flush=True)
        print("  " + training_report(prog._first().op.qualname).replace("\n", "\n  "), flush=True)


if __name__ == "__main__":
    main()
