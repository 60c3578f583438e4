"""Row scales folded into exponential weights: a saved backward reads the log-sum-exp, P = e^{a − lse}.

After `grad_saved.save`, the backward of a normalised exponential (a softmax, attention) reads the
forward's row max m and sum l = Σⱼ e^{a − m} and spells every gradient with the divisor and its zero
guard per element — attention's dS = (where(l = 0, 0, dP/l) + where(l = 0, 0, −D/l))·
e^{a − m}, dV's weight where(l = 0, 0, dO/l)·e^{a − m}: two selects, two products by 1/l and an add
per score beside the exponential. Three exact steps give FlashAttention-2's form — one weight
P = e^{a − lse} shared by every gradient, dS = (dP − D)·P (its zero guard dropped: below), nothing
divided per element — with lse = m + L the one row statistic the forward saves for it:

1. Row factors leave sums over other axes (c, l free of k), besides `grad_saved.hoist`'s products:
       Σ_k where(c, 0, x) = where(c, 0, Σ_k x)      Σ_k −x = −Σ_k x      Σ_k x/l = (Σ_k x)/l
2. Terms under one guard, over one divisor, combine:
       where(c, 0, x) + where(c, 0, y) = where(c, 0, x + y)      x/l ± y/l = (x ± y)/l
3. A quotient by l times one of l's terms takes the divisor into the exponent:
       where(l = 0, 0, y/l)·e^{a − m} = where(l = 0, 0, y·e^{a − (m + L)}),   L = where(l = 0, ∞, log l)
   l ≥ 0, and where l = 0 every term is 0 (nonnegative terms of a zero sum), so a − m < ∞ and
   e^{a − m − ∞} = 0 where the guard holds; elsewhere e^{a − m}/l = e^{a − m − log l}, and a − m − L
   = a − (m + L) (a is −∞ where masked; m is never −∞ there, L never −∞). With the plain shift
   (l ≥ 1, numeric.shifted_exp_sum) there is no guard and L = log l. The forward writes m + L as
   a saved statistic: the backward loads one row value per step, no log (the first version computed
   m + log l in the backward from m and l: the replicated per-row log measured 5 % slower on global
   attention's backward, H100; the saved row 7 % faster).

P is 0 exactly on the guarded rows (a − m < ∞ there), so the guard where(l = 0, 0, y·P) only keeps
an inf or NaN in y from giving NaN there. It is dropped where y is finite wherever the loaded values it
reads are — sums, differences and products of loads and folded weights: dV's dO, dS's dP − D =
Σₑ dO·V − Σₑ dO·O — README's finite-operand exception (an inf or NaN in dO, V or O on a row with no
key gives NaN, not 0). FlashAttention-2 has no such select either (its lse is +∞ on an empty row).
Dropped, the select no longer costs a compare and a select per score in dK/dV's loop over queries,
and the backward no longer reads l (H100, causal dK/dV kernel at L = 16384: 8.2-8.5 → 7.6-8.0 ms,
bench/probe_dq_edits.py). It stays on anything else (a quotient, a log, an exponential of a
computed value). Only when every use of a term e^{a − m} folds (else a kernel would compute two
exponentials a point) is anything rewritten.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from . import ir
from .ir import Call, Const, Load, Reduce
from .numeric import shifted_exp_sum

_ZERO = Const(0.0)


def _call(op: str, *args: ir.Node) -> Call:
    return Call(op, tuple(args))


def fold(exprs: list[ir.Node], stats: dict[str, ir.TensorSpec],
         fresh: Callable[[str], str]) -> tuple[list[ir.Node], dict[str, ir.Node]]:
    """The backward expressions `exprs` with the three steps above applied (see the module docstring),
    and the statistics they now read: name → what the forward computes for it. `stats` are the saved
    statistics (each spec holds its forward reduction); `fresh(stem)` names a new one. The row shift
    m + L of each folded weight is such a statistic, the forward's log-sum-exp: the backward reads it
    (and no longer l or m where they were read only there)."""
    sums = _exp_sums(stats)
    if not sums:
        return exprs, {}
    folder = _Folder(sums, {_load(n, sp): sp.holds for n, sp in stats.items()}, fresh)
    memo: dict = {}
    out = [ir.rebuild(e, folder.step, memo) for e in exprs]
    left = {n for e in out for n in ir.walk(e)}
    if not folder.folded or any(e in left for e in folder.folded):  # nothing folded, or a term of l also
        return exprs, {}                                             # used unfolded: two exponentials a point
    return out, {ld.tensor: value for value, ld in folder.shifts.values()}


def _exp_sums(stats: dict[str, ir.TensorSpec]) -> dict[Load, tuple[str, ir.Node, str]]:
    """Saved statistics l = Σⱼ e^{t} with the max shift: load → (exp op, t as the backward spells it,
    "plain" or "guarded"). t reads the other saved statistics where it reduces to one."""
    holds = {s.holds: _load(n, s) for n, s in stats.items() if s.holds is not None}
    out = {}
    for name, spec in stats.items():
        kind = shifted_exp_sum(spec.holds) if spec.holds is not None else None
        if kind is None or spec.holds.body.op != "exp":
            continue
        body = spec.holds.body
        exponent = ir.substitute(body.args[0], {r: ld for r, ld in holds.items() if r != spec.holds})
        out[_load(name, spec)] = (body.op, exponent, kind)
    return out


def _load(name: str, spec: ir.TensorSpec) -> Load:
    return Load(name, tuple(ir.Index(a) for a in spec.axes))


class _Folder:
    def __init__(self, sums: dict[Load, tuple[str, ir.Node, str]], held: dict[Load, ir.Node],
                 fresh: Callable[[str], str]):
        self.sums = sums
        self.held = held  # saved load → the forward reduction it holds
        self.stat_tensors = {ld.tensor for ld in held}
        self.fresh = fresh
        self.shifts: dict[tuple[ir.Node, ir.Node], tuple[ir.Node, Load]] = {}  # (m, l) → (forward m + L, its load)
        self.weights: dict[ir.Node, ir.Node] = {}  # a folded weight → its guard l = 0 (where it is 0)
        self.folded: set[ir.Node] = set()  # the terms e^{t} they replace

    def step(self, old: ir.Node, new: ir.Node) -> ir.Node:
        if isinstance(new, Reduce) and new.op == "sum":
            return self.pull(new)
        if isinstance(new, Call) and new.op in ("add", "sub"):
            return _combine(new)
        if isinstance(new, Call) and new.op == "mul":
            for q, e in (new.args, new.args[::-1]):
                got = self.weigh(q, e)
                if got is not None:
                    return got
        return new

    def pull(self, r: Reduce) -> ir.Node:
        """Step 1 (and the dropped guard of a loaded operand's sum), recursively on what it builds."""
        body, ax = r.body, r.axis
        if isinstance(body, Call) and body.op == "where" and body.args[1] == _ZERO:
            c, _, x = body.args
            if ax not in c.axes:
                return _call("where", c, _ZERO, self.pull(Reduce("sum", ax, x)))
        if isinstance(body, Call) and body.op == "neg":
            return _call("neg", self.pull(Reduce("sum", ax, body.args[0])))
        if isinstance(body, Call) and body.op == "div" and ax not in body.args[1].axes:
            return _call("div", self.pull(Reduce("sum", ax, body.args[0])), body.args[1])
        if isinstance(body, Call) and body.op == "mul":
            for f, y in (body.args, body.args[::-1]):
                if isinstance(f, Call) and f.op == "where" and f.args[1] == _ZERO and ax not in f.args[0].axes:
                    return _call("where", f.args[0], _ZERO, self.pull(Reduce("sum", ax, _call("mul", f.args[2], y))))
                if isinstance(f, Call) and f.op == "div" and ax not in f.args[1].axes:
                    return _call("div", self.pull(Reduce("sum", ax, _call("mul", f.args[0], y))), f.args[1])
        return r

    def finite_where_loads_are(self, y: ir.Node) -> bool:
        """Is y finite wherever the loaded values it reads are (sums, differences and products of loads,
        finite constants and folded weights, which lie in [0, 1])? Overflow aside, only an inf or NaN
        loaded gives a non-finite y. A saved statistic is no such load: a row max or log-sum-exp is ±∞
        on exactly the rows the guard selects."""
        if isinstance(y, Load):
            return y.tensor not in self.stat_tensors
        if y in self.weights:
            return True
        if isinstance(y, Const):
            return math.isfinite(y.value)
        if isinstance(y, Call) and y.op in ("add", "sub", "mul", "neg"):
            return all(self.finite_where_loads_are(a) for a in y.args)
        return isinstance(y, Reduce) and y.op == "sum" and self.finite_where_loads_are(y.body)

    def weigh(self, q: ir.Node, e: ir.Node) -> ir.Node | None:
        """Step 3: q·e with q = where(l = 0, 0, y/l) (or y/l, l ≥ 1) and e one of l's terms, else None."""
        guard = None
        if isinstance(q, Call) and q.op == "where" and q.args[1] == _ZERO:
            guard, q = q.args[0], q.args[2]
        if not (isinstance(q, Call) and q.op == "div" and q.args[1] in self.sums):
            return None
        y, l = q.args
        op, t, kind = self.sums[l]
        if not (isinstance(e, Call) and e.op == op and e.args[0] == t):
            return None
        if (kind == "plain") != (guard is None) or (guard is not None and guard != _call("eq", l, _ZERO)):
            return None
        a, m = (t.args if isinstance(t, Call) and t.op == "sub" and not (t.args[1].axes - l.axes)
                else (t, _ZERO))
        key = (m, l)
        if key not in self.shifts:  # the forward's m + L, L = log l (or ∞ where l = 0)
            lf = self.held[l]
            big = _call("log", lf) if kind == "plain" else \
                _call("where", _call("eq", lf, _ZERO), Const(math.inf), _call("log", lf))
            value = _call("add", ir.substitute(m, self.held), big) if m != _ZERO else big
            self.shifts[key] = (value, Load(self.fresh("saved_lse"), l.index))
        w = _call(op, _call("sub", a, self.shifts[key][1]))
        if guard is not None:
            self.weights[w] = guard
        self.folded.add(e)
        body = _call("mul", y, w)
        # w is 0 exactly where the guard holds: the select only keeps an inf or NaN in y from giving NaN
        # there, and y can hold one only where a loaded value does (README's finite-operand exception)
        return body if guard is None or self.finite_where_loads_are(y) else _call("where", guard, _ZERO, body)


def _combine(n: Call) -> ir.Node:
    """Step 2 on a + b and a − b (a + (−b) read as a − b); n itself when nothing combines."""
    a, b = n.args
    op = n.op
    if op == "add" and isinstance(b, Call) and b.op == "neg":
        b, op = b.args[0], "sub"
    elif op == "add" and isinstance(a, Call) and a.op == "neg":
        a, b, op = b, a.args[0], "sub"
    if isinstance(a, Call) and isinstance(b, Call) and a.op == b.op:
        if a.op == "where" and a.args[1] == _ZERO and a.args[:2] == b.args[:2]:
            return _call("where", a.args[0], _ZERO, _combine(_call(op, a.args[2], b.args[2])))
        if a.op == "div" and a.args[1] == b.args[1]:
            return _call("div", _call(op, a.args[0], b.args[0]), a.args[1])
    return n


__all__ = ["fold"]
