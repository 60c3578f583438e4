"""Kernels whose float arithmetic must not depend on the code around it: those comparing a computed
value with a reduction's state (the elements attaining a min, amin's tie count in its gradient) and
those computing such a state.

A value compared with its own min recomputed in another kernel meets it only when both kernels compute
it with the same operations. A multiply and an add contracted into one FMA in one kernel and not in the
other round apart (the code around them decides: a product hoisted out of a loop is not contracted),
and then no element equals the min: the min's gradient is lost on that row. Such kernels are compiled
without FMA contraction (KernelSource.exact_arith). The interpreter never contracts; what it showed
(fuzz seed 1511: a division lowered as a·(1/b) in one kernel and a / b in the other) is closed in
lower/kernel.py, which takes the reciprocal whatever the layout.
"""

from __future__ import annotations

from .. import ir
from ..extract.exact_tests import computed
from ..kernel_terms import with_inlined
from ..ops import COMPARISONS
from ..plan import Combine, KernelPlan, Plan


def exact_kernels(plan: Plan) -> set[str]:
    """The kernels of `plan` that compare a computed value with a state, or compute a state some kernel
    of the plan compares a computed value with."""
    # (a later kernel reads a state as the buffer its kernel's epilogue wrote it to)
    held = {st.target: st.expr.name for k in plan.kernels for st in k.epilogue
            if isinstance(st.expr, ir.StateRef) and st.expr.kind is ir.RefKind.FINAL}
    tested = {k.name: _tested(plan, k, held) for k in plan.kernels}
    states = set().union(*tested.values())
    out = {name for name, found in tested.items() if found}
    for k in plan.kernels:
        comps = {c.name for ph in k.phases for c in (ph.source if isinstance(ph, Combine) else ph).comps}
        inline = {n.name for n in _walk(plan, k.exprs())
                  if isinstance(n, ir.StateRef) and n.kind is ir.RefKind.INLINE}
        if states & (comps | inline):
            out.add(k.name)
    return out


def _tested(plan: Plan, k: KernelPlan, held: dict[str, str]) -> set[str]:
    """The states that kernel `k` compares a computed value with (`held`: buffer → the state it holds)."""
    out = set()
    for n in _walk(plan, k.exprs()):
        if isinstance(n, ir.Call) and n.op in COMPARISONS:
            for a, b in (n.args, n.args[::-1]):
                if isinstance(b, ir.StateRef) and computed(a):
                    out.add(b.name)
                elif isinstance(b, ir.Load) and b.tensor in held and computed(a):
                    out.add(held[b.tensor])
    return out


def _walk(plan: Plan, exprs):
    """The nodes of `exprs`, and of the inline terms (val:x, plan.inline) they read."""
    for e in with_inlined(list(exprs), plan):
        yield from ir.walk(e)
