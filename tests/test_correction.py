"""Corrections are found by saturating the quotient, never written by hand."""

import numpy as np
from neptune_eq.rules.algebra import ALGEBRA
from neptune_eq.rules.soundness import eval_ir_sampled

from neptune_eq import dsl as ne
from neptune_eq import ir
from neptune_eq.fusion.correction import correction_for
from neptune_eq.runtime import compile_ir

AXES = ("i", "j")
EXT = {"i": 8, "j": 64}
x = ir.Load("x", (ir.Index("i"), ir.Index("j")))
cur, old = ir.StateRef(ir.RefKind.CURRENT, "m", ("i",)), ir.StateRef(ir.RefKind.OLD, "m", ("i",))


def sub_state(e):
    return ir.substitute(e, {cur: old})


def search(core, monoid="sum"):
    return correction_for(core, sub_state(core), monoid, "j", AXES, EXT, ALGEBRA)


def test_softmax_correction_is_exp_of_the_shift():
    core = ir.Call("exp", (ir.Call("sub", (x, cur)),))
    r = search(core)
    assert r.found and r.dist == "mul"
    assert "j" not in r.correction.axes and not any(isinstance(n, ir.Load) for n in ir.walk(r.correction))
    rng = np.random.default_rng(0)
    env = {"cur:m": rng.normal(0, 3, 100), "old:m": rng.normal(0, 3, 100)}
    np.testing.assert_allclose(eval_ir_sampled(r.correction, env), np.exp(env["old:m"] - env["cur:m"]),
                               rtol=1e-12)


def test_max_consumer_gets_additive_correction():
    core = ir.Call("sub", (x, cur))  # max_j (x - m): shifting the reference subtracts
    r = search(core, "max")
    assert r.found and r.dist == "add"
    env = {"cur:m": np.array([1.0, 5.0]), "old:m": np.array([3.0, -2.0])}
    np.testing.assert_allclose(eval_ir_sampled(r.correction, env), env["old:m"] - env["cur:m"])


def test_no_correction_for_a_body_without_one():
    core = ir.Call("tanh", (ir.Call("sub", (x, cur)),))  # tanh(x - m): no factor moves m
    r = search(core)
    assert not r.found
    assert "no term free of j" in r.reason


def test_rejected_fusion_is_recorded_and_plan_still_correct():
    P = ne.program("tanh_chain")
    i, j = P.axes(i=4, j=40)
    xx = P.input("x", i, j)
    m = ne.max(xx, j)
    P.output("y", ne.sum(ne.tanh(xx - m), j))
    prog = compile_ir(P.build())
    rejected = [lp for lp in prog.compilation.fusion.rejected if lp.reason]
    assert rejected and "no correction" in rejected[0].reason
    assert all(not any(c.producers for c in ph.comps) for k in prog.plan.kernels for ph in k.passes())
    assert prog.verify(seed=3).passed


def test_correction_over_two_producers():
    """p = exp(x − m)/l normalised before the sum: the quotient still cancels the per-element terms."""
    v = ir.Load("v", (ir.Index("j"),))
    cur_l, old_l = ir.StateRef(ir.RefKind.CURRENT, "l", ("i",)), ir.StateRef(ir.RefKind.OLD, "l", ("i",))
    core = ir.Call("mul", (ir.Call("div", (ir.Call("exp", (ir.Call("sub", (x, cur)),)), cur_l)), v))
    old_core = ir.substitute(core, {cur: old, cur_l: old_l})
    r = correction_for(core, old_core, "sum", "j", AXES, EXT, ALGEBRA)
    assert r.found and "j" not in r.correction.axes
    rng = np.random.default_rng(1)
    env = {k: rng.normal(0, 2, 50) for k in ("cur:m", "old:m")}
    env.update({k: rng.uniform(0.5, 4, 50) for k in ("cur:l", "old:l")})
    want = np.exp(env["old:m"] - env["cur:m"]) * env["old:l"] / env["cur:l"]
    np.testing.assert_allclose(eval_ir_sampled(r.correction, env), want, rtol=1e-12)


def test_alibi_positions_promoted_to_float_still_roll():
    """ALiBi adds slope·float(j − i): the typed int→float cast must be finite to the analysis, or the
    quotient's common score never cancels and the rolling (FlashAttention) plan disappears."""
    import sys

    import torch
    from helpers import EXAMPLES

    from neptune_eq.frontend import capture
    from neptune_eq.pipeline import compile_program

    sys.path.insert(0, str(EXAMPLES))
    import neptune_ops

    for op in ("alibi_pf", "alibi_dc"):
        q, k, v = neptune_ops.example_inputs(op, 64, dtype=torch.float16, device="cpu", head_dim=16, heads=(2, 2))
        c = compile_program(capture(getattr(neptune_ops, op), q, k, v).program)
        three = [lp for lp in c.fusion.candidates if set(lp.names) == {"max_j", "sum_j", "sum_j2"}]
        assert three and three[0].valid, three[0].reason if three else c.fusion.candidates


def test_a_correction_undefined_where_the_body_is_zero_is_refused():
    """h comes from the e-class of the quotient body(n′) / body(n); for g / n that class held
    g / (n′ · (g / n)), NaN wherever the cotangent g is 0, so the rolled state 0 · NaN was NaN where the
    gradient is 0 (torch.stack then amax: NaN gradients for the rows of a one-hot cotangent). The
    check finds it on sampled values; old / new is accepted."""
    from neptune_eq import ir
    from neptune_eq.fusion.correction import repair_failure

    g = ir.Load("g", (ir.Index("i"),))
    cur, old = (ir.StateRef(kind, "n", ("i",)) for kind in (ir.RefKind.CURRENT, ir.RefKind.OLD))
    core, old_core = ir.Call("div", (g, cur)), ir.Call("div", (g, old))
    nan_at_zero = ir.Call("div", (g, ir.Call("mul", (cur, old_core))))
    assert "old mul h = np.float64(nan)" in repair_failure(core, old_core, nan_at_zero, "mul")
    assert repair_failure(core, old_core, ir.Call("div", (old, cur)), "mul") is None


def test_a_mask_testing_a_running_value_stays_in_the_core_on_every_plan():
    """The count of a row's maxima, Σ_e [x_e == max_e x]: its select tests the running max, so it is no
    mask (a mask's verdict on an element never changes). Split off as one, the quotient was 1/1 and the
    rolled count kept every element that had equalled some running max: 2–26 maxima a row, where there
    is one, on every streamed plan (silently wrong until session 55). Since session 73 the count rolls
    with the max by a reset (fusion/reset.py: kept where the max did not move, 0 where it did). Every
    alternative, ties and a NaN row included, against float64."""
    import torch

    import neptune_eq

    def maxima(x):
        return (x == x.amax(-1, keepdim=True)).float().sum(-1)

    x = torch.randn(6, 4096, generator=torch.Generator().manual_seed(0))
    x[0, 100] = x[0, 3000] = 10.0
    x[1, 7] = float("nan")
    want = maxima(x.double()).float()
    prog = neptune_eq.compile(maxima, x).program
    rolled = [a for a in prog.alternatives if "rolling" in a.structure]
    assert rolled and all("selection_reset" in " ".join(a.plan.derivation) for a in rolled)
    for alt in [*prog.alternatives[:8], *rolled[:4]]:
        (got,) = prog.pin(alt.id).run({"x": x}).values()
        assert torch.equal(got.flatten(), want), (alt.structure, got)
