"""Out-of-sample sweep: plain-PyTorch programs and shapes that no other benchmark of this repository
holds (odd widths, reductions over non-last axes, head dims that are not powers of two, padding masks,
training steps), compiled with `neptune_eq.compile` untuned — what a new user gets first — and timed
beside eager PyTorch, torch.compile and Liger-Kernel where it has the operation, in one process.

Every implementation is first checked against the same function evaluated in float64 on the same
inputs (normwise relative error; fwd+bwd rows check the output and every input gradient), then timed
(triton.testing.do_bench medians, L2 cleared). A failed check is recorded and not timed. Output: one
JSON line per row on stdout and `--out FILE` (a list).

    python bench/sweep_unseen.py [--only NAME ...] [--skip-compile] [--out sweep.json]
    TRITON_INTERPRET=1 python bench/sweep_unseen.py --dry       # CPU: tiny sizes, every code path
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from float64_mode import KeepFloat64

import neptune_eq
from neptune_eq.verify import default_tolerance, rel_err

PEER_TOLERANCE = 1e-2


# ---------------------------------------------------------------- the programs, as a user writes them

def column_softmax(x):
    return torch.softmax(x, dim=0)


def vocab_log_softmax(x):
    return F.log_softmax(x.float(), dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def cross_entropy(logits, target):
    return F.cross_entropy(logits.float(), target)


def l2_normalize(x):
    return F.normalize(x, dim=-1)


def mean_pool(x):
    return x.mean(dim=1)


def column_standardize(x):
    m = x.mean(0, keepdim=True)
    v = x.var(0, keepdim=True, unbiased=False)
    return (x - m) * torch.rsqrt(v + 1e-5)


def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def causal_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def gqa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def mqa_decode(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def padded_attention(q, k, v, lengths):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    keep = torch.arange(k.shape[-2], device=q.device)[None, :] < lengths[:, None]  # B × S
    return torch.softmax(s.masked_fill(~keep[:, None, None, :], float("-inf")), dim=-1) @ v


def kl_log_target(a, b):
    return F.kl_div(F.log_softmax(a.float(), -1), F.log_softmax(b.float(), -1), reduction="batchmean",
                    log_target=True)


def softmax_of_matmul(x, w):
    return torch.softmax(x @ w, dim=-1)


def _rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


def rope_causal(q, k, v, cos, sin):
    """Rotary embeddings (cos, sin: [L, D] buffers) applied inside causal attention."""
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def rope_gqa(q, k, v, cos, sin):
    """RoPE, then causal grouped-query attention (k and v have fewer heads), as Llama writes it."""
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def qk_norm_causal(q, k, v, wq, wk):
    """RMSNorm of q and k over the head dimension with learnable weights (Qwen3, OLMo2), then causal attention."""
    q = q * torch.rsqrt((q * q).mean(-1, keepdim=True) + 1e-6) * wq
    k = k * torch.rsqrt((k * k).mean(-1, keepdim=True) + 1e-6) * wk
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def lse_middle(x):
    return torch.logsumexp(x.float(), dim=1)


# ---------------------------------------------------------------- inputs and rows

def _randn(*shape, dtype, device, g, scale=1.0):
    return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * scale).to(dtype)


@dataclass(frozen=True)
class Row:
    name: str
    fn: Callable
    make: Callable  # (device, generator, dry) -> inputs
    peers: tuple[str, ...] = ("eager", "compile")
    backward: bool = False  # fwd+bwd: sum(out * g) backward, every floating input's gradient checked
    liger: Callable | None = None  # (inputs) -> thunk for Liger-Kernel's version
    notes: dict = field(default_factory=dict)
    buffers: tuple[int, ...] = ()  # floating inputs that need no gradient (RoPE's cos and sin)


def _shape(dry, big, tiny):
    return tiny if dry else big


def rows_make(shape_big, shape_tiny, dtype, scale=1.0, extra=()):
    def make(device, g, dry):
        x = _randn(*_shape(dry, shape_big, shape_tiny), dtype=dtype, device=device, g=g, scale=scale)
        n = x.shape[-1]
        return (x, *(_randn(n, dtype=dtype, device=device, g=g) for _ in extra))
    return make


def _ce_make(device, g, dry):
    n, v = (37, 101) if dry else (8192, 50257)
    return (_randn(n, v, dtype=torch.bfloat16, device=device, g=g, scale=2.0),
            torch.randint(0, v, (n,), generator=g, device=device))


def _attn_make(b, h, hkv, lq, lk, d, dtype, tiny):
    def make(device, g, dry):
        bb, hh, hk, ll, lkk, dd = tiny if dry else (b, h, hkv, lq, lk, d)
        return (_randn(bb, hh, ll, dd, dtype=dtype, device=device, g=g),
                _randn(bb, hk, lkk, dd, dtype=dtype, device=device, g=g),
                _randn(bb, hk, lkk, dd, dtype=dtype, device=device, g=g))
    return make


def _rope_make(b, h, l, d, dtype, tiny):
    def make(device, g, dry):
        bb, hh, ll, dd = tiny if dry else (b, h, l, d)
        q, k, v = (_randn(bb, hh, ll, dd, dtype=dtype, device=device, g=g) for _ in range(3))
        inv = 10000.0 ** (-torch.arange(dd // 2, device=device, dtype=torch.float32) / (dd // 2))
        ang = torch.arange(ll, device=device, dtype=torch.float32)[:, None] * inv[None]
        ang = torch.cat([ang, ang], -1)
        return q, k, v, ang.cos().to(dtype), ang.sin().to(dtype)
    return make


def _rope_gqa_make(b, h, hkv, l, d, dtype, tiny):
    def make(device, g, dry):
        bb, hh, hk, ll, dd = tiny if dry else (b, h, hkv, l, d)
        q = _randn(bb, hh, ll, dd, dtype=dtype, device=device, g=g)
        k, v = (_randn(bb, hk, ll, dd, dtype=dtype, device=device, g=g) for _ in range(2))
        cos, sin = _rope_make(1, 1, ll, dd, dtype, None)(device, g, False)[3:]
        return q, k, v, cos, sin
    return make


def _qk_norm_make(b, h, l, d, dtype, tiny):
    def make(device, g, dry):
        bb, hh, ll, dd = tiny if dry else (b, h, l, d)
        q, k, v = (_randn(bb, hh, ll, dd, dtype=dtype, device=device, g=g) for _ in range(3))
        wq, wk = (1 + 0.1 * _randn(dd, dtype=dtype, device=device, g=g) for _ in range(2))
        return q, k, v, wq.to(dtype), wk.to(dtype)
    return make


def _padded_make(device, g, dry):
    b, h, lq, d = (2, 2, 45, 16) if dry else (4, 16, 2048, 64)
    q, k, v = (_randn(b, h, lq, d, dtype=torch.float16, device=device, g=g) for _ in range(3))
    lengths = torch.randint(1, lq + 1, (b,), generator=g, device=device)
    return q, k, v, lengths


def _two_rows(shape_big, shape_tiny, dtype):
    def make(device, g, dry):
        s = _shape(dry, shape_big, shape_tiny)
        return _randn(*s, dtype=dtype, device=device, g=g), _randn(*s, dtype=dtype, device=device, g=g)
    return make


def _mm_make(device, g, dry):
    m, k, n = (37, 40, 50) if dry else (8192, 4096, 4096)
    return (_randn(m, k, dtype=torch.bfloat16, device=device, g=g),
            _randn(k, n, dtype=torch.bfloat16, device=device, g=g, scale=k ** -0.5))


def _liger(name):
    def build(xs):
        from liger_kernel.transformers import functional as lf
        if name == "rms_norm":
            x, w = xs
            return lambda: lf.liger_rms_norm(x, w, 1e-6, in_place=False)
        if name == "layer_norm":
            x, w, b = xs
            return lambda: lf.liger_layer_norm(x, w, b, 1e-5)
        if name == "cross_entropy":
            logits, t = xs
            return lambda: lf.liger_cross_entropy(logits, t)
        if name == "kl_div":
            a, b = xs
            return lambda: lf.liger_kl_div(F.log_softmax(a.float(), -1), F.log_softmax(b.float(), -1),
                                           reduction="batchmean", log_target=True)
        raise ValueError(name)
    return build


ROWS = [
    Row("column_softmax 4096x8192 fp16", column_softmax, rows_make((4096, 8192), (37, 50), torch.float16)),
    Row("log_softmax 16384x32000 bf16", vocab_log_softmax, rows_make((16384, 32000), (37, 101), torch.bfloat16)),
    Row("layer_norm 16384x4096 bf16", layer_norm, rows_make((16384, 4096), (37, 50), torch.bfloat16, extra=(1, 1)),
        liger=_liger("layer_norm")),
    Row("rms_norm 16384x4096 bf16", rms_norm, rows_make((16384, 4096), (37, 50), torch.bfloat16, extra=(1,)),
        liger=_liger("rms_norm")),
    Row("cross_entropy 8192x50257 bf16", cross_entropy, _ce_make, liger=_liger("cross_entropy")),
    Row("l2_normalize 32768x1024 fp32", l2_normalize, rows_make((32768, 1024), (37, 50), torch.float32)),
    Row("mean_pool 32x4096x1024 bf16", mean_pool, rows_make((32, 4096, 1024), (3, 37, 50), torch.bfloat16)),
    Row("column_standardize 65536x1024 fp32", column_standardize,
        rows_make((65536, 1024), (41, 23), torch.float32, scale=3.0)),
    Row("lse_middle 64x4096x512 fp16", lse_middle, rows_make((64, 4096, 512), (3, 37, 50), torch.float16)),
    Row("kl_log_target 8192x32000 fp32", kl_log_target, _two_rows((8192, 32000), (37, 101), torch.float32),
        liger=_liger("kl_div")),
    Row("softmax_of_matmul 8192x4096x4096 bf16", softmax_of_matmul, _mm_make),
    Row("attention L3000 2x16 d64 fp16", attention,
        _attn_make(2, 16, 16, 3000, 3000, 64, torch.float16, (1, 2, 2, 45, 45, 16)),
        peers=("eager", "compile", "sdpa")),
    Row("causal d96 1x16 L4096 bf16", causal_sdpa,
        _attn_make(1, 16, 16, 4096, 4096, 96, torch.bfloat16, (1, 2, 2, 45, 45, 24)), peers=("eager", "sdpa")),
    Row("mqa_decode 16x32/1 S8192 d128 fp16", mqa_decode,
        _attn_make(16, 32, 1, 1, 8192, 128, torch.float16, (2, 4, 1, 1, 77, 16)), peers=("eager", "sdpa")),
    Row("padded_attention 4x16 L2048 d64 fp16", padded_attention, _padded_make, peers=("eager", "compile", "sdpa")),
    Row("rope_causal 4x16 L2048 d128 bf16", rope_causal, _rope_make(4, 16, 2048, 128, torch.bfloat16, (1, 2, 45, 16)),
        peers=("eager", "compile")),
    Row("rope_gqa 2x32/8 L2048 d128 bf16", rope_gqa,
        _rope_gqa_make(2, 32, 8, 2048, 128, torch.bfloat16, (1, 4, 2, 45, 16)), peers=("eager", "compile")),
    Row("qk_norm_causal 4x16 L2048 d128 bf16", qk_norm_causal,
        _qk_norm_make(4, 16, 2048, 128, torch.bfloat16, (1, 2, 45, 16)), peers=("eager", "compile")),
    # training steps
    Row("layer_norm fwd+bwd 16384x4096 bf16", layer_norm, rows_make((16384, 4096), (37, 50), torch.bfloat16,
                                                                  extra=(1, 1)),
        backward=True, liger=_liger("layer_norm")),
    Row("rms_norm fwd+bwd 16384x4096 bf16", rms_norm, rows_make((16384, 4096), (37, 50), torch.bfloat16, extra=(1,)),
        backward=True, liger=_liger("rms_norm")),
    Row("cross_entropy fwd+bwd 8192x50257 bf16", cross_entropy, _ce_make, backward=True,
        liger=_liger("cross_entropy")),
    Row("log_softmax fwd+bwd 16384x32000 bf16", vocab_log_softmax,
        rows_make((16384, 32000), (37, 101), torch.bfloat16), backward=True),
    Row("rope_causal fwd+bwd 4x16 L2048 d128 bf16", rope_causal,
        _rope_make(4, 16, 2048, 128, torch.bfloat16, (1, 2, 45, 16)), backward=True, peers=("eager", "compile"),
        buffers=(3, 4)),
    Row("rope_gqa fwd+bwd 2x32/8 L2048 d128 bf16", rope_gqa,
        _rope_gqa_make(2, 32, 8, 2048, 128, torch.bfloat16, (1, 4, 2, 45, 16)), backward=True,
        peers=("eager", "compile"), buffers=(3, 4)),
    Row("qk_norm_causal fwd+bwd 4x16 L2048 d128 bf16", qk_norm_causal,
        _qk_norm_make(4, 16, 2048, 128, torch.bfloat16, (1, 2, 45, 16)), backward=True, peers=("eager", "compile")),
    Row("causal fwd+bwd 4x16 L2048 d128 bf16", causal_sdpa,
        _attn_make(4, 16, 16, 2048, 2048, 128, torch.bfloat16, (1, 2, 2, 45, 45, 16)), backward=True,
        peers=("eager", "sdpa")),
    Row("gqa_causal fwd+bwd 2x32/8 L2048 d128 bf16", gqa_causal,
        _attn_make(2, 32, 8, 2048, 2048, 128, torch.bfloat16, (1, 4, 2, 45, 45, 16)), backward=True,
        peers=("eager", "sdpa")),
    Row("attention fwd+bwd L3000 2x16 d64 fp16", attention,
        _attn_make(2, 16, 16, 3000, 3000, 64, torch.float16, (1, 2, 2, 45, 45, 16)), backward=True,
        peers=("eager", "compile", "sdpa")),
]


# ---------------------------------------------------------------- checking and timing

def _sdpa_of(row: Row, xs):
    if row.fn is padded_attention:
        q, k, v, lengths = xs
        keep = torch.arange(k.shape[-2], device=q.device)[None, :] < lengths[:, None]
        mask = keep[:, None, None, :]
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if row.fn is attention:
        return lambda: F.scaled_dot_product_attention(*xs)
    return lambda: row.fn(*xs)  # the row is SDPA already (causal_sdpa, mqa_decode): "eager" is SDPA's math


def _leaves(xs, grad, buffers=()):
    return tuple(x.detach().clone().requires_grad_(grad and x.is_floating_point() and k not in buffers)
                 for k, x in enumerate(xs))


def _error(got, want) -> float:
    """The relative error of an output (the worst of its parts, for a program returning several)."""
    if isinstance(want, tuple | list):
        return max(_error(a, b) for a, b in zip(got, want, strict=True))
    err, nonfinite = rel_err(got, want)
    return math.inf if nonfinite else err


@dataclass(frozen=True)
class Reference:
    """A row's inputs and its float64 result (and, for fwd+bwd rows, the cotangent and the gradients)."""

    xs: tuple
    out: torch.Tensor
    gout: torch.Tensor | None = None
    grads: tuple = ()
    buffers: tuple[int, ...] = ()

    @property
    def dtype(self) -> torch.dtype:
        return next(x.dtype for x in self.xs if x.is_floating_point())


def reference(row: Row, device: str, dry: bool) -> Reference:
    g = torch.Generator(device=device).manual_seed(0)
    xs = row.make(device, g, dry)
    ref_xs = tuple(x.double() if x.is_floating_point() else x for x in xs)
    if not row.backward:
        with torch.no_grad(), KeepFloat64():
            return Reference(xs, row.fn(*ref_xs))
    leaves = _leaves(ref_xs, True, row.buffers)
    with KeepFloat64():
        out = row.fn(*leaves)
    gout = torch.randn(out.shape, generator=g, device=device, dtype=torch.float64)
    out.backward(gout)
    return Reference(xs, out.detach(), gout, tuple(x.grad for x in leaves if x.requires_grad), row.buffers)


def checked(name: str, built: Callable, ref: Reference) -> tuple[list[float], float, Callable]:
    """(relative errors of the output and each gradient, the tolerance, the thunk to time) of one built
    implementation: a forward, or a fwd+bwd step of sum(out · gout)."""
    xs = ref.xs
    if ref.gout is not None:
        def timed():
            leaves = _leaves(xs, True, ref.buffers)
            out = built(*leaves)
            out.backward(ref.gout.to(out.dtype))
            return out, tuple(x.grad for x in leaves if x.requires_grad)
        out, grads = timed()
        errs = [_error(out, ref.out)] + [_error(a, b) for a, b in zip(grads, ref.grads)]
    else:
        def timed():
            with torch.no_grad():
                return built(*xs)
        errs = [_error(timed(), ref.out)]
    dt = ref.dtype
    tol = default_tolerance(dt, (dt,)) if name == "neptune_eq" else max(default_tolerance(dt, (dt,)), PEER_TOLERANCE)
    return errs, tol, timed


def run_row(row: Row, device: str, dry: bool, peers: set[str], bench: Callable) -> dict:
    ref = reference(row, device, dry)
    res = {"row": row.name, "backward": row.backward, "impl": {}}
    for name, thunk_of in _implementations(row, ref.xs, peers):
        entry: dict = {}
        t0 = time.perf_counter()
        try:
            built = thunk_of()  # compile (neptune_eq, torch.compile), or build the peer
            entry["build_s"] = round(time.perf_counter() - t0, 2)
            errs, tol, timed = checked(name, built, ref)
            entry["rel_err"] = [float(f"{e:.3g}") for e in errs]
            if max(errs) > tol:
                entry["error"] = f"failed the float64 check: {max(errs):.2e} > {tol:g}"
            else:
                entry["ms"] = bench(timed)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:240] if str(e) else ''}"
            if "--verbose" in sys.argv:
                traceback.print_exc()
        res["impl"][name] = entry
        print(f"  {row.name:45s} {name:10s} {entry.get('ms', entry.get('error'))}", file=sys.stderr, flush=True)
    times = {k: v["ms"] for k, v in res["impl"].items() if "ms" in v}
    if "neptune_eq" in times and len(times) > 1:
        best = min((v, k) for k, v in times.items() if k != "neptune_eq")
        res["best_peer"], res["ratio"] = best[1], round(best[0] / times["neptune_eq"], 3)
    return res


def _implementations(row: Row, xs, peers: set[str]):
    """(name, builder): a builder returns the callable to check and time (compiling it first)."""
    def ours():
        prog = neptune_eq.compile(row.fn, *xs)
        return prog

    yield "neptune_eq", ours
    if "eager" in peers and "eager" in row.peers:
        yield "eager", lambda: row.fn
    if "compile" in peers and "compile" in row.peers:
        def comp():
            import torch._dynamo
            torch._dynamo.reset()
            return torch.compile(row.fn, dynamic=False)
        yield "compile", comp
    if "sdpa" in peers and "sdpa" in row.peers:
        def sdpa():
            def call(*a):
                return _sdpa_of(row, a)()
            return call
        yield "sdpa", sdpa
    if "liger" in peers and row.liger is not None:
        def lig():
            def call(*a):
                return row.liger(a)()
            return call
        yield "liger", lig


def main(argv=None, rows: list[Row] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="substrings of row names")
    ap.add_argument("--dry", action="store_true", help="CPU, tiny sizes, Triton's interpreter")
    ap.add_argument("--skip-compile", action="store_true", help="no torch.compile peer (slow to build)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    device = "cpu" if a.dry else "cuda"
    peers = {"eager", "sdpa", "liger"} | (set() if a.skip_compile or a.dry else {"compile"})
    if device == "cuda":
        import triton.testing

        def bench(fn):
            return round(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"), 4)
    else:
        def bench(fn):
            t0 = time.perf_counter()
            fn()
            return round((time.perf_counter() - t0) * 1e3, 3)
    rows = [r for r in (ROWS if rows is None else rows) if not a.only or any(s in r.name for s in a.only)]
    results = []
    for row in rows:
        print(f"[{len(results) + 1}/{len(rows)}] {row.name}", file=sys.stderr, flush=True)
        res = run_row(row, device, a.dry, peers, bench)
        results.append(res)
        print(json.dumps(res), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "date": time.strftime("%Y-%m-%d"),
            "torch": torch.__version__}
    if a.out:
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
