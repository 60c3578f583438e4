"""A plan is checked against its program before it is priced or cached (extract/sanity.py): a carried
reduction whose core no longer varies along its axis, where the program's reduction does, is dropped
(session 66: once, a cross-entropy's rolling sum read exp(−∞ − m) for exp(x[i, d] − m), returned −∞
and was cached; the compile did not reproduce)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from neptune_eq.extract.sanity import lost_axis

from neptune_eq import ir
from neptune_eq.frontend import capture
from neptune_eq.pipeline import Options, compile_program


def _cross_entropy(x, t):
    return F.cross_entropy(x, t)


def _corrupt(plan, axis):
    """`plan` with every load over `axis` in its pass cores replaced by −inf (the plan seen in session 66)."""
    def swap(n):
        return ir.Const(float("-inf")) if isinstance(n, ir.Load) and axis in n.axes else n

    kernels = []
    for k in plan.kernels:
        phases = []
        for ph in k.phases:
            if isinstance(ph, ir.Node) or not hasattr(ph, "comps") or not hasattr(ph, "axis") or ph.axis != axis:
                phases.append(ph)
                continue
            comps = tuple(dataclasses.replace(c, core=ir.rebuild(c.core, lambda _o, n: swap(n))) for c in ph.comps)
            phases.append(dataclasses.replace(ph, comps=comps))
        kernels.append(dataclasses.replace(k, phases=type(k.phases)(phases)))
    return dataclasses.replace(plan, kernels=type(plan.kernels)(kernels))


def test_a_plan_that_lost_its_reduction_axis_is_caught():
    cap = capture(_cross_entropy, torch.randn(64, 24, dtype=torch.float64), torch.randint(0, 24, (64,)))
    c = compile_program(cap.program, Options())
    plans = [a.plan for a in c.alternatives]
    assert plans and all(lost_axis(p, c.bindings) is None for p in plans)  # (every plan offered passes)
    rolling = next(p for p in plans if any(ps.axis == "d" and len(ps.comps) > 1 for k in p.kernels
                                           for ps in k.passes()))
    why = lost_axis(_corrupt(rolling, "d"), c.bindings)
    assert why is not None and "free of d" in why, why
