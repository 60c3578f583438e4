"""Triton helpers for the op table's math functions that have no `tl.` builtin: pow, hypot, and the
roundings to integral values (floor, ceil, trunc, rint).

On a GPU each is libdevice's (C's special values, correctly rounded to a few ulps). Triton's
interpreter has no libdevice (extern calls are refused), so the portable versions are written from
tl.exp2 / tl.log2 / tl.sqrt with C's special values spelled out. Each helper first makes both
arguments tensors of one dtype and shape (`tl.where(True, a, b)`): a constant argument arrives as a
Python number, which libdevice and tl.floor do not take.
"""

from __future__ import annotations

POW_CUDA = '''

from triton.language.extra import libdevice


@triton.jit
def _pow(x, p):
    x, p = tl.where(True, x, p), tl.where(True, p, x)
    return libdevice.pow(x, p)
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
    r = tl.where(negative & odd, -r, r)
    r = tl.where((x < 0) & (x > NEG_INF) & (whole == 0), _nan().to(r.dtype), r)
    r = tl.where((ax == 1.0) & (tl.abs(p) == POS_INF), 1.0, r)
    return tl.where((x == 1.0) | (p == 0.0), 1.0, r)
'''

HYPOT_CUDA = '''

from triton.language.extra import libdevice


@triton.jit
def _hypot(a, b):
    a, b = tl.where(True, a, b), tl.where(True, b, a)
    return libdevice.hypot(a, b)
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

# to integral values, from tl.floor alone (the same code on a GPU: a few ALU operations): x − ⌊x⌋ is
# exact, a tie goes to the even neighbour, |x| ≥ 2^52 is integral already, ±inf and NaN pass unchanged
INTEGRAL = '''

@triton.jit
def _floor(x):
    return tl.floor(tl.where(True, x, x))


@triton.jit
def _ceil(x):
    return -tl.floor(-tl.where(True, x, x))


@triton.jit
def _trunc(x):
    x = tl.where(True, x, x)
    return tl.where(x < 0, -tl.floor(-x), tl.floor(x))


@triton.jit
def _rint(x):
    x = tl.where(True, x, x)
    f = tl.floor(x)
    d = x - f
    r = tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, f + (f - 2.0 * tl.floor(0.5 * f))))
    return tl.where(d == d, r, x)
'''

_HELPERS = {"_pow(": (POW_CUDA, POW_PORTABLE), "_hypot(": (HYPOT_CUDA, HYPOT_PORTABLE)}
_INTEGRAL_CALLS = ("_floor(", "_ceil(", "_trunc(", "_rint(")


def math_helpers(sources: list[str], target: str) -> str:
    """The helper definitions the kernel sources call, for `target`."""
    out = ""
    for call, (cuda, portable) in _HELPERS.items():
        if any(call in s for s in sources):
            out += cuda if target == "cuda" else portable
    if any(call in s for call in _INTEGRAL_CALLS for s in sources):
        out += INTEGRAL
    return out
