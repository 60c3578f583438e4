"""Two exact simplifications of a derived backward, for the gradients of slices and gathers.

The gradient of a read at a shifted row, x[k + n] for k < n (a batch's second half, torch.cat, a
slice), is a one-hot sum over the reading axis: Σ_k where(k + n = b ∧ c(k), g(k), 0) for each row b of
x. A backward program carried it as a reduction over k, lowered as a [rows × columns × k] block per
tile (DPO's gradient: a loop over the half's 4 rows with 3-D blocks and data-bounded loop tables, 2 ms
where its bytes take 0.3 on the H200). And each half's term reads x at its clamped row, max(b − n, 0)
+ n under the guard b ≥ n: a load of its own beside the other half's min(b, n − 1), where both are b.

1. `eliminate_deltas`: a sum over an axis k whose terms are selected by an equality k + c = e, e an
   index expression free of k, has at most one term, at k = e − c:

       Σ_k where(k + c = e ∧ p(k), g(k), 0) = where(0 ≤ e − c < n_k ∧ p(k̂), g(k̂), 0),
       k̂ = min(max(e − c, 0), n_k − 1)

   (k̂ is clamped so that every load it indexes stays in range where the guard is false.)
2. `unclamp_guarded`: inside where(c, x, y), a clamp of an index of x that c's bounds on its axis make
   inactive is dropped — where the unclamped index stays inside the tensor's dimension over the axis'
   whole extent (the lowering computes x where c is false too, so its loads must stay in bounds
   there): max(b − n, 0) + n is b under b ≥ n.
"""

from __future__ import annotations

import math

from . import ir
from .grad_gather import _call, rebound
from .index_shift import clamped_shift
from .ir import Call, Const, Index, Load, Reduce
from .masks import affine, conjunction, conjuncts


def _index_only(n: ir.Node) -> bool:
    """An integer index expression: axes and integer constants added and subtracted (k = b + 0.5 has no
    solution; it must not become a fractional index)."""
    return all(isinstance(m, Index) or (isinstance(m, Const) and float(m.value).is_integer())
               or (isinstance(m, Call) and m.op in ("add", "sub", "neg")) for m in ir.walk(n))


def _solve(pred: ir.Node, axis: str) -> tuple[ir.Node, int] | None:
    """(e, c) where pred is the equality axis + c = e (either side), e an index expression free of the axis."""
    if not (isinstance(pred, Call) and pred.op == "eq"):
        return None
    for lhs, rhs in (pred.args, pred.args[::-1]):
        sh = clamped_shift(lhs)
        if (sh is not None and sh.axis == axis and math.isinf(sh.lo) and math.isinf(sh.hi)
                and axis not in rhs.axes and _index_only(rhs)):
            return rhs, sh.c
    return None


def _eliminated(r: Reduce, extents: dict[str, int], dynamic: frozenset[str],
                copies: dict[str, str] | None) -> ir.Node | None:
    body = r.body
    if not (r.op == "sum" and isinstance(body, Call) and body.op == "where"
            and isinstance(body.args[2], Const) and body.args[2].value == 0.0):
        return None
    cond, value, _ = body.args
    if any(isinstance(m, Reduce) and m.axis == r.axis for m in ir.walk(body)):
        return None  # (the axis bound again inside: not one index to substitute)
    parts = conjuncts(cond)
    for i, p in enumerate(parts):
        got = _solve(p, r.axis)
        if got is None:
            continue
        e, c = got
        if any(isinstance(m, Reduce) and m.axis in e.axes and r.axis in m.axes for m in ir.walk(body)):
            value = rebound(value, r.axis, e.axes, extents, dynamic, copies)  # (k̂ read inside it: captured)
            parts = [rebound(q, r.axis, e.axes, extents, dynamic, copies) for q in parts]
        at = _call("add", e, Const(-c)) if c else e
        n = extents[r.axis]
        hat = _call("min2", _call("max2", at, Const(0)), Const(n - 1))
        sub = {Index(r.axis): hat}
        guard = [_call("ge", at, Const(0)), _call("le", at, Const(n - 1))]
        rest = [ir.substitute(q, sub) for j, q in enumerate(parts) if j != i]
        return _call("where", conjunction(guard + rest), ir.substitute(value, sub), Const(0.0))
    return None


def eliminate_deltas(expr: ir.Node, extents: dict[str, int], dynamic: frozenset[str] = frozenset(),
                     copies: dict[str, str] | None = None) -> ir.Node:
    """`expr` with every one-hot sum (rule 1 above) replaced by its one term. A reduction the term's
    index would be captured by binds a fresh axis instead, added to `extents` (a copy of one of the
    `dynamic` axes recorded in `copies`: grad_gather.fresh_axis)."""
    def step(_old, new):
        if isinstance(new, Reduce):
            got = _eliminated(new, extents, dynamic, copies)
            if got is not None:
                return got
        return new

    return ir.rebuild(expr, step)


Ranges = dict[str, tuple[float, float]]


def _bounds(pred: ir.Node, ranges: Ranges) -> Ranges:
    """`ranges` narrowed by the single-axis affine conjuncts of `pred` (which hold where it is true)."""
    out = dict(ranges)
    for part in conjuncts(pred):
        for a in affine(part) or []:
            if len(a.coef) != 1:
                continue
            (axis, k), = a.coef
            lo, hi = out.get(axis, (-math.inf, math.inf))
            if k > 0:  # k·axis + const ≤ 0
                hi = min(hi, math.floor(-a.const / k))
            else:
                lo = max(lo, math.ceil(-a.const / k))
            out[axis] = (lo, hi)
    return out


def unclamp_guarded(expr: ir.Node, extents: dict[str, int], dims: dict[str, tuple[int, ...]]) -> ir.Node:
    """`expr` with the clamps its guards make inactive dropped (rule 2 above); `dims`: tensor → the
    extent of each of its dimensions."""
    memo: dict[tuple, ir.Node] = {}

    def index(e: ir.Node, dim: int, ranges: Ranges) -> ir.Node:
        sh = clamped_shift(e)
        if sh is None or sh.axis not in ranges or (math.isinf(sh.lo) and math.isinf(sh.hi)):
            return e
        lo, hi = ranges[sh.axis]
        n = extents[sh.axis]
        lo, hi = max(lo, 0), min(hi, n - 1)
        if not (sh.lo <= lo + sh.c and hi + sh.c <= sh.hi):
            return e  # the clamp acts under the guard
        if not (sh.c >= 0 and n - 1 + sh.c <= dim - 1):
            return e  # unclamped, it would read outside the dimension where the guard is false
        return Index(sh.axis) if sh.c == 0 else _call("add", Index(sh.axis), Const(sh.c))

    def go(n: ir.Node, ranges: Ranges) -> ir.Node:
        key = (id(n), tuple(sorted(ranges.items())))
        if key in memo:
            return memo[key]
        if isinstance(n, Call) and n.op == "where":
            c, x, y = n.args
            out = Call("where", (go(c, ranges), go(x, _bounds(c, ranges)), go(y, ranges)))
        elif isinstance(n, Call):
            out = Call(n.op, tuple(go(a, ranges) for a in n.args))
        elif isinstance(n, Reduce):
            out = Reduce(n.op, n.axis, go(n.body, {a: r for a, r in ranges.items() if a != n.axis}))
        elif isinstance(n, Load):
            shape = dims.get(n.tensor)
            idx = tuple(go(e, ranges) for e in n.index)
            if shape is not None and ranges:
                idx = tuple(index(e, d, ranges) for e, d in zip(idx, shape))
            out = Load(n.tensor, idx)
        else:
            out = n
        memo[key] = out
        return out

    return go(expr, {})


__all__ = ["eliminate_deltas", "unclamp_guarded"]
