"""A loop's mask conjunct that does not vary along the loop is applied once, after it:

    ⊕ⱼ where(c ∧ m, x, e) = where(c, ⊕ⱼ where(m, x, e), e)      c free of j, e the identity of ⊕

Exact for every value, NaN included: where c holds both sides reduce the same elements; where it does
not, the left reduces nothing (e) and the right selects e whatever the loop computed. A backward's
dQ pass carries the forward's "this row is not fully masked" test, ¬(lᵢ = 0), in every (query, key)
element of its loop; after the rewrite it is one select per output element (measured on the H100:
the dQ kernel of causal attention at L = 16384, 0.2–0.3 ms of 7).

The rewrite is on the plan, like merge.py's. It moves conjuncts that read data (a load; a purely
affine conjunct may bound the tiles a loop visits, so it stays) over the reduction's free axes only,
shared by every component of one unsplit pass with no per-tile stores — the components that read
each other's running values then all select e for the same rows — and whose results are read only
by the kernel's epilogue (a later pass reading them would pay the select per element of its own
loop). A conjunct that gathers (an index read from data) stays: it may guard the gather's index.
"""

from __future__ import annotations

from neptune_eq import ir
from neptune_eq.masks import conjunction, conjuncts
from neptune_eq.plan import CompPlan, KernelPlan, Pass


def hoist_row_conditions(kernels: list[KernelPlan]) -> list[str]:
    """Apply the rewrite, in place, to every pass of `kernels` it applies to; the derivation lines."""
    out = []
    for k in kernels:
        for ps in k.passes():
            hoisted = _hoistable(k, ps)
            if not hoisted:
                continue
            cond = conjunction(hoisted)
            for c in ps.comps:
                kept = [cj for cj in conjuncts(c.mask) if cj not in hoisted]
                c.mask = conjunction(kept)
            finals = {c.ref(ir.RefKind.FINAL): ir.Call("where", (cond, c.ref(ir.RefKind.FINAL), ir.Const(c.identity)))
                      for c in ps.comps}
            for st in k.epilogue:
                st.expr = ir.substitute(st.expr, finals)
            out.append(f"hoist_condition: {ir.show(cond)} does not vary over {ps.axis}: applied once to "
                       f"{', '.join(c.name for c in ps.comps)} after the loop, not per element")
    return out


def _hoistable(k: KernelPlan, ps: Pass) -> list[ir.Node]:
    if ps.split > 1 or ps.stores or not ps.comps or any(c.integer or c.affine or c.mask is None for c in ps.comps):
        return []
    names = {c.name for c in ps.comps}
    for other in k.phases:
        if other is ps:
            continue
        src = other.source if not isinstance(other, Pass) else other
        exprs = [e for c in src.comps for e in (c.core, c.mask, c.corr) if e is not None]
        exprs += [st.expr for st in getattr(other, "stores", [])]
        if any(isinstance(n, ir.StateRef) and n.name in names for e in exprs for n in ir.walk(e)):
            return []  # a later pass reads them inside its own loop
    first, *rest = ps.comps
    return [cj for cj in conjuncts(first.mask)
            if _row_condition(cj, ps.axis, first) and all(cj in conjuncts(c.mask) and _row_condition(cj, ps.axis, c)
                                                          for c in rest)]


def _row_condition(cj: ir.Node, axis: str, c: CompPlan) -> bool:
    nodes = list(ir.walk(cj))
    loads = [n for n in nodes if isinstance(n, ir.Load)]
    return (bool(loads) and axis not in cj.axes and cj.axes <= set(c.free)
            and not any(isinstance(n, ir.StateRef) for n in nodes)
            and not any(isinstance(x, ir.Load) for ld in loads for a in ld.index for x in ir.walk(a)))
