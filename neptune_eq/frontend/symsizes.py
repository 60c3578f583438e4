"""Which numbers of a traced function are its arguments' lengths, and which tests of them it makes.

A dynamic capture traces the function a second time with symbolic sizes (make_fx's "symbolic" mode).
The two graphs hold the same tensor operations in the same order; where the concrete one has a
number and the symbolic one a size expression (`x.sum() / x.shape[0]`, `torch.arange(L) - (L - 1)`,
kl_div's `batchmean`), the translation writes that argument with `len(axis)` (SizeTrace.values), so
the program no longer depends on the length and its axis can stay dynamic. The symbolic trace also
records the tests the function's Python made of its sizes (`if L > 1000:`, the shape guards): a
dimension such a test constrains cannot change length without changing the program, however the
probe captures at nearby lengths come out (`restricting`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import sympy
import torch
from torch import fx

from .. import ir
from .exprs import call, const

_SIZE_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)


@dataclass(frozen=True)
class SizeTrace:
    values: dict  # (node of the concrete graph, argument position) → its size expression (sympy)
    sizes: dict  # size symbol → (placeholder number, dimension) it stands for
    guards: tuple  # the tests the function made of its sizes (sympy relations)
    example: dict  # size symbol → its length in the example


def trace_sizes(trace_symbolic, gm: fx.GraphModule) -> SizeTrace | None:
    """The size trace of a function traced as `gm` (concrete sizes): `trace_symbolic()` traces it with
    symbolic sizes. None where that fails; no values where its operations differ from gm's (the tests
    it made of its sizes are still known)."""
    from torch.fx.experimental import _config

    try:
        # one symbol per dimension: duck shaping would give two dimensions of one length the same symbol,
        # and a number computed from one (a vocabulary's size) would be read as the other's (the rows')
        with _config.patch(use_duck_shape=False):
            sym = trace_symbolic()
    except Exception:  # (a function that traces with numbers but not with symbols keeps its numbers)
        return None
    pairs = _aligned([n for n in gm.graph.nodes if n.op == "call_function"],
                     [n for n in sym.graph.nodes if n.op == "call_function" and not _is_size(n)])
    values = {}
    for a, b in pairs or ():
        for k, (x, y) in enumerate(zip(a.args, b.args)):
            if isinstance(x, int | float) and not isinstance(x, bool) and isinstance(y, fx.Node) and _is_size(y):
                values[(a, k)] = _expr(y.meta["val"])
    sizes, example, env = {}, {}, None
    placeholders = [n for n in sym.graph.nodes if n.op == "placeholder"]
    concrete = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for p, (node, real) in enumerate(zip(placeholders, concrete)):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for d, (n, m) in enumerate(zip(val.shape, real.meta["val"].shape)):
            # (the symbol the dimension was traced with: one the function's Python specialised, by
            # math.sqrt(L) or int(L), now reads as its number, and its guard names the symbol)
            symbol = n.node._expr if isinstance(n, torch.SymInt) else None
            if isinstance(symbol, sympy.Symbol):
                sizes.setdefault(symbol, (p, d))
                example[symbol] = int(m)
                env = n.node.shape_env
    guards = tuple(g.expr for g in env.guards) if env is not None else ()
    return SizeTrace(values, sizes, guards, example)


_VIEWS = (torch.ops.aten.slice.Tensor, torch.ops.aten.alias.default)  # (x[:, None]'s full slice: kept symbolically)
_SAME = {torch.ops.aten._unsafe_view.default: torch.ops.aten.view.default}  # (a matmul's reshape, traced either way)


def _target(n: fx.Node):
    return _SAME.get(n.target, n.target)


def _aligned(ops: list[fx.Node], sops: list[fx.Node]) -> list[tuple[fx.Node, fx.Node]] | None:
    """Each operation of the concrete graph with its twin of the symbolic one, in order (a view the
    symbolic trace keeps where the concrete one saw it did nothing is passed over); None where they
    differ otherwise."""
    out, k = [], 0
    for a in ops:
        while k < len(sops) and _target(sops[k]) != _target(a) and sops[k].target in _VIEWS:
            k += 1
        if k == len(sops) or _target(sops[k]) != _target(a):
            return None
        out.append((a, sops[k]))
        k += 1
    return out if all(b.target in _VIEWS for b in sops[k:]) else None


def _is_size(n: fx.Node) -> bool:
    """Does node `n` compute a size (a SymInt, an int) rather than a tensor?"""
    val = n.meta.get("val")
    return isinstance(val, _SIZE_TYPES) or n.target in (operator.add, operator.sub, operator.mul, operator.floordiv,
                                                         operator.truediv, operator.mod, operator.neg)


def _expr(v):
    return v.node.expr if isinstance(v, torch.SymInt | torch.SymFloat) else sympy.sympify(v)


class _NotAnExpression(Exception):
    pass


def size_expression(e, length) -> ir.Node | None:
    """Size expression `e` (sympy) as IR, `length(symbol)` the IR of one symbol (its axes' lengths);
    None for a form the IR does not hold (the number is then kept)."""
    try:
        return _ir(e, length)
    except _NotAnExpression:
        return None


def _ir(e, length) -> ir.Node:
    if e.is_Integer or e.is_Rational or e.is_Float:
        return const(float(e))
    if isinstance(e, sympy.Symbol):
        return length(e)
    name = type(e).__name__
    args = [_ir(a, length) for a in e.args]
    if isinstance(e, sympy.Add):
        out = args[0]
        for a in args[1:]:
            out = call("add", out, a)
        return out
    if isinstance(e, sympy.Mul):
        out = args[0]
        for a in args[1:]:
            out = call("mul", out, a)
        return out
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp != 0:
        out = args[0]
        for _ in range(abs(int(e.exp)) - 1):
            out = call("mul", out, args[0])
        return out if e.exp > 0 else call("div", const(1.0), out)
    if isinstance(e, sympy.Pow) and e.exp == sympy.Rational(1, 2):
        return call("sqrt", args[0])
    ops = {"FloorDiv": "floordiv", "PythonMod": "mod", "Mod": "mod", "IntTrueDiv": "div", "FloatTrueDiv": "div"}
    if name in ops and len(args) == 2:
        return call(ops[name], *args)
    if name in ("ToFloat", "TruncToFloat") and len(args) == 1:
        return args[0]
    raise _NotAnExpression(name)


_PROBES = (2, 3, 5, 7, 16, 17, 31, 100, 127, 1000, 1001, 2048, 4096, 4097, 10000, 65536, 1 << 20)


def restricting(sizes: SizeTrace, symbol) -> str | None:
    """A test the function made of size `symbol` that does not hold at every length ≥ 2 (its text, of
    that length n), else None. An equality of two sizes (x − y: their lengths are one) ties them, and
    they move together; other sizes stay at the example's lengths."""
    tied, more = set(), {symbol}
    while more - tied:  # (ties are transitive: a = b, b = c in any order)
        tied |= more
        for g in sizes.guards:
            if isinstance(g, sympy.Eq) and all(isinstance(a, sympy.Symbol) for a in g.args) and tied & g.free_symbols:
                more |= g.free_symbols
    for g in sizes.guards:
        if not g.free_symbols & tied or (isinstance(g, sympy.Eq) and all(isinstance(a, sympy.Symbol) for a in g.args)):
            continue
        rest = {s: sizes.example.get(s, 2) for s in g.free_symbols - tied}
        for n in sorted({*_PROBES, *_near(g, rest, tied)}):
            try:
                holds = bool(g.subs({**rest, **dict.fromkeys(tied, n)}))
            except TypeError:  # (not decided by numbers: keep the dimension specialised)
                holds = False
            if not holds:  # (said of n, the length of every size tied to this one)
                return str(g.subs(dict.fromkeys(tied, sympy.Symbol("n"))))
    return None


def _near(g, rest: dict, tied: set) -> set[int]:
    """Lengths ≥ 2 where test `g` may change its answer: next to the numbers it names and to where
    its two sides meet (`L == 20`, `L != 17`, `2 * L > 40` hold at every probe length but one)."""
    out = set()
    for c in g.atoms(sympy.Number):
        if c.is_finite and c.is_real:
            out.update(range(int(sympy.floor(c)) - 1, int(sympy.floor(c)) + 2))
    if isinstance(g, sympy.core.relational.Relational):
        n = sympy.Symbol("n")
        try:
            roots = sympy.solve((g.lhs - g.rhs).subs({**rest, **dict.fromkeys(tied, n)}), n)
        except Exception:  # (a form sympy cannot solve: the numbers it names are probed still)
            roots = []
        for r in roots:
            if r.is_real and r.is_finite:
                out.update(range(int(sympy.floor(r)) - 1, int(sympy.floor(r)) + 2))
    return {n for n in out if n >= 2}


__all__ = ["SizeTrace", "restricting", "size_expression", "trace_sizes"]
