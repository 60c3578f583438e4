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

A tensor read at both reads them as neighbouring dimensions: a then b, or a + c then b with c an index
expression of other axes (group norm's channel h·8 + j beside the pixel f: x[c, h·8 + j, f] is read at
x[c, h·8·n_f + jf], the two dimensions merged, whatever the first one's extent). A tensor read along
one of them alone reads it as jf // n_f or jf % n_f (the per-channel weights, w[h·8 + jf // n_f]).
Axes that appear anywhere else — a mask or other arithmetic on them (j ≤ i), a gather, a constant
offset (a slice reads part of a dimension) — are never merged, so the rewrite changes no value: every
load reads the element it read, at the position a·n_b + b of the merged axis.
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
    nodes = _value_nodes(program)
    loads = [n for o in program.outputs for n in ir.walk(o.expr) if isinstance(n, ir.Load)]
    reduced = {(n.axis, n.body.axis) for n in nodes if isinstance(n, ir.Reduce) and isinstance(n.body, ir.Reduce)
               and n.op == n.body.op}
    for outer, inner in sorted(reduced, key=str):
        for a, b in ((outer, inner), (inner, outer)):
            if _mergeable(program, nodes, loads, a, b):
                return a, b
    return None


def _value_nodes(program: ir.Program) -> set[ir.Node]:
    """The nodes computing values: every node of the outputs but those inside a load's index."""
    seen: set[ir.Node] = set()
    stack = [o.expr for o in program.outputs]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(() if isinstance(n, ir.Load) else n.children())
    return seen


def _offset(e: ir.Node, a: str, b: str) -> ir.Node | None:
    """c where the index entry e is a + c, c an index expression of other axes (no gather; Const(0) for
    e = a), else None. (A constant offset, a slice x[:, 2:5], is left alone: its axis reads part of a
    dimension.)"""
    if e == ir.Index(a):
        return ir.Const(0)
    if isinstance(e, ir.Call) and e.op == "add":
        for x, c in (e.args, e.args[::-1]):
            if x == ir.Index(a) and c.axes and not ({a, b} & c.axes) and not _gathers(c):
                return c
    return None


def _gathers(e: ir.Node) -> bool:
    return any(isinstance(n, ir.Load) for n in ir.walk(e))


def _position(index: tuple[ir.Node, ...], a: str, b: str) -> int | None:
    """p where index[p] is a (or a + c) and index[p + 1] is b, and no other entry mentions a or b."""
    for p in range(len(index) - 1):
        if _offset(index[p], a, b) is not None and index[p + 1] == ir.Index(b):
            rest = index[:p] + index[p + 2:]
            return None if any({a, b} & e.axes for e in rest) else p
    return None


def _mergeable(program: ir.Program, nodes: set[ir.Node], loads: list[ir.Load], a: str, b: str) -> bool:
    # a and b are read by loads alone: no mask or arithmetic on them computes a value
    if ir.Index(a) in nodes or ir.Index(b) in nodes or any(o.expr in (ir.Index(a), ir.Index(b))
                                                          for o in program.outputs):
        return False
    # a tensor read at both reads them as neighbouring dimensions, a (or a + c) then b, at every
    # load and at one position; b spans its dimension
    both = {ld.tensor for ld in loads if {a, b} <= ld.axes}
    if not both:
        return False
    for t in both:
        at = {_position(ld.index, a, b) for ld in loads if ld.tensor == t}
        if None in at or len(at) != 1:
            return False
        p = at.pop()
        dims = [program.axes[x] for x in program.inputs[t].axes[p:p + 2]]
        plain = all(ld.index[p] == ir.Index(a) for ld in loads if ld.tensor == t)
        if dims[1] != program.axes[b] or (plain and dims[0] != program.axes[a]):
            return False
    # a load reading one of them reads it in index arithmetic without a gather (it becomes ab // n_b
    # or ab % n_b there)
    if any(_gathers(e) for ld in loads if ld.tensor not in both for e in ld.index if {a, b} & e.axes):
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
        axes = o.axes
        if {a, b} & set(axes) and not any(axes[p:p + 2] == (a, b) for p in range(len(axes) - 1)):
            return False
    return True


def _merge(program: ir.Program, a: str, b: str) -> ir.Program:
    name = _fresh(a + b, program.axes)
    merged, n_b = ir.Index(name), ir.Const(program.axes[b])
    split = {ir.Index(a): ir.Call("floordiv", (merged, n_b)), ir.Index(b): ir.Call("mod", (merged, n_b))}
    where: dict[str, int] = {}  # tensor → the first of its two merged dimensions

    def fn(old: ir.Node, new: ir.Node) -> ir.Node:
        if isinstance(new, ir.Load):
            p = _position(old.index, a, b)
            if p is not None:  # (a + c, b) → c·n_b + ab
                where[old.tensor] = p
                c = _offset(old.index[p], a, b)
                at = merged if c == ir.Const(0) else ir.Call("add", (ir.Call("mul", (c, n_b)), merged))
                return ir.Load(new.tensor, (*new.index[:p], at, *new.index[p + 2:]))
            if {a, b} & old.axes:  # one of them, in index arithmetic: a = ab // n_b, b = ab % n_b
                return ir.Load(new.tensor, tuple(ir.substitute(e, split) for e in old.index))
        if isinstance(new, ir.Reduce) and new.axis in (a, b) and isinstance(new.body, ir.Reduce) \
                and new.body.axis in (a, b):  # (the inner one is left for the outer to take)
            return ir.Reduce(new.op, name, new.body.body)
        return new

    memo: dict = {}
    wider: dict[int, str] = {}  # the extent of a dimension read at a + c (wider than a) → its merged axis
    outputs = []
    for o in program.outputs:
        axes = o.axes
        if a in axes:
            p = axes.index(a)
            axes = (*axes[:p], name, *axes[p + 2:])
        outputs.append(replace(o, axes=axes, expr=ir.rebuild(o.expr, fn, memo)))
    inputs = {}
    for t, spec in program.inputs.items():
        if t not in where:
            inputs[t] = spec
            continue
        p = where[t]
        extent = program.axes[spec.axes[p]]
        if extent != program.axes[a] and extent not in wider:
            wider[extent] = _fresh(f"{name}_{len(wider)}", program.axes)
        dim = name if extent == program.axes[a] else wider[extent]
        inputs[t] = replace(spec, axes=(*spec.axes[:p], dim, *spec.axes[p + 2:]))
    axes = {}
    for x, n in program.axes.items():
        if x == a:
            axes[name] = n * program.axes[b]
        axes[x] = n
    for extent, dim in wider.items():  # a dimension read at a + c: its own extent times n_b
        axes[dim] = extent * program.axes[b]
    used = {x for s in inputs.values() for x in s.axes} | {x for o in outputs for x in o.axes}
    used |= {n.axis for o in outputs for n in ir.walk(o.expr) if isinstance(n, ir.Index | ir.Reduce)}
    axes = {x: n for x, n in axes.items() if x in used}
    return ir.Program(program.name, axes, inputs, outputs, program.dynamic,
                      program.copies_within(axes)).validate()


def _fresh(name: str, taken) -> str:
    while name in taken:
        name += "_"
    return name
