"""Analyses the other rulesets consult: which axes a term varies over, which terms are ≥ 0 or > 0,
and which are finite (no syntactic ±inf or NaN can reach them).

deps(t) is a bitmask of axes merged by AND, so an e-class counts as independent of an axis as soon
as one of its members is (e.g. exp(s − m′)/exp(s − m) once it is shown equal to exp(m − m′)).
These rules are derived from the op table, one per constructor arity.
"""

from __future__ import annotations

from egglog import String, eq, f64, i64, rule, ruleset, set_, var, vars_

from neptune_eq.terms import (
    BINARY,
    UNARY,
    Term,
    abs_,
    axis_bit,
    deps,
    exp,
    exp2,
    finite,
    get,
    max2,
    min2,
    nonneg,
    pos,
    red,
)
from neptune_eq.terms import rsqrt as rsqrt_
from neptune_eq.terms import sqrt as sqrt_
from neptune_eq.terms import where as where_

t, a, b, c = vars_("t a b c", Term)
da, db, dc = vars_("da db dc", i64)
x = var("x", f64)
op, ax, name = vars_("op ax name", String)


def _deps_rules():
    yield rule(eq(t).to(Term(x))).then(set_(deps(t)).to(i64(0)))  # constants vary over nothing
    for fn in UNARY.values():
        yield rule(eq(t).to(fn(a)), eq(da).to(deps(a))).then(set_(deps(t)).to(da))
    for fn in BINARY.values():
        yield rule(eq(t).to(fn(a, b)), eq(da).to(deps(a)), eq(db).to(deps(b))).then(set_(deps(t)).to(da | db))
    yield rule(eq(t).to(where_(a, b, c)), eq(da).to(deps(a)), eq(db).to(deps(b)), eq(dc).to(deps(c))).then(
        set_(deps(t)).to(da | db | dc)
    )
    # a reduction no longer varies along its axis
    yield rule(eq(t).to(red(op, ax, a)), eq(da).to(deps(a)), eq(db).to(axis_bit(ax))).then(
        set_(deps(t)).to(da & ~db)
    )


DEPS = ruleset(*_deps_rules(), name="deps")

_ = get
NONNEG = ruleset(
    rule(eq(t).to(exp(a))).then(nonneg(t)),  # exp(a) ≥ 0
    rule(eq(t).to(exp2(a))).then(nonneg(t)),  # 2^a ≥ 0
    rule(eq(t).to(sqrt_(a))).then(nonneg(t)),  # √a ≥ 0 (or NaN)
    rule(eq(t).to(rsqrt_(a))).then(nonneg(t)),  # 1/√a ≥ 0 (or NaN)
    rule(eq(t).to(abs_(a))).then(nonneg(t)),  # |a| ≥ 0
    rule(eq(t).to(a * a)).then(nonneg(t)),  # a·a ≥ 0 (or NaN)
    rule(eq(t).to(Term(x)), x >= f64(0.0)).then(nonneg(t)),  # c ≥ 0
    rule(eq(t).to(a * b), nonneg(a), nonneg(b)).then(nonneg(t)),  # a,b ≥ 0 ⇒ a·b ≥ 0
    rule(eq(t).to(a + b), nonneg(a), nonneg(b)).then(nonneg(t)),  # a,b ≥ 0 ⇒ a+b ≥ 0
    rule(eq(t).to(a / b), nonneg(a), nonneg(b)).then(nonneg(t)),  # a,b ≥ 0 ⇒ a/b ≥ 0
    rule(eq(t).to(max2(a, b)), nonneg(a)).then(nonneg(t)),  # a ≥ 0 ⇒ max(a,b) ≥ 0
    rule(eq(t).to(min2(a, b)), nonneg(a), nonneg(b)).then(nonneg(t)),  # a,b ≥ 0 ⇒ min(a,b) ≥ 0
    rule(eq(t).to(where_(c, a, b)), nonneg(a), nonneg(b)).then(nonneg(t)),  # both branches ≥ 0
    rule(eq(t).to(red(op, ax, a)), nonneg(a)).then(nonneg(t)),  # a reduction of values ≥ 0
    name="nonneg",
)

# pos(t): t > 0 or NaN, by a margin rounding cannot close: a positive constant, plus anything ≥ 0
# (fl(a + c) ≥ c: rounding is monotone). Not products: two tiny positive numbers multiply to 0.
POS = ruleset(
    rule(eq(t).to(Term(x)), x > f64(0.0)).then(pos(t)),  # c > 0
    rule(eq(t).to(a + b), nonneg(a), pos(b)).then(pos(t)),  # a ≥ 0, b > 0 ⇒ a + b > 0
    rule(eq(t).to(max2(a, b)), pos(a)).then(pos(t)),  # a > 0 ⇒ max(a, b) > 0
    rule(eq(t).to(where_(c, a, b)), pos(a), pos(b)).then(pos(t)),  # both branches > 0
    rule(eq(t).to(sqrt_(a)), pos(a)).then(pos(t)),  # √a > 0 (√ of the smallest subnormal is 2e-162)
    rule(pos(t)).then(nonneg(t)),  # > 0 ⇒ ≥ 0
    name="pos",
)



s = var("s", String)
_FINITE_UNARY = ("neg", "exp", "exp2", "tanh", "abs", "not", "float")  # float(int index) too
_FINITE_BINARY = ("add", "sub", "mul", "max2", "min2", "lt", "le", "gt", "ge", "eq", "ne", "and", "or")
FINITE = ruleset(
    rule(eq(t).to(Term(x)), x > f64(-1e308), x < f64(1e308)).then(finite(t)),  # finite constants
    rule(eq(t).to(Term.load(s))).then(finite(t)),  # inputs are finite (documented precondition)
    rule(eq(t).to(Term.index(s))).then(finite(t)),
    rule(eq(t).to(Term.sym(s))).then(finite(t)),  # loop state symbols
    *[rule(eq(t).to(UNARY[o](a)), finite(a)).then(finite(t)) for o in _FINITE_UNARY],
    *[rule(eq(t).to(BINARY[o](a, b)), finite(a), finite(b)).then(finite(t)) for o in _FINITE_BINARY],
    rule(eq(t).to(where_(c, a, b)), finite(a), finite(b)).then(finite(t)),
    rule(eq(t).to(red(op, ax, a)), finite(a)).then(finite(t)),
    rule(eq(t).to(sqrt_(a)), finite(a), nonneg(a)).then(finite(t)),  # √a of a ≥ 0 (no NaN from a < 0)
    rule(eq(t).to(rsqrt_(a)), finite(a), pos(a)).then(finite(t)),  # 1/√a of a > 0 (no ∞ from a = 0): RMSNorm's
    name="finite",                                                 # rsqrt(mean(x²) + ε) factors out of a sum
)

ANALYSIS = DEPS | NONNEG | POS | FINITE
