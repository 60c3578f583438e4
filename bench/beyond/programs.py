"""The programs of bench/beyond: what bench/ does not time, each written as ordinary PyTorch.

Each program is the plain function a user would write (nothing here uses neptune_eq), with its
seeded input maker, its useful work, its ceiling and its sizes:

| program            | what it computes                                   | dtype | sizes                    |
| softmax            | torch.softmax(x, -1)                               | fp16  | 4096×65536, 65536×1024   |
| log_softmax        | torch.log_softmax(x, -1)                           | fp16  | 4096×65536, 65536×1024   |
| logsumexp          | torch.logsumexp(x, -1)                             | fp16  | 4096×65536, 65536×1024   |
| rmsnorm_matmul     | RMSNorm(x)·w @ W                                   | bf16  | x 4096×8192, W 8192×8192 |
| layernorm_matmul   | F.layer_norm(x, (K,), g, b) @ W                    | bf16  | x 4096×8192, W 8192×8192 |
| linear_ce          | F.cross_entropy((h @ Wᵀ).float(), target)          | bf16  | 8192 tokens, 4096 → 128256 |
| bias_attention     | softmax(q kᵀ/√d + bias[h]) v, bias of (heads, L, L) | fp16  | 2×16 heads, L 4096, d 64 |
| causal_gqa         | causal attention, 32 query / 8 kv heads            | bf16  | 4×32/8 heads, L 4096, d 128 |
| causal_attention   | causal attention (arange mask)                     | bf16  | 8×16 heads, L 2048, d 64 |
| softmax_entropy    | −Σ softmax(x)·log_softmax(x) per row (issue 12)     | fp16  | 4096×32768, 512×262144   |
| kl_rows            | KL(softmax(a) ‖ softmax(b)) per row                | fp16  | 4096×32768, 512×262144   |
| row_variance       | x.var(-1, unbiased=False)                          | fp16  | 4096×32768               |
| temperature_softmax| softmax(x / t), t per row                          | fp16  | 4096×32768               |
| absmax_softmax     | softmax(x / max|x|)                                | fp16  | 4096×32768               |
| naive_softmax      | exp(x) / Σ exp(x), no max subtracted               | fp16  | 4096×32768               |
| moments_variance   | E[x²] − E[x]² in float32 (cancels as written)      | fp16  | 4096×32768, 512×262144   |
| layer_norm_rows    | F.layer_norm(x, (N,)), no affine                   | fp16  | 4096×32768, 512×262144   |

row_variance, softmax_entropy and kl_rows also run at 512×262144: a 512 KB row that no program holds
on chip, so a plan reading it once (the affine repairs of issue 12: Welford's running mean, the
entropy's and KL's borrowed normalisers) and one reading it two or three times differ by passes over HBM.

Useful work: memory-bound programs count the bytes they must read and write once; matmul-fed
programs count 2·M·K·N FLOPs; attention counts 4·d FLOPs per head per unmasked (query, key) pair.
Ceilings: a `torch.mm` at the matmul's shape (attention: a square mm of the same FLOPs, the
tensor-core rate a fused kernel can at best reach), or a device copy moving the program's bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

Dims = Mapping[str, int]
Kind = Literal["matmul", "memory", "attention"]
EPS = 1e-6


# ---------------------------------------------------------------- the programs, as a user writes them


def softmax(x):
    return torch.softmax(x, dim=-1)


def log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def logsumexp(x):
    return torch.logsumexp(x, dim=-1)


def rmsnorm_matmul(x, w, W):
    """RMSNorm as Llama writes it (statistics in float32), feeding a projection."""
    rms = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
    return (x * rms.to(x.dtype) * w) @ W


def rmsnorm_matmul_math(x, w, W):
    """The same without the narrowing casts: what the float64 reference evaluates."""
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w) @ W


def layernorm_matmul(x, g, b, W):
    return F.layer_norm(x, (x.shape[-1],), g, b, eps=EPS) @ W


def linear_ce(h, W, target):
    """Cross-entropy of the logits of an LM head (the logits are what a fused kernel avoids writing)."""
    return F.cross_entropy((h @ W.T).float(), target)


def linear_ce_math(h, W, target, chunk: int = 1024):
    """The same mean, in chunks of tokens: the float64 logits of 8192 × 128256 would take 8 GB."""
    total = sum(F.cross_entropy(h[i:i + chunk] @ W.T, target[i:i + chunk], reduction="sum")
                for i in range(0, h.shape[0], chunk))
    return total / h.shape[0]


def bias_attention(q, k, v, bias):
    """Attention with a learned per-head bias of the scores (bias: heads × L × L, shared by the batch)."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 + bias
    return torch.softmax(s, dim=-1) @ v


def causal_gqa(q, k, v):
    """Causal grouped-query attention: the kv heads are broadcast to the query heads (expand + reshape)."""
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    k = k[:, :, None].expand(B, Hkv, H // Hkv, S, D).reshape(B, H, S, D)
    v = v[:, :, None].expand(B, Hkv, H // Hkv, S, D).reshape(B, H, S, D)
    s = q @ k.transpose(-2, -1) / math.sqrt(D)
    keep = torch.arange(S, device=q.device)[None, :] <= torch.arange(L, device=q.device)[:, None]
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


def causal_attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    L, S = s.shape[-2:]
    keep = torch.arange(S, device=q.device)[None, :] <= torch.arange(L, device=q.device)[:, None]
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


# issue 12: reductions whose one-pass plans need corrections over several accumulators, or a stable spelling


def softmax_entropy(x):
    """−Σ p·log p of softmax(x) per row."""
    return -(torch.softmax(x.float(), -1) * torch.log_softmax(x.float(), -1)).sum(-1)


def kl_rows(a, b):
    """KL(softmax(a) ‖ softmax(b)) per row."""
    la, lb = torch.log_softmax(a.float(), -1), torch.log_softmax(b.float(), -1)
    return (la.exp() * (la - lb)).sum(-1)


def row_variance(x):
    return x.float().var(-1, unbiased=False)


def temperature_softmax(x, t):
    """softmax(x / t) with a per-row temperature t (rows × 1)."""
    return torch.softmax(x / t, -1)


def absmax_softmax(x):
    return torch.softmax(x / x.abs().amax(-1, keepdim=True), -1)


def moments_variance(x):
    """The variance as E[x²] − E[x]², as it is often written: catastrophic cancellation in float32 when the
    mean is large against the spread (the compiler extracts the centred form instead)."""
    xf = x.float()
    return (xf * xf).mean(-1) - xf.mean(-1) ** 2


def layer_norm_rows(x):
    return F.layer_norm(x, (x.shape[-1],))


def naive_softmax(x):
    """exp(x) / Σ exp(x) as written, without subtracting the row max."""
    e = torch.exp(x.float())
    return e / e.sum(-1, keepdim=True)


# ---------------------------------------------------------------- what a program is


@dataclass(frozen=True)
class MatmulCeiling:
    """torch.mm of an (m × k) by (k × n) matrix in the program's dtype."""

    m: int
    k: int
    n: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


@dataclass(frozen=True)
class CopyCeiling:
    """A device copy y.copy_(x) moving `nbytes` in all (half read, half written)."""

    nbytes: int


Ceiling = MatmulCeiling | CopyCeiling


@dataclass(frozen=True)
class Check:
    """What the float64 check compares: `count` indices sampled along the output's dimension 0 and,
    in step, along `input_dims[i]` of input i (None: input i whole). An output row must depend only
    on its own input rows. All indices when the extent is not larger than `count`."""

    input_dims: tuple[int | None, ...]
    count: int


@dataclass(frozen=True)
class AttentionSpec:
    """How the attention peers (SDPA, FlexAttention) express the program: causal or not, and which
    input (if any) is a bias of the scores, of shape (heads, L, S)."""

    causal: bool
    bias_input: int | None = None


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable[..., torch.Tensor]
    kind: Kind
    dtype: torch.dtype
    make_inputs: Callable[[Dims, torch.dtype, str, torch.Generator], tuple]
    sizes: tuple[Dims, ...]  # the benchmark's sizes
    tiny: Dims  # the CPU dry mode's size
    work: Callable[[Dims, int], float]  # FLOPs (matmul, attention) or bytes (memory); args: dims, itemsize
    ceiling: Callable[[Dims, int], Ceiling]
    check: Check | None = None  # None: the whole output
    reference_fn: Callable | None = None  # evaluated in float64; None: fn itself
    attention: AttentionSpec | None = None
    liger: str | None = None  # the Liger-Kernel operation that computes it (bench/beyond/peers.py)


@dataclass(frozen=True)
class Case:
    """One program at one size."""

    program: Program
    dims: Dims

    @property
    def name(self) -> str:
        return self.program.name

    @property
    def shape(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.dims.items())

    @property
    def label(self) -> str:
        return f"{self.name} {self.shape}"

    @property
    def itemsize(self) -> int:
        return torch.finfo(self.program.dtype).bits // 8

    def inputs(self, device: str, seed: int = 0) -> tuple:
        """Seeded random inputs, drawn on `device` (a GPU draws the 0.5 G values of linear_ce's W
        in milliseconds; the values differ between devices, their distribution does not)."""
        g = torch.Generator(device=device).manual_seed(seed)
        return self.program.make_inputs(self.dims, self.program.dtype, device, g)

    @property
    def work(self) -> float:
        return self.program.work(self.dims, self.itemsize)

    @property
    def ceiling(self) -> Ceiling:
        return self.program.ceiling(self.dims, self.itemsize)


# ---------------------------------------------------------------- inputs, work and ceilings


def _randn(g: torch.Generator, *shape, dtype, device, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, device=device) * scale + offset).to(dtype)


def _rows_inputs(d: Dims, dtype, device, g):
    return (_randn(g, d["M"], d["N"], dtype=dtype, device=device),)


def _rows_bytes(d: Dims, el: int) -> float:  # read x, write y
    return 2.0 * d["M"] * d["N"] * el


def _lse_bytes(d: Dims, el: int) -> float:  # read x, write one value a row
    return float(d["M"] * d["N"] * el + d["M"] * el)


def _copy_of(nbytes: Callable[[Dims, int], float]) -> Callable[[Dims, int], Ceiling]:
    return lambda d, el: CopyCeiling(int(nbytes(d, el)))


def _norm_mm_inputs(affine: int):
    """x (M × K), `affine` vectors of K (weight, then bias), W (K × N) scaled to keep y of unit size."""

    def make(d: Dims, dtype, device, g):
        x = _randn(g, d["M"], d["K"], dtype=dtype, device=device)
        vecs = [_randn(g, d["K"], dtype=dtype, device=device, scale=0.1, offset=1.0 - i) for i in range(affine)]
        W = _randn(g, d["K"], d["N"], dtype=dtype, device=device, scale=d["K"] ** -0.5)
        return (x, *vecs, W)

    return make


def _mm_flops(d: Dims, el: int) -> float:
    return 2.0 * d["M"] * d["K"] * d["N"]


def _mm_ceiling(d: Dims, el: int) -> Ceiling:
    return MatmulCeiling(d["M"], d["K"], d["N"])


def _ce_inputs(d: Dims, dtype, device, g):
    h = _randn(g, d["T"], d["H"], dtype=dtype, device=device)
    W = _randn(g, d["V"], d["H"], dtype=dtype, device=device, scale=d["H"] ** -0.5)
    target = torch.randint(0, d["V"], (d["T"],), generator=g, device=device)
    return h, W, target


def _attn_inputs(bias: bool):
    def make(d: Dims, dtype, device, g):
        B, H, Hkv, L, D = d["B"], d["H"], d.get("Hkv", d["H"]), d["L"], d["D"]
        q = _randn(g, B, H, L, D, dtype=dtype, device=device)
        k = _randn(g, B, Hkv, L, D, dtype=dtype, device=device)
        v = _randn(g, B, Hkv, L, D, dtype=dtype, device=device)
        return (q, k, v, _randn(g, H, L, L, dtype=dtype, device=device)) if bias else (q, k, v)

    return make


def _attn_flops(causal: bool) -> Callable[[Dims, int], float]:
    def flops(d: Dims, el: int) -> float:
        L = d["L"]
        pairs = L * (L + 1) // 2 if causal else L * L
        return 4.0 * d["B"] * d["H"] * d["D"] * pairs

    return flops


def _square_mm_of(flops: Callable[[Dims, int], float]) -> Callable[[Dims, int], Ceiling]:
    """A square mm of (about) the same FLOPs, its side a multiple of 256."""

    def ceiling(d: Dims, el: int) -> Ceiling:
        n = max(256, round((flops(d, el) / 2) ** (1 / 3) / 256) * 256)
        return MatmulCeiling(n, n, n)

    return ceiling


def _program_rows(name, fn, nbytes, liger=None) -> Program:
    return Program(name, fn, "memory", torch.float16, _rows_inputs,
                   sizes=({"M": 4096, "N": 65536}, {"M": 65536, "N": 1024}), tiny={"M": 16, "N": 256},
                   work=nbytes, ceiling=_copy_of(nbytes), check=Check((0,), 256), liger=liger)


def _program_attention(name, fn, dtype, sizes, tiny, causal, bias, check_count) -> Program:
    flops = _attn_flops(causal)
    dims = (0, 0, 0, None) if bias else (0, 0, 0)
    return Program(name, fn, "attention", dtype, _attn_inputs(bias), sizes=sizes, tiny=tiny, work=flops,
                   ceiling=_square_mm_of(flops), check=Check(dims, check_count),
                   attention=AttentionSpec(causal=causal, bias_input=3 if bias else None))


def _two_rows_inputs(second: str):
    """x (rows × N) and a second input: another row block ("rows") or a positive temperature per row."""

    def make(d: Dims, dtype, device, g):
        x = _randn(g, d["M"], d["N"], dtype=dtype, device=device)
        if second == "rows":
            return x, _randn(g, d["M"], d["N"], dtype=dtype, device=device)
        return x, (0.5 + torch.rand(d["M"], 1, generator=g, device=device)).to(dtype)

    return make


def _program_long_rows(name, fn, nbytes, make=_rows_inputs, inputs: int = 1, streamed: bool = False) -> Program:
    """Issue 12's rows: 4096 of 32768, fp16 (the row length its report asks for); `streamed`: also
    512 rows of 262144, too long for any plan to hold a row on chip."""
    sizes = ({"M": 4096, "N": 32768},) + (({"M": 512, "N": 262144},) if streamed else ())
    return Program(name, fn, "memory", torch.float16, make, sizes=sizes,
                   tiny={"M": 16, "N": 256}, work=nbytes, ceiling=_copy_of(nbytes), check=Check((0,) * inputs, 256))


PROGRAMS: dict[str, Program] = {p.name: p for p in (
    _program_rows("softmax", softmax, _rows_bytes, liger="softmax"),
    _program_rows("log_softmax", log_softmax, _rows_bytes),
    _program_rows("logsumexp", logsumexp, _lse_bytes),
    Program("rmsnorm_matmul", rmsnorm_matmul, "matmul", torch.bfloat16, _norm_mm_inputs(1),
            sizes=({"M": 4096, "K": 8192, "N": 8192},), tiny={"M": 16, "K": 64, "N": 32}, work=_mm_flops,
            ceiling=_mm_ceiling, check=Check((0, None, None), 256), reference_fn=rmsnorm_matmul_math,
            liger="rms_norm"),
    Program("layernorm_matmul", layernorm_matmul, "matmul", torch.bfloat16, _norm_mm_inputs(2),
            sizes=({"M": 4096, "K": 8192, "N": 8192},), tiny={"M": 16, "K": 64, "N": 32}, work=_mm_flops,
            ceiling=_mm_ceiling, check=Check((0, None, None, None), 256), liger="layer_norm"),
    Program("linear_ce", linear_ce, "matmul", torch.bfloat16, _ce_inputs,
            sizes=({"T": 8192, "H": 4096, "V": 128256},), tiny={"T": 16, "H": 32, "V": 128},
            work=lambda d, el: 2.0 * d["T"] * d["H"] * d["V"],
            ceiling=lambda d, el: MatmulCeiling(d["T"], d["H"], d["V"]),
            reference_fn=linear_ce_math, liger="fused_linear_ce"),
    _program_attention("bias_attention", bias_attention, torch.float16,
                       sizes=({"B": 2, "H": 16, "L": 4096, "D": 64},), tiny={"B": 1, "H": 2, "L": 32, "D": 16},
                       causal=False, bias=True, check_count=2),
    _program_attention("causal_gqa", causal_gqa, torch.bfloat16,
                       sizes=({"B": 4, "H": 32, "Hkv": 8, "L": 4096, "D": 128},),
                       tiny={"B": 2, "H": 4, "Hkv": 2, "L": 32, "D": 16}, causal=True, bias=False, check_count=1),
    _program_attention("causal_attention", causal_attention, torch.bfloat16,
                       sizes=({"B": 8, "H": 16, "L": 2048, "D": 64},), tiny={"B": 1, "H": 2, "L": 32, "D": 16},
                       causal=True, bias=False, check_count=2),
    _program_long_rows("softmax_entropy", softmax_entropy, _lse_bytes, streamed=True),
    _program_long_rows("kl_rows", kl_rows, lambda d, el: 2.0 * d["M"] * d["N"] * el + d["M"] * 4,
                       make=_two_rows_inputs("rows"), inputs=2, streamed=True),
    _program_long_rows("row_variance", row_variance, _lse_bytes, streamed=True),
    _program_long_rows("temperature_softmax", temperature_softmax, _rows_bytes, make=_two_rows_inputs("t"),
                       inputs=2),
    _program_long_rows("absmax_softmax", absmax_softmax, _rows_bytes),
    _program_long_rows("naive_softmax", naive_softmax, _rows_bytes),
    _program_long_rows("moments_variance", moments_variance, _lse_bytes, streamed=True),
    _program_long_rows("layer_norm_rows", layer_norm_rows, _rows_bytes, streamed=True),
)}


def cases(names=None, *, dry: bool = False) -> list[Case]:
    """Every (program, size) to run, in PROGRAMS order; `dry`: each program once, at its tiny size."""
    unknown = set(names or ()) - set(PROGRAMS)
    if unknown:
        raise ValueError(f"unknown program(s) {sorted(unknown)}; known: {', '.join(PROGRAMS)}")
    chosen = [p for p in PROGRAMS.values() if not names or p.name in names]
    return [Case(p, d) for p in chosen for d in ((p.tiny,) if dry else p.sizes)]
