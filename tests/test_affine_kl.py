"""Affine repairs with several running references (issue 12): KL(softmax(a) ‖ softmax(b)) in one pass.

The body Σ e^{a−m_a−log Z_a}·((a − m_a − log Z_a) − (b − m_b − log Z_b)) reads two log-sum-exps that
move as the pass goes on. The search moves them one at a time (fusion/affine.py), sees functions of
one running value as symbols (fusion/extrapolate.py::opaque_symbols), and skips groups whose body is
no combination of their accumulators (span_test) before spending an e-graph budget on them.
"""

from __future__ import annotations

import pytest
import torch

from neptune_eq import ir
from neptune_eq.frontend import capture
from neptune_eq.fusion.affine import to_old
from neptune_eq.fusion.affine_check import check_affine, span_test
from neptune_eq.fusion.extrapolate import opaque_symbols
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir
from neptune_eq.saturate import Budget

OLD, CUR, FIN = ir.RefKind.OLD, ir.RefKind.CURRENT, ir.RefKind.FINAL
ONE_PASS = "rolling over d (max_d, sum_d, max_d2, sum_d2, sum_d3)"


def kl(a, b):
    la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    return (la.exp() * (la - lb)).sum(-1)


def _x() -> ir.Node:
    return ir.Load("x", (ir.Index("i"), ir.Index("d")))


def _ref(kind, name):
    return ir.StateRef(kind, name, ("i",))


def _call(op, *args):
    return ir.Call(op, tuple(args))


# ---------------------------------------------------------------- units


def test_span_test_needs_the_accumulator_a_repair_borrows():
    """Σ e^{x−m′}(x − m′) moves by e^{m−m′} and borrows (m − m′)·Σ e^{x−m}: without Σ e^{x−m} among
    the carried sums no coefficients exist, whatever the rules; with it the test passes."""
    x = _x()
    body = lambda m: _call("mul", _call("exp", _call("sub", x, m)), _call("sub", x, m))  # noqa: E731
    core, old = body(_ref(CUR, "m")), body(_ref(OLD, "m"))
    norm = _call("exp", _call("sub", x, _ref(OLD, "m")))
    miss = span_test(core, {"t": old}, "d")
    assert miss is not None and "is not a combination of t" in miss
    assert span_test(core, {"t": old, "s": norm}, "d") is None


def test_span_test_judges_huge_finite_values_without_warnings():
    """Bodies whose finite values pass 1e154 (an exp of a sampled value times a large constant) had their
    norms' squares overflow: numpy's RuntimeWarnings leaked out of a compile (fuzz seed 1607). The draw is
    scaled first, and a body in the span still passes. (Such a draw judges little — its largest point
    dominates the fit — and the test only prunes: passing a body is always safe, the search and
    check_affine decide.)"""
    import warnings

    x = _x()
    big = _call("exp", _call("mul", x, ir.Const(200.0)))  # e^{200x}: up to ~1e520 → inf, or ~1e200 finite
    core = _call("mul", big, _ref(CUR, "s"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert span_test(core, {"t": _call("mul", big, _ref(OLD, "s"))}, "d") is None


def test_opaque_symbols_pair_current_and_old_forms():
    x, m_cur, m_old = _x(), _ref(CUR, "m"), _ref(OLD, "m")
    guard = lambda m: _call("where", _call("eq", m, ir.Const(float("-inf"))), ir.Const(0.0), m)  # noqa: E731
    log_cur, log_old = _call("log", _ref(CUR, "s")), _call("log", _ref(OLD, "s"))
    fixed = _call("add", _ref(FIN, "f"), _call("log", _ref(FIN, "g")))
    core = _call("exp", _call("sub", _call("sub", x, _call("add", guard(m_cur), log_cur)), fixed))
    old = _call("exp", _call("sub", _call("sub", x, _call("add", guard(m_old), log_old)), fixed))
    out = opaque_symbols([core, old], "d", ("i",))
    assert out[guard(m_cur)].name == out[guard(m_old)].name and out[guard(m_cur)].kind is CUR
    assert out[log_cur].name == out[log_old].name and out[log_old].kind is OLD
    assert out[fixed].kind is FIN
    # a subterm reading a running value and anything else stays open: the rebasing pairs its parts
    assert _call("add", guard(m_cur), log_cur) not in out
    assert not any(ir.Index("d") in ir.walk(k) for k in out)


# ---------------------------------------------------------------- KL in one pass


def _compile_unhurried(program):
    """The compile with its wall-clock budgets (the compile's, the affine searches') ten times the
    default: the repair is found in ~1 s alone, but the suite's other worker on a loaded 2-core
    machine had starved them (these tests ask whether the repair exists and holds, not how fast the
    search is)."""
    from dataclasses import replace

    from neptune_eq.fusion import search

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(search, "AFFINE_TOTAL_SECONDS", 10 * search.AFFINE_TOTAL_SECONDS)
        budget = search.AFFINE_BUDGET
        mp.setattr(search, "AFFINE_BUDGET", replace(budget, max_seconds=10 * budget.max_seconds))
        return compile_ir(program, Options(budget=Budget(max_seconds=200.0)))


@pytest.fixture(scope="module")
def kl32():
    torch.manual_seed(0)
    a, b = torch.randn(3, 3000) * 3, torch.randn(3, 3000) * 3  # long enough to be split (and no tile multiple)
    c = capture(kl, a, b)
    return c, _compile_unhurried(c.program), (a, b)


def test_kl_repair_is_found_and_holds_in_float64(kl32):
    _, p, _ = kl32
    groups = [lp for lp in p.compilation.fusion.valid if len(lp.names) == 5]
    assert groups, [(lp.names, lp.reason[:200]) for lp in p.compilation.fusion.candidates if len(lp.names) == 5]
    (lp,) = groups
    c = next(c for c in lp.comps if c.chosen_affine is not None)
    assert c.binding.name == "sum_d3" and set(c.chosen_affine.terms) >= {"sum_d3", "sum_d"}
    basis = {o.binding.name: to_old(o.core, lp.names) for o in lp.comps if o.binding.op == "sum"}
    assert check_affine(c.core, basis, c.chosen_affine, seed=5) is None
    text = [a.detail for a in lp.applications if a.rule == "affine_update"]
    assert text and text[0].startswith("sum_d3 carried with an affine repair sum_d3 ← "), text
    # log_softmax's exponent is known ≤ 0: no max of it is added to keep exp(log p) from overflowing
    assert "max_d3" not in {b.name for b in p.compilation.bindings}


def test_kl_one_pass_and_split_match_float64(kl32):
    c, p, xs = kl32
    want = kl(*(x.double() for x in xs))
    one = [i for i, a in enumerate(p.alternatives) if ONE_PASS in a.structure]
    picked = [next(i for i in one if "split" not in p.alternatives[i].structure),
              next(i for i in one if "split-K" in p.alternatives[i].structure)]
    for i in picked:
        got = c.call_with(p.pin(i).run, xs)
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6), (p.alternatives[i].structure, got, want)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_kl_one_pass_half_precision(dtype, tol):
    torch.manual_seed(1)
    a, b = (torch.randn(3, 700) * 3).to(dtype), (torch.randn(3, 700) * 3 + 40).to(dtype)  # b shifted: lse moves
    c = capture(kl, a, b)
    p = _compile_unhurried(c.program)
    want = kl(a.double(), b.double())
    i = next(i for i, a in enumerate(p.alternatives) if ONE_PASS in a.structure)
    got = c.call_with(p.pin(i).run, (a, b))
    assert torch.allclose(got.double(), want, rtol=tol, atol=tol), (got, want)


def test_a_cut_short_plan_space_keeps_the_fewest_passes(kl32):
    """Each cover of the reductions brings a plan per split choice: the unfused cover alone fills a
    small max_plans. Covers are taken fewest passes first, so the one-pass plan survives the cut."""
    from neptune_eq.pipeline import Options

    c, _, _ = kl32
    p = compile_ir(c.program, Options(max_plans=6))
    assert p.compilation.plans_truncated
    assert any(ONE_PASS in a.structure for a in p.alternatives), [a.structure for a in p.alternatives]
