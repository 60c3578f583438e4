"""A rewrite rule as data: the egglog rewrite that runs, plus what the fuzzer and the explorer read.

    rw("exp_mul", exp(a) * exp(b), exp(a + b))                   # exp(a)·exp(b) → exp(a+b)
    rw("sum_factor", red("sum", ax, a * b), red("sum", ax, a) * b, free_of(b, ax))

Side conditions are small named helpers (free_of, positive, nonzero, is_nonneg) so that the
soundness fuzzer knows how to sample values that satisfy them.
"""

from __future__ import annotations

from dataclasses import dataclass

from egglog import Fact, RewriteOrRule, String, birewrite, eq, f64, i64, ne, rewrite

from neptune_eq.terms import Term, axis_bit, bounded, deps, extent, finite, nonneg

from .patterns import PNode, pattern_of, pretty


@dataclass(frozen=True)
class Cond:
    """A side condition. kind: free_of / varies (term var, axis var), positive / nonzero (f64 var), nonneg (term
    var)."""

    kind: str
    var: str
    axis: str | None = None
    facts: tuple[Fact, ...] = ()

    def __str__(self) -> str:
        if self.kind == "free_of":
            return f"{self.var} free of {self.axis}"
        if self.kind == "extent":
            return f"{self.var} = extent({self.axis})"
        if self.kind == "varies":
            return f"{self.var} varies along {self.axis}"
        return f"{self.kind}({self.var})"


def _name(v) -> str:
    p = pattern_of(v)
    if p.kind != "var":
        raise TypeError(f"a side condition takes a pattern variable, got {pretty(p)}")
    return p.name


def free_of(t: Term, axis: String) -> Cond:
    """t does not vary along `axis` (the deps analysis has its bit clear)."""
    return Cond("free_of", _name(t), _name(axis), (eq(deps(t) & axis_bit(axis)).to(i64(0)),))


def varies(t: Term, axis: String) -> Cond:
    """t is not known to be constant along `axis` (its deps bit is set). Restricts where a rule fires,
    not the values it sees: the fuzzer samples t varying along every axis anyway."""
    return Cond("varies", _name(t), _name(axis), (ne(deps(t) & axis_bit(axis)).to(i64(0)),))


def extent_of(n: i64, axis: String) -> Cond:
    """Binds n to the extent of `axis` (for rules like Σⱼ b → n·b)."""
    return Cond("extent", _name(n), _name(axis), (eq(n).to(extent(axis)),))


def positive(x: f64) -> Cond:
    """x is a finite number > 0."""
    return Cond("positive", _name(x), None, (x > f64(0.0), x < f64(1e308)))


def normal(x: f64) -> Cond:
    """x and 1/x are finite normal doubles (so replacing a/x by a·(1/x) cannot overflow)."""
    return Cond("normal", _name(x), None, (abs(x) > f64(1e-300), abs(x) < f64(1e300)))


def nonzero(x: f64) -> Cond:
    return Cond("nonzero", _name(x), None, (ne(x).to(f64(0.0)),))


def is_finite(t: Term) -> Cond:
    """t is built from finite constants and inputs only (no syntactic ±inf, no division)."""
    return Cond("finite", _name(t), None, (finite(t),))


def is_bounded(t: Term) -> Cond:
    """No finite constant past float32's half range reaches t (rules/analysis.py BOUNDED): a syntactic
    guard, like is_finite."""
    return Cond("bounded", _name(t), None, (bounded(t),))


def not_zero(t: Term) -> Cond:
    """t is not (yet) known to equal the constant 0 (guards denominators against syntactic 0/0)."""
    return Cond("not_zero", _name(t), None, (ne(t).to(Term(0.0)),))


def is_nonneg(t: Term) -> Cond:
    return Cond("nonneg", _name(t), None, (nonneg(t),))


@dataclass(frozen=True)
class Rule:
    name: str
    lhs: Term
    rhs: Term
    conds: tuple[Cond, ...] = ()
    bidirectional: bool = False
    origin: str = "builtin"

    def egglog(self) -> RewriteOrRule:
        """The egglog rewrite (built once: each compile builds its rulesets from the same rules)."""
        built = self.__dict__.get("_egglog")  # (a frozen dataclass: cached beside its fields, not one of them)
        if built is None:
            facts = [f for c in self.conds for f in c.facts]
            built = (birewrite if self.bidirectional else rewrite)(self.lhs).to(self.rhs, *facts)
            self.__dict__["_egglog"] = built
        return built

    @property
    def lhs_pattern(self) -> PNode:
        return pattern_of(self.lhs)

    @property
    def rhs_pattern(self) -> PNode:
        return pattern_of(self.rhs)

    @property
    def rounds(self) -> bool:
        """Does the right side compute a constant in float64 (c₁·c₂, 1/c)? Two orders of such folds round
        the same real number two ways, and the e-graph then holds both numbers in one class."""
        def walk(p: PNode) -> bool:
            return (p.kind == "op" and p.name in _ROUNDING) or any(map(walk, p.args))
        return walk(self.rhs_pattern)

    @property
    def math(self) -> str:
        arrow = " ↔ " if self.bidirectional else " → "
        text = pretty(self.lhs_pattern) + arrow + pretty(self.rhs_pattern)
        if self.conds:
            text += "   if " + ", ".join(str(c) for c in self.conds)
        return text

    @property
    def exact(self) -> str:
        """The rule as exact text: its name, both sides as pattern trees with every constant as repr writes
        it (the shortest text that reads back to the same float64, -0.0 apart from 0.0), its direction and
        conditions. Two rules with one text rewrite alike; the compile cache keys user rules on it (`math`
        is for reading: it once printed constants to 6 digits, so 1.0000001 and 1.0000002 shared a key)."""
        conds = tuple((c.kind, c.var, c.axis) for c in self.conds)
        return repr((self.name, self.lhs_pattern, self.rhs_pattern, self.bidirectional, conds))

    def __str__(self) -> str:
        return f"{self.name}: {self.math}"


_ROUNDING = frozenset({"f_add", "f_sub", "f_mul", "f_div"})  # f64 arithmetic a right side may compute (f_neg is exact)


def rw(name: str, lhs: Term, rhs: Term, *conds: Cond) -> Rule:
    return Rule(name, lhs, rhs, tuple(conds))


def birw(name: str, lhs: Term, rhs: Term, *conds: Cond) -> Rule:
    return Rule(name, lhs, rhs, tuple(conds), bidirectional=True)
