"""Algebra over terms: one rule per line with its math.

Soundness is refinement over IEEE doubles: wherever the left side is defined (not NaN) the right
side must equal it; where the left side is NaN (0·∞, ∞ − ∞, 0/0) the right side may be anything.
tests/test_rules_fuzz.py checks every rule here on random values including ±inf, huge and tiny.

In an e-graph a refinement becomes an equality, and two refinements of one *syntactic* NaN
(say −∞ − −∞ ≡ 0 by a − a → 0, and ≡ −∞ by −∞ − a → −∞) would merge unrelated e-classes. So
every rule that refines (a − a → 0, a·0 → 0, (a−b)−(a−c) → c−b, ...) is guarded by `is_finite`
(no syntactic ±inf can reach the operand) or `not_zero` (a denominator is not the constant 0):
it then only refines for data values, never for terms the e-graph itself knows to be NaN.
Masks (where(p, s, −∞)) are therefore handled with strictly sound rules: hoisting a where is an
identity, and corrections are searched on the unmasked core of a reduction body (fusion.py).
"""

from __future__ import annotations

import math

from egglog import String, f64, i64, var, vars_

from neptune_eq.ops import LN2, LOG2E, OPS
from neptune_eq.terms import (
    BINARY,
    Term,
    abs_,
    eq_,
    exp,
    exp2,
    log,
    log2,
    max2,
    min2,
    red,
    rsqrt,
    sqrt,
    where,
)

from .base import (
    Rule,
    birw,
    extent_of,
    free_of,
    is_bounded,
    is_finite,
    is_nonneg,
    nonzero,
    normal,
    not_zero,
    positive,
    rw,
    varies,
)

a, b, c, d, p = vars_("a b c d p", Term)
x, y = vars_("x y", f64)
ax, op = vars_("ax op", String)
n = var("n", i64)
INF = math.inf


def _identity_rules() -> list[Rule]:
    """a ⊕ e → a for every op of the table with an identity e (derived, not hand-listed)."""
    return [rw(f"{name}_identity", BINARY[name](a, Term(op.identity)), a)
            for name, op in OPS.items() if op.identity is not None and name in BINARY]


def _commutativity_rules() -> list[Rule]:
    return [rw(f"{name}_comm", BINARY[name](a, b), BINARY[name](b, a))
            for name, op in OPS.items() if op.commutative and not op.predicate]


CONSTANTS = [
    rw("fold_add", Term(x) + Term(y), Term(x + y)),  # c₁ + c₂ → c
    rw("fold_sub", Term(x) - Term(y), Term(x - y)),  # c₁ − c₂ → c
    rw("fold_mul", Term(x) * Term(y), Term(x * y)),  # c₁ · c₂ → c
    rw("fold_div", Term(x) / Term(y), Term(x / y), nonzero(y)),  # c₁ / c₂ → c
    rw("fold_neg", -Term(x), Term(-x)),  # −(c) → −c
    rw("div_by_const", a / Term(x), a * Term(f64(1.0) / x), normal(x)),  # a / c → a · (1/c)
]

ARITHMETIC = [
    *_identity_rules(),  # a + 0 → a, a · 1 → a, a − 0 → a, a / 1 → a, max(a, −∞) → a, min(a, ∞) → a
    *_commutativity_rules(),  # a ⊕ b → b ⊕ a for + · max min
    rw("mul_const_assoc", (a * Term(x)) * Term(y), a * Term(x * y), not_zero(a)),  # (a·c₁)·c₂ → a·(c₁c₂)
    rw("mul_const_out", (a * Term(x)) * b, (a * b) * Term(x), nonzero(x)),  # (a·c)·b → (a·b)·c: constants out
    rw("add_const_assoc", (a + Term(x)) + Term(y), a + Term(x + y)),  # (a + c₁) + c₂ → a + (c₁+c₂)
    rw("mul_zero", a * Term(0.0), Term(0.0), is_finite(a)),  # a · 0 → 0
    rw("sub_self", a - a, Term(0.0), is_finite(a)),  # a − a → 0
    rw("neg_neg", -(-a), a),  # −(−a) → a  # noqa: B002
    rw("neg_sub", -(a - b), b - a),  # −(a − b) → b − a
    rw("sub_neg", a - (-b), a + b),  # a − (−b) → a + b
    rw("add_neg", a + (-b), a - b),  # a + (−b) → a − b
    rw("zero_sub", Term(0.0) - a, -a),  # 0 − a → −a
    rw("sub_sub_common", (a - b) - (a - c), c - b, is_finite(a)),  # (a − b) − (a − c) → c − b
    rw("add_sub_common", (a + b) - (a + c), b - c, is_finite(a)),  # (a + b) − (a + c) → b − c
    rw("add_sub_cancel", (a + b) - b, a, is_finite(b)),  # (a + b) − b → a
    rw("sub_add_cancel", (a - b) + b, a, is_finite(b)),  # (a − b) + b → a
    rw("mul_sub_factor", a * c - b * c, (a - b) * c, is_finite(c)),  # a·c − b·c → (a − b)·c
    rw("mul_add_factor", a * c + b * c, (a + b) * c, is_finite(c)),  # a·c + b·c → (a + b)·c
    rw("mul_sub_dist", (a - b) * Term(x), a * Term(x) - b * Term(x), positive(x),  # (a − b)·k → a·k − b·k
       is_bounded(a), is_bounded(b)),  # (float32 holds (K − K)·log₂e, not K·log₂e, at K = finfo.min)
    rw("div_mul_common", (a * b) / (a * c), b / c, is_finite(a), not_zero(a)),  # (a·b)/(a·c) → b/c
    rw("mul_div_cancel", (a * b) / b, a, is_finite(b), not_zero(b)),  # (a·b)/b → a
    rw("div_mul_swap", (a / b) * c, (a * c) / b),  # (a/b)·c → (a·c)/b
    rw("div_div", (a / b) / c, a / (b * c)),  # (a/b)/c → a/(b·c)
    rw("div_by_div", a / (b / c), (a * c) / b),  # a/(b/c) → (a·c)/b
    rw("div_split", (a * b) / (c * d), (a / c) * (b / d)),  # (a·b)/(c·d) → (a/c)·(b/d)
    rw("rsqrt_def", Term(1.0) / sqrt(a), rsqrt(a)),  # 1/√a → rsqrt(a)
]

EXP_LOG = [
    rw("exp_add", exp(a) * exp(b), exp(a + b)),  # eᵃ·eᵇ → eᵃ⁺ᵇ
    rw("exp_sub", exp(a) / exp(b), exp(a - b)),  # eᵃ/eᵇ → eᵃ⁻ᵇ
    rw("exp_zero", exp(Term(0.0)), Term(1.0)),  # e⁰ → 1
    rw("exp_neg_inf", exp(Term(-INF)), Term(0.0)),  # e^−∞ → 0
    rw("log_exp", log(exp(a)), a),  # log eᵃ → a
    rw("exp_log", exp(log(a)), a, is_nonneg(a)),  # e^(log a) → a  (a ≥ 0)
    rw("exp_to_exp2", exp(a), exp2(a * Term(LOG2E))),  # eᵃ → 2^(a·log₂e)
    rw("exp2_add", exp2(a) * exp2(b), exp2(a + b)),  # 2ᵃ·2ᵇ → 2ᵃ⁺ᵇ
    rw("exp2_sub", exp2(a) / exp2(b), exp2(a - b)),  # 2ᵃ/2ᵇ → 2ᵃ⁻ᵇ
    rw("exp2_zero", exp2(Term(0.0)), Term(1.0)),  # 2⁰ → 1
    rw("exp2_neg_inf", exp2(Term(-INF)), Term(0.0)),  # 2^−∞ → 0
    rw("log_to_log2", log(a), log2(a) * Term(LN2)),  # log a → log₂a · ln 2
]

INFINITIES = [
    rw("neg_inf_sub", Term(-INF) - a, Term(-INF), is_finite(a)),  # −∞ − a → −∞
    rw("neg_inf_add", Term(-INF) + a, Term(-INF), is_finite(a)),  # −∞ + a → −∞
    rw("eq_neg_inf_scaled", eq_(a * Term(x), Term(-INF)), eq_(a, Term(-INF)), positive(x)),  # a·c = −∞ ⇔ a = −∞
    rw("guard_scaled", where(eq_(a, Term(-INF)), b, a * Term(x)),  # (a = −∞ ? b : a·c) → (a·c = −∞ ? b : a·c)
       where(eq_(a * Term(x), Term(-INF)), b, a * Term(x)), positive(x)),
]


def _where_hoisting() -> list[Rule]:
    """f(p ? a : b) → p ? f(a) : f(b): lifts masks to the top of a reduction body."""
    out = [rw(f"where_{n}", f(where(p, a, b)), where(p, f(a), f(b)))
           for n, f in (("exp", exp), ("exp2", exp2), ("neg", Term.__neg__), ("log", log), ("log2", log2))]
    for n in ("add", "sub", "mul", "div"):
        f = BINARY[n]
        out.append(rw(f"where_{n}_l", f(where(p, a, b), c), where(p, f(a, c), f(b, c))))
        out.append(rw(f"where_{n}_r", f(c, where(p, a, b)), where(p, f(c, a), f(c, b))))
    return out


WHERE = [
    *_where_hoisting(),
    rw("where_same", where(p, a, a), a),  # p ? a : a → a
    rw("where_nested_t", where(p, where(p, a, b), c), where(p, a, c)),  # p ? (p ? a : b) : c → p ? a : c
    rw("where_nested_f", where(p, a, where(p, b, c)), where(p, a, c)),  # p ? a : (p ? b : c) → p ? a : c
]

REDUCTIONS = [
    rw("sum_factor", red("sum", ax, a * b), red("sum", ax, a) * b, free_of(b, ax), is_finite(b)),  # Σⱼ a·b → (Σⱼ a)·b
    # Σⱼ (a·b)·c → Σⱼ a·(b·c): with commutativity any factor of a product body comes to the top, where
    # sum_factor takes it out (Σ_d x·r·w·W → r·Σ_d x·w·W). Scoped to sum bodies, and only grouping c with
    # a factor when c varies along j (constants and per-row factors are left for sum_factor, not regrouped),
    # never inside the e-class of 0 (where 0·x holds every product x: it would regroup them all)
    rw("sum_assoc", red("sum", ax, (a * b) * c), red("sum", ax, a * (b * c)), varies(c, ax), not_zero(a),
       not_zero(b)),
    rw("sum_div_out", red("sum", ax, a / b), red("sum", ax, a) / b, free_of(b, ax), not_zero(b)),  # Σⱼ a/b → (Σⱼa)/b
    rw("red_where", red(op, ax, where(p, a, b)),  # ⊕ⱼ (p ? a : b) → p ? ⊕ⱼa : ⊕ⱼb  (p free of j)
       where(p, red(op, ax, a), red(op, ax, b)), free_of(p, ax)),
    rw("sum_linear", red("sum", ax, a + b), red("sum", ax, a) + red("sum", ax, b)),  # Σⱼ(a+b) → Σⱼa + Σⱼb
    rw("sum_linear_sub", red("sum", ax, a - b), red("sum", ax, a) - red("sum", ax, b)),  # Σⱼ(a−b) → Σⱼa − Σⱼb
    rw("sum_free", red("sum", ax, b), b * Term(f64.from_i64(n)), free_of(b, ax), extent_of(n, ax),
       is_finite(b)),  # Σⱼ b → n·b
    rw("max_shift", red("max", ax, a + b), red("max", ax, a) + b, free_of(b, ax)),  # maxⱼ(a+b) → maxⱼa + b
    rw("max_shift_sub", red("max", ax, a - b), red("max", ax, a) - b, free_of(b, ax)),  # maxⱼ(a−b) → maxⱼa − b
    birw("max_scale", red("max", ax, a * Term(x)), red("max", ax, a) * Term(x), positive(x)),  # maxⱼ(a·k) = maxⱼa·k
    rw("min_shift", red("min", ax, a + b), red("min", ax, a) + b, free_of(b, ax)),  # minⱼ(a+b) → minⱼa + b
    birw("min_scale", red("min", ax, a * Term(x)), red("min", ax, a) * Term(x), positive(x)),  # minⱼ(a·k) = minⱼa·k
    rw("max_free", red("max", ax, b), b, free_of(b, ax)),  # maxⱼ b → b
    rw("min_free", red("min", ax, b), b, free_of(b, ax)),  # minⱼ b → b
    rw("max_of_max2", red("max", ax, max2(a, b)), max2(red("max", ax, a), red("max", ax, b))),  # maxⱼ max(a,b)
    rw("min_of_min2", red("min", ax, min2(a, b)), min2(red("min", ax, a), red("min", ax, b))),  # minⱼ min(a,b)
]

# Stability. Σⱼ eᵇ = e^M·Σⱼ e^(b−M) with M = maxⱼ b is an identity for finite b; its exponents b − M ≤ 0
# cannot overflow, and e^M then cancels in a ratio or leaves the log. Σa²/n − (Σa/n)² = Σ(a − Σa/n)²/n
# (the centred variance) subtracts no two large sums. Not part of ALGEBRA: the pipeline's stabilise phase
# adds them when the cheapest program exponentiates a value not known ≤ 0 inside a sum, or subtracts two
# sums ≥ 0 (a program already written stably never sees them), and the extractor prices such an exp as
# an overflow risk and such a difference as a cancellation risk, so the stable spelling is taken.
_M = red("max", ax, b)
_S, _N = red("sum", ax, a), Term(f64.from_i64(n))  # (a sum and the extent it is divided by, for the centring)
_SHIFT = where(eq_(abs_(_M), Term(INF)), Term(0.0), _M)  # M, or 0 where M = ±∞ (a row of −∞, an input ∞)
STABILITY = [
    rw("sum_exp_shift", red("sum", ax, exp(b)),  # Σⱼ eᵇ → e^M·Σⱼ e^(b−M)
       exp(_SHIFT) * red("sum", ax, exp(b - _SHIFT)), varies(b, ax)),
    rw("sum_exp_mul_shift", red("sum", ax, exp(b) * c),  # Σⱼ eᵇ·c → e^M·Σⱼ e^(b−M)·c
       exp(_SHIFT) * red("sum", ax, exp(b - _SHIFT) * c), varies(b, ax)),
    rw("exp_div_exp_mul", exp(a) / (exp(b) * c), exp(a - b) / c),  # eᵃ/(eᵇ·c) → e^(a−b)/c
    rw("log_exp_mul", log(exp(a) * b), a + log(b), is_finite(a)),  # log(eᵃ·b) → a + log b
    rw("mean_sq_centred", red("sum", ax, a * a) / _N - (_S / _N) * (_S / _N),  # Σa²/n − (Σa/n)² → Σ(a − Σa/n)²/n
       red("sum", ax, (a - _S / _N) * (a - _S / _N)) / _N, extent_of(n, ax)),
]

ALGEBRA: list[Rule] = [*CONSTANTS, *ARITHMETIC, *EXP_LOG, *INFINITIES, *WHERE, *REDUCTIONS]
STABILITY_HELPERS = ("div_mul_common",)  # what the stabilise phase runs besides STABILITY and merges: e^M cancels
BUILTIN: list[Rule] = [*ALGEBRA, *STABILITY]  # every shipped rule (listing, fuzzing, reserved names)


def simplifies(rule: Rule) -> bool:
    """The right side is one of the left side's variables or a constant: the rule merges e-classes and
    adds at most a constant, so running it to a fixpoint cannot grow the e-graph."""
    rhs = rule.rhs_pattern
    return not rule.bidirectional and (rhs.kind == "var" or (rhs.kind == "op" and rhs.name == "const"))

_ = (rsqrt, positive)
