"""Which numbers of a traced function are its arguments' lengths, and which tests of them it makes.

A dynamic capture traces the function a second time with symbolic sizes (make_fx's "symbolic" mode).
The two graphs hold the same tensor operations in the same order; where the concrete one has a
number and the symbolic one a size expression (`x.sum() / x.shape[0]`, `torch.arange(L) - (L - 1)`,
kl_div's `batchmean`), the translation writes that argument with `len(axis)` (SizeTrace.values), so
the program no longer depends on the length and its axis can stay dynamic. The symbolic trace also
records the tests the function's Python made of its sizes (`if L > 1000:`, the shape guards): a
dimension changes length only where each test of it is proved to hold at every length ≥ 2
(`restricting`, `proved`: never sampled, as `L // 3 == 400` holds at all lengths but three), and
where every number computed from it that the program holds as it is changes at the probe's length,
so that the probe capture there sees its part in the program (`SizeTrace.unseen`: `(L // 8) ** 1.5`
is the same at 20 and 23).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace

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
    # every number computed from sizes that a tensor operation takes: (its `values` key, or None where
    # the graphs are not aligned or it sits in a list or keyword; its size expression, None if unknown)
    numbers: tuple = ()
    held: tuple = ()  # the numbers' expressions the program holds as they are, not as len(axis) (`hold`)
    shapes: dict = field(default_factory=dict)  # node of the concrete graph → its symbolic shape (sympy)

    def hold(self, written: set) -> SizeTrace:
        """This trace with `held` known: the translation wrote the numbers at keys `written` with
        len(axis); every other number of a size is in the program as it is (a constant, an extent)."""
        return replace(self, held=tuple(e for key, e in self.numbers if key not in written))

    def unseen(self, symbols: set, moved: int) -> str | None:
        """A number the program holds that depends on the sizes `symbols` (one length) and is the same
        with them at `moved` as at the example's length (`(L // 8) ** 1.5` at 20 and 23), said of that
        length n; else None. A probe capture at `moved` cannot see how the program depends on such a
        number, which changes at other lengths; every other number it holds changes there, so the probe
        sees any part it has in the program."""
        for e in self.held:
            if e is None:
                return "a number not recorded"
            if not e.free_symbols & symbols:
                continue
            at = dict(self.example)
            try:
                same = bool(sympy.Eq(e.subs(at), e.subs({**at, **dict.fromkeys(symbols, moved)})))
            except TypeError:  # (not decided by numbers)
                same = True
            if same:
                return str(e.subs(dict.fromkeys(symbols, sympy.Symbol("n"))))
        return None


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
    values, shapes = {}, {}
    for a, b in pairs or ():
        val = b.meta.get("val")
        if isinstance(val, torch.Tensor):
            shapes[a] = tuple(_expr(n) for n in val.shape)
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
            shapes[real] = tuple(_expr(n) for n in val.shape)
            if isinstance(symbol, sympy.Symbol):
                sizes.setdefault(symbol, (p, d))
                example[symbol] = int(m)
                env = n.node.shape_env
    guards = tuple(g.expr for g in env.guards) if env is not None else ()
    return SizeTrace(values, sizes, guards, example, _numbers(sym, dict((b, a) for a, b in pairs or ())),
                     shapes=shapes)


def _numbers(sym: fx.GraphModule, twin: dict) -> tuple:
    """(key, size expression) of every number computed from sizes that a tensor operation of the
    symbolic graph takes (`values`' key where it is a positional argument of an aligned operation)."""
    out = []
    for b in sym.graph.nodes:
        if b.op != "call_function" or _is_size(b):
            continue
        for k, arg in [*enumerate(b.args), *((None, v) for v in b.kwargs.values())]:
            for leaf in _leaves(arg):
                if isinstance(leaf, fx.Node) and _is_size(leaf):
                    key = (twin[b], k) if leaf is arg and b in twin and k is not None else None
                    val = leaf.meta.get("val")
                    out.append((key, _expr(val) if val is not None else None))  # (None: not recorded)
    return tuple(out)


def _leaves(arg):
    if isinstance(arg, list | tuple):
        for a in arg:
            yield from _leaves(a)
    else:
        yield arg


_VIEWS = (torch.ops.aten.slice.Tensor, torch.ops.aten.alias.default)  # (x[:, None]'s full slice: kept symbolically)
_SAME = {torch.ops.aten._unsafe_view.default: torch.ops.aten.view.default}  # (a matmul's reshape, traced either way)


def _target(n: fx.Node):
    return _SAME.get(n.target, n.target)


def _aligned(ops: list[fx.Node], sops: list[fx.Node]) -> list[tuple[fx.Node, fx.Node]] | None:
    """Each operation of the concrete graph with its twin of the symbolic one, in order (a view the
    symbolic trace keeps where the concrete one saw it did nothing is passed over: `x[:, :-1]`'s full
    slice of dimension 0, also a slice, is told from the slice of dimension 1 by its shape); None where
    they differ otherwise."""
    out, k = [], 0
    for a in ops:
        while k < len(sops) and not _twins(a, sops[k]) and sops[k].target in _VIEWS:
            k += 1
        if k == len(sops) or _target(sops[k]) != _target(a):
            return None
        out.append((a, sops[k]))
        k += 1
    return out if all(b.target in _VIEWS for b in sops[k:]) else None


def _twins(a: fx.Node, b: fx.Node) -> bool:
    """Same operation, and the symbolic value at the example's sizes has the concrete one's shape."""
    if _target(a) != _target(b):
        return False
    x, y = a.meta.get("val"), b.meta.get("val")
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        return True
    return tuple(x.shape) == tuple(n.node.hint if isinstance(n, torch.SymInt) else n for n in y.shape)


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


def restricting(sizes: SizeTrace, symbol, moving=None, together=(), least=None) -> str | None:
    """A test the function made of size `symbol` that is not proved to hold at every length ≥ 2 (its
    text, of that length n), else None. An equality of two sizes (x − y: their lengths are one)
    ties them, and they move together, as do the sizes `together` (one length); the other sizes of
    `moving` (sets of sizes, each set one length: the axes of one dynamic group; by default every
    size on its own) move too, each over every length ≥ 2, and the rest stay at the example's
    lengths. Proved, never sampled (`proved`): a test it cannot decide keeps the dimension
    specialised. `least`: size → the least length it takes where that is more than 2 (one sliced
    `x[:, :-1]` takes 3 and more: at 2 the slice has length 1, another program)."""
    tied = set().union(*(ties(sizes, s) for s in {symbol, *together}))
    least = least or {}
    lengths = None if moving is None else [set().union(*(ties(sizes, s) for s in group)) for group in moving]
    for g in sizes.guards:
        if not g.free_symbols & tied or _tie(g):
            continue
        groups, fixed = [tied], {}
        for s in sorted(g.free_symbols - tied, key=str):  # (each other size with those tied to it)
            if any(s in group for group in groups) or s in fixed:
                continue
            group = ties(sizes, s)
            own = next((x for x in lengths if group & x), None) if lengths is not None else set()
            if own is None and all(x in sizes.example for x in group):
                fixed.update({x: sizes.example[x] for x in group})  # (it stays at the example's length)
            else:
                groups.append(group | (own or set()))
        if not proved(g, groups, fixed, [max((least.get(x, 2) for x in group), default=2) for group in groups]):
            return str(g.subs(dict.fromkeys(tied, sympy.Symbol("n"))))
    return None


def ties(sizes: SizeTrace, symbol) -> set:
    """The sizes an equality of two sizes ties to `symbol` (one length: they move together), itself included."""
    tied, more = set(), {symbol}
    while more - tied:  # (ties are transitive: a = b, b = c in any order)
        tied |= more
        for g in sizes.guards:
            if _tie(g) and tied & g.free_symbols:
                more |= g.free_symbols
    return tied


def _tie(g) -> bool:
    return isinstance(g, sympy.Eq) and all(isinstance(a, sympy.Symbol) for a in g.args)


def proved(g, groups: list[set], fixed: dict, least=None) -> bool:
    """Does test `g` hold wherever the sizes of each group (one length per group) are any lengths
    ≥ 2 (≥ `least[k]` for group k), the sizes in `fixed` at those numbers? (The symbolic trace itself
    takes every length ≥ 2.) Each length is written m + 2 (m + least) with m a nonnegative integer,
    and the test decided by sympy's own evaluation (`Mod(1, m + 2)` is 1), else by sound interval
    bounds (torch's value ranges: Max, Min, FloorDiv, Mod included) of the test or of its sides'
    factored difference (B*(L - 1) ≠ B as B*(L - 2) ≠ 0), else, for a single length, by the exact
    real solution set of the relation (`x**2 - 5*x + 7 > 0`, `Ne(2*x, 7)`). Anything else is not proved."""
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    ms = [sympy.Symbol(f"m{k}", integer=True, nonnegative=True) for k in range(len(groups))]
    least = least or [2] * len(groups)
    h = g.subs({**fixed, **{s: m + n for m, n, group in zip(ms, least, groups) for s in group}})
    if h is sympy.true or h is sympy.false:
        return bool(h)
    ranges = {m: ValueRanges(0, int_oo) for m in ms}
    floorless, remainders = _without_floors(h)
    # (B*(L - 1) ≠ B is bounded as (B)*(L - 2) ≠ 0, not side by side; L // 2 <= L as L - (L - r)/2 >= 0)
    forms = [(h, {}), (_difference(h), {})] + ([(_difference(floorless), remainders)] if remainders else [])
    for form, rs in forms:
        try:
            bounds = bound_sympy(form, ranges | rs)
            if bounds.lower is sympy.true or bounds.lower is True:
                return True
        except Exception:  # (a form the value ranges do not bound: tried exactly below)
            pass
    free = [m for m in ms if m in h.free_symbols]
    return len(free) == 1 and _holds_from_zero(h, free[0])


def _without_floors(h):
    """Relation h with each floor division by a positive integer k written exactly as (a − r)/k and each
    a mod k as r, r an integer in [0, k − 1] of its own (a bound over every such r holds at the real
    one): interval bounds see `L // 2 <= L` as `L − (L − r)/2 >= 0` (DPO's halves of a batch), which
    they cannot bound with the floor in it. Returns (the relation, each r's range)."""
    from torch.utils._sympy.value_ranges import ValueRanges

    remainders = {}

    def remainder(k):
        r = sympy.Symbol(f"_r{len(remainders)}", integer=True, nonnegative=True)
        remainders[r] = ValueRanges(0, k - 1)
        return r

    def positive(k) -> bool:
        return isinstance(k, sympy.Integer) and k > 0

    try:
        out = h.replace(lambda e: type(e).__name__ == "FloorDiv" and positive(e.args[1]),
                        lambda e: (e.args[0] - remainder(e.args[1])) / e.args[1])
        out = out.replace(lambda e: type(e).__name__ in ("Mod", "PythonMod") and positive(e.args[1]),
                          lambda e: remainder(e.args[1]))
    except Exception:  # (a form sympy does not rewrite: as it is)
        return h, {}
    return out, remainders


def _difference(h):
    """Relation h as (lhs - rhs, factored) against 0, else h itself."""
    if not isinstance(h, sympy.core.relational.Relational):
        return h
    try:
        return type(h)(sympy.factor(h.lhs - h.rhs), 0)
    except Exception:  # (a form sympy does not factor)
        return h


MAX_DEGREE = 4  # the relations solved exactly: rational functions of a length up to this degree


def _holds_from_zero(h, m) -> bool:
    """Does relation h(m) hold at every integer m ≥ 0? From its exact real solution set, for a rational
    function of m of low degree: an inequality holding on all of [0, ∞); an inequation whose roots
    there are not integers; an identity."""
    if not isinstance(h, sympy.core.relational.Relational):
        return False
    x = sympy.Symbol("x", real=True)
    try:
        d = _plain(h.lhs - h.rhs).subs(m, x)
        top, bottom = sympy.fraction(sympy.together(d))
        if any(not p.is_polynomial(x) or sympy.degree(p, x) > MAX_DEGREE for p in (top, bottom)):
            return False  # (beyond a rational function of low degree: not solved, so never slow)
        if isinstance(h, sympy.Eq):
            return sympy.simplify(d) == 0
        if isinstance(h, sympy.Ne):
            roots = sympy.solveset(sympy.Eq(d, 0), x, sympy.Interval(0, sympy.oo))
            return isinstance(roots, sympy.FiniteSet) and all(r.is_integer is False for r in roots)
        where = sympy.solveset(type(h)(d, 0), x, sympy.S.Reals)
        return sympy.Interval(0, sympy.oo).is_subset(where) is True
    except Exception:  # (a form sympy cannot solve: not proved)
        return False


def _plain(e):
    """e with torch's size functions that are plain arithmetic on reals (ToFloat, true division)
    written as such; FloorDiv, Mod and the rest are kept (and then not solved)."""
    names = {"ToFloat": lambda a: a, "TruncToFloat": lambda a: a, "IntTrueDiv": lambda a, b: a / b,
             "FloatTrueDiv": lambda a, b: a / b}
    return e.replace(lambda x: type(x).__name__ in names, lambda x: names[type(x).__name__](*x.args))


__all__ = ["SizeTrace", "proved", "restricting", "size_expression", "ties", "trace_sizes"]
