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

A value free of reductions meets the same trap by another road: the e-graph holds many spellings of it,
and a plan's terms are extracted per pass, so the max's pass may reduce rsqrt(v)·(s − m/4)·0.1 while a
later map compares (s·0.1 − m·0.025)·rsqrt(v) with it — equal on the reals, apart by an ulp in float32
(fuzz seed 1552: a layer norm's amax lost its gradient on some rows). `spell_tests_alike` makes every
comparison with such a max spell the value as the max's own pass does.
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


def self_tested(outputs, bindings) -> set[str]:
    """The names of the max and min bindings that `outputs` compare with nothing but the value they are
    the extreme of (`v == v.amax(-1)`, the gradient of a max)."""
    alike, other = set(), set()
    for e in outputs:
        for n in ir.walk(e):
            if isinstance(n, ir.Call) and n.op in COMPARISONS:
                for a, b in (n.args, n.args[::-1]):
                    if isinstance(b, ir.Reduce) and b.op in ("max", "min"):
                        (alike if b.body == a else other).add(b)
    return {b.name for b in bindings if b.node in alike - other}


def spell_tests_alike(kernels, names: set[str]) -> list[str] | None:
    """Make, in place, each comparison of a computed value with the final value of a max or min `names`
    holds spell that value as the max's own pass reduces it (the e-graph proved the two equal; their
    spellings may round apart). Run before states become buffer loads (every reference is fin:x then).
    The derivation lines; None where such a max rolls with other states (its core reads their running
    values, its final value is repaired: no spelling of the value meets it exactly) — no such plan."""
    spelled = {}
    for k in kernels:
        for ps in k.passes():
            for c in ps.comps:
                if c.name not in names or c.integer:
                    continue
                value = c.core if c.mask is None else ir.Call("where", (c.mask, c.core, ir.Const(c.identity)))
                if c.producers or c.affine or any(isinstance(n, ir.StateRef) and n.kind in ir.RUNNING
                                                  for n in ir.walk(value)):
                    return None
                spelled[c.name] = value
    if not spelled:
        return []
    mapping, out = {}, []
    for k in kernels:
        found = False
        for e in k.exprs():
            for n in ir.walk(e):
                if not (isinstance(n, ir.Call) and n.op in COMPARISONS):
                    continue
                if n in mapping:
                    found = True
                    continue
                args = list(n.args)
                for i, ref in ((0, args[1]), (1, args[0])):
                    if isinstance(ref, ir.StateRef) and ref.kind is ir.RefKind.FINAL and ref.name in spelled \
                            and computed(args[i]) and args[i] != spelled[ref.name]:
                        out.append(f"exact_test: {ir.show(args[i])} is compared with {ref.name} as its pass "
                                   f"reduces it, {ir.show(spelled[ref.name])}")
                        args[i] = spelled[ref.name]
                if tuple(args) != n.args:
                    mapping[n] = ir.Call(n.op, tuple(args))
                    found = True
        if found:  # (a rebuild of every expression of every plan's kernels cost 5 s of a 70 s test)
            k.substitute(mapping)
    return out


def computed(n: ir.Node) -> bool:
    """Is `n` the result of arithmetic (not a load, an index or a constant)?"""
    return any(isinstance(m, ir.Call | ir.Reduce) for m in ir.walk(n))


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
