"""The expressions a kernel plan evaluates: its computations, masks and stores with the inlined values they
refer to, the loads among them, and the axes of its inline contractions (what the schedule and its
shared-memory model read off a kernel)."""

from __future__ import annotations

from . import ir
from .plan import Combine, KernelPlan, Pass, Plan


def kernel_exprs(k: KernelPlan, plan: Plan, phases=None) -> list[ir.Node]:
    """Every expression kernel `k` evaluates (or, given `phases`, those phases alone): computations,
    masks, stores, the epilogue's stores, and the inlined values they refer to."""
    exprs = []
    for ph in k.phases if phases is None else phases:
        src = ph.source if isinstance(ph, Combine) else ph
        for c in src.comps:
            exprs += [c.core] + ([c.mask] if c.mask is not None else [])
        if isinstance(ph, Pass):
            exprs += [s.expr for s in ph.stores]
    if phases is None:
        exprs += [s.expr for s in k.epilogue]
    return with_inlined(exprs, plan)


def with_inlined(exprs: list[ir.Node], plan: Plan) -> list[ir.Node]:
    """`exprs` and the inlined values they refer to (transitively)."""
    exprs = list(exprs)
    for e in exprs:
        for n in e.refs:
            if n.kind is ir.RefKind.INLINE and n.name in plan.inline:
                exprs.append(plan.inline[n.name])
    return exprs


def loads_in(k: KernelPlan, plan: Plan) -> list[ir.Load]:
    return [n for e in kernel_exprs(k, plan) for n in e.loads]


def loop_loads(k: KernelPlan, plan: Plan, program: ir.Program | None = None) -> list[ir.Load]:
    """The loads of `k` that vary over one of its loop axes (the tensors streamed by its passes); given
    `program`, over its longest loop axis alone (the main pass: attention's backward streams keys for
    dQ after a pass over the head dimension that reads dO and O for D, which says nothing of its rows)."""
    loop_axes = {p.axis for p in k.passes()}
    if program is not None and loop_axes:
        longest = max(program.axes[a] for a in loop_axes)
        loop_axes = {a for a in loop_axes if program.axes[a] == longest}
    return [ld for ld in loads_in(k, plan) if ld.axes & loop_axes]


def inner_axes(k: KernelPlan, plan: Plan) -> set[str]:
    """Axes of the inline contractions the kernel uses. (A split-K combine folds its pass's chunk states
    with their corrections: the inline values of the pass's cores were summed by the partial kernel.
    Counted, they held a combine's row whole, one program for the weight gradient of a 4096-wide
    RMSNorm folded into its row pass, extract/fold_rows.py.)"""
    exprs = kernel_exprs(k, plan, [ph for ph in k.phases if not isinstance(ph, Combine)])
    exprs += [s.expr for s in k.epilogue]
    for ph in k.phases:
        if isinstance(ph, Combine):
            exprs += [e for c in ph.source.comps for e in (c.corr, *(h for _, h in c.affine)) if e is not None]
    used = {n.name for e in with_inlined(exprs, plan) for n in e.refs
            if n.kind is ir.RefKind.INLINE and n.name in plan.inline}
    return {a for name in used for a in plan.inline[name].reduced_axes}

