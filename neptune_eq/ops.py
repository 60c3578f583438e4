"""The operator vocabulary: one table of elementwise ops and reduction monoids with their properties.

Everything else derives from here: the egglog constructors (terms.py), the generic algebra rules
(commutativity, identities), the float64 evaluators used by the reference and the rule fuzzer,
the Triton emitters and the cost classes of the cost model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

INF = math.inf
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def _np_rsqrt(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(x)


def _np_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.divide(a, b)


_np_erf = np.vectorize(math.erf, otypes=[float])  # (numpy has no erf)


def _np_round_bf16(x):
    """x rounded to bfloat16 (to nearest, ties to even) through float32, as torch converts a double."""
    with np.errstate(all="ignore"):
        f = np.asarray(x, dtype=np.float64).astype(np.float32)
        u = f.view(np.uint32).astype(np.uint64)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
        return np.where(np.isnan(f), f, r).astype(np.float64)


def _np_round_to(dtype):
    def run(x):
        with np.errstate(all="ignore"):  # (fp16 overflows to ±inf, as torch's conversion does)
            return np.asarray(x, dtype=np.float64).astype(np.float32).astype(dtype).astype(np.float64)

    return run


def _np_guard(fn):
    def run(*args):
        with np.errstate(all="ignore"):
            return fn(*args)

    return run


@dataclass(frozen=True)
class Op:
    """An elementwise operator.

    `unit` says which hardware unit does the work on a GPU ("alu": FMA pipes, "sfu": special
    function unit, "cmp": compare/select), `weight` is its relative cost on that unit.
    `triton` is a format string over the argument expressions (already fp32 Triton values).
    """

    name: str
    arity: int
    numpy: Callable
    triton: str
    unit: str = "alu"
    weight: float = 1.0
    commutative: bool = False
    associative: bool = False
    identity: float | None = None  # x op identity == x
    infix: str | None = None  # for printing
    predicate: bool = False  # result is a boolean
    integer_ok: bool = True  # may appear in index arithmetic


OPS: dict[str, Op] = {
    op.name: op
    for op in [
        Op("add", 2, _np_guard(np.add), "({0} + {1})", commutative=True, associative=True, identity=0.0, infix="+"),
        Op("sub", 2, _np_guard(np.subtract), "({0} - {1})", identity=0.0, infix="-"),
        Op("mul", 2, _np_guard(np.multiply), "({0} * {1})", commutative=True, associative=True, identity=1.0,
           infix="*"),
        Op("div", 2, _np_div, "({0} / {1})", weight=4.0, identity=1.0, infix="/", integer_ok=False),
        Op("floordiv", 2, _np_guard(np.floor_divide), "({0} // {1})", infix="//"),
        Op("mod", 2, _np_guard(np.mod), "({0} % {1})", infix="%"),
        # x·(−1), not -x: Triton 3.6 writes a float's unary minus as 0 − x, which is +0 at x = +0 (torch: −0)
        Op("neg", 1, _np_guard(np.negative), "(-1 * {0})"),
        Op("exp", 1, _np_guard(np.exp), "tl.exp({0})", unit="sfu", weight=1.0, integer_ok=False),
        Op("exp2", 1, _np_guard(np.exp2), "_exp2({0})", unit="sfu", weight=1.0, integer_ok=False),
        Op("log", 1, _np_guard(np.log), "tl.log({0})", unit="sfu", weight=1.0, integer_ok=False),
        Op("log2", 1, _np_guard(np.log2), "tl.log2({0})", unit="sfu", weight=1.0, integer_ok=False),
        Op("log1p", 1, _np_guard(np.log1p), "_log1p({0})", unit="sfu", weight=2.0, integer_ok=False),
        Op("expm1", 1, _np_guard(np.expm1), "_expm1({0})", unit="sfu", weight=2.0, integer_ok=False),
        Op("erf", 1, _np_guard(_np_erf), "tl.math.erf({0})", unit="sfu", weight=4.0, integer_ok=False),
        Op("tanh", 1, _np_guard(np.tanh), "_tanh({0})", unit="sfu", weight=2.0, integer_ok=False),
        # (libdevice's sinf / cosf: full-range argument reduction, RoPE's angles of 10⁴ radians stay exact)
        Op("sin", 1, _np_guard(np.sin), "tl.sin({0})", unit="sfu", weight=2.0, integer_ok=False),
        Op("cos", 1, _np_guard(np.cos), "tl.cos({0})", unit="sfu", weight=2.0, integer_ok=False),
        Op("sqrt", 1, _np_guard(np.sqrt), "tl.sqrt({0})", unit="sfu", weight=1.0, integer_ok=False),
        Op("rsqrt", 1, _np_rsqrt, "tl.rsqrt({0})", unit="sfu", weight=1.0, integer_ok=False),
        Op("abs", 1, _np_guard(np.abs), "tl.abs({0})"),
        # x.detach(): the value of x, through which no gradient flows (neptune_eq/stopgrad.py: a
        # forward program is compiled without it, a backward derived with it)
        Op("stopgrad", 1, _np_guard(np.positive), "({0})", integer_ok=False),
        Op("max2", 2, _np_guard(np.maximum), "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
           commutative=True, associative=True, identity=-INF),
        Op("min2", 2, _np_guard(np.minimum), "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
           commutative=True, associative=True, identity=INF),
        Op("where", 3, _np_guard(np.where), "tl.where({0}, {1}, {2})", unit="cmp"),
        Op("lt", 2, _np_guard(np.less), "({0} < {1})", unit="cmp", infix="<", predicate=True),
        Op("le", 2, _np_guard(np.less_equal), "({0} <= {1})", unit="cmp", infix="<=", predicate=True),
        Op("gt", 2, _np_guard(np.greater), "({0} > {1})", unit="cmp", infix=">", predicate=True),
        Op("ge", 2, _np_guard(np.greater_equal), "({0} >= {1})", unit="cmp", infix=">=", predicate=True),
        Op("eq", 2, _np_guard(np.equal), "({0} == {1})", unit="cmp", infix="==", predicate=True,
           commutative=True),
        Op("ne", 2, _np_guard(np.not_equal), "({0} != {1})", unit="cmp", infix="!=", predicate=True,
           commutative=True),
        Op("and", 2, _np_guard(np.logical_and), "({0} & {1})", unit="cmp", infix="&", predicate=True,
           commutative=True, associative=True),
        Op("or", 2, _np_guard(np.logical_or), "({0} | {1})", unit="cmp", infix="|", predicate=True,
           commutative=True, associative=True),
        # (x == 0), not ~x: Triton's interpreter cannot invert a 0-d boolean (a row statistic's test)
        Op("not", 1, _np_guard(np.logical_not), "({0} == 0)", unit="cmp", predicate=True),
        # an integer made a float (torch's promotion of int · float, .float()): what follows is float
        # arithmetic, not int64 (which would overflow where torch's float does not)
        Op("float", 1, _np_guard(lambda x: np.asarray(x, dtype=float)), "{0}", weight=0.5, integer_ok=False),
        # a value torch holds in a narrower float dtype than the arithmetic that reads it (x.bfloat16().float(),
        # a bf16 product added to fp32): rounded to that dtype, still a number of the compute precision
        # (frontend/rounding.py places them; 1.0e5 in fp16 is inf, as torch's conversion gives)
        Op("round_bf16", 1, _np_round_bf16, "_round_bf16({0})", integer_ok=False),
        Op("round_f16", 1, _np_round_to(np.float16), "_round_f16({0})", integer_ok=False),
        Op("round_f32", 1, _np_round_to(np.float32), "_round_f32({0})", integer_ok=False),
        # xᵖ as torch's (C's) pow: a negative x to an integer p real, to any other p NaN; 0 to p < 0 is ∞;
        # x⁰ and 1ᵖ are 1, NaN included (lower/mathlib.py: exp2(p·log2|x|), on a GPU by its approximate log2 and exp2)
        Op("pow", 2, _np_guard(lambda x, p: np.power(np.asarray(x, dtype=float), p)), "_pow({0}, {1})", unit="sfu",
           weight=4.0, integer_ok=False),
        # √(a² + b²) without overflow or underflow of the squares; ∞ where either is ±∞, NaN included (C's)
        Op("hypot", 2, _np_guard(np.hypot), "_hypot({0}, {1})", unit="sfu", weight=3.0, commutative=True,
           integer_ok=False),
        # to an integral value: down, up, toward 0, to nearest with ties to even (torch.round's); no
        # gradient flows through them (torch's derivative is 0); ±inf and NaN pass (lower/mathlib.py)
        Op("floor", 1, _np_guard(np.floor), "_floor({0})", integer_ok=False),
        Op("ceil", 1, _np_guard(np.ceil), "_ceil({0})", integer_ok=False),
        Op("trunc", 1, _np_guard(np.trunc), "_trunc({0})", integer_ok=False),
        Op("rint", 1, _np_guard(np.rint), "_rint({0})", integer_ok=False),
    ]
}

COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
# the rounding of each float dtype narrower than float64, by dtype name
ROUNDINGS = {"bfloat16": "round_bf16", "float16": "round_f16", "float32": "round_f32"}


@dataclass(frozen=True)
class Monoid:
    """A reduction monoid ⊕ with the operator ⊗' that distributes over it.

    A correction h for a consumer ⊕_j g(r, c_j) is applied as `t ⊗' h`; it is searched as the
    quotient `g(r', c) ⊘ g(r, c)` with ⊘ the inverse of ⊗'. `dist` lists the candidate (⊗', ⊘)
    pairs in order of preference with the side condition on h that makes ⊗' distribute over ⊕.
    `annihilator` is the value a of ⊗' with t ⊗' a == identity of ⊕ (for t finite).
    """

    name: str
    combine: str  # the binary Op of the monoid
    identity: float
    triton_reduce: str  # format string over (block, axis); max/min propagate NaN like torch's amax/amin
    dist: tuple[tuple[str, str, str, float], ...] = field(default_factory=tuple)
    # each: (⊗', ⊘, side condition on h: "any" | "nonneg", annihilator of ⊗')


MONOIDS: dict[str, Monoid] = {
    "sum": Monoid("sum", "add", 0.0, "tl.sum({0}, axis={1})", dist=(("mul", "div", "any", 0.0),)),
    "max": Monoid("max", "max2", -INF, "tl.reduce({0}, {1}, _nan_max)",
                  dist=(("add", "sub", "any", -INF), ("mul", "div", "nonneg", 0.0))),
    "min": Monoid("min", "min2", INF, "tl.reduce({0}, {1}, _nan_min)",
                  dist=(("add", "sub", "any", INF), ("mul", "div", "nonneg", 0.0))),
}


def np_reduce(monoid: str, x: np.ndarray, axis: int) -> np.ndarray:
    """float64 reduction with the monoid's identity for empty axes."""
    with np.errstate(all="ignore"):
        if monoid == "sum":
            return np.sum(x, axis=axis)
        if x.shape[axis] == 0:
            shape = list(x.shape)
            del shape[axis]
            return np.full(shape, MONOIDS[monoid].identity)
        return np.max(x, axis=axis) if monoid == "max" else np.min(x, axis=axis)
