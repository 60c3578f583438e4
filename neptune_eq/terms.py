"""The e-graph's sorts: scalar terms, reductions and the fused loop forms, with their encoding from IR.

    Term    a value per index point: constants, tensor elements, axis indices, elementwise calls,
            red(op, axis, body), get(loop, name) (a component of a fused loop), sym(name)
    Comp    one component of a fused loop's state: name, monoid, mask, body core, correction quotient
    Loop    one pass over an axis carrying a tuple state; Loop.split(n) cuts the pass into n chunks

Analyses (rules/analysis.py): deps(t), the bitmask of axes t varies over (merged by AND: an
e-class is independent of an axis if any of its members is); nonneg(t); pos(t); finite(t); nonpos(t);
bounded(t).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from egglog import (
    EGraph,
    Expr,
    String,
    StringLike,
    Unit,
    converter,
    f64,
    f64Like,
    function,
    i64,
    i64Like,
    relation,
    set_,
)

from . import ir
from .egg_write import let, write
from .ops import COMPARISONS, OPS


class Term(Expr):
    def __init__(self, value: f64Like) -> None: ...

    @classmethod
    def load(cls, key: StringLike) -> Term: ...  # a tensor element; key names an ir.Load

    @classmethod
    def index(cls, axis: StringLike) -> Term: ...

    @classmethod
    def sym(cls, name: StringLike) -> Term: ...  # an ir.StateRef by its key: "cur:r1", "old:r1", "fin:r1"

    @classmethod
    def length(cls, axis: StringLike) -> Term: ...  # a dynamic axis's length (ir.Length): positive, finite

    def __add__(self, other: Term) -> Term: ...

    def __sub__(self, other: Term) -> Term: ...

    def __mul__(self, other: Term) -> Term: ...

    def __truediv__(self, other: Term) -> Term: ...

    def __neg__(self) -> Term: ...

    def __radd__(self, other: Term) -> Term: ...

    def __rsub__(self, other: Term) -> Term: ...

    def __rmul__(self, other: Term) -> Term: ...

    def __rtruediv__(self, other: Term) -> Term: ...


LEAVES = ("const", "load", "index", "sym", "length")  # the e-node ops with no Term children

converter(float, Term, lambda x: Term(f64(x)))
converter(int, Term, lambda x: Term(f64(float(x))))


def _egg_name(name: str) -> str:
    """The e-graph's name of a function whose Python name ends in a digit: with a trailing `_`. egglog
    (13.2) names the variables it flattens a command into after the function or global they hold and a
    count (exp's third is `exp2`), so a name that is another's plus digits (exp2, log2; egglog-python's
    global lets $__expr_2 and $__expr_21) can be given a variable of the other: in plain egglog a let
    holding (P (E2 p) (E (E q))) after six to nine lets using E held (P (E (E q)) (E (E q)))
    (tests/test_egg_names.py). No name ending in a digit, no such pair."""
    return f"neptune_eq_terms_{name}_"


@function
def exp(x: Term) -> Term: ...


@function(egg_fn=_egg_name("exp2"))
def exp2(x: Term) -> Term: ...


@function
def log(x: Term) -> Term: ...


@function(egg_fn=_egg_name("log2"))
def log2(x: Term) -> Term: ...


@function
def log1p(x: Term) -> Term: ...


@function(egg_fn=_egg_name("expm1"))
def expm1(x: Term) -> Term: ...


@function
def erf(x: Term) -> Term: ...


@function
def tanh(x: Term) -> Term: ...


@function
def sin(x: Term) -> Term: ...


@function
def cos(x: Term) -> Term: ...


@function
def sqrt(x: Term) -> Term: ...


@function
def rsqrt(x: Term) -> Term: ...


@function
def abs_(x: Term) -> Term: ...


@function(egg_fn=_egg_name("max2"))
def max2(a: Term, b: Term) -> Term: ...


@function(egg_fn=_egg_name("min2"))
def min2(a: Term, b: Term) -> Term: ...


@function
def floordiv(a: Term, b: Term) -> Term: ...


@function
def mod(a: Term, b: Term) -> Term: ...


@function
def where(c: Term, a: Term, b: Term) -> Term: ...


@function
def to_float(x: Term) -> Term: ...  # the integer x as a float (ops.py "float")


@function(egg_fn=_egg_name("round_bf16"))
def round_bf16(x: Term) -> Term: ...  # x rounded to bfloat16 (ops.py: a narrow value read by wider arithmetic)


@function(egg_fn=_egg_name("round_f16"))
def round_f16(x: Term) -> Term: ...


@function(egg_fn=_egg_name("round_f32"))
def round_f32(x: Term) -> Term: ...


@function
def lt(a: Term, b: Term) -> Term: ...


@function
def le(a: Term, b: Term) -> Term: ...


@function
def gt(a: Term, b: Term) -> Term: ...


@function
def ge(a: Term, b: Term) -> Term: ...


@function
def eq_(a: Term, b: Term) -> Term: ...


@function
def ne_(a: Term, b: Term) -> Term: ...


@function
def and_(a: Term, b: Term) -> Term: ...


@function
def or_(a: Term, b: Term) -> Term: ...


@function
def not_(a: Term) -> Term: ...


@function
def pow_(a: Term, b: Term) -> Term: ...


@function
def hypot(a: Term, b: Term) -> Term: ...


@function
def floor_(x: Term) -> Term: ...


@function
def ceil_(x: Term) -> Term: ...


@function
def trunc_(x: Term) -> Term: ...


@function
def rint(x: Term) -> Term: ...  # to nearest, ties to even (torch.round)


@function
def red(op: StringLike, axis: StringLike, body: Term) -> Term: ...


class Comp(Expr):
    """Component `name` of a loop: name = op_j(where(mask, core, identity)), repaired by `corr`."""

    def __init__(self, name: StringLike, op: StringLike, mask: Term, core: Term, corr: Term) -> None: ...


class Comps(Expr):
    def __init__(self) -> None: ...

    def add(self, comp: Comp) -> Comps: ...


class Loop(Expr):
    def __init__(self, axis: StringLike, comps: Comps) -> None: ...

    def split(self, n: i64Like) -> Loop: ...


@function
def get(loop: Loop, name: StringLike) -> Term: ...


# ---- analyses (their rules live in rules/analysis.py)


@function(merge=lambda old, new: old & new)
def deps(t: Term) -> i64: ...


@function(merge=lambda old, new: old)
def axis_bit(axis: StringLike) -> i64: ...


@function(merge=lambda old, new: old)
def extent(axis: StringLike) -> i64: ...


nonneg = relation("nonneg", Term)
pos = relation("pos", Term)  # t > 0 or NaN, bounded away from 0 (no rounding of data takes it to 0)
finite = relation("finite", Term)  # no syntactic ±inf or NaN can reach this term
nonpos = relation("nonpos", Term)  # t ≤ 0 or NaN (a − maxⱼ a): exp(t) ≤ 1 cannot overflow
# no finite constant of magnitude past FLT_MAX / 2 reaches t (finfo.min is one): float32 holds a multiple of
# t by a constant ≤ 2 (log₂e) wherever it holds t
bounded = relation("bounded", Term)
split_factor = relation("split_factor", String, i64)  # (axis, n): n chunks allowed along axis

# elementwise constructors by op name (the op table's vocabulary)
BINARY = {"add": Term.__add__, "sub": Term.__sub__, "mul": Term.__mul__, "div": Term.__truediv__,
          "max2": max2, "min2": min2, "floordiv": floordiv, "mod": mod, "lt": lt, "le": le, "gt": gt,
          "ge": ge, "eq": eq_, "ne": ne_, "and": and_, "or": or_, "pow": pow_, "hypot": hypot}
UNARY = {"neg": Term.__neg__, "exp": exp, "exp2": exp2, "log": log, "log2": log2, "log1p": log1p, "expm1": expm1,
         "erf": erf, "tanh": tanh, "sin": sin, "cos": cos, "sqrt": sqrt, "rsqrt": rsqrt, "abs": abs_, "not": not_,
         "float": to_float, "round_bf16": round_bf16, "round_f16": round_f16, "round_f32": round_f32,
         "floor": floor_, "ceil": ceil_, "trunc": trunc_, "rint": rint}
CONSTRUCTORS = {**BINARY, **UNARY, "where": where}
# (stopgrad marks a detached value for the gradient alone; compile_program removes it before encoding)
assert set(CONSTRUCTORS) == set(OPS) - {"stopgrad"}, set(OPS) ^ set(CONSTRUCTORS)
assert all(c in BINARY for c in COMPARISONS)

# name of each Python-level callable, as the op-table name (used to read rules and e-graphs back)
_METHOD_OPS = {"__add__": "add", "__sub__": "sub", "__mul__": "mul", "__truediv__": "div", "__neg__": "neg",
               "__radd__": "add", "__rsub__": "sub", "__rmul__": "mul", "__rtruediv__": "div"}
_FUNCTION_OPS = {"exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2", "log1p": "log1p", "expm1": "expm1",
                 "erf": "erf", "tanh": "tanh", "sin": "sin", "cos": "cos", "sqrt": "sqrt", "rsqrt": "rsqrt",
                 "abs_": "abs", "max2": "max2",
                 "min2": "min2",
                 "floordiv": "floordiv", "mod": "mod", "where": "where", "lt": "lt", "le": "le", "gt": "gt",
                 "ge": "ge", "eq_": "eq",
                 "ne_": "ne", "and_": "and", "or_": "or", "not_": "not", "to_float": "float",
                 "round_bf16": "round_bf16", "round_f16": "round_f16", "round_f32": "round_f32", "red": "red",
                 "get": "get",
                 "deps": "deps", "axis_bit": "axis_bit", "extent": "extent", "nonneg": "nonneg", "pos": "pos",
                 "finite": "finite",
                 "nonpos": "nonpos", "bounded": "bounded", "split_factor": "split_factor", "pow_": "pow",
                 "hypot": "hypot",
                 "floor_": "floor", "ceil_": "ceil", "trunc_": "trunc", "rint": "rint"}


def op_of_callable(ref) -> str | None:
    """Map an egglog callable reference (FunctionRef, MethodRef, ...) to our vocabulary's name."""
    kind = type(ref).__name__
    if kind == "MethodRef":
        cls = ref.ident.name
        if cls == "Term":
            return _METHOD_OPS.get(ref.method_name)
        if cls == "Comps" and ref.method_name == "add":
            return "comps_add"
        if cls == "Loop" and ref.method_name == "split":
            return "split"
        return None
    if kind == "ClassMethodRef" and ref.ident.name == "Term":
        return ref.method_name  # load / index / sym
    if kind == "InitRef":
        return {"Term": "const", "Comp": "comp", "Comps": "comps", "Loop": "loop"}.get(ref.ident.name)
    if kind == "FunctionRef":
        return _FUNCTION_OPS.get(ref.ident.name)
    return None


# ---------------------------------------------------------------- encoding IR → terms


LET_SIZE = 24  # expressions larger than this (counted below named subterms) get a name


@dataclass
class Encoder:
    """Turns IR nodes into Terms, registering leaf facts (deps of loads, syms and axes) in `egraph`.

    Tensor elements become `Term.load(key)` leaves: the key is the printed load (e.g. "k[b, h, j, d]")
    and `loads` maps it back. Gather indices are data access, not algebra, so they stay out of the
    e-graph.
    """

    egraph: EGraph
    axis_order: tuple[str, ...]
    extents: dict[str, int]
    dynamic: frozenset[str] = frozenset()  # axes of unknown length: no extent fact (Σⱼ b ↛ n·b)
    loads: dict[str, ir.Load] = field(default_factory=dict)
    syms: dict[str, ir.StateRef] = field(default_factory=dict)  # Term.sym key → the reference
    _memo: dict[ir.Node, Term] = field(default_factory=dict)
    _pending: list = field(default_factory=list)
    _size: dict[ir.Node, int] = field(default_factory=dict)  # expression size below the nearest lets
    _lets: list = field(default_factory=lambda: [0])  # let names handed out (shared with fresh() encoders)

    def __post_init__(self) -> None:
        if len(self.axis_order) > 62:
            raise ir.ProgramError("at most 62 axes are supported")
        # constants that rule guards refer to (egglog queries only see terms that exist)
        write(self.egraph, Term(f64(0.0)), Term(f64(1.0)))
        for ax in self.axis_order:
            self._pending.append(set_(axis_bit(ax)).to(i64(1 << self.axis_order.index(ax))))
            if ax not in self.dynamic:
                self._pending.append(set_(extent(ax)).to(i64(self.extents[ax])))
        self.flush()

    def fresh(self) -> Encoder:
        """An encoder into the same e-graph that shares the axis facts but not the memo."""
        out = Encoder.__new__(Encoder)
        out.egraph, out.axis_order, out.extents, out.dynamic = self.egraph, self.axis_order, self.extents, self.dynamic
        out.loads, out.syms, out._memo, out._pending, out._size, out._lets = {}, {}, {}, [], {}, self._lets
        return out

    @property
    def encoded(self) -> dict[ir.Node, Term]:
        """Every IR node this encoder has encoded, with its term (build_view marks these as written)."""
        return self._memo

    def mask(self, axes) -> int:
        m = 0
        for a in axes:
            m |= 1 << self.axis_order.index(a)
        return m

    def flush(self) -> None:
        if self._pending:
            write(self.egraph, *self._pending)
            self._pending.clear()

    def encode(self, node: ir.Node) -> Term:
        hit = self._memo.get(node)
        if hit is not None:
            return hit
        out = self._encode(node)
        size = 1 + sum(self._size.get(c, 1) for c in node.children())
        if size > LET_SIZE and isinstance(node, ir.Call | ir.Reduce):
            # named in the e-graph: an expression refers to it by name, so a chain of softmaxes (each
            # using its input twice) is not handed to egglog as a tree exponential in its depth
            self._lets[0] += 1
            out = let(self.egraph, f"nq_let{self._lets[0]}_", out)
            size = 1
        self._size[node] = size
        self._memo[node] = out
        return out

    def _encode(self, n: ir.Node) -> Term:
        if isinstance(n, ir.Const):
            return Term(f64(n.value))
        if isinstance(n, ir.Index):
            t = Term.index(n.axis)
            self._pending.append(set_(deps(t)).to(i64(self.mask([n.axis]))))
            return t
        if isinstance(n, ir.Load):
            key = ir.show(n)
            self.loads[key] = n
            t = Term.load(key)
            self._pending.append(set_(deps(t)).to(i64(self.mask(n.axes))))
            return t
        if isinstance(n, ir.Length):
            if n.axis not in self.dynamic:  # (a length known at compile time is its extent)
                return Term(f64(float(self.extents[n.axis])))
            # a dynamic axis's length: a leaf the e-graph knows only as positive and finite (≥ 1)
            t = Term.length(n.axis)
            self._pending += [set_(deps(t)).to(i64(0)), pos(t), nonneg(t), finite(t)]
            return t
        if isinstance(n, ir.StateRef):
            self.syms[n.key] = n
            t = Term.sym(n.key)
            self._pending.append(set_(deps(t)).to(i64(self.mask(n.axes))))
            return t
        if isinstance(n, ir.Reduce):
            return red(n.op, n.axis, self.encode(n.body))
        if isinstance(n, ir.Call):
            args = [self.encode(a) for a in n.args]
            return CONSTRUCTORS[n.op](*args)
        raise TypeError(f"cannot encode {type(n).__name__}")


__all__ = [
    "BINARY", "CONSTRUCTORS", "LEAVES", "UNARY", "Comp", "Comps", "Encoder", "Loop", "Term", "Unit", "axis_bit", "deps",
    "extent", "get", "nonneg", "op_of_callable", "pos", "red", "split_factor",
]


def held_forms(load: ir.Load, value: ir.Node) -> list[tuple[ir.Node, ir.Node]]:
    """(value, its spelling from the load) pairs a held input stands for: the value itself and, for a
    max or min of a positively scaled body, the unscaled one (maxⱼ(c·x) = c·maxⱼ x, so maxⱼ x = m/c).
    The algebra rewrites only forwards, so without the second the e-graph would know maxⱼ x only as a
    reduction to recompute — a score scale (softmax(q·k/√d)) made the backward recompute its max."""
    forms = [(value, load)]
    if isinstance(value, ir.Reduce) and value.op in ("max", "min") and isinstance(value.body, ir.Call) \
            and value.body.op in ("mul", "div"):
        op, (a, b) = value.body.op, value.body.args
        scaled = {"mul": [(a, b), (b, a)], "div": [(a, b)]}.get(op, [])  # (x, c): c·x, x·c or x/c
        for x, c in scaled:
            if isinstance(c, ir.Const) and math.isfinite(c.value) and c.value > 0 and not isinstance(x, ir.Const):
                unscaled = ir.Call("mul", (load, c)) if op == "div" else ir.Call("div", (load, c))
                forms.append((ir.Reduce(value.op, value.axis, x), unscaled))
                break
    return forms
