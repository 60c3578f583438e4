"""Masks in reduction bodies: which predicates make an element contribute nothing, and which of
them are affine in the indices (so that they bound loops instead of being evaluated everywhere).

split_mask(body, monoid) finds `where(p, a, b)` nodes such that the body with b in place of the
where is the monoid's identity (or NaN, which refines to anything) for every sampled value; then
body ≡ where(p, body[a], identity). The check is by evaluation on random float64 values,
including ±inf for state symbols, so it is a property of the body, not a pattern.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import ir
from .ops import MONOIDS

_SAMPLES = 512


_FREE = "_free_test"  # the tensor name of a comparison sampled as a free boolean (_free_equalities)


def _free_equalities(node: ir.Node) -> ir.Node:
    """`node` with each equality test that sampling cannot make true replaced by a free boolean leaf.
    A reduction's state is sampled apart from the elements it reduces, so `p == max_d p` (an element
    against its row's maximum, which some element always attains) was never true at the samples;
    a where between two such tests then looked like the identity on one side and its branch was
    dropped: the count of a max's adjoint lost its main case (softmax then amax: an infinite
    gradient). A test of a reduction's state or of a computed value against a non-constant is sampled
    true or false at random: more behaviours, never fewer. So is a test of two loads or indices: sampled
    apart, `j == b` and `t[b, i] == d` each hold at a few per cent of the samples (some_equal), and
    both at once at none of the 512, so where(j == b & t[b, i] == d, g, 0) looked like 0 everywhere
    and a split dropped the case it selects (DPO's gradient of the chosen half was 0; sweep 4). (A test
    against a constant is sampled through its values: a state against ±inf, a load at the constant,
    compared_constants; a state against a finite constant, `l == 0`, never true, which keeps the guards'
    splits, and the derivations, as they were.)"""
    subs: dict[ir.Node, ir.Node] = {}
    for n in ir.walk(node):
        if isinstance(n, ir.Call) and n.op in ("eq", "ne") and not any(isinstance(a, ir.Const) for a in n.args):
            subs.setdefault(n, ir.Load(_FREE, (ir.Index(f"k{len(subs)}"),)))
    return ir.substitute(node, subs) if subs else node


@functools.lru_cache(maxsize=4096)  # (split_mask asks it for each candidate branch of a body)
def _thresholds(node: ir.Node) -> tuple[float, ...]:
    """The integer constants of `node` (a mask's `f < 300`, a clamp's `min2(f, 299)`), and the points where
    a test of one index changes its truth (_index_breakpoints)."""
    consts = {n.value for n in ir.walk(node)
              if isinstance(n, ir.Const) and math.isfinite(n.value) and n.value == int(n.value)}
    return tuple(sorted(consts | _index_breakpoints(node, frozenset(consts))))


_INDEX_OPS = frozenset({"add", "sub", "mul", "neg", "min2", "max2", "floordiv", "mod", "abs"})


def _index_breakpoints(node: ir.Node, consts: frozenset[float]) -> set[float]:
    """The indices at which a comparison of one axis' index expression with constants flips: a cat of a
    cat tests max2(max2(e − 12, 0) − 6, 0) < 3, true on [18, 21), whose edges no constant names. Drawn
    only near 12, 6 and 3, e met [18, 21) at a few samples, none with the rest of the body nonzero, and
    split_mask took that part of a gradient for 0 (fuzz seed 1499: silently wrong). Each such test is
    evaluated at every integer over the span its constants reach (up to 2^16 points)."""
    from neptune_eq.rules.soundness import eval_ir_sampled

    reach = sum(abs(c) for c in consts if abs(c) < 2**15) + 8
    lo, hi = int(min(consts, default=0) - reach), int(max(consts, default=0) + reach)
    if hi - lo > 2**16:
        return set()
    out: set[float] = set()
    xs = np.arange(lo, hi + 1, dtype=float)
    for n in ir.walk(node):
        if not (isinstance(n, ir.Call) and n.op in _COMPARISONS):
            continue
        leaves = [x for x in ir.walk(n) if not isinstance(x, ir.Call)]
        axes = {x.axis for x in leaves if isinstance(x, ir.Index)}
        if len(axes) != 1 or not all(isinstance(x, ir.Index | ir.Const) for x in leaves) or not all(
                x.op in _INDEX_OPS or x is n for x in ir.walk(n) if isinstance(x, ir.Call)):
            continue
        with np.errstate(all="ignore"):
            truth = np.broadcast_to(eval_ir_sampled(n, {ir.show(ir.Index(axes.pop())): xs}), xs.shape) != 0
        flips = np.nonzero(truth[1:] != truth[:-1])[0]
        out |= {float(xs[k + 1]) for k in flips[:64]}
    return out


def _index_samples(rng, thresholds: list[float]) -> np.ndarray:
    """Index values: half in [−64, 64), half within 2 of one of the node's integer constants. Indices
    drawn only near 0 never reach `f >= 300`: a where(f < 300, masked, sink) then looked like a mask
    on every sample, and the sink column of a concatenation was masked away (silently wrong on the
    GPU at 2048 keys)."""
    v = rng.integers(-64, 64, _SAMPLES).astype(float)
    if thresholds:
        near = rng.choice(np.asarray(thresholds), _SAMPLES) + rng.integers(-2, 3, _SAMPLES)
        v = np.where(rng.integers(0, 2, _SAMPLES) == 0, v, near)
    # a quarter from one small window spanning the small constants, drawn alike for every axis: a relation
    # between two axes and a constant (e ≥ 4 ∧ |d − (e − 4)| ≤ 1, the second half of a cat of a banded
    # mask) held at 2 of 512 samples drawn apart, and the first half's band looked like a mask of every
    # element (fuzz seed 986: a silently wrong gradient)
    small = [t for t in thresholds if abs(t) <= 64] or [0.0]
    window = rng.integers(int(min(small)) - 2, int(max(small)) + 3, _SAMPLES).astype(float)
    return np.where(rng.integers(0, 4, _SAMPLES) == 0, window, v)


def compared_constants(node: ir.Node) -> list[float]:
    """The finite constants `node` compares values with (`t != -100`, `x > 0`)."""
    return sorted({a.value for n in ir.walk(node) if isinstance(n, ir.Call) and n.op in _COMPARISONS
                   for a in n.args if isinstance(a, ir.Const) and math.isfinite(a.value)})


_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")


def large_constants(node: ir.Node, at_least: float = 100) -> list[float]:
    """The node's finite constants of magnitude `at_least` or more: a mask's fill (`masked_fill(~m, -1e9)`,
    `finfo.min`, BERT's −10000), which a reduction's state equals on a row with every element masked."""
    return sorted({n.value for n in ir.walk(node)
                   if isinstance(n, ir.Const) and math.isfinite(n.value) and abs(n.value) >= at_least})


def _near(rng, fills: list[float]) -> np.ndarray:
    return rng.choice(np.asarray(fills), _SAMPLES) + rng.normal(0, 4, _SAMPLES)


def _sample_env(nodes, seed: int = 0, thresholds: list[float] = (), fills: list[float] = (),
                compared: list[float] = ()) -> dict[str, np.ndarray]:
    """Sampled values of the leaves: a state ±inf at a tenth of its samples each, a state or a loaded
    value near one of `fills` at another tenth, a loaded value exactly one of the `compared` constants at
    a tenth (a label's `t != -100` is false there; drawn near −100 it never was). A state drawn only near
    0 never met a finite fill K: exp(K − m) was 0 at
    every sample, where(m, s, K) split off as a mask, and a row whose every element was masked gave
    0 (softmax, attention) or −inf (logsumexp) where torch gives the softmax of K's: uniform."""
    rng = np.random.default_rng(seed)
    env: dict[str, np.ndarray] = {}
    for n in nodes:
        key = ir.show(n)
        if key in env:
            continue
        if isinstance(n, ir.Load) and n.tensor == _FREE:
            env[key] = rng.integers(0, 2, _SAMPLES).astype(float)
        elif isinstance(n, ir.Index):
            env[key] = some_equal(rng, _index_samples(rng, list(thresholds)))
        elif isinstance(n, ir.StateRef):
            v = rng.normal(0, 4, _SAMPLES)
            kind = rng.integers(0, 10, _SAMPLES)
            v = np.where(kind == 0, -np.inf, v)
            v = np.where(kind == 1, np.inf, v)
            if fills:
                v = np.where(kind == 2, _near(rng, fills), v)
            if compared:  # a state may equal what the body compares it with: a row's max is the 0 of its
                # masked entries (max_d where(d ≤ i, w, 0) on a row of negative w); never drawn at 0, the
                # count [where(c, w, 0) == max] split off c as a mask and a max gradient divided 0 by 0
                v = np.where(kind == 3, rng.choice(np.asarray(compared), _SAMPLES), v)
            env[key] = v
        else:  # (a loaded value too: a saved statistic, the backward's log-sum-exp of a masked row)
            v = some_equal(rng, rng.normal(0, 4, _SAMPLES))
            # a twentieth far out (±1e5 … ±1e38): what the program computes from data may overflow —
            # exp(x), x·1e35, a cast to half — so `exp(x) == inf` is not "never true"
            huge = rng.choice([-1.0, 1.0], _SAMPLES) * 10.0 ** rng.choice([5, 10, 20, 38], _SAMPLES)
            v = np.where(rng.integers(0, 20, _SAMPLES) == 0, huge, v)
            if fills:
                near = _near(rng, fills)
                v = np.where(rng.integers(0, 10, _SAMPLES) == 0, near, v)
            if compared:
                v = np.where(rng.integers(0, 10, _SAMPLES) == 0, rng.choice(np.asarray(compared), _SAMPLES), v)
            env[key] = v
    return env


def some_equal(rng, v: np.ndarray) -> np.ndarray:
    """`v` with a third of its samples drawn from {-2, …, 2}: two leaves sampled apart must still be
    equal often. Without it `doc[i] == doc[j]` (two loads of one tensor, sampled independently as
    normals) was never true, so every other where in its body looked like it selected the identity,
    and split_mask took `sum_j == 0` for the mask of a document-masked gradient (silently wrong)."""
    small = rng.integers(0, 3, v.shape) == 0
    return np.where(small, rng.integers(-2, 3, v.shape).astype(float), v)


def _leaves(node: ir.Node):
    return [n for n in ir.walk(node) if isinstance(n, ir.StateRef | ir.Load | ir.Index)]


def is_identity_everywhere(node: ir.Node, identity: float, fills: bool = True) -> bool:
    from neptune_eq.rules.soundness import eval_ir_sampled

    node = _free_equalities(node)
    env = _sample_env(_leaves(node), thresholds=_thresholds(node), fills=large_constants(node) if fills else (),
                      compared=compared_constants(node))
    v = np.broadcast_to(eval_ir_sampled(node, env), (_SAMPLES,))
    defined = ~np.isnan(v)
    # NaN refines to anything, but a body that is NaN at most samples (rsqrt of a sampled negative
    # deep inside a chain of norms) proves nothing: it was once taken for "always the identity",
    # which made the last variance of nine layer norms 0
    return bool(defined.sum() >= _SAMPLES // 4 and np.all(~defined | (v == identity)))


def split_mask(body: ir.Node, monoid: str, nonempty: Callable[[ir.Node], bool] | None = None
               ) -> tuple[list[ir.Node], ir.Node]:
    """(predicates, core) with body ≡ where(and(predicates), core, identity) up to refinement.
    A select of a finite fill (`masked_fill(~causal, -1e9)`) gives the identity only on rows where
    some element is kept (the state then never nears the fill): it is split where `nonempty` proves
    that the predicates keep an element of every row (an affine causal or window mask), else kept
    in the body (a row of fills is the softmax of equal values, as torch computes it)."""
    got = _split(body, monoid, fills=True)
    got = (list(got[0]), got[1])
    if nonempty is not None and large_constants(body):
        # (a max or min over a row that keeps an element takes a kept value over a fill: a fill branch
        # is then its identity, ∓inf, for finite data of any sampled size)
        sub = _fills_as_identity(body, monoid)
        loose = _split(ir.substitute(body, sub) if sub else body, monoid, fills=False)
        left = {n for n in ir.walk(loose[1]) if n in set(sub.values())}
        if list(loose[0]) != got[0] and not left and nonempty(conjunction(list(loose[0])) or ir.Const(1.0)):
            return list(loose[0]), loose[1]
    return got


def _fills_as_identity(body: ir.Node, monoid: str) -> dict[ir.Node, ir.Node]:
    """For a max (min): each select's branch that is a fill of that sign, mapped to the monoid's identity."""
    sign = {"max": -1.0, "min": 1.0}.get(monoid)
    if sign is None:
        return {}
    ident = ir.Const(MONOIDS[monoid].identity)
    return {b: ident for w in ir.walk(body) if isinstance(w, ir.Call) and w.op == "where"
            for b in w.args[1:] if isinstance(b, ir.Const) and math.isfinite(b.value) and b.value * sign >= 100}


@functools.lru_cache(maxsize=4096)  # (a fusion search splits each body once per group it joins: 17 ms each)
def _split(body: ir.Node, monoid: str, fills: bool) -> tuple[tuple[ir.Node, ...], ir.Node]:
    ident = MONOIDS[monoid].identity
    preds: list[ir.Node] = []
    core = body
    changed = True
    while changed:
        changed = False
        for w in ir.walk(core):
            if not (isinstance(w, ir.Call) and w.op == "where"):
                continue
            cond, a, b = w.args
            if is_identity_everywhere(ir.substitute(core, {w: b}), ident, fills):
                preds.append(cond)
                core = ir.substitute(core, {w: a})
                changed = True
                break
            if is_identity_everywhere(ir.substitute(core, {w: a}), ident, fills):
                preds.append(ir.Call("not", (cond,)))
                core = ir.substitute(core, {w: b})
                changed = True
                break
    if is_identity_everywhere(core, ident, fills) and not preds:
        return (ir.Const(0.0),), core  # the body is the identity everywhere: an always-false mask
    return tuple(preds), core


def conjunction(preds: list[ir.Node]) -> ir.Node | None:
    out = None
    for p in preds:
        out = p if out is None else ir.Call("and", (out, p))
    return out


# ---------------------------------------------------------------- affine predicates


@dataclass(frozen=True)
class Affine:
    """coef·axes + const  (op)  0, with op in {"le", "lt"}: e.g. j − i − c ≤ 0."""

    coef: tuple[tuple[str, int], ...]
    const: int
    op: str

    def coefficient(self, axis: str) -> int:
        return dict(self.coef).get(axis, 0)

    def __str__(self) -> str:
        terms = " + ".join(f"{c}·{a}" for a, c in self.coef)
        return f"{terms} + {self.const} {'<=' if self.op == 'le' else '<'} 0"


def _linear(n: ir.Node) -> tuple[dict[str, int], float] | None:
    """Linear form of an integer-valued index expression, or None."""
    if isinstance(n, ir.Index):
        return {n.axis: 1}, 0.0
    if isinstance(n, ir.Const):
        return {}, n.value
    if isinstance(n, ir.Call):
        if n.op in ("add", "sub"):
            a, b = _linear(n.args[0]), _linear(n.args[1])
            if a is None or b is None:
                return None
            s = 1 if n.op == "add" else -1
            out = dict(a[0])
            for k, v in b[0].items():
                out[k] = out.get(k, 0) + s * v
            return out, a[1] + s * b[1]
        if n.op == "neg":
            a = _linear(n.args[0])
            return None if a is None else ({k: -v for k, v in a[0].items()}, -a[1])
        if n.op == "mul":
            a, b = _linear(n.args[0]), _linear(n.args[1])
            if a is None or b is None:
                return None
            if not a[0]:
                a, b = b, a
            if b[0]:
                return None
            return {k: v * b[1] for k, v in a[0].items()}, a[1] * b[1]
    return None


def conjuncts(pred: ir.Node) -> list[ir.Node]:
    """The leaves of pred's tree of `and`s."""
    if isinstance(pred, ir.Call) and pred.op == "and":
        return conjuncts(pred.args[0]) + conjuncts(pred.args[1])
    return [pred]


def affine_part(pred: ir.Node) -> list[Affine]:
    """The affine conjuncts of `pred` (those of an `and` that are not affine dropped): every element
    where pred holds meets them, so they bound the tiles a loop must visit."""
    if isinstance(pred, ir.Call) and pred.op == "and":
        return affine_part(pred.args[0]) + affine_part(pred.args[1])
    return affine(pred) or []


def affine(pred: ir.Node) -> list[Affine] | None:
    """Affine constraints (all must hold) equivalent to `pred`, or None if it is not affine."""
    pred = _negations_pushed(pred)
    if isinstance(pred, ir.Call) and pred.op == "and":
        a, b = affine(pred.args[0]), affine(pred.args[1])
        return None if a is None or b is None else a + b
    if not (isinstance(pred, ir.Call) and pred.op in ("le", "lt", "ge", "gt")):
        return None
    lhs, rhs = _linear(pred.args[0]), _linear(pred.args[1])
    if lhs is None or rhs is None:
        return None
    if pred.op in ("ge", "gt"):
        lhs, rhs = rhs, lhs
    coef = dict(lhs[0])
    for k, v in rhs[0].items():
        coef[k] = coef.get(k, 0) - v
    const = lhs[1] - rhs[1]
    if not all(math.isfinite(v) for v in (*coef.values(), const)):
        return None  # a comparison with NaN or ±inf: evaluated, not a bound
    if any(float(v) != int(v) for v in coef.values()) or const != int(const):
        return None
    coef = {k: int(v) for k, v in coef.items() if v != 0}
    op = "le" if pred.op in ("le", "ge") else "lt"
    if op == "lt":  # integers: x < 0 ⇔ x + 1 ≤ 0
        return [Affine(tuple(sorted(coef.items())), int(const) + 1, "le")]
    return [Affine(tuple(sorted(coef.items())), int(const), "le")]


def keeps_an_element_of_every_row(pred: ir.Node, axis: str, extents: dict[str, int], dynamic=frozenset(),
                                  most: int = 1 << 22) -> bool:
    """Does affine `pred` hold for some index of `axis` (in [0, extent)) at every value of the other
    axes it reads? Checked by enumerating those (at most `most` combinations; a dynamic axis, whose
    length varies by call, is not checked: False)."""
    cons = affine(pred)
    if cons is None or any(a not in extents or a in dynamic for c in cons for a, _ in c.coef):
        return False
    others = sorted({a for c in cons for a, _ in c.coef} - {axis})
    if math.prod(extents[a] for a in others) > most or axis not in extents:
        return False
    grids = np.meshgrid(*(np.arange(extents[a]) for a in others), indexing="ij") if others else []
    vals = {a: g.ravel() for a, g in zip(others, grids)}
    shape = (math.prod(extents[a] for a in others),)
    lo, hi, ok = np.zeros(shape), np.full(shape, extents[axis] - 1.0), np.ones(shape, dtype=bool)
    for c in cons:  # Σ coef·a + const (≤ or <) 0
        rest = c.const + sum(v * vals[a] for a, v in c.coef if a != axis) + np.zeros(shape)
        slack = -rest - (1 if c.op == "lt" else 0)  # cj·j ≤ slack
        cj = c.coefficient(axis)
        if cj > 0:
            hi = np.minimum(hi, np.floor(slack / cj))
        elif cj < 0:
            lo = np.maximum(lo, np.ceil(slack / cj))
        else:
            ok &= slack >= 0
    return bool(np.all(ok & (lo <= hi)))


def _negations_pushed(pred: ir.Node) -> ir.Node:
    """`pred` with `not` pushed into comparisons (¬(a ≤ b) = a > b) and double negations removed."""
    if isinstance(pred, ir.Call) and pred.op == "and":
        return ir.Call("and", tuple(_negations_pushed(p) for p in pred.args))
    if isinstance(pred, ir.Call) and pred.op == "not":
        inner = pred.args[0]
        if isinstance(inner, ir.Call) and inner.op == "not":
            return _negations_pushed(inner.args[0])
        flip = {"le": "gt", "lt": "ge", "ge": "lt", "gt": "le"}
        if isinstance(inner, ir.Call) and inner.op in flip:
            return ir.Call(flip[inner.op], inner.args)
    return pred
