"""Analyses the other rulesets consult: which axes a term varies over, which terms are ≥ 0 or > 0,
which are finite (no syntactic ±inf or NaN can reach them), and which are bounded (no finite constant
past float32's half range reaches them).

deps(t) is a bitmask of axes merged by AND, so an e-class counts as independent of an axis as soon
as one of its members is (e.g. exp(s − m′)/exp(s − m) once it is shown equal to exp(m − m′)).
These rules are derived from the op table, one per constructor arity.
"""

from __future__ import annotations

import math

from egglog import String, eq, f64, i64, rule, ruleset, set_, var, vars_

from neptune_eq.terms import (
    BINARY,
    UNARY,
    Loop,
    Term,
    abs_,
    axis_bit,
    bounded,
    deps,
    eq_,
    exp,
    exp2,
    finite,
    get,
    log,
    max2,
    min2,
    nonneg,
    nonpos,
    pos,
    red,
)
from neptune_eq.terms import rsqrt as rsqrt_
from neptune_eq.terms import sqrt as sqrt_
from neptune_eq.terms import where as where_

t, a, b, c = vars_("t a b c", Term)
da, db, dc = vars_("da db dc", i64)
x = var("x", f64)
s = var("s", String)
op, ax, name = vars_("op ax name", String)
loop = var("loop", Loop)


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
    rule(eq(t).to(Term.index(s))).then(nonneg(t)),  # a loop index ≥ 0
    rule(eq(t).to(UNARY["float"](a)), nonneg(a)).then(nonneg(t)),  # float(a) keeps a ≥ 0
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


_FINITE_UNARY = ("neg", "exp", "exp2", "tanh", "sin", "cos", "abs", "not", "float", "floor", "ceil",
                 "trunc", "rint")  # float(int index) too
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

# nonpos(t): t ≤ 0 (or NaN) wherever the data is finite, so exp(t) ≤ 1 cannot overflow. What makes an
# exponent safe is the shift by a maximum; the extractor prices exp of anything else as an overflow risk.
# Read by the extractor only, never a rule's side condition: it steers which spelling is taken.
NONPOS = ruleset(
    rule(eq(t).to(a - red("max", ax, a))).then(nonpos(t)),  # a − maxⱼ a ≤ 0
    # a − (maxⱼ a = −∞ ? b : maxⱼ a) ≤ 0: torch's guarded softmax; where the guard holds every a is −∞
    rule(eq(t).to(a - where_(eq_(red("max", ax, a), Term(-math.inf)), b, red("max", ax, a)))).then(nonpos(t)),
    # a − (|maxⱼ a| = ∞ ? b : maxⱼ a) ≤ 0: STABILITY's shift; the guard holds only for a row of −∞ on
    # finite data (a row holding +∞ is not finite data)
    rule(eq(t).to(a - where_(eq_(abs_(red("max", ax, a)), Term(math.inf)), b, red("max", ax, a)))).then(nonpos(t)),
    # a − (b + log Σⱼ e^{a−b}) ≤ 0 for any shift b: the sum holds e^{a−b} among its nonnegative terms, so
    # its log is at least a − b (a log-softmax, as log_softmax is written out: no max of it is needed)
    rule(eq(t).to(a - (b + log(red("sum", ax, exp(a - b)))))).then(nonpos(t)),
    rule(eq(t).to((a - b) - log(red("sum", ax, exp(a - b))))).then(nonpos(t)),  # the same, reassociated
    # a − (b + (c ? ∞ : log Σⱼ e^{a−b})) ≤ 0: the same with an empty row's log-sum-exp ∞ (the statistic
    # neptune_eq/grad_fold saves where Σⱼ e^{a−b} = 0): a − ∞ is −∞
    rule(eq(t).to(a - (b + where_(c, Term(math.inf), log(red("sum", ax, exp(a - b))))))).then(nonpos(t)),
    rule(eq(t).to(a - max2(a, b))).then(nonpos(t)),  # a − max(a, b) ≤ 0
    rule(eq(t).to(a - max2(b, a))).then(nonpos(t)),  # a − max(b, a) ≤ 0
    rule(eq(t).to(Term(x)), x <= f64(0.0)).then(nonpos(t)),  # c ≤ 0
    rule(eq(t).to(-a), nonneg(a)).then(nonpos(t)),  # a ≥ 0 ⇒ −a ≤ 0
    rule(eq(t).to(a - b), nonpos(a), nonneg(b)).then(nonpos(t)),  # a ≤ 0, b ≥ 0 ⇒ a − b ≤ 0
    rule(eq(t).to(a + b), nonpos(a), nonpos(b)).then(nonpos(t)),  # a, b ≤ 0 ⇒ a + b ≤ 0
    rule(eq(t).to(a * b), nonpos(a), nonneg(b)).then(nonpos(t)),  # a ≤ 0, b ≥ 0 ⇒ a·b ≤ 0
    rule(eq(t).to(a / b), nonpos(a), nonneg(b)).then(nonpos(t)),  # a ≤ 0, b ≥ 0 ⇒ a/b ≤ 0
    rule(eq(t).to(min2(a, b)), nonpos(a)).then(nonpos(t)),  # a ≤ 0 ⇒ min(a, b) ≤ 0
    rule(eq(t).to(max2(a, b)), nonpos(a), nonpos(b)).then(nonpos(t)),  # a, b ≤ 0 ⇒ max(a, b) ≤ 0
    rule(eq(t).to(where_(c, a, b)), nonpos(a), nonpos(b)).then(nonpos(t)),  # both branches ≤ 0
    rule(eq(t).to(red(op, ax, a)), nonpos(a)).then(nonpos(t)),  # a reduction of values ≤ 0 (max, min)
    name="nonpos",
)

# bounded(t): no finite constant of magnitude past FLT_MAX / 2 reaches t. A mask filled with finfo.min
# (−3.4e38, Hugging Face's) is not: float32 holds (s − m)·log₂e but not s·log₂e − m·log₂e there, where
# a fully masked row's scores are all the fill (session 51: exp2's distributed form made that row 0,
# torch's softmax of equal values is uniform). Infinite constants are bounded: −∞·log₂e is −∞.
HALF_FLT_MAX = 1.7e38
BOUNDED = ruleset(
    rule(eq(t).to(Term(x)), x >= f64(-HALF_FLT_MAX), x <= f64(HALF_FLT_MAX)).then(bounded(t)),
    rule(eq(t).to(Term(x)), eq(x).to(f64(math.inf))).then(bounded(t)),
    rule(eq(t).to(Term(x)), eq(x).to(f64(-math.inf))).then(bounded(t)),
    rule(eq(t).to(Term.load(s))).then(bounded(t)),  # inputs are finite: read, they are what torch holds
    rule(eq(t).to(Term.index(s))).then(bounded(t)),
    rule(eq(t).to(Term.sym(s))).then(bounded(t)),
    rule(eq(t).to(get(loop, s))).then(bounded(t)),  # a fused loop's result: its reductions were judged
    *[rule(eq(t).to(fn(a)), bounded(a)).then(bounded(t)) for fn in UNARY.values()],
    *[rule(eq(t).to(fn(a, b)), bounded(a), bounded(b)).then(bounded(t)) for fn in BINARY.values()],
    rule(eq(t).to(where_(c, a, b)), bounded(c), bounded(a), bounded(b)).then(bounded(t)),
    rule(eq(t).to(red(op, ax, a)), bounded(a)).then(bounded(t)),
    name="bounded",
)

ANALYSIS = DEPS | NONNEG | POS | FINITE | NONPOS | BOUNDED
# derived before a phase's first iteration (Saturator.phase's seed): mul_sub_dist, which reads bounded,
# fires from the first iteration as it did before it had the condition (the other analyses run after
# each iteration, and a budget that stops after three would otherwise see a different e-graph)
SEED = BOUNDED
