"""A proof that a program's outputs do not see a shift of one of its reductions: r → r + δ, δ any
finite value over r's free axes. Where it holds, r's adjoint is 0 (the max of a softmax, of a
log-sum-exp, of attention with a sink column or a gathered bias) and the backward drops it.

Each node is classed by how it moves when r does, for every δ at once:

    Inv        unchanged                          (everything not reading r)
    Add(a)     v + a·δ                            r itself; x − r; max_j (x − r) over j not an axis of δ
    Mul(k)     v · e^{k·δ}                        e^{x − r} (k = −1); Σ_j e^{x − r}; their products

    exp(Add a) = Mul a     exp2(Add a) = Mul a·ln 2     log(Mul k) = Add k     log2(Mul k) = Add k/ln 2
    Add a ± Add b = Add(a ± b)          Add a · c = Add(a·c) for a constant c        −Add a = Add(−a)
    Mul k · Mul l = Mul(k + l)          Mul k / Mul l = Mul(k − l)                   Mul k ± Mul k = Mul k
    Σ_j, max_j, min_j keep the class along an axis δ does not vary on (max_j also on Add)
    where(c, A, B) with c Inv: A and B of one class (0 is every Mul, ±∞ every Add)
    a comparison of two values of one class, of Mul with 0, of Add with ±∞: Inv
    where(X == ±∞, c, X) = X's class (the guard of an empty row's shift)

The outputs are invariant when every one is Inv. This is exact algebra over the reals (no test
inputs, no extents), so it holds for programs too large for `grad.shift_invariant`'s numerical test,
whose masks pin their axes at full length (a relative-position bias gathered at clamp(j − i)); where
it cannot class a node (any other operator on a moving value) it proves nothing and the numerical
test decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import ir
from .ir import Call, Const, Load, Reduce


@dataclass(frozen=True)
class _Add:
    a: float


@dataclass(frozen=True)
class _Mul:
    k: float


_INV = _Add(0.0)  # also _Mul(0.0): both normalise to this
_UNKNOWN = None
_CMP = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
_BOOL = frozenset({"and", "or", "not", "float"})


def _norm(c):
    if isinstance(c, _Mul) and c.k == 0:
        return _INV
    return c


def _is_const(n: ir.Node, pred) -> bool:
    return isinstance(n, Const) and pred(n.value)


def _same(x, y) -> bool:
    return x is not _UNKNOWN and x == y


def _call_class(n: Call, cls: list):
    op, a = n.op, n.args
    if all(c == _INV for c in cls):
        return _INV
    if any(c is _UNKNOWN for c in cls):
        return _UNKNOWN
    if op in _CMP:
        x, y = cls
        if _same(x, y):
            return _INV
        for u, v, w in ((x, y, a[1]), (y, x, a[0])):
            if isinstance(u, _Mul) and v == _INV and _is_const(w, lambda z: z == 0):
                return _INV
            if isinstance(u, _Add) and v == _INV and _is_const(w, math.isinf):
                return _INV
        return _UNKNOWN
    if op in _BOOL:
        return _UNKNOWN  # a boolean of a moving value that is not a class-preserving comparison
    if op == "where":
        c, x, y = cls
        guard = a[0]
        if (isinstance(guard, Call) and guard.op == "eq" and guard.args[0] is a[2]
                and _is_const(guard.args[1], math.isinf) and isinstance(a[1], Const)):
            return y  # where(X == ±∞, c, X): X wherever X is finite
        if c != _INV:
            return _UNKNOWN
        if _same(x, y):
            return x
        for u, v, w in ((x, y, a[2]), (y, x, a[1])):
            if v == _INV and isinstance(u, _Mul) and _is_const(w, lambda z: z == 0):
                return u
            if v == _INV and isinstance(u, _Add) and _is_const(w, math.isinf):
                return u
        return _UNKNOWN
    if op in ("add", "sub"):
        x, y = cls
        sign = 1.0 if op == "add" else -1.0
        if isinstance(x, _Add) and isinstance(y, _Add):
            return _norm(_Add(x.a + sign * y.a))
        if isinstance(x, _Mul) and _same(x, y):
            return x
        for u, v, w in ((x, y, a[1]), (y, x, a[0])):
            if isinstance(u, _Mul) and v == _INV and _is_const(w, lambda z: z == 0):
                return u
        return _UNKNOWN
    if op == "neg":
        (x,) = cls
        return _Add(-x.a) if isinstance(x, _Add) else x
    if op in ("mul", "div"):
        x, y = cls
        if isinstance(x, _Mul) or isinstance(y, _Mul) or (x == _INV and y == _INV):
            kx = x.k if isinstance(x, _Mul) else (0.0 if x == _INV else None)
            ky = y.k if isinstance(y, _Mul) else (0.0 if y == _INV else None)
            if kx is None or ky is None:
                return _UNKNOWN
            return _norm(_Mul(kx + ky if op == "mul" else kx - ky))
        if isinstance(x, _Add) and y == _INV and isinstance(a[1], Const) and math.isfinite(a[1].value):
            f = a[1].value if op == "mul" else (1.0 / a[1].value if a[1].value else math.nan)
            return _norm(_Add(x.a * f)) if math.isfinite(f) else _UNKNOWN
        if op == "mul" and isinstance(y, _Add) and x == _INV and _is_const(a[0], math.isfinite):
            return _norm(_Add(y.a * a[0].value))
        return _UNKNOWN
    (x,) = cls if len(cls) == 1 else (None,)
    if op == "exp" and isinstance(x, _Add):
        return _norm(_Mul(x.a))
    if op == "exp2" and isinstance(x, _Add):
        return _norm(_Mul(x.a * math.log(2.0)))
    if op == "log" and isinstance(x, _Mul):
        return _norm(_Add(x.k))
    if op == "log2" and isinstance(x, _Mul):
        return _norm(_Add(x.k / math.log(2.0)))
    return _UNKNOWN


def proves_shift_invariant(outputs: list[ir.Node], r: Reduce) -> bool:
    """True when every output is unchanged by r → r + δ for every finite δ over r's free axes (a proof;
    False means not proved, not "not invariant")."""
    moving = frozenset(r.axes)
    cls: dict[ir.Node, object] = {r: _Add(1.0)}
    stack: list[tuple[ir.Node, bool]] = [(o, False) for o in outputs]
    while stack:  # post-order, iterative (programs may be deep)
        n, ready = stack.pop()
        if n in cls:
            continue
        kids = n.children()
        if not ready:
            stack.append((n, True))
            stack.extend((k, False) for k in kids if k not in cls)
            continue
        if isinstance(n, Reduce):
            b = cls[n.body]
            if b == _INV:
                c = _INV
            elif b is _UNKNOWN or n.axis in moving:
                c = _UNKNOWN
            elif n.op == "sum":
                c = b if isinstance(b, _Mul) else _UNKNOWN
            elif n.op in ("max", "min"):
                c = b
            else:
                c = _UNKNOWN
        elif isinstance(n, Call):
            c = _call_class(n, [cls[k] for k in kids])
        elif isinstance(n, Load):
            c = _INV if all(cls[k] == _INV for k in kids) else _UNKNOWN
        else:
            c = _INV
        cls[n] = c
    return all(cls[o] == _INV for o in outputs)
