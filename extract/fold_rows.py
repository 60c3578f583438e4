"""A row (or map) kernel folded into the pass that streams the same rows: its stores ride the column sums.

A norm's backward is a column sum and a row map over the same two tensors: dW[d] = Σᵢ dyᵢd·xᵢd·rᵢ
(a pass over the rows i into [d], split into chunks of rows) and dXᵢd = f(dyᵢd, xᵢd, sᵢ) with
sᵢ = Σ_d dyᵢd·wd·xᵢd (a pass over d into [i], then a map over d). As two kernels each reads dy and
x; Liger-Kernel and torch.compile write it as one: a program takes a chunk of rows, holds each row
whole, computes sᵢ from it, stores dXᵢ and adds the row into its partial dW — dy and x read once.

Here that is a plan rewrite: in a plan where kernel A runs a pass over i with grid F ∪ {d} and
another kernel B runs, over grid F ∪ {i}, passes over d whose reductions only B reads and whose stores
are over F ∪ {i, d}, B's reductions become inline values (computed per tile of A's pass, d held
whole: schedule.sums_whole) and its stores move into A's pass; B is dropped. B may come before A when
A read B's reductions from buffers (a recomputed Σ_d x² that the weight's gradient scales by): A then
computes them inline too, and the buffers go. Exact: every value is
computed from the same terms, each store still written once per element. A's pass, when split, is
also offered in more chunks (its partial states combine as before, whatever their count): a program
per chunk of rows needs a chunk per SM, not the few that the split-K rule's 512-element chunks give.
The cost model chooses between the fold and the two kernels.

B may also be a map kernel (stores over F ∪ {i, d} alone, nothing reduced): a bias's gradient beside
the activation's, db[d] = Σᵢ gᵢd and dxᵢd = gᵢd with g = dy·act′(x + b), read x and dy twice as two
kernels; folded, the map's stores ride A's pass (d need not be held whole: nothing sums it).
"""

from __future__ import annotations

import copy

from neptune_eq import ir
from neptune_eq.block_bounds import next_pow2
from neptune_eq.plan import Combine, CompPlan, KernelPlan, Pass, Plan

WHOLE_MAX = 8192  # the widest row (d) a program holds whole, with its fp32 partial sums of the columns
CHUNKS = (16, 32, 64, 128, 256)  # chunk counts offered beside the split-K rule's (132 SMs to fill)
MIN_ROWS = 8  # rows a chunk takes at least


def fold_row_kernels(plan: Plan, program: ir.Program) -> list[Plan]:
    """The plans of `plan` with one row (or map) kernel folded into another kernel's pass over its rows, in
    each chunk count offered (none where no kernel pair fits)."""
    out = []
    for a, b in _pairs(plan, program):
        ka = plan.kernels[a]
        ps = ka.passes()[0]
        n = program.axes[ps.axis]
        # (every split base gives the same plan in a larger count: the counts come from the 2-way one alone)
        counts = [ps.split] + ([c for c in CHUNKS if n >= MIN_ROWS * c] if ps.split == 2 else [])
        out += [_fold(plan, program, a, b, count) for count in counts]
    return out


def _plain(c: CompPlan) -> bool:
    return not c.producers and c.corr is None and not c.affine and not c.integer and c.op in ("sum", "max", "min")


def _writers(plan: Plan) -> dict[str, int]:
    """Tensor name → the index of the kernel that stores it."""
    out = {}
    for i, k in enumerate(plan.kernels):
        for st in [*k.epilogue, *(st for p in k.passes() for st in p.stores)]:
            out[st.target] = i
    return out


def _loads(e: ir.Node) -> set[str]:
    return {ld.tensor for ld in e.loads}


def _reads(k: KernelPlan) -> set[str]:
    """The tensors kernel `k` loads (a Combine folds its chunks' states: not its source pass's loads)."""
    exprs = [e for p in k.passes() for c in p.comps for e in (c.core, c.mask, c.corr) if e is not None]
    exprs += [st.expr for p in k.passes() for st in p.stores] + [st.expr for st in k.epilogue]
    return set().union(*map(_loads, exprs))


def _foldable(kb: KernelPlan, plan: Plan, program: ir.Program):
    """(d, reductions, stores, buffers) of a row kernel — passes over one axis d of plain reductions over
    its grid, read by its own stores and by its epilogue's buffers (`buffers`: their names) alone — or
    (None, [], stores, {}) of a map kernel (epilogue stores alone); else None."""
    passes = kb.passes()
    if kb.chunks > 1 or len(passes) != len(kb.phases):
        return None
    if not passes:
        return (None, [], kb.epilogue, {}) if kb.epilogue else None
    d = passes[0].axis
    comps = [c for p in passes for c in p.comps]
    stores = [st for p in passes for st in p.stores]
    # (an epilogue storing a program output — a training forward's saved row statistic — does not fold:
    # the fold replaces buffers by inline values, and an output must still be written; fuzz seed 932)
    buffers = {st.target: c for st in kb.epilogue for c in comps
               if st.expr == c.ref(ir.RefKind.FINAL) and st.target in plan.buffers}
    names = {c.name for c in comps}
    if (len(buffers) != len(kb.epilogue) or not stores or any(p.axis != d for p in passes) or d in kb.grid
            or next_pow2(program.axes[d]) > WHOLE_MAX
            or not all(_plain(c) and set(c.free) == set(kb.grid) for c in comps)
            or any(n.kind is ir.RefKind.INLINE and n.name in names for e in plan.inline.values() for n in e.refs)
            or any(_loads(e) & set(buffers) for e in plan.inline.values())):
        return None
    return d, comps, stores, buffers


def _pairs(plan: Plan, program: ir.Program):
    """(A, B) kernel indices that fold: B a row or map kernel (_foldable), A another kernel of one pass
    over a row axis i of B whose grid is B's with d for i (a map kernel's without i), B's stores spanning
    A's grid and rows. B's work moves to A's place: where A comes first, B reads nothing written from A
    on and stores no buffer; where B comes first, its buffers are read by A alone, and what it stores by
    no kernel from B to A."""
    writers = _writers(plan)
    reads = [_reads(k) for k in plan.kernels]
    for b, kb in enumerate(plan.kernels):
        got = _foldable(kb, plan, program)
        if got is None:
            continue
        d, _, stores, buffers = got
        for a, ka in enumerate(plan.kernels):
            if a == b or len(ka.phases) != 1 or not isinstance(ka.phases[0], Pass):
                continue
            i = ka.phases[0].axis
            if any(c.mask is not None for c in ka.phases[0].comps):
                continue  # (a mask may bound the rows the pass visits: B's stores need every row)
            rows = set(ka.grid) | {i}
            grid = set(kb.grid) - {i} == set(ka.grid) - {d} if d is not None else set(kb.grid) == rows
            if (i not in kb.grid or i in ka.grid or (d is not None and d not in ka.grid) or not grid
                    or any(set(st.axes) != rows for st in stores)):
                continue
            if a < b and (buffers or any(writers.get(t, -1) >= a for t in reads[b])):
                continue
            stored = {st.target for st in stores}
            if a > b and (any(buffers.keys() & reads[k] for k in range(len(plan.kernels)) if k != a)
                          or any(stored & reads[k] for k in range(b, a + 1))):
                continue
            yield a, b
            break


def _fold(plan: Plan, program: ir.Program, a: int, b: int, chunks: int) -> Plan:
    new = copy.deepcopy(plan)
    ka, kb = new.kernels[a], new.kernels[b]
    ps = ka.passes()[0]
    _, comps, stores, buffers = _foldable(kb, new, program)
    refs = {c.ref(ir.RefKind.FINAL): c.ref(ir.RefKind.INLINE) for c in comps}
    for c in comps:  # (a row value may read another: a variance about the row's mean)
        body = c.core if c.mask is None else ir.Call("where", (c.mask, c.core, ir.Const(c.identity)))
        new.inline[c.name] = ir.Reduce(c.op, kb.passes()[0].axis, ir.substitute(body, refs))
    for st in stores:
        st.expr = ir.substitute(st.expr, refs)
        ps.stores.append(st)
    if buffers:  # (B came first: A read its reductions from buffers, now their inline values)
        ka.substitute({ir.Load(t, tuple(ir.Index(x) for x in new.buffers[t].axes)): c.ref(ir.RefKind.INLINE)
                       for t, c in buffers.items()})
        for t in buffers:
            del new.buffers[t]
    new.kernels.remove(kb)
    targets = ", ".join(st.target for st in stores)
    lines = [f"fold_rows: {kb.name}'s stores ({targets}) ride the pass over {ps.axis}" + (
        f", its row values ({', '.join(c.name for c in comps)}) computed per tile with {kb.passes()[0].axis} "
        "held whole" if comps else " (a map over the same rows)")]
    if chunks != ps.split:
        _rechunk(new, ka, ps, chunks)
        lines.append(f"fold_rows: the pass over {ps.axis} runs as {chunks} chunks (a chunk of rows a program)")
    new.groups = [(ax, names, chunks if ax == ps.axis and ps.comps and set(names) == {c.name for c in ps.comps}
                   else split) for ax, names, split in new.groups
                  if not set(names) <= {c.name for c in comps}]
    new.derivation = [*new.derivation, *lines]
    new.cost, new.folded = None, True
    return new


def _rechunk(plan: Plan, ka: KernelPlan, ps: Pass, chunks: int) -> None:
    ps.split = ka.chunks = chunks
    for k in plan.kernels:
        for ph in k.phases:
            if isinstance(ph, Combine) and ph.source is ps:
                ph.chunks = chunks
