"""clamp with tensor bounds, any / all, hypot, searchsorted / bucketize: ops written from the op table's
primitives."""

from __future__ import annotations

import torch

from .exprs import call, const
from .operands import Operand
from .ops_math import binary
from .ops_reduce import Reduction
from .source import CaptureError

aten = torch.ops.aten


class ClampTensor:
    """torch.clamp(x, lo, hi) with tensor bounds (either may be None).

    Of floats, selects whose value and gradient are torch's: x where lo ≤ x ≤ hi, lo where x < lo < hi,
    hi where x > hi or hi < lo (torch gives max when min > max; NaN for a NaN x), and otherwise — NaN
    in any of the three, or x < lo = hi — min(max(x, lo), hi) with no gradient (torch passes none there). Of integers
    min2(max2(x, lo), hi), the form index analysis reads. `bounds` names the call's bound arguments
    (clamp_min / clamp_max take one: a tie x = bound passes the gradient to x, as torch's)."""

    def __init__(self, bounds: tuple[str, ...] = ("min", "max")):
        self.bounds = bounds

    def _args(self, c):
        got = {name: c.arg(k + 1, name) for k, name in enumerate(self.bounds)}
        return c.args[0], got.get("min"), got.get("max")

    def infer(self, tx, c):
        ops = [a for a in self._args(c) if isinstance(a, Operand)]
        return tx.broadcast(c, ops, len(c.out.shape))

    def build(self, tx, c):
        x, lo, hi = self._args(c)
        if lo is None and hi is None:
            raise CaptureError("torch.clamp needs at least one of min and max")
        floats = c.out.dtype.is_floating_point

        def value(a):
            if a is None:
                return None
            e = a.expr if isinstance(a, Operand) else const(a)
            return call("float", e) if floats and isinstance(a, Operand) and not a.dtype.is_floating_point else e

        x, lo, hi = value(x), value(lo), value(hi)
        if not floats:
            x = x if lo is None else call("max2", x, lo)
            return x if hi is None else call("min2", x, hi)
        return clamp_selects(x, lo, hi)


def _both(a, b):
    return a if b is None else b if a is None else call("and", a, b)


def clamp_selects(x, lo, hi):
    """clamp(x, lo, hi) of floats with torch's value and gradient (ClampTensor)."""
    inside = _both(None if lo is None else call("ge", x, lo), None if hi is None else call("le", x, hi))
    out = x
    if lo is not None:
        out = call("max2", out, lo)
    if hi is not None:
        out = call("min2", out, hi)
    rest = call("stopgrad", out)  # NaN anywhere (max2 / min2 propagate it), or x < lo = hi: no gradient
    out = rest
    if hi is not None:  # x > hi, or hi < lo: hi; NaN where x or lo is, its gradient still hi's (torch's)
        if lo is None:
            out = call("where", call("gt", x, hi), hi, out)
        else:
            over = call("or", call("gt", x, hi), call("lt", hi, lo))
            out = call("where", over, call("where", call("eq", rest, rest), hi, call("add", hi, rest)), out)
    if lo is not None:  # x < lo (< hi): lo
        under = call("lt", x, lo) if hi is None else call("and", call("lt", x, lo), call("lt", lo, hi))
        out = call("where", under, lo, out)
    return call("where", inside, x, out)


class AnyAll(Reduction):
    """torch.any / torch.all: whether some (every) element is nonzero (NaN counts), as a max (min) of
    0/1 flags; over no element any is False and all is True (the monoids' identities ∓∞)."""

    def __init__(self, kind: str, dim_arg: int | None = 1, keepdim_arg: int | None = 2):
        super().__init__(kind, dim_arg, keepdim_arg)

    def build(self, tx, c):
        if c.out.dtype != torch.bool:
            raise CaptureError(f"{c.op_name} of {c.args[0].dtype} (a result of {c.out.dtype}) is not supported; "
                               "compare with 0 first")
        x, pos, _ = self._where(c)
        truth = x.expr if x.dtype == torch.bool else call("ne", x.expr, const(0))
        flags = call("where", truth, const(1), const(0))
        return call("gt", tx.reduce("max" if self.kind == "any" else "min", flags, [x.dims[p] for p in pos]),
                    const(0))


class Search:
    """torch.searchsorted(seq, v, right=) and torch.bucketize(v, boundaries, right=) of a sorted 1-D
    sequence: how many of its elements lie below v (at or below it with right=True), a sum of
    comparisons — the document of each packed token from FlashAttention's offsets is
    `searchsorted(cu_seqlens, arange(T), right=True) - 1`, and a loop masked by equal documents is
    bounded per call (lower/databounds.py). For a sequence that is not sorted torch's result (a binary
    search) is unspecified; this is the count. A NaN value counts every element below it, as torch's
    sort order puts NaN last."""

    def __init__(self, seq_arg: int, values_arg: int):
        self.seq_arg, self.values_arg = seq_arg, values_arg

    def _args(self, c):
        seq, v = c.args[self.seq_arg], c.args[self.values_arg]
        if not isinstance(v, Operand) or not isinstance(seq, Operand):
            raise CaptureError(f"{c.op_name} of a Python number is not supported; pass a tensor")
        if seq.ndim != 1:
            raise CaptureError(f"{c.op_name} in a sequence of {seq.ndim} dimensions is not supported (one row of "
                               "sorted values only)")
        if c.kwargs.get("sorter") is not None:
            raise CaptureError(f"{c.op_name} with a sorter is not supported; pass the sequence sorted")
        return seq, v

    def infer(self, tx, c):
        _, v = self._args(c)
        return list(v.dims)

    def build(self, tx, c):
        seq, v = self._args(c)
        side = c.kwargs.get("side")
        right = side == "right" if side is not None else bool(c.kwargs.get("right", False))
        (d,) = seq.dims
        if d is not None and tx.axes.find(d) in {tx.axes.find(x) for x in v.dims if x is not None}:
            raise CaptureError(f"{c.op_name} of values that run along the sorted sequence itself is not supported")
        a, b = seq.expr, v.expr
        if seq.dtype.is_floating_point != v.dtype.is_floating_point:
            a, b = (a, call("float", b)) if seq.dtype.is_floating_point else (call("float", a), b)
        below = call("le" if right else "lt", a, b)
        if v.dtype.is_floating_point:  # (NaN sorts last)
            below = call("or", below, call("ne", b, b))
        return tx.reduce("sum", call("where", below, const(1), const(0)), [d])


HANDLERS = {
    aten.searchsorted.Tensor: Search(0, 1),
    aten.bucketize.Tensor: Search(1, 0),
    aten.clamp.Tensor: ClampTensor(),
    aten.clamp_min.Tensor: ClampTensor(("min",)),
    aten.clamp_max.Tensor: ClampTensor(("max",)),
    aten.any.default: AnyAll("any", None, None),
    aten.any.dim: AnyAll("any"),
    aten.any.dims: AnyAll("any"),
    aten.all.default: AnyAll("all", None, None),
    aten.all.dim: AnyAll("all"),
    aten.all.dims: AnyAll("all"),
    aten.hypot.default: binary("hypot"),
}
