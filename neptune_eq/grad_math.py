"""Local derivatives of pow and hypot, with torch's conventions at their edges (checked against float64
torch autograd in tests/test_more_ops.py):

    xᵖ      ∂x: ḡ·p·x^(p−1), 0 where p = 0     ∂p: ḡ·xᵖ·log x, 0 where x = 0 and p ≥ 0 (torch's pow_backward)
    hypot   ∂a: ḡ·a/h, ∂b: ḡ·b/h              (NaN at (0, 0), as torch's)

A zero cotangent passes back 0 where the factor is ∞ or NaN (`keep_zero`, grad._zero_keeps), as for a
quotient or a logarithm: the unselected branch of a select stays 0.
"""

from __future__ import annotations

from collections.abc import Callable

from . import ir
from .grad_gather import _c, _call
from .ir import Call, Const

OPS = frozenset({"pow", "hypot"})


def local_math(n: Call, g: ir.Node, keep_zero: Callable[[ir.Node, ir.Node], ir.Node]) -> list[ir.Node | None]:
    """∂n/∂argₖ · g for each argument of a pow or hypot (None: no gradient flows to it)."""
    a = n.args
    if n.op == "hypot":
        return [keep_zero(g, _call("div", _call("mul", g, a[k]), n)) for k in range(2)]
    assert n.op == "pow", n.op
    x, p = a
    if isinstance(p, Const):  # a constant exponent: p·x^(p−1), nothing where p = 0 (x⁰ = 1 everywhere)
        if p.value == 0:
            return [None, None]
        return [keep_zero(g, _call("mul", g, _call("mul", p, _call("pow", x, _c(p.value - 1))))), None]
    dx = _call("mul", g, _call("mul", p, _call("pow", x, _call("sub", p, _c(1.0)))))
    at_zero = _call("and", _call("eq", x, _c(0.0)), _call("ge", p, _c(0.0)))  # d(0ᵖ)/dp: 0 for p ≥ 0, −∞ below
    dp = _call("mul", g, _call("mul", n, _call("log", x)))
    return [keep_zero(g, _call("where", _call("eq", p, _c(0.0)), _c(0.0), dx)),
            keep_zero(g, _call("where", at_zero, _c(0.0), dp))]
