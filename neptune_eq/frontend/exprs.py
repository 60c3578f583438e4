"""Small IR helpers for the translator: constants, calls, and substitution of axis indices that
respects the axes bound by reductions."""

from __future__ import annotations

import math
from collections.abc import Callable

from .. import ir


def const(x: float) -> ir.Const:
    return ir.Const(float(x))


def call(op: str, *args: ir.Node) -> ir.Call:
    return ir.Call(op, tuple(args))


def is_const(n: ir.Node, value: float | None = None) -> bool:
    return isinstance(n, ir.Const) and (value is None or n.value == value)


def add(a: ir.Node, b: ir.Node) -> ir.Node:
    if is_const(b, 0.0):
        return a
    if is_const(a, 0.0):
        return b
    return call("add", a, b)


def mul(a: ir.Node, b: ir.Node) -> ir.Node:
    if is_const(b, 1.0):
        return a
    if is_const(a, 1.0):
        return b
    return call("mul", a, b)


def power(x: ir.Node, n: int) -> ir.Node:
    """xⁿ for an integer n ≥ 1 as products (cheaper than a pow per element, and exact at x = 0)."""
    out = x
    for _ in range(n - 1):
        out = call("mul", out, x)
    return out


def reduce(op: str, body: ir.Node, axes: list[str], length: Callable[[str], ir.Node]) -> ir.Node:
    """`op` over each of `axes` in turn; an axis the body does not vary along is a repeated
    element: n·body for sum (n = `length(axis)`), body for max/min."""
    for a in reversed(axes):
        if a in body.axes:
            body = ir.Reduce(op, a, body)
        elif op == "sum":
            body = mul(body, length(a))
    return body


def substitute(node: ir.Node, mapping: dict[str, ir.Node], fresh: Callable[[str], str]) -> ir.Node:
    """Replace free occurrences of `Index(a)` by `mapping[a]`.

    Occurrences bound by a reduction over `a` are left alone; a reduction whose axis appears free in
    a replacement is renamed to `fresh(axis)` first, so nothing is captured.
    """
    memo: dict[tuple, ir.Node] = {}

    def go(n: ir.Node, m: dict[str, ir.Node]) -> ir.Node:
        live = {k: v for k, v in m.items() if k in n.axes}
        if not live:
            return n
        key = (id(n), tuple(sorted((k, id(v)) for k, v in live.items())))
        hit = memo.get(key)
        if hit is not None and hit[1] is n and all(hit[2].get(k) is v for k, v in live.items()):
            return hit[0]
        if isinstance(n, ir.Index):
            out = live[n.axis]
        elif isinstance(n, ir.Load):
            out = ir.Load(n.tensor, tuple(go(a, live) for a in n.index))
        elif isinstance(n, ir.Call):
            out = ir.Call(n.op, tuple(go(a, live) for a in n.args))
        elif isinstance(n, ir.Reduce):
            inner = {k: v for k, v in live.items() if k != n.axis}
            axis, body = n.axis, n.body
            if any(axis in v.axes for v in inner.values()):
                axis = fresh(n.axis)
                body = go(body, {n.axis: ir.Index(axis)})
            out = ir.Reduce(n.op, axis, go(body, inner))
        else:
            out = n
        # (n and the values kept with the entry, and checked on a hit: the key holds their ids, and a
        # renamed body or a fresh index built here would otherwise be freed and its id taken by another
        # node, which would then find this entry)
        memo[key] = (out, n, live)
        return out

    return go(node, dict(mapping))


_FLIP = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}
_INTEGER_OPS = ("add", "sub", "mul", "neg", "floordiv", "mod", "max2", "min2", "abs")


def is_integer(n: ir.Node, int_tensors: frozenset[str] | set[str]) -> bool:
    """n is integer-valued: built from axis indices, integral constants and integer inputs."""
    if isinstance(n, ir.Index):
        return True
    if isinstance(n, ir.Const):
        return math.isfinite(n.value) and n.value == int(n.value)
    if isinstance(n, ir.Load):
        return n.tensor in int_tensors
    if isinstance(n, ir.Call) and n.op in _INTEGER_OPS:
        return all(is_integer(a, int_tensors) for a in n.args)
    return False


def negate(p: ir.Node, int_tensors: frozenset[str] | set[str]) -> ir.Node | None:
    """An expression for `not p` without a `not` at the top, or None: ~~x → x, ~(j > i) → j <= i
    for integer operands (floats may be NaN), De Morgan over & and |."""
    if not isinstance(p, ir.Call):
        return None
    if p.op == "not":
        return p.args[0]
    if p.op in _FLIP and all(is_integer(a, int_tensors) for a in p.args):
        return call(_FLIP[p.op], *p.args)
    if p.op in ("and", "or"):
        parts = [negate(a, int_tensors) for a in p.args]
        if all(x is not None for x in parts):
            return call("or" if p.op == "and" else "and", *parts)
    return None


def select(cond: ir.Node, a: ir.Node, b: ir.Node, int_tensors: frozenset[str] | set[str]) -> ir.Node:
    """where(cond, a, b), written with the kept value first when the other is -inf (a mask): the
    predicate then says which elements take part (`where(j <= i, s, -inf)`), as masks.py reads it."""
    if isinstance(cond, ir.Call) and cond.op == "not":
        cond, a, b = cond.args[0], b, a
    if is_const(a, float("-inf")) and not is_const(b, float("-inf")):
        flipped = negate(cond, int_tensors)
        if flipped is not None:
            return call("where", flipped, b, a)
    return call("where", cond, a, b)


def arg_extreme_axis(n: ir.Node) -> str | None:
    """The axis `n` is the argmax or argmin over, where n is _arg_extreme's form over one axis
    (min_a where(x == ext_a x  or  x != x, a, n_a)): an index in [0, n_a), a selection along a."""
    if not (isinstance(n, ir.Reduce) and n.op == "min" and isinstance(n.body, ir.Call) and n.body.op == "where"):
        return None
    hit, at, past = n.body.args
    a = n.axis
    if not (isinstance(at, ir.Index) and at.axis == a and isinstance(hit, ir.Call) and hit.op == "or"):
        return None
    eq, nan = hit.args
    if not (isinstance(eq, ir.Call) and eq.op == "eq" and isinstance(eq.args[1], ir.Reduce)
            and eq.args[1].op in ("max", "min") and eq.args[1].axis == a and eq.args[1].body == eq.args[0]
            and nan == ir.Call("ne", (eq.args[0], eq.args[0]))):
        return None
    # (the element attaining the extreme, or a NaN, is always hit: `past`, the value for none, is never taken)
    return a if isinstance(past, ir.Const | ir.Length) else None
