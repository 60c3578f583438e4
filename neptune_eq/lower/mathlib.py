"""Triton helpers for the op table's math functions that have no `tl.` builtin: pow, hypot, the
roundings to integral values (floor, ceil, trunc, rint) and to narrower float dtypes (round_*).

On a GPU each is libdevice's (C's special values, correctly rounded to a few ulps), but pow: the
hardware's approximate log2 and exp2 (POW_CUDA). Triton's
interpreter has no libdevice (extern calls are refused), so the portable versions are written from
tl.exp2 / tl.log2 / tl.sqrt with C's special values spelled out. Each helper first makes both
arguments tensors of one dtype and shape (`tl.where(True, a, b)`): a constant argument arrives as a
Python number, which libdevice and tl.floor do not take.
"""

from __future__ import annotations

LIBDEVICE = """
from triton.language.extra import libdevice
"""


def _libdevice(name: str) -> str:
    """`_name(a, b)` as libdevice's `name` on a GPU, both arguments made tensors of one dtype first."""
    return f'''

@triton.jit
def _{name}(a, b):
    a, b = tl.where(True, a, b), tl.where(True, b, a)
    return libdevice.{name}(a, b)
'''


# |x|ᵖ = 2^(p·log2|x|), then C's pow at the edges: a negative x (−0 and −∞ included) to an odd integer p
# negates it, a finite negative x to a non-integer p is NaN, (−1)^±∞ = 1, x⁰ = 1ᵖ = 1 (NaN included).
# 0ᵖ, ∞ᵖ and |x| ≠ 1 to ±∞ come out of exp2 and log2 as C's (0, ∞).
POW_PORTABLE = '''

@triton.jit
def _pow(x, p):
    x, p = tl.where(True, x, p), tl.where(True, p, x)
    ax = tl.abs(x)
    r = tl.exp2(p * tl.log2(ax))
    whole = tl.floor(p) == p
    odd = whole & (p - 2.0 * tl.floor(0.5 * p) == 1.0)
    negative = (x < 0) | ((x == 0) & (1.0 / tl.where(x == 0, x, 1.0) < 0))
    r = tl.where(negative & odd, -1.0 * r, r)
    r = tl.where((x < 0) & (x > NEG_INF) & (whole == 0), _nan().to(r.dtype), r)
    r = tl.where((ax == 1.0) & (tl.abs(p) == POS_INF), 1.0, r)
    return tl.where((x == 1.0) | (p == 0.0), 1.0, r)
'''

# The same on a GPU with the hardware's approximate log2 and exp2 (one MUFU instruction each, subnormals
# kept) in place of libdevice's powf (about a hundred instructions an element: GeM pooling's
# clamp(eps).pow(p) over 16384×4096 bf16 took 223 µs for a 33 µs read, H200, session 48). The error is
# relative, |p|·2⁻²² from log2's absolute error, far inside float32's tolerance; the edge values are
# C's as above, the sign of −0 read from its bits. A float64 program keeps libdevice's pow.
POW_CUDA = LIBDEVICE + '''

@triton.jit
def _pow(x, p):
    x, p = tl.where(True, x, p), tl.where(True, p, x)
    if x.dtype == tl.float32:
        ax = tl.abs(x)
        lg = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [ax], dtype=tl.float32, is_pure=True,
                                       pack=1)
        r = tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=r,r", [p * lg], dtype=tl.float32,
                                      is_pure=True, pack=1)
        whole = tl.floor(p) == p
        odd = whole & (p - 2.0 * tl.floor(0.5 * p) == 1.0)
        r = tl.where((x.to(tl.int32, bitcast=True) < 0) & odd, -1.0 * r, r)
        r = tl.where((x < 0) & (x > NEG_INF) & (whole == 0), _nan(), r)
        r = tl.where((ax == 1.0) & (tl.abs(p) == POS_INF), 1.0, r)
        r = tl.where((x == 1.0) | (p == 0.0), 1.0, r)
    else:
        r = libdevice.pow(x, p)
    return r
'''

# hi·√(1 + (lo/hi)²) with hi = max(|a|, |b|): no square overflows or underflows; ∞ where either is ±∞
# (also beside NaN, as C's), NaN where either is NaN otherwise, 0 at (0, 0)
HYPOT_PORTABLE = '''

@triton.jit
def _hypot(a, b):
    a, b = tl.where(True, a, b), tl.where(True, b, a)
    aa, ab = tl.abs(a), tl.abs(b)
    hi = tl.maximum(aa, ab, propagate_nan=tl.PropagateNan.ALL)
    lo = tl.minimum(aa, ab, propagate_nan=tl.PropagateNan.ALL)
    r = lo / tl.where(hi == 0, 1.0, hi)
    h = hi * tl.sqrt(1.0 + r * r)
    return tl.where((aa == POS_INF) | (ab == POS_INF), POS_INF, h)
'''

# (a sign flips as x·(−1): Triton 3.6 writes -x as 0 − x, +0 at x = +0 where C has −0)
# to integral values, from tl.floor alone (the same code on a GPU: a few ALU operations): x − ⌊x⌋ is
# exact, a tie goes to the even neighbour, |x| ≥ 2^52 is integral already, ±inf and NaN pass unchanged
INTEGRAL = '''

@triton.jit
def _floor(x):
    return tl.floor(tl.where(True, x, x))


@triton.jit
def _ceil(x):
    return -1.0 * tl.floor(-1.0 * tl.where(True, x, x))


@triton.jit
def _trunc(x):
    x = tl.where(True, x, x)
    return tl.where(x < 0, -1.0 * tl.floor(-1.0 * x), tl.floor(x))


@triton.jit
def _rint(x):
    x = tl.where(True, x, x)
    f = tl.floor(x)
    d = x - f
    r = tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, f + (f - 2.0 * tl.floor(0.5 * f))))
    return tl.where(d == d, r, x)
'''

# a value rounded to a narrower float dtype (ops.py round_*), in the compute precision: the GPU converts
# to nearest even; Triton's interpreter truncates to bfloat16, so there the rounding is written out
# (_rne_bf16, lower/triton.py INTERPRETER_HELPERS)
ROUND_NARROW = '''

@triton.jit
def _round_f16(x):
    return x.to(tl.float32).to(tl.float16).to(x.dtype)


@triton.jit
def _round_f32(x):
    return x.to(tl.float32).to(x.dtype)
'''

ROUND_BF16_CUDA = '''

@triton.jit
def _round_bf16(x):
    return x.to(tl.float32).to(tl.bfloat16).to(x.dtype)
'''

ROUND_BF16_PORTABLE = '''

@triton.jit
def _round_bf16(x):
    return _rne_bf16(x).to(x.dtype)
'''

# the calls a kernel may make → (their helpers on a GPU, elsewhere), each block written once a module
_HELPERS = {
    ("_pow(",): (POW_CUDA, POW_PORTABLE),
    ("_hypot(",): (LIBDEVICE + _libdevice("hypot"), HYPOT_PORTABLE),
    ("_floor(", "_ceil(", "_trunc(", "_rint("): (INTEGRAL, INTEGRAL),
    ("_round_f16(", "_round_f32(", "_round_bf16("): (ROUND_NARROW + ROUND_BF16_CUDA,
                                                      ROUND_NARROW + ROUND_BF16_PORTABLE),
}


def math_helpers(sources: list[str], target: str) -> str:
    """The helper definitions the kernel sources call, for `target`."""
    out = ""
    for calls, (cuda, portable) in _HELPERS.items():
        if any(call in s for call in calls for s in sources):
            out += cuda if target == "cuda" else portable
    return out
