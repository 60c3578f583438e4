"""Session 49 on the GPU, in one process, each implementation checked against float64 first (do_bench
medians; GPU only; run from bench/):

  * pow_edges: `torch.pow(x, p)` compiled, over a grid of C's special values (±0, ±1, ±inf, NaN,
    subnormals, negative bases to integer and non-integer exponents), element for element against
    torch.pow in float64 rounded to float32: the same NaNs, the same infinities and signed zeros,
    finite values within a relative 1e-5 (pow now runs on the hardware's log2 and exp2,
    lower/mathlib.py POW_CUDA, where it had called libdevice's powf);
  * pow_speed: programs whose elements each take a pow — GeM pooling, a p-norm of order 1.5, focal
    weights (1 − p)^γ of every class, gamma correction — beside torch.compile and eager.

  * signed_zeros: 1/(−x), 1/ceil(x), 1/trunc(x) at ±0 against eager (the sign of zero);
  * packed_profile: packed prefill's call beside the device time of each kernel it launches.

    python probe_session49.py [pow_edges signed_zeros pow_speed]
"""

from __future__ import annotations

import torch
import triton
import triton.testing
from probe_session48 import versus_compile  # (run from bench/, as session 48's probe)

import neptune_eq


def pow_edges() -> None:
    special = [float("-inf"), -3.0, -2.5, -1.0, -0.5, -1e-40, -0.0, 0.0, 1e-40, 1e-30, 0.5, 1.0, 1.5, 2.0,
               3.0, 1e30, float("inf"), float("nan")]
    xs = torch.tensor(special, device="cuda")
    x = xs[:, None].expand(len(special), len(special)).contiguous()
    p = xs[None, :].expand(len(special), len(special)).contiguous()
    got = neptune_eq.compile(lambda x, p: torch.pow(x, p), x, p)(x, p)
    want = torch.pow(x.double(), p.double()).float()
    same_nan = torch.equal(got.isnan(), want.isnan())
    fin = torch.isfinite(want) & (want != 0)
    same_edges = torch.equal(got[~fin & ~want.isnan()], want[~fin & ~want.isnan()]) and torch.equal(
        torch.signbit(got[want == 0]), torch.signbit(want[want == 0]))
    rel = ((got[fin].double() - want[fin].double()).abs() / want[fin].double().abs()).max().item()
    bad = [(special[i], special[j], got[i, j].item(), want[i, j].item()) for i in range(len(special))
           for j in range(len(special)) if not (torch.isnan(got[i, j]) and torch.isnan(want[i, j]))
           and (got[i, j] != want[i, j] or torch.signbit(got[i, j]) != torch.signbit(want[i, j]))
           and not (fin[i, j] and abs(got[i, j].item() - want[i, j].item()) <= 1e-5 * abs(want[i, j].item()))]
    print(f"pow edges: NaNs equal {same_nan}, infinities and zeros equal {same_edges}, finite max rel err "
          f"{rel:.2e}; {len(bad)} differ: {bad[:8]}", flush=True)
    r = torch.rand(4096, 4096, device="cuda") * 4
    e = torch.randn(4096, 4096, device="cuda") * 3
    got = neptune_eq.compile(lambda x, p: torch.pow(x, p), r, e)(r, e)
    want = torch.pow(r.double(), e.double())
    ok = torch.isfinite(want) & (want != 0) & (want.abs() < 3e38) & (want.abs() > 1e-37)  # float32's range
    print(f"pow random (base in [0, 4), exponent N(0, 9)): max rel err "
          f"{((got.double() - want).abs() / want.abs())[ok].max().item():.2e} over {ok.sum().item()} values",
          flush=True)


def signed_zeros() -> None:
    """−x, ceil and trunc keep the sign of zero as torch does (1/−0 = −inf): Triton 3.6 writes a float's
    unary minus as 0 − x, +0 at x = +0."""
    x = torch.tensor([0.0, -0.0, -0.5, 0.5, -1e-30, 2.0, float("inf"), float("nan")], device="cuda")
    for name, fn in (("1 / (-x)", lambda x: 1.0 / (-x)), ("1 / ceil(x)", lambda x: 1.0 / torch.ceil(x)),
                     ("1 / trunc(x)", lambda x: 1.0 / torch.trunc(x)), ("(-x)^-1", lambda x: torch.pow(-x, -1.0))):
        got, want = neptune_eq.compile(fn, x)(x), fn(x)
        same = torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~want.isnan()], want[~want.isnan()])
        print(f"signed zeros {name:14s}: same as eager {same}  got {got.tolist()}  eager {want.tolist()}", flush=True)


def pow_speed() -> None:
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    p = torch.full((1,), 3.0, device="cuda")
    img = torch.rand(64, 3, 512, 512, device="cuda", dtype=torch.float16)
    y = torch.randint(0, 4096, (16384,), device="cuda")
    rows = (
        ("GeM pooling clamp(eps).pow(p).mean.pow(1/p), 16384x4096 bf16",
         lambda x, p: x.float().clamp(min=1e-6).pow(p).mean(-1).pow(1.0 / p), (x, p)),
        ("p-norm |x|^1.5 row sum, 16384x4096 bf16", lambda x: x.float().abs().pow(1.5).sum(-1).pow(1 / 1.5), (x,)),
        ("focal weights (1 - softmax)^2.5 row mean, bf16",
         lambda x: (1 - torch.softmax(x.float(), -1)).pow(2.5).mean(-1), (x,)),
        ("gamma correction img^(1/2.2), 64x3x512x512 fp16", lambda img: img.pow(1 / 2.2), (img,)),
        ("focal loss gamma 1.5, bf16 logits", lambda x, y: (
            (1 - torch.softmax(x.float(), -1).gather(-1, y[:, None])).pow(1.5).squeeze(-1)
            * torch.nn.functional.cross_entropy(x.float(), y, reduction="none")).mean(), (x, y)),
    )
    versus_compile(rows)


def _kernels(name: str, step, n: int = 5) -> None:
    """do_bench of `step` beside the device time of each kernel it launches (torch.profiler)."""
    for _ in range(3):
        step()
    ms = triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    rows = sorted(((e.key, e.count / n, e.device_time_total / n) for e in prof.key_averages()), key=lambda r: -r[2])
    print(f"{name}: do_bench {ms:.3f} ms; kernels a call {sum(r[2] for r in rows) / 1e3:.3f} ms "
          f"({sum(r[1] for r in rows):.0f} launches)", flush=True)
    for kname, count, us in rows[:10]:
        print(f"    {count:4.0f}x {us:9.1f} us  {kname[:100]}", flush=True)


def dpo_step():
    """(compiled DPO, a fwd+bwd step of it) at bench/sweep_fourth.py's row, 8 × 1024 × 32000 bf16, on the
    same tensors every step."""
    from sweep_fourth import dpo_loss

    logits = torch.randn(8, 1024, 32000, device="cuda", dtype=torch.bfloat16)
    labels = torch.randint(0, 32000, (8, 1024), device="cuda")
    labels[:, :128] = -100
    ref = torch.randn(8, device="cuda")
    x = logits.clone().requires_grad_()
    prog = neptune_eq.compile(dpo_loss, x, labels, ref)

    def step():
        x.grad = None
        prog(x, labels, ref).backward()

    return prog, step


def dpo_profile() -> None:
    """DPO fwd+bwd: 0.18x torch.compile in the sweep; which kernels take the time."""
    prog, step = dpo_step()
    _kernels("dpo fwd+bwd", step)
    print("    " + prog.explain().splitlines()[0][:300], flush=True)


def packed_profile() -> None:
    """Where packed prefill's time goes (bench/varlen_paged.py's layout: 16 documents, 32768 tokens, 32
    heads, d 128, fp16): do_bench of the call beside the device time of each kernel it launches."""
    from varlen_paged import random_lengths, varlen_attention

    lengths = random_lengths(16, 32768, 0)
    q, k, v = (torch.randn(32, 32768, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    doc = torch.repeat_interleave(torch.arange(16, device="cuda"), torch.tensor(lengths, device="cuda"))
    prog = neptune_eq.compile(varlen_attention, q, k, v, doc)
    _kernels("packed prefill", lambda: prog(q, k, v, doc))


if __name__ == "__main__":
    import sys

    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for part in sys.argv[1:] or ["pow_edges", "signed_zeros", "pow_speed"]:
        globals()[part]()
