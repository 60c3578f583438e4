"""Composite operations written from primitives (no special IR nodes).

Masked rows: softmax over a row whose entries are all -inf returns 0 (like torch's safe softmax
used by SDPA and like FlexAttention), and logsumexp of such a row is -inf; a row holding +inf has
logsumexp +inf (torch.logsumexp), a row holding NaN gives NaN (max and min propagate NaN). The guards are part
of the programs below, so the float64 reference and the generated kernels agree on them.
"""

from __future__ import annotations

from .dsl import Expr, eq, exp, inf, log, max, rsqrt, sum, where


def safe_max(x: Expr, axis) -> Expr:
    """max over `axis`, with 0 in place of -inf (all-masked rows) so that x - m stays -inf, not NaN."""
    m = max(x, axis)
    return where(eq(m, -inf), 0.0, m)


def softmax(x: Expr, axis) -> Expr:
    p = exp(x - safe_max(x, axis))
    l = sum(p, axis)
    return where(eq(l, 0.0), 0.0, p / l)


def _shifted_lse(x: Expr, axis) -> Expr:
    """m + log Σ exp(x − m): NaN for a row holding +inf (x − m = inf − inf), -inf for an all -inf row."""
    m = safe_max(x, axis)
    return m + log(sum(exp(x - m), axis))


def logsumexp(x: Expr, axis) -> Expr:
    """log Σ exp(x); a row holding +inf gives +inf (and one holding NaN, NaN), like torch.logsumexp."""
    return where(eq(max(x, axis), inf), inf, _shifted_lse(x, axis))


def log_softmax(x: Expr, axis) -> Expr:
    """x − log Σ exp(x); a row holding +inf is NaN throughout, like torch.log_softmax."""
    return x - _shifted_lse(x, axis)


def attention(q: Expr, k: Expr, v: Expr, *, key_axis, dim_axis, scale: float, mask: Expr | None = None,
              score_mod=None) -> Expr:
    """softmax_j(score_mod(Σ_d q·k · scale) masked) · v, normalised after the P·V sum.

    `mask` is a boolean expression (True = keep); `score_mod(s)` rewrites the scaled score.
    Fully masked query rows give 0.
    """
    s = sum(q * k, dim_axis) * scale
    if score_mod is not None:
        s = score_mod(s)
    if mask is not None:
        s = where(mask, s, -inf)
    p = exp(s - safe_max(s, key_axis))
    l = sum(p, key_axis)
    return where(eq(l, 0.0), 0.0, sum(p * v, key_axis) / l)


def rmsnorm(x: Expr, axis, eps: float = 1e-6) -> Expr:
    n = float(x.builder._axes[x.builder._axis_name(axis)])
    return x * rsqrt(sum(x * x, axis) / n + eps)


def layernorm(x: Expr, axis, eps: float = 1e-5) -> Expr:
    n = float(x.builder._axes[x.builder._axis_name(axis)])
    mu = sum(x, axis) / n
    d = x - mu
    return d * rsqrt(sum(d * d, axis) / n + eps)


def cross_entropy(logits: Expr, target_logit: Expr, axis) -> Expr:
    """-log softmax(logits)[target] per row: logsumexp - logits[target]."""
    return logsumexp(logits, axis) - target_logit
