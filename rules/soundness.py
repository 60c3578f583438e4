"""Soundness fuzzing: evaluate both sides of a rule in float64 on random values.

What a user may rely on (docs/RULES.md says the same):

Values. Every variable is sampled from a mix of ordinary numbers, ±inf, NaN, 0, ±1, huge (up to
1e300) and tiny (down to 1e-300) magnitudes and the domain edges of log and sqrt. Conditions only
restrict what they guarantee about *values*: positive/nonzero/normal constrain a constant, nonneg
keeps a value ≥ 0 (or NaN, or −0, as sqrt gives), free_of keeps it constant along an axis.
finite(x) and not_zero(x) are syntactic guards in the e-graph, not promises about the data, so
their variables still see ±inf, NaN and 0.

Axes. Every axis variable of the rule gets its own array dimension and is tried at the extents
EXTENTS (1, 2, 3, 5, 8), rotated so that two axes of one rule get different extents; a variable
bound by `extent_of(n, j)` is that extent. A rule with several axis variables is also tried with
all of them the same axis (egglog may bind two axis variables to one axis). A reduction of a body
that does not vary along its axis reduces `extent` copies, as the kernels do. Every monoid is tried
for a monoid variable.

Verdict. A rule is *sound* when, at every sample where the left side is defined (not NaN), the
right side equals it within a tolerance scaled by the largest intermediate value of either side (so
catastrophic cancellation in a correct rule is not mistaken for an error). It is a *refinement*
when it is sound but the left side is NaN at some sample where the right side is not (a/a → 1 at
a = 0): the rewritten program may then give a number where the original gave NaN. Samples where
either side overflows or underflows from finite operands are not judged: rules must be exact over
the reals and keep IEEE's special values as inputs. Each finding comes with its sample, preferring
one whose inputs are finite.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from neptune_eq import ir
from neptune_eq.ops import MONOIDS, OPS, np_reduce

from .patterns import PNode, pretty

EXTENTS = (1, 2, 3, 5, 8)  # extents tried along every reduced axis (programs require extents ≥ 1)
NAN_RATE = 0.04  # share of sampled values that are NaN (kept low: one NaN poisons a whole reduction)
_TINY = 2.2250738585072014e-308  # smallest normal double


def special_values(rng: np.random.Generator, shape, *, finite: bool = False) -> np.ndarray:
    """Random float64 values with many special cases (±inf and NaN unless `finite`)."""
    n = int(np.prod(shape))
    kind = rng.integers(0, 12, n)
    out = rng.normal(0.0, 3.0, n)
    mag = 10.0 ** rng.uniform(1, 300, n)
    tiny = 10.0 ** -rng.uniform(1, 300, n)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    out = np.where(kind == 1, sign * mag, out)
    out = np.where(kind == 2, sign * tiny, out)
    out = np.where(kind == 3, 0.0, out)
    out = np.where(kind == 4, sign, out)
    out = np.where(kind == 5, rng.uniform(0, 1e-300, n), out)  # just above log/sqrt's domain edge
    out = np.where(kind == 6, rng.uniform(-1, 1, n), out)
    out = np.where(kind == 7, rng.integers(-4, 5, n).astype(float), out)
    if not finite:
        out = np.where(kind == 8, sign * np.inf, out)
        out = np.where(rng.random(n) < NAN_RATE, np.nan, out)
    return out.reshape(shape)


@dataclass
class _Ev:
    """A sampled value, whether it overflowed from finite operands, and the largest |intermediate|."""

    v: np.ndarray
    tainted: np.ndarray
    mag: np.ndarray


_CAN_UNDERFLOW = {"mul", "div", "exp", "exp2", "f_mul", "f_div"}
_F64 = {"f_add": np.add, "f_sub": np.subtract, "f_mul": np.multiply, "f_div": np.divide, "f_neg": np.negative}


def _leaf(v) -> _Ev:
    v = np.asarray(v, dtype=float)
    return _Ev(v, np.zeros(v.shape, bool), np.where(np.isfinite(v), np.abs(v), 0.0))


def _apply(fn, args: list[_Ev], name: str = "") -> _Ev:
    shape = np.broadcast_shapes(*(a.v.shape for a in args))
    with np.errstate(all="ignore"):
        v = np.asarray(fn(*(a.v for a in args)), dtype=float)
    v = np.broadcast_to(v, shape)
    finite_in = np.ones(shape, bool)
    tainted = np.zeros(shape, bool)
    mag = np.zeros(shape)
    for a in args:
        finite_in &= np.broadcast_to(np.isfinite(a.v), shape)
        tainted |= np.broadcast_to(a.tainted, shape)
        mag = np.maximum(mag, np.broadcast_to(a.mag, shape))
    tainted = tainted | (np.isinf(v) & finite_in)
    if name in _CAN_UNDERFLOW:  # a result that lost its magnitude to underflow cannot be judged either
        nonzero_in = np.ones(shape, bool)
        for a in args:
            nonzero_in &= np.broadcast_to(a.v != 0, shape)
        tainted = tainted | (finite_in & nonzero_in & (np.abs(v) < _TINY))
    fin = np.where(np.isfinite(v), np.abs(v), 0.0)
    return _Ev(v, tainted, np.maximum(mag, fin))


def _reduce(op: str, body: _Ev, axis: int, extent: int, rank: int) -> _Ev:
    """Reduce along array axis `axis` (of `extent` elements), keeping it as size 1.

    A body that does not vary along the axis (size 1 there) is reduced as `extent` copies."""
    def full(x: np.ndarray) -> np.ndarray:
        x = x.reshape((1,) * (rank - x.ndim) + x.shape)
        shape = list(x.shape)
        shape[axis] = extent
        return np.broadcast_to(x, shape)

    v = full(body.v)
    red = np.expand_dims(np_reduce(op, v, axis), axis)
    t = full(body.tainted).any(axis, keepdims=True)
    m = full(body.mag).max(axis, keepdims=True)
    finite_in = np.isfinite(v).all(axis, keepdims=True)
    t = t | (np.isinf(red) & finite_in)
    return _Ev(red, t, np.maximum(m, np.where(np.isfinite(red), np.abs(red), 0.0)))


def _axis_key(p: PNode) -> str:
    """The name of a reduction's axis: its variable, or the quoted literal."""
    return p.name if p.kind == "var" else repr(p.value)


@dataclass
class _Context:
    """Where each axis lives in the sampled arrays (axis 0 holds the samples) and its extent."""

    dims: dict[str, int] = field(default_factory=dict)  # axis key → array axis ≥ 1
    extents: dict[int, int] = field(default_factory=dict)  # array axis → extent

    @property
    def rank(self) -> int:
        return 1 + len(self.extents)


def eval_pattern(p: PNode, env: dict[str, np.ndarray], ints: dict[str, object], ctx: _Context | None = None) -> _Ev:
    """Evaluate a rule side on sampled values; without `ctx` every reduction is over array axis 1."""
    ctx = ctx or _Context({}, {1: env_extent(env)})
    if p.kind == "var":
        return _leaf(ints[p.name]) if p.name in ints else _leaf(env[p.name])
    if p.kind == "lit":
        return _leaf(float(p.value) if isinstance(p.value, int | float) else 0.0)
    name = p.name
    if name in ("const", "f64.from_i64"):
        return eval_pattern(p.args[0], env, ints, ctx)
    if name in _F64:
        return _apply(_F64[name], [eval_pattern(a, env, ints, ctx) for a in p.args], name)
    if name == "red":
        op = p.args[0].value if p.args[0].kind == "lit" else ints[p.args[0].name]
        axis = ctx.dims.get(_axis_key(p.args[1]), 1)
        return _reduce(op, eval_pattern(p.args[2], env, ints, ctx), axis, ctx.extents.get(axis, 1), ctx.rank)
    if name in ("load", "index", "sym"):
        key = f"{name}:{p.args[0].value}"
        if key not in env:
            raise KeyError(key)
        return _leaf(env[key])
    if name not in OPS:
        raise ValueError(f"cannot evaluate '{name}' in a rule")
    return _apply(OPS[name].numpy, [eval_pattern(a, env, ints, ctx) for a in p.args], name)


def env_extent(env: dict[str, np.ndarray]) -> int:
    """The extent of array axis 1 among sampled values (1 when none has that axis)."""
    return max((np.shape(v)[1] for v in env.values() if np.ndim(v) >= 2), default=1)


# ---------------------------------------------------------------- findings


@dataclass
class Counterexample:
    """A sample on which a rule fails (kind "unsound") or only refines (kind "refinement")."""

    rule: str
    values: dict[str, object]
    lhs: float
    rhs: float
    kind: str = "unsound"

    @property
    def where(self) -> str:
        return ", ".join(f"{k}={fmt_value(v)}" for k, v in self.values.items()) or "any input"

    def __str__(self) -> str:
        if self.kind == "refinement":
            return (f"rule '{self.rule}' is a refinement: at {self.where} the left side is undefined (nan) and "
                    f"the right side = {fmt_value(self.rhs)}")
        return (f"rule '{self.rule}' is unsound: with {self.where}: left side = {fmt_value(self.lhs)}, "
                f"right side = {fmt_value(self.rhs)}")


@dataclass
class Verdict:
    """What fuzzing found: `counterexample` (unsound) or `refinement` (sound but refining), or neither."""

    counterexample: Counterexample | None = None
    refinement: Counterexample | None = None

    @property
    def sound(self) -> bool:
        return self.counterexample is None


def fmt_value(v) -> str:
    """A sampled value as the messages show it (floats by repr, NaN as nan, arrays as lists)."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, list):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)
    return repr(v)


# ---------------------------------------------------------------- sampling and judging


def _leaf_keys(p: PNode, out: set[str]) -> None:
    if p.kind == "op" and p.name in ("load", "index", "sym") and p.args and p.args[0].kind == "lit":
        out.add(f"{p.name}:{p.args[0].value}")
    for a in p.args:
        _leaf_keys(a, out)


def _reductions(p: PNode, monoids: set[str], axes: list[str]) -> None:
    if p.kind == "op" and p.name == "red":
        if p.args[0].kind == "var":
            monoids.add(p.args[0].name)
        key = _axis_key(p.args[1])
        if key not in axes:
            axes.append(key)
    for a in p.args:
        _reductions(a, monoids, axes)


def _layouts(axes: list[str], sorts: dict[str, str]) -> list[_Context]:
    """Axis layouts × extents to try: distinct axes at rotated extents, then (≥ 2 axis variables) one axis."""
    if not axes:
        return [_Context()]
    variables = [ax for ax in axes if sorts.get(ax) == "String"]
    layouts = [{ax: k + 1 for k, ax in enumerate(axes)}]
    if len(variables) > 1:  # egglog may bind two axis variables to the same axis
        merged = {ax: 1 for ax in variables}
        for ax in axes:
            if ax not in merged:
                merged[ax] = max(merged.values()) + 1
        layouts.append(merged)
    out = []
    for dims in layouts:
        arrays = sorted(set(dims.values()))
        for t in range(len(EXTENTS)):
            out.append(_Context(dims, {d: EXTENTS[(t + m) % len(EXTENTS)] for m, d in enumerate(arrays)}))
    return out


def _sample(rng, sorts: dict[str, str], keys: set[str], conds, ctx: _Context, monoids: dict[str, str],
            samples: int) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    full = (samples, *(ctx.extents[d] for d in sorted(ctx.extents)))
    env: dict[str, np.ndarray] = {}
    ints: dict[str, object] = {}
    for var, sort in sorts.items():
        if sort == "Term":
            shape = list(full)
            for c in conds:  # a term free of an axis is constant along it
                if c.kind == "free_of" and c.var == var and c.axis in ctx.dims:
                    shape[ctx.dims[c.axis]] = 1
            env[var] = special_values(rng, tuple(shape))
        elif sort == "f64":
            env[var] = special_values(rng, (samples,) + (1,) * (len(full) - 1))
        elif sort == "String":
            ints[var] = monoids.get(var, 0.0)
        elif sort == "i64":
            ints[var] = 0.0
    for k in sorted(keys):  # (sorted: each key draws the same values in every process)
        env[k] = special_values(rng, full)
    for c in conds:
        v = env.get(c.var)
        if c.kind == "positive":
            env[c.var] = np.where((v > 0) & np.isfinite(v), v, 2.0)
        elif c.kind == "nonzero":
            env[c.var] = np.where(v != 0, v, 1.0)
        elif c.kind == "normal":
            env[c.var] = np.where((np.abs(v) > 1e-300) & (np.abs(v) < 1e300), v, 2.0)
        elif c.kind == "nonneg":  # what the nonneg analysis proves: ≥ 0 or NaN
            env[c.var] = np.abs(v)
        elif c.kind == "extent":
            ints[c.var] = float(ctx.extents[ctx.dims[c.axis]]) if c.axis in ctx.dims else 1.0
        # finite / not_zero are syntactic guards (no ±inf literal, not the literal 0): data is unrestricted
    return env, ints


def _expand(e: _Ev, rank: int) -> _Ev:
    def up(x):
        x = np.asarray(x)
        return x.reshape((1,) * (rank - x.ndim) + x.shape)
    return _Ev(up(e.v), up(e.tainted), up(e.mag))


def _judge(L: _Ev, R: _Ev, rtol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per sample row: unsound?, refining?; and per element the masks they came from."""
    rank = max(L.v.ndim, R.v.ndim, 1)
    L, R = _expand(L, rank), _expand(R, rank)
    shape = np.broadcast_shapes(L.v.shape, R.v.shape)
    lv, rv = np.broadcast_to(L.v, shape), np.broadcast_to(R.v, shape)
    tainted = np.broadcast_to(L.tainted, shape) | np.broadcast_to(R.tainted, shape)
    mag = np.maximum(np.broadcast_to(L.mag, shape), np.broadcast_to(R.mag, shape))
    with np.errstate(all="ignore"):
        close = np.abs(lv - rv) <= rtol * np.maximum(mag, np.maximum(np.abs(lv), np.abs(rv))) + 1e-300
    same = (lv == rv) | close
    ok = np.isnan(lv) | tainted | (np.isfinite(lv) & np.isfinite(rv) & same) | (np.isinf(lv) & (lv == rv))
    refines = np.isnan(lv) & ~np.isnan(rv) & ~tainted
    return ~ok, refines, lv, rv


def _finding(kind: str, name: str, mask: np.ndarray, lv, rv, sorts, env, ints, ctx) -> Counterexample:
    """The flagged element whose inputs are plainest (fewest NaN, then ±inf, then values that are not small
    integers), first among equals: the message should show the simplest failing input."""
    rows = mask.reshape(mask.shape[0], -1).any(1)
    odd = np.zeros(mask.shape[0])
    for v in env.values():
        with np.errstate(invalid="ignore"):
            small_int = (np.abs(v) <= 4) & (np.round(v) == v)
        score = 1000.0 * np.isnan(v) + 100.0 * np.isinf(v) + ~small_int
        odd += score.reshape(v.shape[0], -1).sum(1)
    row = int(np.argmin(np.where(rows, odd, np.inf)))
    k = (row, *np.unravel_index(int(np.argmax(mask[row].ravel())), mask.shape[1:]))
    values: dict[str, object] = {}
    for d in sorted(ctx.extents):  # extent(j)=3; axis variables bound to one axis: extent(j=k)=3
        values[f"extent({'='.join(ax for ax, e in ctx.dims.items() if e == d)})"] = ctx.extents[d]
    for var in sorted(sorts):
        if var in env:
            v = np.squeeze(env[var][row])
            values[var] = v if np.ndim(v) else float(v)
        elif var in ints and sorts[var] != "String":
            values[var] = ints[var]
        elif isinstance(ints.get(var), str):
            values[var] = ints[var]  # a monoid variable: the monoid tried
    for key in sorted(k for k in env if ":" in k):
        v = np.squeeze(env[key][row])
        values[key] = v if np.ndim(v) else float(v)
    return Counterexample(name, values, float(lv[k]), float(rv[k]), kind)


def fuzz_verdict(name: str, lhs: PNode, rhs: PNode, conds=(), *, samples: int = 2000, seed: int = 0,
                 rtol: float = 1e-9) -> Verdict:
    """Fuzz `lhs → rhs` under `conds`: the first unsound sample, else the first refining one (see module doc)."""
    sorts = {**rhs.vars(), **lhs.vars()}
    mvars: set[str] = set()
    axes: list[str] = []
    _reductions(lhs, mvars, axes)
    _reductions(rhs, mvars, axes)
    axes += [c.axis for c in conds if c.kind in ("extent", "free_of") and c.axis not in axes]
    keys: set[str] = set()
    _leaf_keys(lhs, keys)
    _leaf_keys(rhs, keys)
    rng = np.random.default_rng(seed)
    verdict = Verdict()
    for combo in itertools.product(sorted(MONOIDS), repeat=len(mvars)):
        monoids = dict(zip(sorted(mvars), combo))
        for ctx in _layouts(axes, sorts):
            env, ints = _sample(rng, sorts, keys, conds, ctx, monoids, samples)
            L, R = eval_pattern(lhs, env, ints, ctx), eval_pattern(rhs, env, ints, ctx)
            bad, refines, lv, rv = _judge(L, R, rtol)
            if bad.any():
                verdict.counterexample = _finding("unsound", name, bad, lv, rv, sorts, env, ints, ctx)
                return verdict
            if verdict.refinement is None and refines.any():
                verdict.refinement = _finding("refinement", name, refines, lv, rv, sorts, env, ints, ctx)
    return verdict


def fuzz(name: str, lhs: PNode, rhs: PNode, conds=(), **kw) -> Counterexample | None:
    """The first unsound sample of `lhs → rhs`, or None (refinements are not counterexamples)."""
    return fuzz_verdict(name, lhs, rhs, conds, **kw).counterexample


def rule_verdict(rule, **kw) -> Verdict:
    """Fuzz a rules.base.Rule (both directions if bidirectional; a reverse refinement counts too)."""
    out = fuzz_verdict(rule.name, rule.lhs_pattern, rule.rhs_pattern, rule.conds, **kw)
    if out.sound and rule.bidirectional:
        back = fuzz_verdict(rule.name + " (reverse)", rule.rhs_pattern, rule.lhs_pattern, rule.conds, **kw)
        out = Verdict(back.counterexample, out.refinement or back.refinement)
    return out


def fuzz_rule(rule, **kw) -> Counterexample | None:
    """The first unsound sample of a rules.base.Rule (both directions if bidirectional), or None."""
    return rule_verdict(rule, **kw).counterexample


def describe(rule) -> str:
    return f"{rule.name}: {pretty(rule.lhs_pattern)} → {pretty(rule.rhs_pattern)}"


# ---------------------------------------------------------------- IR evaluation on samples


def eval_ir_sampled(node: ir.Node, env: dict[str, np.ndarray]) -> np.ndarray:
    """Evaluate an IR expression elementwise; leaves (state refs, loads, indices) are looked up by
    their printed form (`cur:m`, `x[i, j]`). A dynamic axis's length (`len(i)`) not in `env` takes the
    values 2 … 65 in turn: any length a dynamic compile serves."""
    memo: dict[int, np.ndarray] = {}
    points = max((np.size(v) for v in env.values()), default=1)

    def go(n: ir.Node) -> np.ndarray:
        hit = memo.get(id(n))
        if hit is not None:
            return hit
        if isinstance(n, ir.Const):
            out = np.asarray(n.value)
        elif isinstance(n, ir.StateRef | ir.Load | ir.Index):
            out = env[ir.show(n)]
        elif isinstance(n, ir.Length):
            out = env.get(ir.show(n), np.resize(np.arange(2.0, 66.0), points))
        elif isinstance(n, ir.Call):
            out = OPS[n.op].numpy(*(go(a) for a in n.args))
        else:
            raise ValueError(f"cannot sample-evaluate {type(n).__name__} ({ir.show(n)})")
        memo[id(n)] = out = np.asarray(out, dtype=float)
        return out

    return go(node)


__all__ = ["EXTENTS", "MONOIDS", "Counterexample", "Verdict", "eval_ir_sampled", "fmt_value", "fuzz", "fuzz_rule",
           "fuzz_verdict", "rule_verdict", "special_values"]
