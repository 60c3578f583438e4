"""Soundness fuzzing: evaluate both sides of a rule in float64 on random values.

Values mix ordinary numbers with ±inf, 0, ±1, huge (up to 1e300) and tiny (down to 1e-300)
magnitudes and the domain edges of log and sqrt. A rule is sound when, for every sample where
the left side is defined (not NaN), the right side equals it within a tolerance scaled by the
largest intermediate value of either side (so catastrophic cancellation in a correct rule is not
mistaken for an error). Samples where either side overflows or underflows from finite operands
are not judged: the rules must be exact over the reals and keep IEEE's special values (±inf,
signed zero, NaN for undefined) as inputs. A failure comes with its counterexample.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from neptune_eq import ir
from neptune_eq.ops import MONOIDS, OPS, np_reduce

from .patterns import PNode, pretty

J = 5  # elements along a reduced axis


def special_values(rng: np.random.Generator, shape, *, finite: bool = False) -> np.ndarray:
    """Random float64 values with many special cases."""
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
    return out.reshape(shape)


@dataclass
class _Ev:
    """A sampled value, whether it overflowed from finite operands, and the largest |intermediate|."""

    v: np.ndarray
    tainted: np.ndarray
    mag: np.ndarray


_CAN_UNDERFLOW = {"mul", "div", "exp", "exp2", "f_mul", "f_div"}


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
        tainted = tainted | (finite_in & nonzero_in & (np.abs(v) < 2.2250738585072014e-308))
    fin = np.where(np.isfinite(v), np.abs(v), 0.0)
    return _Ev(v, tainted, np.maximum(mag, fin))


def _reduce(op: str, body: _Ev) -> _Ev:
    """Reduce over the sampled axis (dimension 1), keeping it as size 1."""
    v = np.broadcast_to(body.v if body.v.ndim == 2 else body.v[:, None], (body.v.shape[0], J))
    red = np_reduce(op, v, 1)[:, None]
    t = np.broadcast_to(body.tainted if body.tainted.ndim == 2 else body.tainted[:, None], v.shape).any(1)[:, None]
    m = np.broadcast_to(body.mag if body.mag.ndim == 2 else body.mag[:, None], v.shape).max(1)[:, None]
    finite_in = np.isfinite(v).all(1)[:, None]
    t = t | (np.isinf(red) & finite_in)
    return _Ev(red, t, np.maximum(m, np.where(np.isfinite(red), np.abs(red), 0.0)))


_F64 = {"f_add": np.add, "f_sub": np.subtract, "f_mul": np.multiply, "f_div": np.divide, "f_neg": np.negative}


def eval_pattern(p: PNode, env: dict[str, np.ndarray], ints: dict[str, float]) -> _Ev:
    if p.kind == "var":
        if p.name in ints:
            v = np.asarray(ints[p.name], float)
            return _Ev(v, np.zeros(v.shape, bool), np.abs(v))
        v = env[p.name]
        return _Ev(v, np.zeros(v.shape, bool), np.where(np.isfinite(v), np.abs(v), 0.0))
    if p.kind == "lit":
        v = np.asarray(float(p.value) if isinstance(p.value, int | float) else 0.0)
        return _Ev(v, np.zeros((), bool), np.where(np.isfinite(v), np.abs(v), 0.0))
    name = p.name
    if name == "const":
        return eval_pattern(p.args[0], env, ints)
    if name in _F64:
        return _apply(_F64[name], [eval_pattern(a, env, ints) for a in p.args], name)
    if name == "f64.from_i64":
        return eval_pattern(p.args[0], env, ints)
    if name == "red":
        op = p.args[0].value if p.args[0].kind == "lit" else ints[p.args[0].name]
        return _reduce(op, eval_pattern(p.args[2], env, ints))
    if name in ("load", "index", "sym"):
        key = f"{name}:{p.args[0].value}"
        if key not in env:
            raise KeyError(key)
        return eval_pattern(PNode("var", key), env, ints)
    if name not in OPS:
        raise ValueError(f"cannot evaluate '{name}' in a rule")
    return _apply(OPS[name].numpy, [eval_pattern(a, env, ints) for a in p.args], name)


@dataclass
class Counterexample:
    rule: str
    values: dict[str, object]
    lhs: float
    rhs: float

    def __str__(self) -> str:
        vals = ", ".join(f"{k}={_fmt(v)}" for k, v in self.values.items())
        return (f"rule '{self.rule}' is unsound: with {vals}: left side = {_fmt(self.lhs)}, "
                f"right side = {_fmt(self.rhs)}")


def _fmt(v) -> str:
    if isinstance(v, np.ndarray):
        return "[" + ", ".join(_fmt(x) for x in v.tolist()) + "]"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)
    return repr(v)


def _leaf_keys(p: PNode, out: set[str]) -> None:
    if p.kind == "op" and p.name in ("load", "index", "sym") and p.args and p.args[0].kind == "lit":
        out.add(f"{p.name}:{p.args[0].value}")
    for a in p.args:
        _leaf_keys(a, out)


def _squeeze(e: _Ev) -> _Ev:
    """A value free of the reduced axis is sampled as (S, 1); compare it as (S,)."""
    if e.v.ndim == 2 and e.v.shape[1] == 1:
        return _Ev(e.v[:, 0], np.broadcast_to(e.tainted, e.v.shape)[:, 0], np.broadcast_to(e.mag, e.v.shape)[:, 0])
    return e


def _unsqueeze(e: _Ev) -> _Ev:
    return _Ev(e.v[:, None], np.broadcast_to(e.tainted, e.v.shape)[:, None], np.broadcast_to(e.mag, e.v.shape)[:, None])


def _monoid_vars(p: PNode, out: set[str]) -> None:
    if p.kind == "op" and p.name == "red" and p.args[0].kind == "var":
        out.add(p.args[0].name)
    for a in p.args:
        _monoid_vars(a, out)


def fuzz(name: str, lhs: PNode, rhs: PNode, conds=(), **kw) -> Counterexample | None:
    """None if no counterexample was found, else the first one. A monoid variable tries every monoid."""
    mvars: set[str] = set()
    _monoid_vars(lhs, mvars)
    _monoid_vars(rhs, mvars)
    for combo in itertools.product(sorted(MONOIDS), repeat=len(mvars)):
        bad = _fuzz_once(name, lhs, rhs, conds, dict(zip(sorted(mvars), combo)), **kw)
        if bad is not None:
            return bad
    return None


def _fuzz_once(name: str, lhs: PNode, rhs: PNode, conds, monoids: dict[str, str], *, samples: int = 2000,
               seed: int = 0, rtol: float = 1e-9) -> Counterexample | None:
    rng = np.random.default_rng(seed)
    sorts = {**rhs.vars(), **lhs.vars()}
    free_axis_vars = {c.var for c in conds if c.kind == "free_of"}
    uses_red = "red" in lhs.ops() | rhs.ops()
    env: dict[str, np.ndarray] = {}
    ints: dict[str, float] = {}
    for var, sort in sorts.items():
        if sort == "Term":
            shape = (samples, J) if uses_red and var not in free_axis_vars else (samples,)
            if uses_red and var in free_axis_vars:
                shape = (samples, 1)
            env[var] = special_values(rng, shape)
        elif sort == "f64":
            env[var] = special_values(rng, (samples, 1) if uses_red else (samples,))
        elif sort == "String":
            ints[var] = monoids.get(var, 0.0)
        elif sort == "i64":
            ints[var] = 0.0
    keys: set[str] = set()
    _leaf_keys(lhs, keys)
    _leaf_keys(rhs, keys)
    for k in keys:
        env[k] = special_values(rng, (samples, J) if uses_red else (samples,))
    for c in conds:
        v = env.get(c.var)
        if c.kind == "positive":
            env[c.var] = np.where((v > 0) & np.isfinite(v), v, 2.0)
        elif c.kind == "nonzero":
            env[c.var] = np.where(v != 0, v, 1.0)
        elif c.kind == "normal":
            env[c.var] = np.where((np.abs(v) > 1e-300) & (np.abs(v) < 1e300), v, 2.0)
        elif c.kind == "nonneg":
            env[c.var] = np.abs(v)
        elif c.kind == "finite":
            env[c.var] = np.where(np.isfinite(v), v, 1.5)
        elif c.kind == "extent":
            ints[c.var] = float(J)
    L = _squeeze(eval_pattern(lhs, env, ints))
    R = _squeeze(eval_pattern(rhs, env, ints))
    if L.v.ndim != R.v.ndim:  # one side still varies along the reduced axis: compare per element
        L, R = (_unsqueeze(e) if e.v.ndim == 1 else e for e in (L, R))
    shape = np.broadcast_shapes(L.v.shape, R.v.shape)
    lv, rv = np.broadcast_to(L.v, shape), np.broadcast_to(R.v, shape)
    lt = np.broadcast_to(L.tainted, shape) | np.broadcast_to(R.tainted, shape)
    mag = np.maximum(np.broadcast_to(L.mag, shape), np.broadcast_to(R.mag, shape))
    with np.errstate(all="ignore"):
        close = np.abs(lv - rv) <= rtol * np.maximum(mag, np.maximum(np.abs(lv), np.abs(rv))) + 1e-300
    same = (lv == rv) | close
    ok = np.isnan(lv) | lt | (np.isfinite(lv) & np.isfinite(rv) & same) | (np.isinf(lv) & (lv == rv))
    if ok.all():
        return None
    k = np.unravel_index(int(np.argmin(ok)), shape)
    row = k[0]
    values = {}
    for var in sorted(sorts):
        if var in env:
            v = env[var][row]
            values[var] = v if np.ndim(v) else float(v)
        elif var in ints:
            values[var] = ints[var]
    return Counterexample(name, values, float(lv[k]), float(rv[k]))


def fuzz_rule(rule, **kw) -> Counterexample | None:
    """Fuzz a rules.base.Rule (both directions if bidirectional)."""
    lhs, rhs = rule.lhs_pattern, rule.rhs_pattern
    bad = fuzz(rule.name, lhs, rhs, rule.conds, **kw)
    if bad is None and rule.bidirectional:
        bad = fuzz(rule.name + " (reverse)", rhs, lhs, rule.conds, **kw)
    return bad


def describe(rule) -> str:
    return f"{rule.name}: {pretty(rule.lhs_pattern)} → {pretty(rule.rhs_pattern)}"


# ---------------------------------------------------------------- IR evaluation on samples


def eval_ir_sampled(node: ir.Node, env: dict[str, np.ndarray]) -> np.ndarray:
    """Evaluate an IR expression elementwise; leaves (syms, loads, indices) are looked up by name."""
    memo: dict[int, np.ndarray] = {}

    def go(n: ir.Node) -> np.ndarray:
        hit = memo.get(id(n))
        if hit is not None:
            return hit
        if isinstance(n, ir.Const):
            out = np.asarray(n.value)
        elif isinstance(n, ir.Sym):
            out = env[n.name]
        elif isinstance(n, ir.Load | ir.Index):
            out = env[ir.show(n)]
        elif isinstance(n, ir.Call):
            out = OPS[n.op].numpy(*(go(a) for a in n.args))
        else:
            raise ValueError(f"cannot sample-evaluate {type(n).__name__} ({ir.show(n)})")
        memo[id(n)] = out = np.asarray(out, dtype=float)
        return out

    return go(node)


__all__ = ["MONOIDS", "Counterexample", "eval_ir_sampled", "fuzz", "fuzz_rule", "special_values"]
