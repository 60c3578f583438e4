"""What a forward saves for its backward: its outputs and its row statistics.

A backward derived from the inputs alone recomputes every reduction of the forward it reads (the max
and the sum of a softmax) and sums that cancel (Σ_j P·dP). Saving trades those passes for a few
vectors the forward computes anyway. Two steps, both exact and neither keyed on a program:

1. `hoist` pulls factors that do not vary over a sum's axis out of the sum before differentiating:

       Σ_j where(c, 0, x)·y = where(c, 0, Σ_j x·y)      c free of j
       Σ_j (x / l)·y        = (Σ_j x·y) / l              l free of j

   so an output O = Σ_j (p/l)·v becomes U/l with U = Σ_j p·v. Differentiating U/l gives the adjoint of
   l as −Σ_e dO·(U/l)/l: the U/l there is O itself, and Σ_e dO·O is FlashAttention-2's D = rowsum(dO∘O)
   — found by the chain rule on the hoisted form, not written.
2. `save` replaces, in the backward's expressions, each forward output by a load of the output and
   each statistic by a load of a saved vector. A statistic is a reduction of the forward whose axes are
   a proper subset of the axes of some tensor the program holds (a row max or sum of x[i, d], never
   the scores s[i, j] of a contraction): saving it never costs more memory than a tensor already held;
   or a fused value the size of an output that the output maps (a gated attention's Σ_j p·v); or a
   product over a long axis that is an operand of another product (an MLP's hidden pre-activations).

Then `grad_fold.fold` takes the row sum's divisor of a normalised exponential into its exponent
(e^{a − m}/l as e^{a − lse}): the backward reads the log-sum-exp lse = m + log l instead of m (and of l
where only the weight read it). The forward writes the statistics the backward reads as extra outputs
(`Saved.forward`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import ir
from .contraction import is_product
from .extract.exact_tests import extremes_tested
from .grad_fold import fold
from .index_shift import clamped_shift
from .ir import Call, Const, Load, Reduce
from .numeric import bounds


def hoist(node: ir.Node) -> ir.Node:
    """`node` with the factors free of a sum's axis pulled out of the sum (the rules above)."""
    return ir.rebuild(node, lambda old, new: _pull(new) if isinstance(new, Reduce) and new.op == "sum" else new)


def _pull(r: Reduce) -> ir.Node:
    body = r.body
    if isinstance(body, Call) and body.op == "mul":
        a, b = body.args
        for f, y in ((a, b), (b, a)):
            got = _factor(f, y, r.axis)
            if got is not None:
                return got
    return r


def _is_zero(n: ir.Node) -> bool:
    return isinstance(n, Const) and n.value == 0.0


def _factor(f: ir.Node, y: ir.Node, axis: str) -> ir.Node | None:
    """Σ_axis f·y with the axis-free part of f outside the sum, or None."""
    if not isinstance(f, Call):
        return None
    if f.op == "where" and axis not in f.args[0].axes:
        c, t, e = f.args
        if _is_zero(t):
            return Call("where", (c, t, _pull(Reduce("sum", axis, Call("mul", (e, y))))))
        if _is_zero(e):
            return Call("where", (c, _pull(Reduce("sum", axis, Call("mul", (t, y)))), e))
    if f.op == "div" and axis not in f.args[1].axes:
        return Call("div", (_pull(Reduce("sum", axis, Call("mul", (f.args[0], y)))), f.args[1]))
    return None


def statistics(program: ir.Program) -> list[Reduce]:
    """The reductions of the forward worth saving: axes a proper subset of those of a tensor held, or
    each axis the shifted index of one dimension of an input it reads, with a dimension left over (the
    row max of logits[k + 4, i, d] over d: a row of the batch's second half, k of extent 4). Not a max
    the program compares a computed value with (a top-1 gate): the backward recomputes it from the
    value it compares (extract/exact_tests.py)."""
    held = [set(s.axes) for s in program.inputs.values()] + [set(o.axes) for o in program.outputs]
    shaped = [set(o.axes) for o in program.outputs]
    outs = {o.expr for o in program.outputs}
    tested = extremes_tested(o.expr for o in program.outputs)  # (the backward recomputes them: exact_tests)
    operands = _product_operands(program)
    found: dict[Reduce, None] = {}
    for o in program.outputs:
        for n in ir.walk(o.expr):
            if isinstance(n, Reduce) and n not in outs and n not in tested and (
                    any(set(n.axes) < h for h in held) or _rows_of_a_load(n) or _fused_value(n, shaped)
                    or _long_operand(n, program, operands)):
                found[n] = None
    return list(found)


# the contraction length from which a product feeding another product is saved rather than recomputed:
# recomputing costs 2·K tensor-core operations an element, saving 8 bytes (written in float32 and read);
# at an H100's ~650 TF/s of bf16 products against ~3 TB/s of HBM the two meet near K = 870
SAVE_CONTRACTION = 1024


def _product_operands(program: ir.Program) -> dict[ir.Node, set[str]]:
    """Each node inside a factor of a product summed over some axes → those axes (one walk of the
    program: statistics asks it of every reduction)."""
    out: dict[ir.Node, set[str]] = {}
    for o in program.outputs:
        for n in ir.walk(o.expr):
            if isinstance(n, Reduce) and n.op == "sum" and isinstance(n.body, Call) and n.body.op == "mul":
                for side in n.body.args:
                    for m in ir.walk(side):
                        out.setdefault(m, set()).add(n.axis)
    return out


def _long_operand(r: Reduce, program: ir.Program, operands: dict[ir.Node, set[str]]) -> bool:
    """Is r a product summed over a long axis (≥ SAVE_CONTRACTION) whose value is an operand of another
    product summed over one of r's axes (`operands`: _product_operands; an MLP's x·W1 inside
    silu(x·W1)·(x·W3) before W2)? The forward writes that operand whole anyway (a GEMM operand is read
    by every output tile), so saving r costs a tensor of its size and spares the backward a GEMM; a
    product feeding a softmax (attention's scores, linear cross-entropy's logits) is never one."""
    return (r.op == "sum" and bool(r.axes) and program.axes[r.axis] >= SAVE_CONTRACTION and is_product(r.body)
            and bool(operands.get(r, set()) & r.axes))


def _fused_value(r: Reduce, shaped: list[set[str]]) -> bool:
    """Is r an output-sized value the output is a map of, computed by a fused chain (a reduction in its
    body): attention's U = Σ_j e^{s − m}·v before an output gate σ(g)·U/l. Saving it costs a tensor the
    size of an output (what eager PyTorch keeps for the gate's backward) and spares the backward a
    whole attention pass; a plain product's result (the scores of a softmax of a matmul) is not one."""
    return set(r.axes) in shaped and any(isinstance(n, Reduce) for n in ir.walk(r.body))


def _rows_of_a_load(r: Reduce) -> bool:
    """Does a load in r's body index every free axis of r by a clamped shift of it alone, each at a
    dimension of its own, with a dimension to spare? r then has at most as many values as that tensor
    has rows."""
    free = r.axes
    if not free:
        return False
    for n in ir.walk(r.body):
        if isinstance(n, Load) and len(n.index) > len(free):
            shifted = [sh.axis for e in n.index if (sh := clamped_shift(e)) is not None]
            if set(shifted) >= free and all(shifted.count(a) == 1 for a in free):
                return True
    return False


def _bound_axes(r: Reduce) -> set[str]:
    return {n.axis for n in ir.walk(r) if isinstance(n, Reduce)}


def _unify(pattern: ir.Node, node: ir.Node, free: frozenset[str], sub: dict[str, ir.Node],
           done: set | None = None) -> bool:
    """Is `node` `pattern` with each index of an axis in `free` replaced by one expression (recorded in
    `sub`, consistent across the term)? `done`: the pairs already unified (a shared subterm is walked
    once, not once per path to it)."""
    done = set() if done is None else done
    if (id(pattern), id(node)) in done:
        return True
    if isinstance(pattern, ir.Index) and pattern.axis in free:
        got = sub.setdefault(pattern.axis, node)
        return got == node
    if pattern.axes.isdisjoint(free):
        return pattern == node
    if type(pattern) is not type(node):
        return False
    if isinstance(pattern, Call):
        same = pattern.op == node.op and len(pattern.args) == len(node.args)
    elif isinstance(pattern, Reduce):
        same = pattern.op == node.op and pattern.axis == node.axis
    elif isinstance(pattern, Load):
        same = pattern.tensor == node.tensor and len(pattern.index) == len(node.index)
    else:
        same = False
    if not (same and all(_unify(p, n, free, sub, done) for p, n in zip(pattern.children(), node.children()))):
        return False
    done.add((id(pattern), id(node)))
    return True


def _shifted_read(node: ir.Node, stats: dict[Reduce, Load], axes: dict[str, int],
                  extents: dict[str, int]) -> ir.Node | None:
    """A reduction of the backward that is a saved statistic read at other indices (the row statistics of
    the batch's second half logits[k + 4] read as logits[max(b − 4, 0) + 4] by the gradient of that
    half, b over the whole batch): the statistic's load at those indices, or None — also where an index
    may leave the statistic's extent (`axes`: the forward's; `extents`: every axis of the backward)."""
    if not isinstance(node, Reduce):
        return None
    for r, load in stats.items():
        if r.op != node.op or r.axis != node.axis:
            continue
        sub: dict[str, ir.Node] = {}
        if not _unify(r, node, r.axes, sub):
            continue
        bound = _bound_axes(r)
        if any(not v.axes.isdisjoint(bound) for v in sub.values()):
            continue  # (an index of a summed axis: not a read of the statistic)
        if any(not ((b := bounds(v, extents))[0] >= 0 and b[1] <= axes[a] - 1) for a, v in sub.items()):
            continue  # (it would read the statistic out of its range: left to recompute)
        return Load(load.tensor, tuple(sub.get(i.axis, i) for i in load.index))
    return None


@dataclass(frozen=True)
class Saved:
    """The saving variant of a backward: `forward` computes the original outputs, then `stats` (name →
    the forward reduction it holds; extra outputs in float32, float64 in a float64 program); the
    backward reads the forward outputs named in `outputs` and the stats by name."""

    forward: ir.Program
    stats: dict[str, ir.Node]
    outputs: tuple[str, ...]


def save(program: ir.Program, exprs: list[ir.Node], taken: set[str],
         extents: dict[str, int] | None = None) -> tuple[list[ir.Node], dict, Saved]:
    """The backward expressions `exprs` reading saved values: returns them rewritten, the new backward
    inputs (name → TensorSpec) and the Saved record. `program` is the hoisted forward; `extents`: the
    axes of `exprs` (the forward's by default)."""
    order = list(program.axes)
    loads: dict[ir.Node, ir.Node] = {}
    guarded: dict[ir.Node, ir.Node] = {}
    # a max the backward compares with the value it is the max of, where that value holds a reduction (a
    # max over a matmul's or attention's result: its adjoint goes to the elements attaining it), is the
    # backward's own: computed from the value its plan writes once (extract/exact_tests.py), never read
    # from the forward, whose kernels summed it in another order (x @ xᵀ's diagonal: half its gradient)
    tested = extremes_tested(exprs)
    for o in program.outputs:
        if o.expr in tested:
            continue
        load = Load(o.name, tuple(ir.Index(a) for a in o.axes))
        loads[o.expr] = load
        inner = _guarded_value(o.expr)
        if inner is not None and inner not in tested and _only_parent(program, inner, o.expr):
            guarded[inner] = load
    wide = "float64" if any(s.dtype == "float64" for s in program.inputs.values()) else "float32"
    stats: dict[str, ir.Node] = {}
    for r in (r for r in statistics(program) if r not in tested):
        name = _fresh(f"saved_{len(stats)}", taken)
        taken.add(name)
        stats[name] = r
        loads[r] = Load(name, tuple(ir.Index(a) for a in sorted(r.axes, key=order.index)))
    shifted = {r: loads[r] for r in stats.values()}
    extents = dict(program.axes) if extents is None else extents
    rewritten = [_replace(e, loads, guarded, lambda n: _shifted_read(n, shifted, program.axes, extents))
                 for e in exprs]

    def fresh(stem: str) -> str:
        name = _fresh(stem, taken)
        taken.add(name)
        return name

    def spec(name: str, value: ir.Node) -> ir.TensorSpec:  # a statistic as the backward's input
        return ir.TensorSpec(name, tuple(sorted(value.axes, key=order.index)), wide, holds=value)

    # grad_fold: e^{t − m}/l read as e^{t − (m + log l)}, lse = m + log l a statistic of its own
    rewritten, lse = fold(rewritten, {k: spec(k, r) for k, r in stats.items()}, fresh)
    stats.update(lse)
    used = {n.tensor for e in rewritten for n in ir.walk(e) if isinstance(n, Load)}
    stats = {k: r for k, r in stats.items() if k in used}
    read = tuple(o.name for o in program.outputs if o.name in used)
    inputs = {o.name: ir.TensorSpec(o.name, o.axes, o.dtype or "float32") for o in program.outputs if o.name in read}
    for k, r in stats.items():
        inputs[k] = spec(k, r)
    outs = list(program.outputs) + [ir.Output(k, inputs[k].axes, r, wide) for k, r in stats.items()]
    forward = replace(program, axes=dict(program.axes), inputs=dict(program.inputs), outputs=outs).validate()
    return rewritten, inputs, Saved(forward, stats, read)


def _guarded_value(expr: ir.Node) -> ir.Node | None:
    """x of an output where(c, 0, x) / where(c, x, 0): the output equals x wherever x's adjoint is not 0."""
    if isinstance(expr, Call) and expr.op == "where":
        _, t, e = expr.args
        if _is_zero(t):
            return e
        if _is_zero(e):
            return t
    return None


def _only_parent(program: ir.Program, node: ir.Node, parent: ir.Node) -> bool:
    for o in program.outputs:
        for n in ir.walk(o.expr):
            if n != parent and node in n.children():
                return False
    return True


def _replace(expr: ir.Node, loads: dict, guarded: dict, shifted) -> ir.Node:
    """Saved values for forward subterms, and for the statistics read at shifted indices (`shifted`: a
    reduction of the backward → the statistic's load at those indices, or None). A guarded output's
    inner value x is replaced everywhere but as a divisor: it occurs in the backward only in its own
    local derivative, times its adjoint, which is 0 where the guard holds (and the saved output there
    is 0, not x)."""

    def step(old, new):
        got = loads.get(old)
        if got is None:
            got = shifted(old)
        if got is not None:
            return got
        if isinstance(new, Call) and any(o in guarded for o in old.args):
            args = tuple(guarded.get(o, a) if not (new.op == "div" and k == 1) else a
                         for k, (o, a) in enumerate(zip(old.args, new.args)))
            return Call(new.op, args)
        return new

    return ir.rebuild(expr, step)


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    return out


__all__ = ["Saved", "hoist", "save", "statistics"]
