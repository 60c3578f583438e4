"""A clamped shift of one axis, clamp(a + c, lo, hi): the index a slice, torch.cat, rotate-half or a
shifted window reads at. The gradient of such a read is a shift back (grad_gather.py); its load is a
contiguous tile under a range mask plus the clamped edges (lower/memory.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import ir
from .ir import Call, Const, Index


@dataclass(frozen=True)
class Shift:
    """e(a) = min(max(a + c, lo), hi) for every index a of `axis` (lo, hi may be ∓inf)."""

    axis: str
    c: int
    lo: float
    hi: float


_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


def _constant(n: ir.Node) -> float | None:
    """n's value where it is arithmetic of constants only: a bound written from a length known at
    capture (F.pad's clamp min2(k − l, n − 1) reads `7 - 1` in a static capture), else None."""
    if isinstance(n, Const):
        return n.value
    if isinstance(n, Call) and n.op in _FOLD and len(n.args) == 2:
        a, b = (_constant(x) for x in n.args)
        return None if a is None or b is None else _FOLD[n.op](a, b)
    if isinstance(n, Call) and n.op == "neg" and len(n.args) == 1:
        a = _constant(n.args[0])
        return None if a is None else -a
    return None


def _integer(n: ir.Node) -> int | None:
    v = _constant(n)
    if v is not None and math.isfinite(v) and float(v).is_integer():
        return int(v)
    return None


def clamped_shift(e: ir.Node) -> Shift | None:
    """e as a clamped shift of one axis, or None. Clamps compose: min(clamp(v, lo, hi), k) is
    clamp(v, min(lo, k), min(hi, k)), and a constant added moves the shift and both bounds."""
    if isinstance(e, Index):
        return Shift(e.axis, 0, -math.inf, math.inf)
    if not isinstance(e, Call) or e.op not in ("add", "sub", "min2", "max2") or len(e.args) != 2:
        return None
    x, k = e.args
    if _integer(k) is None and e.op != "sub":
        x, k = k, x
    kv = _integer(k)
    inner = clamped_shift(x) if kv is not None else None
    if inner is None:
        return None
    return _composed(inner, e.op, kv)


def _composed(sh: Shift, op: str, kv: int) -> Shift:
    """The shift `op(sh, kv)` of a clamped shift and an integer: a constant added moves the shift and
    both bounds; a min or max moves the bounds."""
    a, c, lo, hi = sh.axis, sh.c, sh.lo, sh.hi
    if op in ("add", "sub"):
        kv = kv if op == "add" else -kv
        return Shift(a, c + kv, lo + kv, hi + kv)
    if op == "min2":
        return Shift(a, c, min(lo, kv), min(hi, kv))
    return Shift(a, c, max(lo, kv), max(hi, kv))


def _index_only(n: ir.Node) -> bool:
    return all(isinstance(m, Index | Const) or (isinstance(m, Call) and m.op in ("add", "sub", "neg", "mul"))
               for m in ir.walk(n))


def offset_shift(e: ir.Node) -> tuple[Shift, ir.Node] | None:
    """e as clamp(a + c + o, lo, hi) with o an index expression of other axes (a relative position
    clamp(j − i, −64, 64) + 64: a shift of j by c − i), as (Shift(a, c, lo, hi), o); None where e is
    no such form or a plain clamped shift (o = 0: clamped_shift)."""
    if not isinstance(e, Call) or e.op not in ("add", "sub", "min2", "max2") or len(e.args) != 2:
        return None
    x, k = e.args
    if e.op in ("add", "sub") and isinstance(x, Index) and _integer(k) is None and _index_only(k) and (
            x.axis not in k.axes):
        return Shift(x.axis, 0, -math.inf, math.inf), (k if e.op == "add" else Call("neg", (k,)))
    if _integer(k) is None and e.op != "sub":
        x, k = k, x
    kv = _integer(k)
    inner = offset_shift(x) if kv is not None else None
    if inner is None:
        return None
    return _composed(inner[0], e.op, kv), inner[1]
