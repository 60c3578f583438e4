"""Checks of an enumerated plan against the program it came from, before it is priced or cached.

A pass's carried reduction computes its binding's reduction: where the binding's body varies along
the reduced axis, the core the plan carries (or its mask) must too. A core that does not names a term
that stands for something else — once, in a rare compile (session 66, not reproduced), a cross-entropy's
rolling sum read exp(−∞ − m) for exp(x[i, d] − m): the forward was −∞, and cached on disk.
"""

from __future__ import annotations

from neptune_eq.fusion.types import Binding
from neptune_eq.plan import Plan


def lost_axis(plan: Plan, bindings: list[Binding]) -> str | None:
    """Why `plan` does not compute its bindings (a carried reduction whose core and mask are free of
    the axis its binding's body varies along), or None."""
    by_name = {b.name: b for b in bindings}
    for k in plan.kernels:
        for ps in k.passes():
            for comp in ps.comps:
                b = by_name.get(comp.name)
                if b is None or b.node.axis != ps.axis or ps.axis not in b.node.body.axes:
                    continue
                if ps.axis not in comp.core.axes and (comp.mask is None or ps.axis not in comp.mask.axes):
                    return (f"kernel {k.name}: {comp.name} = {comp.op}_{ps.axis} of a core free of {ps.axis} "
                            f"where the program's reduction varies along it")
    return None
