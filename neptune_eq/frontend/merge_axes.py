"""Adjacent axes reduced together become one axis: x.mean((-2, -1)), F.layer_norm over the last two
dimensions, group norm's statistics over a group's pixels.

PyTorch writes a reduction over several dimensions; the capture translates it into nested reductions,
sum_i(sum_d(x[b, i, d])), and the planner gives each its own pass: a kernel that sums over d per
(b, i) and writes the partial sums, a second that sums those over i. When the two axes are only ever
read as neighbouring dimensions of the same tensors, a then b, and every reduction over one is
directly around a reduction over the other of the same operation, the value of the program is the
same over one axis ab of n_a·n_b elements: sum_ab(x[b, ab]). The tensors are viewed with the two
dimensions merged (a reshape, the binding of the captured call: no copy for a contiguous tensor);
outputs are reshaped back.

Axes that appear anywhere else — an index expression (h·8 + j), a mask (j ≤ i), a gather — are
never merged, so the rewrite changes no value: every load reads the element it read, at the
position a·n_b + b of the merged dimension.
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir


def merge_reduced_axes(program: ir.Program) -> ir.Program:
    """`program` with every mergeable pair of reduced axes merged (repeatedly: three axes reduced
    together become one)."""
    if program.dynamic:
        return program
    while True:
        pair = _mergeable_pair(program)
        if pair is None:
            return program
        program = _merge(program, *pair)


def _mergeable_pair(program: ir.Program) -> tuple[str, str] | None:
    nodes = {n for o in program.outputs for n in ir.walk(o.expr)}
    loads = [n for n in nodes if isinstance(n, ir.Load)]
    reduced = {(n.axis, n.body.axis) for n in nodes if isinstance(n, ir.Reduce) and isinstance(n.body, ir.Reduce)
               and n.op == n.body.op}
    for outer, inner in sorted(reduced, key=str):
        for a, b in ((outer, inner), (inner, outer)):
            if _mergeable(program, nodes, loads, a, b):
                return a, b
    return None


def _position(index: tuple[ir.Node, ...], a: str, b: str) -> int | None:
    """p where index[p], index[p + 1] are Index(a), Index(b) and no other entry mentions a or b."""
    for p in range(len(index) - 1):
        if index[p] == ir.Index(a) and index[p + 1] == ir.Index(b):
            rest = index[:p] + index[p + 2:]
            return None if any({a, b} & e.axes for e in rest) else p
    return None


def _mergeable(program: ir.Program, nodes: set[ir.Node], loads: list[ir.Load], a: str, b: str) -> bool:
    ia, ib = ir.Index(a), ir.Index(b)
    # every load that reads a or b reads both, as neighbouring plain indices, a first (no gather)
    touched = {ld.tensor for ld in loads if {a, b} & ld.axes}
    if not touched or any(_position(ld.index, a, b) is None for ld in loads if ld.tensor in touched):
        return False
    # ... and a and b appear nowhere else (no mask, no arithmetic on them)
    if any(o.expr in (ia, ib) for o in program.outputs) or any(
            c in (ia, ib) for n in nodes if not isinstance(n, ir.Load) for c in n.children()):
        return False
    # every reduction over one is directly around (or inside) a reduction over the other, same op
    around = {n.body for n in nodes if isinstance(n, ir.Reduce) and n.axis in (a, b)}
    for n in nodes:
        if isinstance(n, ir.Reduce) and n.axis in (a, b):
            other = b if n.axis == a else a
            outer = isinstance(n.body, ir.Reduce) and n.body.axis == other and n.body.op == n.op
            if not outer and n not in around:
                return False
    # an output over a or b has both, neighbours, a first
    for o in program.outputs:
        if {a, b} & set(o.axes) and _position(tuple(ir.Index(x) for x in o.axes), a, b) is None:
            return False
    # the dimensions read so have the two extents (the merged dimension is their product)
    for t in touched:
        spec = program.inputs[t]
        p = next(_position(ld.index, a, b) for ld in loads if ld.tensor == t)
        if program.axes[spec.axes[p]] != program.axes[a] or program.axes[spec.axes[p + 1]] != program.axes[b]:
            return False
    return True


def _merge(program: ir.Program, a: str, b: str) -> ir.Program:
    name = a + b
    while name in program.axes:
        name += "_"
    merged = ir.Index(name)

    def fn(old: ir.Node, new: ir.Node) -> ir.Node:
        if isinstance(new, ir.Load):
            p = _position(new.index, a, b)
            if p is not None:
                return ir.Load(new.tensor, (*new.index[:p], merged, *new.index[p + 2:]))
        if isinstance(new, ir.Reduce) and new.axis in (a, b) and isinstance(new.body, ir.Reduce) \
                and new.body.axis in (a, b):  # (the inner one is left for the outer to take)
            return ir.Reduce(new.op, name, new.body.body)
        return new

    memo: dict = {}
    outputs = []
    for o in program.outputs:
        axes = o.axes
        if a in axes:
            p = axes.index(a)
            axes = (*axes[:p], name, *axes[p + 2:])
        outputs.append(replace(o, axes=axes, expr=ir.rebuild(o.expr, fn, memo)))
    loads = [n for o in outputs for n in ir.walk(o.expr) if isinstance(n, ir.Load)]
    inputs = {}
    for t, spec in program.inputs.items():
        ld = next((x for x in loads if x.tensor == t and merged in x.index), None)
        if ld is None:
            inputs[t] = spec
            continue
        p = ld.index.index(merged)
        inputs[t] = replace(spec, axes=(*spec.axes[:p], name, *spec.axes[p + 2:]))
    axes = {}
    for x, n in program.axes.items():
        if x == a:
            axes[name] = program.axes[a] * program.axes[b]
        axes[x] = n
    used = {x for s in inputs.values() for x in s.axes} | {x for o in outputs for x in o.axes}
    used |= {n.axis for o in outputs for n in ir.walk(o.expr) if isinstance(n, ir.Index | ir.Reduce)}
    axes = {x: n for x, n in axes.items() if x in used}
    return ir.Program(program.name, axes, inputs, outputs, program.dynamic).validate()
