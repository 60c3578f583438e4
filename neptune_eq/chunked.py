"""Running a plan in chunks of one axis, so its scratch buffers hold a chunk, not the whole axis.

A plan may write an intermediate far larger than anything the user holds: linear cross-entropy's
backward writes the logits (or their gradient), tokens × vocabulary in fp32, before the two products
that read them. Where an axis `a` of such a buffer is one the program can be cut along, the program
runs once per chunk of `a` (Liger's fused linear cross-entropy cuts the tokens so):

    out[.., a, ..] = e             every chunk writes its slice (e holds no reduction over a)
    out[..]        = Σₐ b + Σₐ c   a sum over a: each chunk adds its part to an fp32 accumulator,
                                   acc ← acc + Σ_{a ∈ chunk} b + ...  (an input of the chunk program)

Two things need the chunk's place in the axis, an input `off` of the chunk program (its first index):
an index of `a` compared for equality (a one-hot j = t[i]) becomes a + off, and a term
of a summed output that reads an input cut along `a` at a computed index g (a gather, W[t[i], d]) and
otherwise does not vary over `a` becomes a one-hot sum over it, exact since one element is selected
and the others add zeros:

    W[g, d]·c  =  Σₐ where(g = a + off, W[a, d]·c, 0)      (each chunk adds it where g falls in it)

Nothing else may mix the chunks: a reduction over `a` anywhere else, the index of `a` used as a number
otherwise (a causal mask j ≤ i, a grouped head h // G: the chunk would compute its masked tiles and the
other axis whole), a load of a cut input at an index built from `a`, a gather along `a` in an output
cut along it, or a term of a summed output that does not vary over `a` and gathers nothing (it would
be added once per chunk). The chunk program is the same program at the chunk's extent, with `a`
dynamic so the last, shorter chunk runs the same kernels; compiled by the same pipeline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import ir

_LINEAR = {"add", "sub", "neg"}  # a summed output is built from its sums by these, and by · or / with
# a factor that does not vary over the axis


@dataclass(frozen=True)
class Chunking:
    """How a program runs in chunks: `count` chunks of at most `size` along `axis`."""

    axis: str
    size: int
    count: int
    program: ir.Program  # the chunk program (axis dynamic up to `size`, accumulators as inputs)
    accumulators: dict[str, str]  # summed output → the input its running sum enters as
    why: str  # the scratch it saves, for explain()
    offset: str | None = None  # the input that takes the chunk's first index, where the program reads it
    end: str | None = None  # the input that takes the index past its last (a gather of its slice reads it)

    def describe(self) -> str:
        return f"runs in {self.count} chunks of ≤ {self.size} along '{self.axis}': {self.why}"


def why_not(program: ir.Program, axis: str) -> str | None:
    """None if `program` can run in chunks of `axis`, else the reason it cannot (naming the output)."""
    if axis in program.dynamic:
        return f"'{axis}' is dynamic"
    index = ir.Index(axis)
    for out in program.outputs:  # the chunk's offset serves a one-hot (a = t[i]); a mask a ≤ i or a // G
        for n in ir.walk(out.expr):  # would also need the loop bounds and grouped axes it narrows
            if (isinstance(n, ir.Call) and n.op not in ("eq", "ne") and index in n.args) or (
                    isinstance(n, ir.Reduce) and n.body == index):
                return (f"output '{out.name}' uses the index of '{axis}' as a number ({ir.show(n)[:80]}), not "
                        "in an equality: a chunk would compute the tiles it masks")
    sliced = _sliced(program, axis)
    outputs, _ = _in_chunks(program, axis, _fresh(f"off_{axis}", program.inputs, program))
    for out in outputs:
        for n in ir.walk(out.expr):
            if isinstance(n, ir.Load):
                at = tuple(k for k, e in enumerate(n.index) if isinstance(e, ir.Index) and e.axis == axis)
                if at != sliced.get(n.tensor, ()):
                    return (f"output '{out.name}' reads '{n.tensor}' along '{axis}' at other dimensions than "
                            f"it is declared over ({ir.show(n)}), and not as a term of a sum over the chunks")
        if axis in out.axes:
            if not _no_reduce_over(out.expr, axis):
                return f"output '{out.name}' reduces over '{axis}' and varies over it"
            continue
        bad = _why_not_additive(out.expr, axis)
        if bad:
            return f"output '{out.name}' is not a sum of sums over '{axis}': {bad}"
    return None


def _sliced(program: ir.Program, axis: str) -> dict[str, tuple[int, ...]]:
    """Input → the dimensions a chunk of `axis` cuts it along."""
    return {n: tuple(k for k, a in enumerate(s.axes) if a == axis) for n, s in program.inputs.items()}


def _in_chunks(program: ir.Program, axis: str, off: str, end: str | None = None) -> tuple[list[ir.Output], bool]:
    """The outputs as a chunk computes them, given its first index as input `off`: the index of `axis`
    used as a number shifted by it, and a gather along `axis` that is a term of a summed output made the
    one-hot sum it stands for (end None: what the checks read), or, given the chunk's end as input `end`,
    the gather of the chunk's own slice it runs as (where(off ≤ g < end, term[X[g − off]], 0), the index
    clamped into the slice). Also whether `off` is read."""
    index = ir.Index(axis)
    shift = ir.Call("add", (index, ir.Load(off, ())))

    def shifted(old, new):
        if isinstance(new, ir.Call) and index in new.args:
            return ir.Call(new.op, tuple(shift if a == index else a for a in new.args))
        if isinstance(new, ir.Reduce) and new.body == index:
            return ir.Reduce(new.op, new.axis, shift)
        return new

    def gathered(term: ir.Node, g: ir.Node) -> ir.Node:
        if end is None:  # Σₐ where(g = a + off, term[X[a]], 0)
            return ir.Reduce("sum", axis, ir.Call("where", (ir.Call("eq", (g, shift)), _read_at(term, sliced, index),
                                                            ir.Const(0.0))))
        lo, hi = ir.Load(off, ()), ir.Load(end, ())
        last = ir.Call("sub", (ir.Call("sub", (hi, lo)), ir.Const(1.0)))
        k = ir.Call("min2", (ir.Call("max2", (ir.Call("sub", (g, lo)), ir.Const(0.0))), last))
        inside = ir.Call("and", (ir.Call("ge", (g, lo)), ir.Call("lt", (g, hi))))
        # an index outside the whole axis reads nothing (NaN), as the unchunked gather does: in the first
        # chunk alone, so it is added once
        n = ir.Const(float(program.axes[axis]))
        outside = ir.Call("and", (ir.Call("eq", (lo, ir.Const(0.0))),
                                  ir.Call("or", (ir.Call("lt", (g, ir.Const(0.0))), ir.Call("ge", (g, n))))))
        nothing = ir.Call("where", (outside, _read_at(term, sliced, None), ir.Const(0.0)))
        return ir.Call("where", (inside, _read_at(term, sliced, k), nothing))

    sliced = _sliced(program, axis)
    outputs = []
    for out in program.outputs:
        expr = ir.rebuild(out.expr, shifted)
        if axis not in out.axes:
            expr = _gather_terms(expr, axis, sliced, gathered)
        outputs.append(replace(out, expr=expr))
    used = any(isinstance(n, ir.Load) and n.tensor == off for o in outputs for n in ir.walk(o.expr))
    return outputs, used


def _read_at(term: ir.Node, sliced: dict, k: ir.Node | None) -> ir.Node:
    """`term` reading every input cut along the axis at index `k` of its cut dimensions (k None: reading
    nothing, NaN, as a gather outside its tensor does)."""
    def at(old, new):
        if isinstance(new, ir.Load) and sliced.get(new.tensor):
            if k is None:
                return ir.Const(math.nan)
            return ir.Load(new.tensor, tuple(k if d in sliced[new.tensor] else e for d, e in enumerate(new.index)))
        return new
    return ir.rebuild(term, at)


def _gather_terms(expr: ir.Node, axis: str, sliced: dict, gathered) -> ir.Node:
    """`expr` (a linear combination of terms, as _why_not_additive reads it) with each term that does not
    vary over `axis` but gathers inputs cut along it at one index g replaced by gathered(term, g)."""
    if isinstance(expr, ir.Reduce) and expr.axis == axis:
        return expr
    if _constant_over(expr, axis):
        g = _gather_index(expr, sliced)
        return expr if g is None else gathered(expr, g)
    if isinstance(expr, ir.Call) and expr.op in _LINEAR:
        return ir.Call(expr.op, tuple(_gather_terms(a, axis, sliced, gathered) for a in expr.args))
    if isinstance(expr, ir.Call) and expr.op in ("mul", "div"):  # the factor that varies (the other does not)
        x, f = expr.args
        if expr.op == "mul" and _constant_over(x, axis):
            return ir.Call("mul", (x, _gather_terms(f, axis, sliced, gathered)))
        return ir.Call(expr.op, (_gather_terms(x, axis, sliced, gathered), f))
    return expr


def _gather_index(expr: ir.Node, sliced: dict) -> ir.Node | None:
    """The one index g at which `expr` reads every input cut along the axis (at every cut dimension),
    where g itself reads none of them; None if there is no such load or more than one index."""
    found = {e for n in ir.walk(expr) if isinstance(n, ir.Load) and sliced.get(n.tensor)
             for k, e in enumerate(n.index) if k in sliced[n.tensor]}
    if len(found) != 1:
        return None
    g = next(iter(found))
    return None if any(isinstance(n, ir.Load) and sliced.get(n.tensor) for n in ir.walk(g)) else g


def _why_not_additive(expr: ir.Node, axis: str) -> str | None:
    """None if `expr` is a linear combination of sums over `axis` (with factors that do not vary over it,
    and no other reduction over it inside), else why not."""
    if isinstance(expr, ir.Reduce) and expr.axis == axis:
        if expr.op != "sum":
            return f"a {expr.op} over '{axis}' ({ir.show(expr)[:80]})"
        if not _no_reduce_over(expr.body, axis):
            return f"a reduction over '{axis}' inside a sum over it ({ir.show(expr)[:80]})"
        return None
    if isinstance(expr, ir.Call) and expr.op in _LINEAR:
        return next((w for a in expr.args if (w := _why_not_additive(a, axis))), None)
    if isinstance(expr, ir.Call) and expr.op in ("mul", "div"):
        x, f = expr.args
        if expr.op == "mul" and _constant_over(x, axis):
            x, f = f, x
        if _constant_over(f, axis):
            return _why_not_additive(x, axis)
        return f"a product of two values that vary over '{axis}' ({ir.show(expr)[:80]})"
    if _constant_over(expr, axis):
        return f"the term {ir.show(expr)[:80]} does not vary over '{axis}' (each chunk would add it)"
    return f"{ir.show(expr)[:80]} is not linear in its sums over '{axis}'"


def _elementwise_in(expr: ir.Node, axis: str) -> bool:
    """Whether `expr` is the same function of each element along `axis` in a chunk as in the whole: no
    reduction over it, and its index used only to address loads."""
    return _no_reduce_over(expr, axis) and not any(
        not isinstance(n, ir.Load) and any(isinstance(c, ir.Index) and c.axis == axis for c in n.children())
        for n in ir.walk(expr))


def _no_reduce_over(expr: ir.Node, axis: str) -> bool:
    return not any(isinstance(n, ir.Reduce) and n.axis == axis for n in ir.walk(expr))


def _constant_over(expr: ir.Node, axis: str) -> bool:
    """Whether `expr` is the same for every chunk: no reduction over `axis` and no index of it."""
    return not any(isinstance(n, ir.Reduce | ir.Index) and n.axis == axis for n in ir.walk(expr))


def chunk_program(program: ir.Program, axis: str, size: int) -> tuple[ir.Program, dict[str, str], tuple]:
    """The program one chunk of at most `size` along `axis` runs, its accumulator inputs, and the inputs
    that take the chunk's first index and its end (each None where nothing reads it)."""
    bad = why_not(program, axis)
    if bad:
        raise ir.ProgramError(f"{program.name} cannot run in chunks of '{axis}': {bad}")
    off = _fresh(f"off_{axis}", program.inputs, program)
    end = _fresh(f"end_{axis}", program.inputs | {off: None}, program)
    cut, used = _in_chunks(program, axis, off, end)
    gathers = any(isinstance(n, ir.Load) and n.tensor == end for o in cut for n in ir.walk(o.expr))
    # a saved statistic's `holds` is its value over the whole axis: kept only where it is per element
    inputs = {n: s if s.holds is None or _elementwise_in(s.holds, axis) else replace(s, holds=None)
              for n, s in program.inputs.items()}
    if used:
        inputs[off] = ir.TensorSpec(off, (), "int32")
    if gathers:
        inputs[end] = ir.TensorSpec(end, (), "int32")
    outputs, accs = [], {}
    for out in cut:
        if axis in out.axes:
            outputs.append(out)
            continue
        name = _fresh(f"acc_{out.name}", inputs, program)
        inputs[name] = ir.TensorSpec(name, out.axes, "float32")
        accs[out.name] = name
        acc = ir.Load(name, tuple(ir.Index(a) for a in out.axes))
        outputs.append(ir.Output(out.name, out.axes, ir.Call("add", (acc, out.expr)), "float32"))
    axes = dict(program.axes)
    axes[axis] = size
    chunk = ir.Program(f"{program.name}_chunk", axes, inputs, outputs, program.dynamic | {axis},
                       program.copies_within(axes), specialised=program.specialised | {axis})
    return chunk.validate(), accs, (off if used else None, end if gathers else None)


def _fresh(base: str, inputs: dict, program: ir.Program) -> str:
    taken = set(inputs) | {o.name for o in program.outputs}
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


def _buffer_bytes(buf, plan, axes: dict[str, int]) -> int:
    chunks = next((k.chunks for k in plan.kernels if k.chunks > 1
                   and any(s.target == buf.name for s in k.epilogue)), 1)
    return math.prod(chunks if a is ir.CHUNK else axes[a] for a in buf.axes) * ir.DTYPE_BYTES[buf.dtype]


def plan_scratch(plan, program: ir.Program, extents: dict[str, int] | None = None) -> int:
    """Bytes of the plan's intermediate buffers at `extents` (default: the program's)."""
    axes = dict(program.axes) | (extents or {})
    return sum(_buffer_bytes(b, plan, axes) for b in plan.buffers.values())


def io_bytes(program: ir.Program) -> list[int]:
    """Bytes of each input and output of `program` (outputs in their dtype)."""
    sizes = [math.prod(program.input_shape(n)) * ir.DTYPE_BYTES[s.dtype] for n, s in program.inputs.items()]
    sizes += [math.prod(program.output_shape(o)) * ir.DTYPE_BYTES[o.dtype or "float32"] for o in program.outputs]
    return sizes


FLOOR = 1 << 30  # scratch the default limit always allows: below a GiB, chunks cost more than they save


def default_limit(program: ir.Program) -> int:
    """The scratch a plan may use unchunked: the largest input or output of the program (so a plan never
    needs more scratch than the data it reads or writes), but at least FLOOR."""
    return max(FLOOR, *io_bytes(program))


_CHUNK_BYTES = 8 << 20  # what one more chunk's launches cost, as bytes of HBM traffic (≈ 3 µs at 3 TB/s)


def _accumulated_bytes(program: ir.Program, axis: str) -> int:
    """The fp32 running sums chunks of `axis` keep: the outputs that do not vary over it."""
    return sum(math.prod(program.output_shape(o)) * 4 for o in program.outputs if axis not in o.axes)


def choose(program: ir.Program, plan, limit: int | None = None, tile: int = 128) -> Chunking | None:
    """The chunking that brings the plan's scratch under `limit` bytes (None: default_limit), or None
    where the scratch fits or no axis can be cut. Of the axes that can be cut, the one whose chunks move
    the fewest bytes beyond the whole plan's: each chunk reads and writes every fp32 running sum (the
    outputs that do not vary over the axis) and costs its launches; then the fewest chunks. Chunks are
    tile multiples where the axis is longer than a tile."""
    default = limit is None
    if default:
        limit = default_limit(program)
    scratch = plan_scratch(plan, program)
    if scratch <= limit:
        return None
    best, others = None, {}
    for axis in program.axes:
        n = program.axes[axis]
        fixed = plan_scratch(plan, program, {axis: 0})
        per = (scratch - fixed) / n  # the scratch is linear in the axis's extent
        if per <= 0 or fixed >= limit or why_not(program, axis) is not None:
            continue
        most = int((limit - fixed) // per)  # the longest chunk that fits
        if most >= tile:
            most -= most % tile
        if most < 1:
            continue
        count = math.ceil(n / most)
        size = math.ceil(n / count)  # balanced, rounded up to a tile where that still fits
        if most >= tile and size % tile and size + tile - size % tile <= most:
            size += tile - size % tile
        moved = count * (2 * _accumulated_bytes(program, axis) + _CHUNK_BYTES)
        others[axis] = count
        if best is None or (moved, count) < best[0]:
            best = ((moved, count), axis, count, size)
    if best is None:
        return None
    _, axis, count, size = best
    chunk, accs, (off, end) = chunk_program(program, axis, size)
    rival = "; ".join(f"along '{a}': {k} chunks, running sums {_gb(_accumulated_bytes(program, a))}"
                      for a, k in others.items() if a != axis)
    why = (f"the plan's scratch is {_gb(scratch)} against a limit of {_gb(limit)} "
           f"({'the largest input or output' if default else 'Options.scratch_limit'}); "
           f"{_gb(plan_scratch(plan, program, {axis: size}))} per chunk, running sums (fp32, read and written "
           f"by each chunk) {_gb(_accumulated_bytes(program, axis))}" + (f" (rather than {rival})" if rival else ""))
    return Chunking(axis, size, count, chunk, accs, why, off, end)


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def first_chunk(c: Chunking, inputs: dict, program: ir.Program) -> dict:
    """The chunk program's inputs for the first chunk of `inputs` (zero accumulators): what tuning runs."""
    import torch

    dims = {n: s.axes.index(c.axis) for n, s in program.inputs.items() if c.axis in s.axes}
    device = next(iter(inputs.values())).device
    feed = {k: (v.narrow(dims[k], 0, min(c.size, v.shape[dims[k]])) if k in dims else v) for k, v in inputs.items()}
    outs = {o.name: o for o in program.outputs}
    if c.offset:
        feed[c.offset] = torch.zeros((), dtype=torch.int32, device=device)
    if c.end:
        feed[c.end] = torch.tensor(min(c.size, program.axes[c.axis]), dtype=torch.int32, device=device)
    return feed | {a: torch.zeros(program.output_shape(outs[o]), dtype=torch.float32, device=device)
                   for o, a in c.accumulators.items()}


def aliasable(plan, program: ir.Program, out: str, acc: str) -> bool:
    """May the chunk plan write output `out` over its accumulator input `acc`? Yes where the one store of
    `out` is the only place `acc` is read, at the element it stores (acc[j, d] + Σ …): each element is
    then read before it is written, by the same program, and by nothing else."""
    from .kernel_terms import with_inlined

    stores = [st for k in plan.kernels for ph in k.passes() for st in ph.stores if st.target == out]
    stores += [st for k in plan.kernels for st in k.epilogue if st.target == out]
    if len(stores) != 1:
        return False
    at = tuple(ir.Index(a) for a in stores[0].axes)
    spec = program.inputs.get(acc)
    if spec is None or tuple(spec.axes) != tuple(stores[0].axes):
        return False
    for k in plan.kernels:
        exprs = [e for ph in k.passes() for c in ph.comps for e in (c.core, c.mask, c.corr) if e is not None]
        exprs += [st.expr for ph in k.passes() for st in ph.stores if st is not stores[0]]
        exprs += [st.expr for st in k.epilogue if st is not stores[0]]
        if any(isinstance(n, ir.Load) and n.tensor == acc for e in with_inlined(exprs, plan) for n in ir.walk(e)):
            return False
    return all(n.index == at for n in ir.walk(stores[0].expr) if isinstance(n, ir.Load) and n.tensor == acc)


def run_chunked(c: Chunking, run, inputs: dict, program: ir.Program, out_dtypes=None,
                alias: dict[str, str] | None = None) -> dict:
    """The outputs of `program` on `inputs`, by running `run(inputs, out_dtypes, into)` (the chunk
    program's) once per chunk: sliced outputs are written into their place, summed ones accumulate in
    fp32 — written over their accumulator where `alias` (summed output → its accumulator input) says
    the chunk plan may (`aliasable`), so one fp32 copy of each is held, not two."""
    import torch

    from .lower.buffers import TORCH_DTYPES

    dims = {n: s.axes.index(c.axis) for n, s in program.inputs.items() if c.axis in s.axes}
    n = program.axes[c.axis]
    device = next(iter(inputs.values())).device
    want = {o.name: (out_dtypes or {}).get(o.name) or TORCH_DTYPES[o.dtype or "float32"] for o in program.outputs}
    accs = {o.name: torch.zeros(program.output_shape(o), dtype=torch.float32, device=device)
            for o in program.outputs if o.name in c.accumulators}
    outs = {o.name: torch.empty(program.output_shape(o), dtype=want[o.name], device=device)
            for o in program.outputs if o.name not in c.accumulators}
    kept = {o: dt for o, dt in want.items() if o in outs}
    cut = {o.name: o.axes.index(c.axis) for o in program.outputs if o.name in outs}
    # the chunks' first indices and ends, one copy to the device for all chunks
    starts = torch.arange(0, n, c.size, dtype=torch.int32, device=device)
    ends = torch.clamp(starts + c.size, max=n)
    for step, start in enumerate(range(0, n, c.size)):
        length = min(c.size, n - start)
        feed = {k: (v.narrow(dims[k], start, length) if k in dims else v) for k, v in inputs.items()}
        feed |= {c.accumulators[o]: acc for o, acc in accs.items()}
        if c.offset:
            feed[c.offset] = starts[step]
        if c.end:
            feed[c.end] = ends[step]
        places = {o: t.narrow(cut[o], start, length) for o, t in outs.items()}
        res = run(feed, kept, {o: acc for o, acc in accs.items() if o in (alias or {})} | places)
        for o in accs:
            accs[o] = res[o]
        for o, place in places.items():  # written in place where the slice is contiguous, else copied
            if res[o].data_ptr() != place.data_ptr():
                place.copy_(res[o])
    return outs | {o: acc.to(want[o]) for o, acc in accs.items()}


__all__ = ["Chunking", "aliasable", "choose", "chunk_program", "default_limit", "first_chunk", "io_bytes",
           "plan_scratch", "run_chunked", "why_not"]
