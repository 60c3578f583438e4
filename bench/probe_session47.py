"""What session 47's correctness fixes cost or gain on the GPU, beside eager and torch.compile in one
process, each checked against float64 first (do_bench medians; GPU only; from bench/):

  * column sums of normalised rows (an inline Σ_d over the kernel's grid axis, which is now held whole
    or written by its own pass: these were silently wrong before): F.normalize(x).sum(0),
    layer_norm(x).mean(0), softmax(x, -1).sum(0);
  * a norm weight's gradient through a matmul without the input's (RMSNorm → matmul, g and W);
  * causal attention masked with a finite fill (masked_fill(~causal, -1e9): split as a mask only where
    it stays exact) beside the same with −inf.

    python probe_session47.py
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton.testing

import neptune_eq


def _err(got, want) -> float:
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def _bench(name: str, impls: dict, want, check=True) -> None:
    row = []
    for label, fn in impls.items():
        try:
            got = fn()
        except Exception as e:  # (a peer that cannot run this program)
            row.append(f"{label} failed: {type(e).__name__}: {str(e)[:80]}")
            continue
        err = _err(got, want) if check else float("nan")
        t = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        row.append(f"{label} {t * 1e3:8.1f} us (err {err:.1e})")
    print(f"{name:44s} | " + " | ".join(row), flush=True)


def columns() -> None:
    x = torch.randn(16384, 1024, device="cuda", dtype=torch.bfloat16)
    for name, fn in (("normalize(x).sum(0) 16384x1024 bf16", lambda x: F.normalize(x, dim=-1).sum(0)),
                     ("layer_norm(x).mean(0)", lambda x: F.layer_norm(x, (x.shape[-1],)).mean(0)),
                     ("softmax(x, -1).sum(0)", lambda x: torch.softmax(x, -1).sum(0))):
        prog = neptune_eq.compile(fn, x)
        comp = torch.compile(fn)
        _bench(name, {"neptune_eq": lambda: prog(x), "torch.compile": lambda: comp(x),  # noqa: B023
                      "eager": lambda: fn(x)}, fn(x.double()))  # noqa: B023
        print(f"    chosen: {prog.program.alternative.structure}", flush=True)


def norm_weight_grad() -> None:
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    g = (1 + 0.1 * torch.randn(4096, device="cuda")).to(torch.bfloat16)
    W = (torch.randn(4096, 4096, device="cuda") / 64).to(torch.bfloat16)

    def fn(x, g, W):
        return F.rms_norm(x, (4096,), g) @ W

    prog = neptune_eq.compile(fn, x, g, W)
    comp = torch.compile(fn)
    cot = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    ref_g = g.double().requires_grad_()
    fn(x.double(), ref_g, W.double()).backward(cot.double())

    def step(f):
        def run():
            gg, ww = g.detach().requires_grad_(), W.detach().requires_grad_()
            f(x, gg, ww).backward(cot)
            return gg.grad
        return run

    _bench("rms_norm @ W fwd+bwd, dg and dW only", {"neptune_eq": step(prog), "torch.compile": step(comp),
                                                    "eager": step(fn)}, ref_g.grad)


def finite_fill_attention() -> None:
    B, H, L, D = 4, 16, 2048, 64
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for fill in (-math.inf, -1e9):
        def fn(q, k, v, fill=fill):  # (the mask from indices: an affine bound where it is split)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            keep = torch.arange(L, device=q.device)[None, :] <= torch.arange(L, device=q.device)[:, None]
            return torch.softmax(s.masked_fill(~keep, fill), -1) @ v

        prog = neptune_eq.compile(fn, q, k, v)
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        _bench(f"causal attention, masked_fill {fill:g}", {
            "neptune_eq": lambda: prog(q, k, v),  # noqa: B023
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}, want)
        print(f"    chosen: {prog.program.alternative.structure}", flush=True)


if __name__ == "__main__":
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    columns()
    norm_weight_grad()
    finite_fill_attention()
