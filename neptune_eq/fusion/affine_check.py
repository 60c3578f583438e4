"""Numeric checks of affine repairs (fusion/affine.py): does Σₖ hₖ·bₖ + h₀ give the body on sampled
values (check_affine), can any repair over these bodies exist (span_test), and the repair in words."""

from __future__ import annotations

import numpy as np

from neptune_eq import ir
from neptune_eq.masks import some_equal
from neptune_eq.rules.soundness import eval_ir_sampled

from .types import AffineResult


def check_affine(core: ir.Node, basis: dict[str, ir.Node], result: AffineResult, samples: int = 256,
                 seed: int = 0) -> str | None:
    """g(R′, c) == Σₖ hₖ·bₖ(R, c) + h₀ on random float64 values; a failure message or None."""
    rng = np.random.default_rng(seed)
    nodes = [core, *basis.values(), *result.terms.values(), *([result.constant] if result.constant else [])]
    env: dict[str, np.ndarray] = {}
    for n in nodes:
        for m in ir.walk(n):
            if isinstance(m, ir.StateRef | ir.Load | ir.Index):
                key = ir.show(m)
                if key not in env:  # running values (sums, counts) positive, like the real ones
                    ref = isinstance(m, ir.StateRef)
                    env[key] = rng.uniform(0.5, 3.0, samples) if ref else some_equal(rng, rng.normal(0, 2, samples))
    want = eval_ir_sampled(core, env)
    got = np.zeros(samples)
    for k, h in result.terms.items():
        got = got + eval_ir_sampled(h, env) * eval_ir_sampled(basis[k], env)
    if result.constant is not None:
        got = got + eval_ir_sampled(result.constant, env)
    ok = ~np.isfinite(want) | np.isclose(got, want, rtol=1e-8, atol=1e-10)
    if not ok.all():
        i = int(np.argmin(ok))
        return f"affine repair fails at sample {i}: g(R′, c) = {want[i]!r}, Σ hₖ·bₖ(R, c) + h₀ = {got[i]!r}"
    return None


def span_test(core: ir.Node, basis: dict[str, ir.Node], axis: str, draws: int = 4, points: int = 48,
              seed: int = 0) -> str | None:
    """A necessary condition for any affine repair, tested before the e-graph search: with the values
    free of `axis` (old, current and final states, per-row inputs) held fixed, g(R′, c) must lie in the
    span of the basis bodies bₖ(R, c) and the constant 1 over the elements c. Least squares on random
    float64 values; a message naming the misfit when it does not (then no search can find a repair),
    else None. It prunes groups that lack an accumulator the repair needs (Σ e^{a−m}·(…) with the
    running Σ e^{a−m} outside the group) without spending an e-graph budget on them."""
    rng = np.random.default_rng(seed)
    leaves = {ir.show(m): m for n in (core, *basis.values()) for m in ir.walk(n)
              if isinstance(m, ir.StateRef | ir.Load | ir.Index)}
    worst = 0.0
    for _ in range(draws):
        env = {}
        for key, m in leaves.items():
            if axis in m.axes:  # one value per element c
                env[key] = rng.normal(0, 2, points)
            else:  # one value for the draw, the same at every element
                v = rng.uniform(0.5, 3.0) if isinstance(m, ir.StateRef) else rng.normal(0, 2)
                env[key] = np.full(points, v)
        with np.errstate(all="ignore"):
            y = np.broadcast_to(eval_ir_sampled(core, env), (points,))
            cols = [np.broadcast_to(eval_ir_sampled(b, env), (points,)) for b in basis.values()]
        a = np.stack([*cols, np.ones(points)], axis=1)
        ok = np.isfinite(y) & np.isfinite(a).all(axis=1)
        if ok.sum() < a.shape[1] + 8:
            continue  # too few finite points to judge this draw
        y, a = y[ok], a[ok]
        # (one scale for both: finite values past 1e154 overflowed the norms' squares, and inf / inf
        # warned from inside a compile — fuzz seed 1607's; the relative misfit is the same)
        big = max(float(np.abs(y).max()), float(np.abs(a).max()), 1e-300)
        y, a = y / big, a / big
        scale = max(np.linalg.norm(y), np.linalg.norm(a, axis=0).max(), 1e-300)
        h, *_ = np.linalg.lstsq(a, y, rcond=None)
        worst = max(worst, float(np.linalg.norm(a @ h - y)) / scale)
    if worst > 1e-7:
        return (f"{ir.show(core)} is not a combination of {', '.join(basis) or 'no carried sum'} (and the count) "
                f"with coefficients free of {axis}: least-squares misfit {worst:.1e} on random values")
    return None


def describe_affine(name: str, result: AffineResult, count: str | None) -> str:
    """The repair as the derivation prints it: the accumulators it reads and their coefficients."""
    parts = [f"{ir.show(h)}·{k}" for k, h in result.terms.items()]
    if result.constant is not None:
        parts.append(f"({ir.show(result.constant)})·{count or 'n'}")
    borrowed = [k for k in result.terms if k != name]
    means = (f", around the running mean{'s' if len(result.means) > 1 else ''} "
             f"{', '.join(f'{s}/{count}' for s in result.means)} (the final {', '.join(result.means)} read as "
             f"mean·N: equal at the end of the pass)" if result.means else "")
    return (f"{name} carried with an affine repair {name} ← {' + '.join(parts) or '0'}{means}"
            + (f", reading the running {', '.join(borrowed)}" if borrowed else "")
            + (f" and the element count {count}" if count else "")
            + f" (found in {result.iterations} iterations, {result.nodes} e-nodes)")
