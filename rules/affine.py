"""Expansion rules for affine correction searches: one rule per line with its math.

The algebra (rules/algebra.py) simplifies: it folds a quotient g(R′, c) / g(R, c) until a term free
of the loop axis appears. An affine repair t′ = Σₖ hₖ(R, R′)·tₖ (+ h₀·n) instead needs g(R′, c)
*expanded* into a sum over the bodies of the carried accumulators, after each running reference R′
has been rebased onto R (R′ = R + (R′ − R), R′ = R·(R′/R): unions the search adds, fusion/affine.py).
These rules distribute and reassociate towards that sum. They would grow the program's own e-graph
without bound, so only the small per-search e-graphs of fusion/affine.py run them, within a budget.

Soundness is the algebra's: refinement over IEEE doubles, checked by tests/test_rules_fuzz.py.
"""

from __future__ import annotations

from egglog import vars_

from neptune_eq.terms import Term, exp, exp2, log

from .base import Rule, is_finite, is_nonneg, not_zero, rw

a, b, c = vars_("a b c", Term)

EXPAND: list[Rule] = [
    rw("sub_add_assoc", a - (b + c), (a - b) - c),  # a − (b + c) → (a − b) − c
    rw("sub_sub_assoc", a - (b - c), (a - b) + c),  # a − (b − c) → (a − b) + c
    rw("add_add_assoc", a + (b + c), (a + b) + c),  # a + (b + c) → (a + b) + c
    rw("add_sub_assoc", a + (b - c), (a + b) - c),  # a + (b − c) → (a + b) − c
    rw("sub_add_swap", (a + b) - c, (a - c) + b),  # (a + b) − c → (a − c) + b
    rw("sub_sub_swap", (a - b) - c, (a - c) - b),  # (a − b) − c → (a − c) − b
    rw("mul_assoc", a * (b * c), (a * b) * c),  # a·(b·c) → (a·b)·c
    rw("mul_add_dist", a * (b + c), a * b + a * c, is_finite(a)),  # a·(b + c) → a·b + a·c
    rw("mul_sub_dist_any", a * (b - c), a * b - a * c, is_finite(a)),  # a·(b − c) → a·b − a·c
    rw("div_add_dist", (a + b) / c, a / c + b / c, is_finite(a), is_finite(b), not_zero(c)),  # (a + b)/c → a/c + b/c
    rw("div_sub_dist", (a - b) / c, a / c - b / c, is_finite(a), is_finite(b), not_zero(c)),  # (a − b)/c → a/c − b/c
    rw("div_mul_split", a / (b * c), (a / b) / c),  # a/(b·c) → (a/b)/c
    rw("mul_neg", a * (-b), -(a * b)),  # a·(−b) → −(a·b)
    rw("exp_split_add", exp(a + b), exp(a) * exp(b)),  # eᵃ⁺ᵇ → eᵃ·eᵇ
    rw("exp_split_sub", exp(a - b), exp(a) / exp(b)),  # eᵃ⁻ᵇ → eᵃ/eᵇ
    rw("exp2_split_add", exp2(a + b), exp2(a) * exp2(b)),  # 2ᵃ⁺ᵇ → 2ᵃ·2ᵇ
    rw("exp2_split_sub", exp2(a - b), exp2(a) / exp2(b)),  # 2ᵃ⁻ᵇ → 2ᵃ/2ᵇ
    rw("log_mul_split", log(a * b), log(a) + log(b), is_nonneg(a), is_nonneg(b)),  # log(a·b) → log a + log b (a, b ≥ 0)
]
