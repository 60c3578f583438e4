"""A row (or map) kernel folded into the pass that streams the same rows: its stores ride the column sums.

A norm's backward is a column sum and a row map over the same two tensors: dW[d] = Σᵢ dyᵢd·xᵢd·rᵢ
(a pass over the rows i into [d], split into chunks of rows) and dXᵢd = f(dyᵢd, xᵢd, sᵢ) with
sᵢ = Σ_d dyᵢd·wd·xᵢd (a pass over d into [i], then a map over d). As two kernels each reads dy and
x; Liger-Kernel and torch.compile write it as one: a program takes a chunk of rows, holds each row
whole, computes sᵢ from it, stores dXᵢ and adds the row into its partial dW — dy and x read once.

Here that is a plan rewrite: in a plan where kernel A runs a pass over i with grid F ∪ {d} and a
later kernel B runs, over grid F ∪ {i}, passes over d whose reductions only B reads and whose stores
are over F ∪ {i, d}, B's reductions become inline values (computed per tile of A's pass, d held
whole: schedule.sums_whole) and its stores move into A's pass; B is dropped. Exact: every value is
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
    """The plans of `plan` with one row kernel folded into an earlier kernel's pass over its rows, in
    each chunk count offered (none where no kernel pair fits)."""
    out = []
    for a, b in _pairs(plan, program):
        ka = plan.kernels[a]
        ps = ka.passes()[0]
        n = program.axes[ps.axis]
        counts = [ps.split] + ([c for c in CHUNKS if c > ps.split and n >= MIN_ROWS * c] if ps.split > 1 else [])
        out += [_fold(plan, a, b, count) for count in counts]
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


def _pairs(plan: Plan, program: ir.Program):
    """(A, B) kernel indices that fold: B a row kernel (passes over one axis d, plain reductions that
    only its own stores read, no epilogue) or a map kernel (stores alone, in its epilogue); A an earlier
    kernel of one pass over a row axis i of B whose grid is B's with d for i (a map kernel's without i),
    and B's stores span A's grid and rows; B reads nothing written from A on."""
    writers = _writers(plan)
    for b, kb in enumerate(plan.kernels):
        passes = kb.passes()
        if kb.chunks > 1 or len(passes) != len(kb.phases):
            continue
        if passes:  # a row kernel
            if kb.epilogue or len({p.axis for p in passes}) != 1 or not any(p.stores for p in passes):
                continue
            d = passes[0].axis
            comps = [c for p in passes for c in p.comps]
            if (not all(_plain(c) and set(c.free) == set(kb.grid) for c in comps)
                    or next_pow2(program.axes[d]) > WHOLE_MAX or d in kb.grid):
                continue
            names = {c.name for c in comps}
            if any(n.kind is ir.RefKind.INLINE and n.name in names for e in plan.inline.values() for n in e.refs):
                continue
            stores = [st for p in passes for st in p.stores]
        elif kb.epilogue:  # a map kernel
            d, stores = None, kb.epilogue
        else:
            continue
        read = {ld.tensor for e in kb.exprs() for ld in e.loads}
        for a in range(b):
            ka = plan.kernels[a]
            if len(ka.phases) != 1 or not isinstance(ka.phases[0], Pass):
                continue
            i = ka.phases[0].axis
            rows = set(ka.grid) | {i}
            grid = set(kb.grid) - {i} == set(ka.grid) - {d} if d is not None else set(kb.grid) == rows
            if (i not in kb.grid or i in ka.grid or (d is not None and d not in ka.grid) or not grid
                    or any(set(st.axes) != rows for st in stores) or any(writers.get(t, -1) >= a for t in read)):
                continue
            yield a, b
            break


def _fold(plan: Plan, a: int, b: int, chunks: int) -> Plan:
    new = copy.deepcopy(plan)
    ka, kb = new.kernels[a], new.kernels[b]
    ps = ka.passes()[0]
    comps = [c for p in kb.passes() for c in p.comps]
    stores = [st for p in kb.passes() for st in p.stores] or kb.epilogue
    refs = {c.ref(ir.RefKind.FINAL): c.ref(ir.RefKind.INLINE) for c in comps}
    for c in comps:
        body = c.core if c.mask is None else ir.Call("where", (c.mask, c.core, ir.Const(c.identity)))
        new.inline[c.name] = ir.Reduce(c.op, kb.passes()[0].axis, body)
    for st in stores:
        st.expr = ir.substitute(st.expr, refs)
        ps.stores.append(st)
    del new.kernels[b]
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
    new.cost = None
    return new


def _rechunk(plan: Plan, ka: KernelPlan, ps: Pass, chunks: int) -> None:
    ps.split = ka.chunks = chunks
    for k in plan.kernels:
        for ph in k.phases:
            if isinstance(ph, Combine) and ph.source is ps:
                ph.chunks = chunks
