"""What session 48's rounding of narrowed values does on the GPU (frontend/rounding.py): a value the
program itself rounds to bf16/fp16 is that rounded value wherever wider arithmetic reads it; narrowness
inherited from the inputs keeps the float32 algebra. In one process, each checked against float64 first
(do_bench medians; GPU only; from bench/):

  * exactness: the CUDA conversions against eager's, element for element;
  * attention, bf16 softmax vs HF's softmax(scores, dtype=float32) of the bf16 scores (inherited: must
    cost nothing), causal (an arange mask) and not, B 4, H 16, L 2048, d 64, beside SDPA;
  * linear cross-entropy, CE of the bf16 logits vs of (h @ Wᵀ).float() (inherited), 4096 tokens,
    4096 → 32768, beside torch.compile and eager;
  * fake quantisation x + (x.bfloat16().float() − x).detach() feeding a row sum (rounded), beside
    eager and torch.compile;
  * new_ops: pow, hypot, clamp with tensor bounds, any, uint8 and int32 arguments against float64;
  * perf_new_ops: GeM pooling, a p-norm normalisation, fake quantisation by round, a focal loss with a
    non-integer gamma, beside torch.compile and eager.

    python probe_session48.py [exactness attention linear_ce fake_quant new_ops]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton.testing
from probe_session47 import _bench  # (run from bench/, as session 47's probe)

import neptune_eq


def attention() -> None:
    q, k, v = (torch.randn(4, 16, 2048, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    def causal(s, is_causal):
        i = torch.arange(s.shape[-1], device=s.device)
        return s.masked_fill(i[None, :] > i[:, None], float("-inf")) if is_causal else s

    for is_causal in (False, True):
        def plain(q, k, v, is_causal=is_causal):
            return torch.softmax(causal((q @ k.transpose(-2, -1)) * 0.125, is_causal), -1) @ v

        def hf(q, k, v, is_causal=is_causal):
            s = causal(torch.matmul(q, k.transpose(-2, -1)) * 0.125, is_causal)
            return F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v

        want = plain(q.double(), k.double(), v.double())
        a, b = neptune_eq.compile(plain, q, k, v), neptune_eq.compile(hf, q, k, v)
        _bench(f"attention causal={is_causal}", {
            "bf16 softmax": lambda: a(q, k, v), "fp32 softmax": lambda: b(q, k, v),  # noqa: B023
            "SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)}, want)  # noqa: B023


def linear_ce() -> None:
    h = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    W = (torch.randn(32768, 4096, device="cuda") / 64).to(torch.bfloat16)
    y = torch.randint(0, 32768, (4096,), device="cuda")

    def narrow(h, W, y):
        return F.cross_entropy(h @ W.T, y)

    def wide(h, W, y):
        return F.cross_entropy((h @ W.T).float(), y)

    a, b = neptune_eq.compile(narrow, h, W, y), neptune_eq.compile(wide, h, W, y)
    comp = torch.compile(wide)
    _bench("linear CE 4096 tok, 4096 -> 32768", {
        "bf16 logits": lambda: a(h, W, y), ".float() logits": lambda: b(h, W, y),
        "torch.compile": lambda: comp(h, W, y), "eager": lambda: wide(h, W, y)}, wide(h.double(), W.double(), y))


def fake_quant() -> None:
    x = torch.randn(16384, 4096, device="cuda")
    w = torch.randn(4096, device="cuda")

    def fn(x, w):
        return ((x + (x.to(torch.bfloat16).float() - x).detach()) * w).sum(-1)

    prog, comp = neptune_eq.compile(fn, x, w), torch.compile(fn)
    _bench("fake quant row sum 16384x4096 fp32", {"neptune_eq": lambda: prog(x, w), "torch.compile": lambda: comp(x, w),
                                                "eager": lambda: fn(x, w)}, fn(x.double(), w.double()))


def exactness() -> None:
    """The GPU's conversions against eager's, element for element (the rounding ops' CUDA path)."""
    x = torch.randn(4096, 1024, device="cuda") * 4
    w = torch.randn(1024, device="cuda")
    h = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)

    def rms(h, w):
        f = h.float()
        return w * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)

    for name, fn, args in (("x.bfloat16().float() - x", lambda x: x.bfloat16().float() - x, (x,)),
                           ("x.half().float() - x", lambda x: x.half().float() - x, (x,)),
                           ("(x * 3e4).half().float()", lambda x: (x * 3e4).half().float(), (x,)),
                           ("(x.bf16 * w.bf16).float() + x", lambda x, w: (x.bfloat16() * w.bfloat16()).float() + x,
                            (x, w)),
                           ("Llama RMSNorm, fp32 weight", rms, (h, w))):
        got, want = neptune_eq.compile(fn, *args)(*args), fn(*args)
        same = torch.equal(got, want) or ((got.isinf() == want.isinf()).all() and torch.equal(
            got[want.isfinite()], want[want.isfinite()]))
        print(f"{name:40s} | max |got - eager| {(got - want).nan_to_num().abs().max().item():.3g} "
              f"| identical: {bool(same)}", flush=True)


def new_ops() -> None:
    """Session 48's new operations through the whole compiler on the GPU (libdevice pow and hypot),
    against float64: values with zeros, negatives and a tensor exponent; the widened int32 sums; the
    roundings to integral values (ties included) and a half's overflow counted."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(512, 256, device="cuda", generator=g)
    x[0, :8] = torch.tensor([0.0, -0.0, -2.0, 2.0, float("inf"), -float("inf"), float("nan"), 1.0])
    p = torch.randn(512, 256, device="cuda", generator=g).round()
    lo, hi = torch.full((256,), -0.5, device="cuda"), torch.full((256,), 0.7, device="cuda")
    img = torch.randint(0, 256, (512, 256), device="cuda", dtype=torch.uint8)
    a = torch.randint(2**30, 2**31 - 1, (512, 256), device="cuda", dtype=torch.int32)
    for name, fn, args in (("x ** 1.5", lambda x: x ** 1.5, (x,)),
                           ("x ** p (tensor exponent)", lambda x, p: torch.pow(x, p), (x, p)),
                           ("(-2) ** p", lambda p: torch.pow(-2.0, p), (p,)),
                           ("hypot(x, p)", torch.hypot, (x, p)),
                           ("clamp(x, lo, hi).sum(-1)", lambda x, lo, hi: torch.clamp(x, lo, hi).sum(-1), (x, lo, hi)),
                           ("(x > 1).any(-1)", lambda x: (x > 1).any(-1), (x,)),
                           ("img.float() / 255 mean", lambda img: (img.float() / 255).mean(-1), (img,)),
                           ("(a.long() * 3).sum(-1)", lambda a: (a.long() * 3).sum(-1), (a,)),
                           ("round(4x) (ties to even)", lambda x: torch.round(x * 4 + 0.5), (x,)),
                           ("floor, ceil, trunc, frac",
                            lambda x: torch.floor(x) + 2 * torch.ceil(x) + 4 * torch.trunc(x) + torch.frac(x), (x,)),
                           ("isinf(x.half()).sum(-1)", lambda x: torch.isinf(x.half() * 1000).sum(-1), (x,)),
                           ("fake quant round(x/s).clamp * s",
                            lambda x: (torch.round(x / 0.125).clamp(-128, 127) * 0.125).sum(-1), (x,))):
        got = neptune_eq.compile(fn, *args)(*args)
        want = fn(*(t.double() if t.is_floating_point() else t for t in args))
        want = want.double() if want.is_floating_point() else want
        if want.dtype == torch.bool or not want.is_floating_point():
            ok = torch.equal(got, want)
        else:
            same = torch.isfinite(want)
            ok = torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~same & ~want.isnan()].double(),
                                                                         want[~same & ~want.isnan()])
            ok = ok and torch.allclose(got[same].double(), want[same], rtol=1e-5, atol=1e-5)
        print(f"{name:32s} | matches float64 (incl. inf/nan): {ok}", flush=True)


def perf_new_ops() -> None:
    """Programs made of session 48's operations beside torch.compile and eager (16384 x 4096)."""
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    p = torch.full((1,), 3.0, device="cuda")
    y = torch.randint(0, 4096, (16384,), device="cuda")
    rows = (
        ("GeM pooling clamp(eps).pow(p).mean.pow(1/p), bf16",
         lambda x, p: x.float().clamp(min=1e-6).pow(p).mean(-1).pow(1.0 / p), (x, p)),
        ("F.normalize(x, p=3), bf16", lambda x: torch.nn.functional.normalize(x, p=3.0, dim=-1), (x,)),
        ("fake quant round(x/s).clamp*s row sum, bf16",
         lambda x: (torch.round(x.float() / 0.05).clamp(-128, 127) * 0.05).sum(-1), (x,)),
        ("focal loss gamma 1.5, bf16 logits", lambda x, y: (
            (1 - torch.softmax(x.float(), -1).gather(-1, y[:, None])).pow(1.5).squeeze(-1)
            * torch.nn.functional.cross_entropy(x.float(), y, reduction="none")).mean(), (x, y)),
    )
    versus_compile(rows)


def versus_compile(rows) -> None:
    """Each (name, fn, args) compiled by neptune_eq and torch.compile, timed beside eager, checked first."""
    for name, fn, args in rows:
        prog, comp = neptune_eq.compile(fn, *args), torch.compile(fn)
        want = fn(*(t.double() if t.is_floating_point() else t for t in args))
        _bench(name, {"neptune_eq": lambda: prog(*args), "torch.compile": lambda: comp(*args),  # noqa: B023
                      "eager": lambda: fn(*args)}, want)  # noqa: B023


if __name__ == "__main__":
    import sys

    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    parts = sys.argv[1:] or ["exactness", "attention", "linear_ce", "fake_quant", "new_ops", "perf_new_ops"]
    for part in parts:
        globals()[part]()
