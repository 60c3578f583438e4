"""Running a plan in chunks of one axis, so its scratch buffers hold a chunk, not the whole axis.

A plan may write an intermediate far larger than anything the user holds: linear cross-entropy's
backward writes the logits (or their gradient), tokens × vocabulary in fp32, before the two products
that read them. Where an axis `a` of such a buffer is one the program can be cut along, the program
runs once per chunk of `a` (Liger's fused linear cross-entropy cuts the tokens so):

    out[.., a, ..] = e             every chunk writes its slice (e holds no reduction over a)
    out[..]        = Σₐ b + Σₐ c   a sum over a: each chunk adds its part to an fp32 accumulator,
                                   acc ← acc + Σ_{a ∈ chunk} b + ...  (an input of the chunk program)

Nothing else may mix the chunks: a reduction over `a` anywhere else, an index of `a` used as a
number (a causal mask i ≥ j would need the chunk's offset), a load at a computed index built from
`a`, or a term of a summed output that does not vary over `a` (it would be added once per chunk).
The chunk program is the same program at the chunk's extent, with `a` dynamic so the last, shorter
chunk runs the same kernels; compiled by the same pipeline.
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

    def describe(self) -> str:
        return f"runs in {self.count} chunks of ≤ {self.size} along '{self.axis}': {self.why}"


def why_not(program: ir.Program, axis: str) -> str | None:
    """None if `program` can run in chunks of `axis`, else the reason it cannot (naming the output)."""
    if axis in program.dynamic:
        return f"'{axis}' is dynamic"
    sliced = {n: tuple(k for k, a in enumerate(s.axes) if a == axis) for n, s in program.inputs.items()}
    for out in program.outputs:
        for n in ir.walk(out.expr):
            if isinstance(n, ir.Load):
                at = tuple(k for k, e in enumerate(n.index) if isinstance(e, ir.Index) and e.axis == axis)
                if at != sliced[n.tensor]:
                    return (f"output '{out.name}' reads '{n.tensor}' along '{axis}' at other dimensions than "
                            f"it is declared over ({ir.show(n)})")
            elif any(isinstance(c, ir.Index) and c.axis == axis for c in n.children()):
                return (f"output '{out.name}' uses the index of '{axis}' as a number ({ir.show(n)[:80]}): a "
                        "chunk would need its offset")
        if axis in out.axes:
            if not _no_reduce_over(out.expr, axis):
                return f"output '{out.name}' reduces over '{axis}' and varies over it"
            continue
        bad = _why_not_additive(out.expr, axis)
        if bad:
            return f"output '{out.name}' is not a sum of sums over '{axis}': {bad}"
    return None


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


def chunk_program(program: ir.Program, axis: str, size: int) -> tuple[ir.Program, dict[str, str]]:
    """The program one chunk of at most `size` along `axis` runs, and its accumulator inputs."""
    bad = why_not(program, axis)
    if bad:
        raise ir.ProgramError(f"{program.name} cannot run in chunks of '{axis}': {bad}")
    # a saved statistic's `holds` is its value over the whole axis: kept only where it is per element
    inputs = {n: s if s.holds is None or _elementwise_in(s.holds, axis) else replace(s, holds=None)
              for n, s in program.inputs.items()}
    outputs, accs = [], {}
    for out in program.outputs:
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
    chunk = ir.Program(f"{program.name}_chunk", axes, inputs, outputs, program.dynamic | {axis})
    return chunk.validate(), accs


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


def choose(program: ir.Program, plan, limit: int | None = None, tile: int = 128) -> Chunking | None:
    """The chunking that brings the plan's scratch under `limit` bytes (None: default_limit) with the
    fewest chunks, or None where the scratch fits or no axis can be cut. Chunks are tile multiples
    where the axis is longer than a tile."""
    default = limit is None
    if default:
        limit = default_limit(program)
    scratch = plan_scratch(plan, program)
    if scratch <= limit:
        return None
    best = None
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
        if best is None or count < best[1]:
            best = (axis, count, size)
    if best is None:
        return None
    axis, count, size = best
    chunk, accs = chunk_program(program, axis, size)
    why = (f"the plan's scratch is {_gb(scratch)} against a limit of {_gb(limit)} "
           f"({'the largest input or output' if default else 'Options.scratch_limit'}); "
           f"{_gb(plan_scratch(plan, program, {axis: size}))} per chunk")
    return Chunking(axis, size, count, chunk, accs, why)


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def first_chunk(c: Chunking, inputs: dict, program: ir.Program) -> dict:
    """The chunk program's inputs for the first chunk of `inputs` (zero accumulators): what tuning runs."""
    import torch

    dims = {n: s.axes.index(c.axis) for n, s in program.inputs.items() if c.axis in s.axes}
    device = next(iter(inputs.values())).device
    feed = {k: (v.narrow(dims[k], 0, min(c.size, v.shape[dims[k]])) if k in dims else v) for k, v in inputs.items()}
    outs = {o.name: o for o in program.outputs}
    return feed | {a: torch.zeros(program.output_shape(outs[o]), dtype=torch.float32, device=device)
                   for o, a in c.accumulators.items()}


def aliasable(plan, program: ir.Program, out: str, acc: str) -> bool:
    """May the chunk plan write output `out` over its accumulator input `acc`? Yes where the one store of
    `out` is the only place `acc` is read, at the element it stores (acc[j, d] + Σ …): each element is
    then read before it is written, by the same program, and by nothing else."""
    from .schedule import with_inlined

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
    program's) once per chunk: sliced outputs are copied into their place, summed ones accumulate in
    fp32 — written over their accumulator where `alias` (summed output → its accumulator input) says
    the chunk plan may (`aliasable`), so one fp32 copy of each is held, not two."""
    import torch

    from .lower.launch import _TORCH_DTYPES

    dims = {n: s.axes.index(c.axis) for n, s in program.inputs.items() if c.axis in s.axes}
    n = program.axes[c.axis]
    device = next(iter(inputs.values())).device
    want = {o.name: (out_dtypes or {}).get(o.name) or _TORCH_DTYPES[o.dtype or "float32"] for o in program.outputs}
    accs = {o.name: torch.zeros(program.output_shape(o), dtype=torch.float32, device=device)
            for o in program.outputs if o.name in c.accumulators}
    outs = {o.name: torch.empty(program.output_shape(o), dtype=want[o.name], device=device)
            for o in program.outputs if o.name not in c.accumulators}
    kept = {o: dt for o, dt in want.items() if o in outs}
    for start in range(0, n, c.size):
        length = min(c.size, n - start)
        feed = {k: (v.narrow(dims[k], start, length) if k in dims else v) for k, v in inputs.items()}
        feed |= {c.accumulators[o]: acc for o, acc in accs.items()}
        res = run(feed, kept, {o: acc for o, acc in accs.items() if o in (alias or {})})
        for o in accs:
            accs[o] = res[o]
        for o in outs:
            at = next(p for p in program.outputs if p.name == o).axes.index(c.axis)
            outs[o].narrow(at, start, length).copy_(res[o])
    return outs | {o: acc.to(want[o]) for o, acc in accs.items()}


__all__ = ["Chunking", "aliasable", "choose", "chunk_program", "default_limit", "first_chunk", "io_bytes",
           "plan_scratch", "run_chunked", "why_not"]
