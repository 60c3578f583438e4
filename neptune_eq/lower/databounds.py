"""Loop bounds from data: the tiles of a loop that a data-dependent mask keeps, worked out per call.

An affine mask conjunct (j <= i) bounds a loop at compile time. A conjunct that compares values
read from the inputs cannot: `doc[i] == doc[j]` (packed documents), `start[i] <= j` (a per-token
document start), `j < lens[b]` (a per-batch length). Per call the launcher evaluates both sides of
each such comparison on the inputs, takes their range [min, max] over each program's tile and each
loop tile, and keeps the loop tiles where the comparison can hold for some pair of values of the
two ranges. That is interval arithmetic, so it is sound: a pair of elements that meets the
predicate has its two values inside the two ranges. The first and last kept tile bound the
program's loop; inside it the predicate is evaluated per element, except over a run of whole tiles
where it holds for every pair (one document's keys below the diagonal), which runs unmasked.

Packed documents then cost the sum of the squares of their lengths, not the square of the total,
as with FlashAttention's cu_seqlens or FlexAttention's BlockMask. This holds whatever order the
documents are in: unsorted ids only widen the ranges, and widening costs time, never correctness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import ir

_COMPARISONS = ("eq", "le", "lt", "ge", "gt")
_FLIP = {"eq": "eq", "le": "ge", "lt": "gt", "ge": "le", "gt": "lt"}
_MAX_EVAL = 1 << 26  # elements of one side's values, or of the tile table, evaluated per call


@dataclass(frozen=True)
class DataBound:
    """The loop over `axis` (tiles of `tile`) visits, per program, the span of loop tiles where
    every comparison in `preds` can hold, unmasked over the whole tiles where all hold. The launcher
    passes it as an int32 tensor [tiles of each grid axis in `grid`..., 4] of element offsets
    (lo, hi, flo, fhi) (bound_tensor)."""

    axis: str
    tile: int
    preds: tuple[ir.Node, ...]  # comparisons (eq, le, lt, ge, gt) of values of the inputs
    grid: tuple[tuple[str, int], ...]  # (grid axis, its step) the bounds vary along, in tensor order


INTEGER = ("int8", "int16", "int32", "int64", "uint8")
INTEGER_OPS = ("add", "sub", "mul", "neg", "abs", "min2", "max2", "floordiv", "mod")
_COUNT_OPS = (*INTEGER_OPS, "where", "and", "or", "not", "ne", *_COMPARISONS)


def exact_integer(n: ir.Node, program: ir.Program, ops=INTEGER_OPS, dtypes=INTEGER) -> bool:
    """Is n an integer the kernels and the float64 evaluator compute alike: inputs of `dtypes` and
    integer constants under `ops` (sums of them too: exact in float32 below 2^24, as counts are)?"""
    return not any((isinstance(m, ir.Load) and (m.tensor not in program.inputs  # (a plan buffer: unknown here)
                                                 or program.inputs[m.tensor].dtype not in dtypes))
                   or (isinstance(m, ir.Const) and not float(m.value).is_integer())
                   or isinstance(m, ir.StateRef)
                   or (isinstance(m, ir.Call) and m.op not in ops) for m in ir.walk(n))


def _evaluable(n: ir.Node, program: ir.Program) -> bool:
    """Can n be computed from the inputs alone (indices, constants, loads of inputs, arithmetic), with
    the kernel's values? A reduction inside (the document of a token counted from offsets,
    Σ_f [cu[f + 1] <= i]) only where it counts integers exactly: a float sum may round otherwise in
    the kernel than in the evaluator, and a loop bounded by the evaluator's values would then skip a
    tile the kernel's mask keeps."""
    for m in ir.walk(n):
        if isinstance(m, ir.StateRef) or (isinstance(m, ir.Load) and m.tensor not in program.inputs):
            return False
        if isinstance(m, ir.Reduce) and not exact_integer(m, program, _COUNT_OPS, (*INTEGER, "bool")):
            return False
    return True


def axes_of(n: ir.Node) -> set[str]:
    """The axes n varies over (its free axes: a reduction's own axis is not one)."""
    return set(n.axes)


def evaluation_box(n: ir.Node) -> set[str]:
    """Every axis n's evaluation runs over: its own and its reductions'."""
    return {m.axis for m in ir.walk(n) if isinstance(m, ir.Index)}


def with_inline_terms(pred: ir.Node, inline: dict[str, ir.Node]) -> ir.Node:
    """`pred` with each inline value of the plan (val:x, computed per element where it is used) written
    as the term it is computed from (`plan.inline`): what the launcher evaluates per call."""
    def term(old, new):
        if isinstance(new, ir.StateRef) and new.kind is ir.RefKind.INLINE and new.name in inline:
            return with_inline_terms(inline[new.name], inline)
        return new
    return ir.rebuild(pred, term)


def with_plan_terms(pred: ir.Node, plan, program: ir.Program) -> ir.Node:
    """`pred` with the plan's values written as the terms of the inputs they are computed from: its
    inline values (with_inline_terms), and the integer buffers an earlier kernel of the plan wrote (a
    token's document counted from offsets once per token, buf[i] = Σ_l [cu[l] <= i], then compared
    in the attention kernel: its loop had gone unbounded, every causal key visited, 7× the packed
    documents' work on an H100). Only a buffer holding an exact integer is replaced: the launcher's
    evaluation of its term then has the values the kernel stored."""
    buffers = _integer_buffers(plan, program)

    def term(old, new):
        if isinstance(new, ir.Load) and new.tensor in buffers:
            axes, t = buffers[new.tensor]
            bound = {m.axis for m in ir.walk(t) if isinstance(m, ir.Reduce)}
            if bound & (set(axes) | set().union(*(e.axes for e in new.index))):
                return new  # (a reduction inside would capture the index read at)
            return ir.substitute(t, {ir.Index(a): e for a, e in zip(axes, new.index)})
        return new

    return ir.rebuild(with_inline_terms(pred, plan.inline), term)


def _integer_buffers(plan, program: ir.Program) -> dict[str, tuple[tuple[str, ...], ir.Node]]:
    """buffer → (its axes, the term of the inputs it holds) for each integer buffer of `plan` a kernel
    stores whole: from its plain passes' final values (no repair, no split) and inline values."""
    from ..plan import Pass

    out = {}
    for k in plan.kernels:
        if k.chunks > 1:
            continue
        comps = {}
        for ph in k.phases:
            if not isinstance(ph, Pass) or ph.split > 1:
                continue
            for c in ph.comps:
                if not (c.producers or c.corr is not None or c.affine):
                    body = c.core if c.mask is None else ir.Call("where", (c.mask, c.core, ir.Const(float(c.identity))))
                    comps[c.name] = ir.Reduce(c.op, ph.axis, body)

        def final(old, new, comps=comps):
            if isinstance(new, ir.StateRef) and new.kind is ir.RefKind.FINAL and new.name in comps:
                return comps[new.name]
            return new

        for st in [*(st for ph in k.passes() for st in ph.stores), *k.epilogue]:
            spec = plan.buffers.get(st.target)
            if spec is None or spec.dtype not in INTEGER or not all(isinstance(a, str) for a in st.axes):
                continue
            t = with_inline_terms(ir.rebuild(st.expr, final), plan.inline)
            if not ir.reads_state(t) and exact_integer(t, program, _COUNT_OPS, (*INTEGER, "bool")):
                out[st.target] = (tuple(st.axes), t)
    return out


def data_conjuncts(pred: ir.Node, axis: str, program: ir.Program) -> list[ir.Node]:
    """The conjuncts of `pred` that are comparisons of input values varying along loop `axis` and
    not affine (those bound the loop at compile time), whose sides can be evaluated per call."""
    from ..masks import affine

    if isinstance(pred, ir.Call) and pred.op == "and":
        return data_conjuncts(pred.args[0], axis, program) + data_conjuncts(pred.args[1], axis, program)
    if not (isinstance(pred, ir.Call) and pred.op in _COMPARISONS) or affine(pred) is not None:
        return []
    if axis not in axes_of(pred) or not _evaluable(pred, program):
        return []
    for side in pred.args:  # one side's values are computed over the box of its axes (and its reductions')
        if math.prod(program.axes[a] for a in evaluation_box(side)) > _MAX_EVAL:
            return []
    return [pred]


def bound_for(preds: list[ir.Node], axis: str, tile: int, grid: list[tuple[str, int]],
              program: ir.Program) -> DataBound | None:
    """The DataBound of a loop masked by `preds` (data_conjuncts), or None where its table of
    (program tile, loop tile) pairs would be too large to work out per call."""
    used = set().union(*(axes_of(p) for p in preds))
    along = tuple((a, step) for a, step in grid if a in used)
    cells = math.ceil(program.axes[axis] / tile) * math.prod(math.ceil(program.axes[a] / s) for a, s in along)
    if not preds or cells > _MAX_EVAL:
        return None
    return DataBound(axis, tile, tuple(preds), along)


def index_comparisons(db: DataBound) -> list[tuple[str, ir.Node]] | None:
    """`db`'s comparisons as (op, v) with the loop index on the left, `j op v`, where each compares
    the loop index itself with a value `v` that does not vary along the loop (`j < lens[b]`, a
    per-request length; `j >= start[b]`); None where one does not. Such bounds need no table: the
    kernel reads v and bounds its loop itself (KernelWriter.data_bound), nothing is worked out per call."""
    out = []
    for p in db.preds:
        a, b = p.args
        if isinstance(a, ir.Index) and a.axis == db.axis and db.axis not in axes_of(b):
            out.append((p.op, b))
        elif isinstance(b, ir.Index) and b.axis == db.axis and db.axis not in axes_of(a):
            out.append((_FLIP[p.op], a))
        else:
            return None
    return out


def in_kernel(db: DataBound, grid, program: ir.Program) -> bool:
    """Can a program of a kernel over `grid` bound its loop under `db` itself, with no per-call work
    (KernelWriter.in_kernel_bound): every comparison is the loop index against an exact integer over
    grid axes alone, no reduction inside (a request's length lens[b])."""
    cmps = index_comparisons(db)
    return cmps is not None and all(
        axes_of(v) <= set(grid) and exact_integer(v, program) and not any(isinstance(m, ir.Reduce) for m in ir.walk(v))
        for _, v in cmps)


def kernel_data_bounds(k, plan, program: ir.Program) -> tuple[bool, bool]:
    """(bounded for free, bounded per call by the launcher): whether some loop of kernel `k` is bounded
    by data its programs read themselves or by indices alone (a head's group, h // G == g: the table
    depends on the layout, not on the values), and whether some is bounded by a table of input values
    the launcher works out on every call (bound_tensor) — the plan's schedule may leave the latter
    unbounded (KernelSchedule.data_bounds), every tile then visited and its mask evaluated per element."""
    own = per_call = False
    for ps in k.passes():
        for c in ps.comps:
            if c.mask is None:
                continue
            preds = data_conjuncts(with_plan_terms(c.mask, plan, program), ps.axis, program)
            if preds:
                if in_kernel(DataBound(ps.axis, 1, tuple(preds), ()), k.grid, program) or not any(
                        isinstance(n, ir.Load) for p in preds for n in ir.walk(p)):
                    own = True
                else:
                    per_call = True
    return own, per_call


def loop_range(op: str, vmin: str, vmax: str, end: str) -> tuple[str, str, str, str]:
    """Code of (lo, hi, flo, fhi), element offsets of the loop index j where `j op v` can hold for
    some value v of the program's, in [vmin, vmax], and where it holds for all of them: the loop
    rounds lo and fhi down and flo up to its tiles. (A wider [vmin, vmax] only widens the loop and
    narrows its unmasked run: sound.) A value is cut to `end` before 1 is added: j < end makes
    `j <= v` and `j <= min(v, end)` the same, and v + 1 cannot wrap past the integer's range."""
    def succ(v: str) -> str:
        return f"tl.minimum({v}, {end}) + 1"

    return {"lt": ("0", vmax, "0", vmin), "le": ("0", succ(vmax), "0", succ(vmin)),
            "gt": (succ(vmin), end, succ(vmax), end), "ge": (vmin, end, vmax, end),
            "eq": (vmin, succ(vmax), "0", "0")}[op]


# ---------------------------------------------------------------- per call


def bound_tensor(db: DataBound, program: ir.Program, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per program, (lo, hi) the loop offsets where the comparisons can hold and (flo, fhi) a run of
    whole loop tiles where they hold for every pair (the loop's unmasked interior, which evaluates no
    mask), as int32 [tiles of each grid axis..., 4]; `program` at the call's lengths."""
    from ..reference import evaluate

    order = list(program.axes)
    steps = {**dict(db.grid), db.axis: db.tile}
    out_dims = (*(a for a, _ in db.grid), db.axis)
    values = evaluate(program, inputs, nodes=[s for p in db.preds for s in p.args])
    can = full = None
    for k, p in enumerate(db.preds):
        sides = []
        for m, side in enumerate(p.args):
            dims = tuple(sorted(axes_of(side), key=order.index))
            t = values[str(2 * k + m)].reshape([program.axes[a] for a in dims])
            lo, hi, nan, kept = _tile_ranges(t, dims, steps)
            sides.append([_align(r, kept, out_dims) for r in (lo, hi, nan)])
        (alo, ahi, anan), (blo, bhi, bnan) = sides
        c = _can_hold(p.op, alo, ahi, blo, bhi)
        f = _always_holds(p.op, alo, ahi, blo, bhi) & ~anan & ~bnan
        can, full = (c, f) if can is None else (can & c, full & f)
    shape = [math.ceil(program.axes[a] / s) for a, s in db.grid] + [math.ceil(program.axes[db.axis] / db.tile)]
    can, full = can.expand(shape), full.expand(shape) & can.expand(shape)
    n, T, end = shape[-1], db.tile, program.axes[db.axis]
    idx = torch.arange(n, device=can.device)
    first = can.to(torch.uint8).argmax(-1)
    last = n - 1 - can.flip(-1).to(torch.uint8).argmax(-1)
    lo = torch.where(can.any(-1), first * T, 0)
    hi = torch.where(can.any(-1), torch.clamp((last + 1) * T, max=end), 0)
    f_first = full.to(torch.uint8).argmax(-1)
    past = ~full & (idx > f_first[..., None])  # the run of whole tiles ends at the first one that is not
    f_end = torch.where(past.any(-1), past.to(torch.uint8).argmax(-1), n)
    flo = torch.where(full.any(-1), f_first * T, 0)
    fhi = torch.where(full.any(-1), torch.clamp(f_end * T, max=end), 0)
    return torch.stack([lo, hi, flo, fhi], -1).to(torch.int32).contiguous()


def _can_hold(op: str, alo, ahi, blo, bhi) -> torch.Tensor:
    """Can `a op b` hold for some a in [alo, ahi], b in [blo, bhi]? (An empty range, lo > hi, never.)"""
    if op in ("ge", "gt"):
        op, alo, ahi, blo, bhi = _FLIP[op], blo, bhi, alo, ahi
    nonempty = (alo <= ahi) & (blo <= bhi)
    if op == "eq":
        return nonempty & (alo <= bhi) & (blo <= ahi)
    return nonempty & ((alo <= bhi) if op == "le" else (alo < bhi))


def _always_holds(op: str, alo, ahi, blo, bhi) -> torch.Tensor:
    """Does `a op b` hold for every a in [alo, ahi], b in [blo, bhi]?"""
    if op in ("ge", "gt"):
        op, alo, ahi, blo, bhi = _FLIP[op], blo, bhi, alo, ahi
    if op == "eq":
        return (alo == ahi) & (blo == bhi) & (alo == blo)
    return (ahi <= blo) if op == "le" else (ahi < blo)


def _tile_ranges(t: torch.Tensor, dims: tuple[str, ...], steps: dict[str, int]):
    """(min, max, has NaN) of `t` over each tile of the axes in `steps` and over the whole of the
    others, with the kept axes; NaN (never equal, less or greater) is left out of min and max."""
    t = t.to(torch.float64)
    nan = torch.isnan(t)
    lo = torch.where(nan, math.inf, t)
    hi = torch.where(nan, -math.inf, t)
    kept = []
    for k in range(len(dims) - 1, -1, -1):
        s = steps.get(dims[k])
        if s is None:
            lo, hi, nan = lo.amin(k), hi.amax(k), nan.any(k)
            continue
        kept.insert(0, dims[k])
        pad = -lo.shape[k] % s
        lo, hi, nan = lo.movedim(k, -1), hi.movedim(k, -1), nan.movedim(k, -1)
        if pad:  # lanes past the end: neutral for min, max and NaN
            lo = torch.nn.functional.pad(lo, (0, pad), value=math.inf)
            hi = torch.nn.functional.pad(hi, (0, pad), value=-math.inf)
            nan = torch.nn.functional.pad(nan, (0, pad), value=False)
        lo = lo.reshape(*lo.shape[:-1], -1, s).amin(-1).movedim(-1, k)
        hi = hi.reshape(*hi.shape[:-1], -1, s).amax(-1).movedim(-1, k)
        nan = nan.reshape(*nan.shape[:-1], -1, s).any(-1).movedim(-1, k)
    return lo, hi, nan, tuple(kept)


def _align(t: torch.Tensor, dims: tuple[str, ...], out_dims: tuple[str, ...]) -> torch.Tensor:
    """`t` over `dims` (a subset of out_dims) laid out for broadcasting over out_dims."""
    t = t.permute(sorted(range(len(dims)), key=lambda k: out_dims.index(dims[k])))
    return t.reshape([t.shape[sorted(dims, key=out_dims.index).index(a)] if a in dims else 1 for a in out_dims])
