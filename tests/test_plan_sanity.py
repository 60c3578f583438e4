"""A plan is checked against its program before it is priced or cached (extract/sanity.py): a carried
reduction whose core no longer varies along its axis, where the program's reduction does, is dropped
(session 66: once, a cross-entropy's rolling sum read exp(−∞ − m) for exp(x[i, d] − m), returned −∞
and was cached; the compile did not reproduce)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from neptune_eq.extract.sanity import differs, lost_axis, unready_state

from neptune_eq import ir, pipeline
from neptune_eq.egg_write import write
from neptune_eq.frontend import capture
from neptune_eq.pipeline import Options, compile_program
from neptune_eq.runtime import CompiledProgram


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


def test_a_plan_reading_a_final_value_before_it_is_computed_is_caught():
    """Every plan offered reads a final value (fin:x) only after its kernel computed it; one whose pass
    reads its own sum's final value (what session 75's merge slip made) is named."""
    cap = capture(_cross_entropy, torch.randn(64, 24, dtype=torch.float64), torch.randint(0, 24, (64,)))
    c = compile_program(cap.program, Options())
    plans = [a.plan for a in c.alternatives]
    assert plans and all(unready_state(p) is None for p in plans)
    plan = next(p for p in plans if any(ps.comps for k in p.kernels for ps in k.passes()))
    k, ps = next((k, ps) for k in plan.kernels for ps in k.passes() if ps.comps)
    comp = ps.comps[-1]
    late = dataclasses.replace(comp, core=ir.Call("add", (comp.core, comp.ref(ir.RefKind.FINAL))))
    bad = dataclasses.replace(plan, kernels=[dataclasses.replace(
        kk, phases=[dataclasses.replace(ph, comps=[*ph.comps[:-1], late]) if ph is ps else ph for ph in kk.phases])
        if kk is k else kk for kk in plan.kernels])
    why = unready_state(bad)
    assert why is not None and comp.name in why and "before it is computed" in why, why


def _exp_minus(a, m):
    safe = ir.Call("where", (ir.Call("eq", (m, ir.Const(float("-inf")))), ir.Const(0.0), m))
    return ir.Call("exp", (ir.Call("sub", (a, safe)),))


def test_a_body_term_that_does_not_take_the_bodys_values_is_named():
    x = ir.Load("x", (ir.Index("i"), ir.Index("d")))
    m = ir.StateRef(ir.RefKind.CURRENT, "max_d", ("i",))
    body = _exp_minus(x, m)
    for wrong in (_exp_minus(ir.Const(float("-inf")), m), _exp_minus(m, m)):  # (the two seen in session 67)
        why = differs(wrong, body)
        assert why is not None and ir.show(wrong) in why, why
    safe = ir.Call("where", (ir.Call("eq", (m, ir.Const(float("-inf")))), ir.Const(0.0), m))
    same = ir.Call("div", (ir.Call("exp", (x,)), ir.Call("exp", (safe,))))
    assert differs(same, body) is None  # another spelling of the same values
    held = ir.Load("saved_0", (ir.Index("i"),))
    assert differs(_exp_minus(x, held), body) is None  # (a leaf the body lacks: not compared)


def test_a_loop_whose_body_term_is_wrong_is_dropped_and_the_compile_stays_right(monkeypatch):
    """Session 67: the e-class looked up for a rolling cross-entropy's body exp(x − m) held exp(m − m)
    alone (rare, not root-caused). Simulated here by handing the fusion's rolling body that wrong term:
    the loop is dropped with its reason, and the plans left compute the program."""
    x64 = torch.randn(48, 24, dtype=torch.float64)
    t = torch.randint(0, 24, (48,))
    cap = capture(_cross_entropy, x64, t)
    real = pipeline._fuse

    def fuse(c, rules):
        real(c, rules)
        for lp in c.fusion.candidates:
            for comp in lp.comps:
                if comp.producers and lp.axis == "d":
                    m = next(r for r in ir.walk(comp.core) if isinstance(r, ir.StateRef) and r.running)
                    comp.core_term = c.encoder.encode(_exp_minus(m, m))
                    write(c.egraph, comp.core_term)
        c.encoder.flush()

    monkeypatch.setattr(pipeline, "_fuse", fuse)
    c = compile_program(cap.program, Options())
    assert any("does not take its values" in why for why in c.dropped_loops), c.dropped_loops
    assert all(not (ps.axis == "d" and any(cp.producers for cp in ps.comps))
               for a in c.alternatives for k in a.plan.kernels for ps in k.passes())  # no rolling pass left
    out = CompiledProgram(c).run({"x": x64, "t": t})
    ref = F.cross_entropy(x64, t)
    assert torch.allclose(next(iter(out.values())).reshape(ref.shape), ref, rtol=1e-9, atol=1e-12)
