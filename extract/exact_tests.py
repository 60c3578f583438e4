"""Values a plan must compute once: a reduction inside a value the program compares with its own max
or min (`logits == logits.amax(-1)`, argmax of a matmul's logits, a top-1 gate).

The elements attaining a max are found by comparing each one with it, which is exact only where both
come from one computation. A plan computing the compared value per element (inline) computes it once
for the max's pass and again for the comparison's; in other kernels, with other tiles and K-loop steps,
the sums round otherwise, and no element equals the max: on the CPU interpreter a top-1 count of
`(x @ W == (x @ W).amax(-1)).sum(-1)` came out 0 on most rows for the plan taking the max split-K in a
kernel of its own (the 71st alternative; the first 60 wrote the logits once). Such reductions must be
written once, where every reader sees the same value.
"""

from __future__ import annotations

from neptune_eq import ir
from neptune_eq.ops import COMPARISONS


def compared_with_extreme(outputs: dict[str, ir.Node]) -> set[ir.Reduce]:
    """The reductions inside a value that the outputs (name → expression) compare with a max or min of
    that value."""
    return {m for _, value in _tests(outputs.values()) for m in ir.walk(value) if isinstance(m, ir.Reduce)}


def extremes_tested(exprs) -> set[ir.Reduce]:
    """The maxes and mins that `exprs` compare with a value holding a reduction that they are the
    extreme of: a training's forward must not save them (grad_saved.statistics), for the backward's
    comparison to meet the max its own plan computes from the same, once-written values."""
    return {r for r, value in _tests(exprs) if any(isinstance(m, ir.Reduce) for m in ir.walk(value))}


def _tests(exprs) -> list[tuple[ir.Reduce, ir.Node]]:
    """(extreme, value) of each comparison of a value with a max or min of it in `exprs`."""
    out = []
    for e in exprs:
        for n in ir.walk(e):
            if isinstance(n, ir.Call) and n.op in COMPARISONS:
                for a, b in (n.args, n.args[::-1]):
                    if isinstance(b, ir.Reduce) and b.op in ("max", "min") and _body(b) == a:
                        out.append((b, a))
    return out


def _body(r: ir.Reduce) -> ir.Node:
    """The value a chain of one op's reductions (amax over several dimensions) takes the extreme of."""
    body = r.body
    while isinstance(body, ir.Reduce) and body.op == r.op:
        body = body.body
    return body


def materialising(plans: list, names: set[str]) -> list:
    """The plans that compute none of the reductions `names` inline (per element where used)."""
    return [p for p in plans if not names & set(p.inline)]
