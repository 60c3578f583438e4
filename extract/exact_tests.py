"""Values a plan must compute once: a reduction inside a value the program compares with its own max
or min (`logits == logits.amax(-1)`, argmax of a matmul's logits, a top-1 gate).

The elements attaining a max are found by comparing each one with it, which is exact only where both
come from one computation. A plan computing the compared value per element (inline) computes it once
for the max's pass and again for the comparison's; in other kernels, with other tiles and K-loop steps,
the sums round otherwise, and no element equals the max: on the CPU interpreter a top-1 count of
`(x @ W == (x @ W).amax(-1)).sum(-1)` came out 0 on most rows for the plan taking the max split-K in a
kernel of its own (the 71st alternative; the first 60 wrote the logits once). Such reductions must be
written once, where every reader sees the same value — except a short reduction written out in index
order by kernels without FMA contraction (numeric.written_out), which has the same bits everywhere.
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
    return [(r, v) for _, r, v in _test_nodes(exprs)]


def _body(r: ir.Reduce) -> ir.Node:
    """The value a chain of one op's reductions (amax over several dimensions) takes the extreme of."""
    body = r.body
    while isinstance(body, ir.Reduce) and body.op == r.op:
        body = body.body
    return body


def tested_in_reductions(outputs: dict[str, ir.Node], bindings) -> dict[str, set[str]] | None:
    """For each max or min the outputs compare a value holding a reduction with: its binding's name →
    the names of the reductions (bindings) whose bodies hold those comparisons (argmax's min over the
    elements attaining the max). None where a comparison lies outside every reduction (an output
    `logits == logits.amax(-1)`): it is computed apart from the max's pass, which needs the value
    written once."""
    by_node = {b.node: b.name for b in bindings}
    tests = {t: r for t, r, v in _test_nodes(outputs.values()) if any(isinstance(m, ir.Reduce) for m in ir.walk(v))}
    if not tests:
        return {}
    out: dict[str, set[str]] = {}
    inside: set[ir.Node] = set()
    for b in bindings:
        for n in _outside_other_bindings(b.node.body, by_node):
            extreme = tests.get(n)
            if extreme is not None and extreme in by_node:
                out.setdefault(by_node[extreme], set()).add(b.name)
                inside.add(n)
    return out if inside == set(tests) else None


def fused_exactly(plan, tested: dict[str, set[str]]) -> bool:
    """Does each tested max share one pass of `plan` with every reduction comparing with it? Each tile's
    value is then computed once and read by both: the running max and the comparison meet exactly
    (fusion/reset.py), and the value need not be written."""
    return all(any(m in comps and readers <= set(comps) for _, comps, _ in plan.groups)
               for m, readers in tested.items())


def materialising(plans: list, names: set[str], tested: dict[str, set[str]] | None = None) -> list:
    """The plans that compute none of the reductions `names` inline (per element where used), or that
    compare each max with its value in the max's own pass (`tested`: tested_in_reductions)."""
    return [p for p in plans if not names & set(p.inline) or (tested is not None and fused_exactly(p, tested))]


def _test_nodes(exprs) -> list[tuple[ir.Node, ir.Reduce, ir.Node]]:
    """(comparison, extreme, value) of each comparison of a value with a max or min of it in `exprs`."""
    out = []
    for e in exprs:
        for n in ir.walk(e):
            if isinstance(n, ir.Call) and n.op in COMPARISONS:
                for a, b in (n.args, n.args[::-1]):
                    if isinstance(b, ir.Reduce) and b.op in ("max", "min") and _body(b) == a:
                        out.append((n, b, a))
    return out


def _outside_other_bindings(body: ir.Node, by_node: dict[ir.Node, str]):
    """The nodes of `body` not inside another binding's reduction."""
    stack, seen = [body], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        stack.extend(c for c in n.children() if c not in by_node)
