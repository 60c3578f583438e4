"""Numerics-aware extraction (issue 12): a naive exp(x)/Σexp(x) is extracted in its max-shifted form,
E[x²] − E[x]² in its centred form.

The e-graph gets the shifted spelling from rules.algebra.STABILITY (Σⱼ eᵇ = e^M·Σⱼ e^(b−M)); the
extractor prices exp of an exponent not known ≤ 0 as an overflow risk, so the shifted form wins and
explain() says why. Rows whose values pass 88.7 overflow float32's exp: the naive spelling returned NaN
there where the float64 result is finite.
"""

import pytest
import torch
from neptune_eq.extract.numerics import cancellation_risks, overflow_risks
from neptune_eq.extract.terms import TermExtractor
from neptune_eq.extract.view import build_view, class_of

import neptune_eq
from neptune_eq import ir
from neptune_eq.frontend import capture
from neptune_eq.pipeline import compile_program
from neptune_eq.runtime import compile_ir


def naive_softmax(x):
    e = torch.exp(x)
    return e / e.sum(-1, keepdim=True)


def naive_logsumexp(x):
    return torch.log(torch.exp(x).sum(-1))


def naive_attention(q, k, v):
    p = torch.exp(q @ k.transpose(-1, -2))
    return (p @ v) / p.sum(-1, keepdim=True)


def _hot_rows(shape, dtype, centre, seed=0):
    """Rows around `centre` (±5): exp of them overflows float32 past 88.7 and fp16 past 11.1."""
    g = torch.Generator().manual_seed(seed)
    return (centre + 10 * torch.rand(shape, generator=g, dtype=torch.float64) - 5).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_naive_softmax_of_large_rows_matches_float64(dtype, tmp_path):
    x = _hot_rows((3, 300), dtype, 90.0)  # 300: not a multiple of any tile
    prog = neptune_eq.compile(naive_softmax, x, cache_dir=tmp_path)
    got = prog(x)
    want = torch.softmax(x.double(), -1)
    assert torch.isfinite(got).all()
    assert ((got.double() - want).norm() / want.norm()).item() < {torch.float32: 1e-5}.get(dtype, 1e-2)
    assert "max-shifted form was chosen" in prog.explain()
    assert "sums exp" in prog.explain() and "x[i, d]" in prog.explain()
    # in every dtype (the kernels compute in float32, where e^90 overflows) each row sums to one
    assert torch.allclose(got.double().sum(-1), torch.ones(3, dtype=torch.float64), atol=1e-2)


def test_naive_logsumexp_of_rows_at_plus_and_minus_80(tmp_path):
    x = torch.cat([_hot_rows((2, 257), torch.float32, 95.0), _hot_rows((2, 257), torch.float32, -95.0, 1)])
    prog = neptune_eq.compile(naive_logsumexp, x, cache_dir=tmp_path)
    got = prog(x)
    want = torch.logsumexp(x.double(), -1)
    assert torch.isfinite(got).all()
    assert (got.double() - want).abs().max().item() < 1e-4
    assert "max_d" in prog.alternatives[0].structure  # the max the shift needs is a pass of its own or rolled


def test_naive_attention_gets_the_shift_and_stays_one_kernel(tmp_path):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(40, 16, generator=g) * 4 for _ in range(3))  # scores reach ~±200
    prog = neptune_eq.compile(naive_attention, q, k, v, cache_dir=tmp_path)
    got = prog(q, k, v)
    want = torch.softmax(q.double() @ k.double().T, -1) @ v.double()
    assert torch.isfinite(got).all()
    assert ((got.double() - want).norm() / want.norm()).item() < 1e-4
    assert len(prog.alternatives[0].plan.kernels) == 1
    assert any("rolling" in a.structure for a in prog.alternatives)  # FlashAttention's repair still found


def test_the_stress_sets_pass_where_they_used_to_overflow(tmp_path):
    prog = neptune_eq.compile(naive_softmax, torch.randn(4, 200), cache_dir=tmp_path)
    report = prog.verify(sets=("normal", "offset", "wide"), seed=0)  # wide: 30·N(0,1) reaches ±100
    assert report.passed, report


def test_a_stable_program_and_one_without_a_stable_equivalent_get_no_note(tmp_path):
    x = torch.randn(4, 64)
    stable = neptune_eq.compile(lambda x: torch.softmax(x, -1), x, cache_dir=tmp_path)
    plain = neptune_eq.compile(lambda x: torch.exp(x) * 2.0, x, cache_dir=tmp_path)
    assert "numerics" not in stable.explain() and "numerics" not in plain.explain()


def test_nonpos_analysis_marks_shifted_exponents_only():
    c = compile_program(capture(naive_softmax, torch.randn(2, 8)).program)
    assert c.numerics_notes and not c.overflow_risks  # after the stabilise phase: nothing left at risk
    view = build_view(c.egraph)
    tx = TermExtractor(view, c.encoder.axis_order, dict(c.program.axes), c.encoder.loads, c.encoder.syms)
    roots = [class_of(c.egraph, view, c.roots[n]) for n in c.roots]
    terms, classes = tx.best_shared(roots)
    exps = [n for t in terms for n in ir.walk(t) if isinstance(n, ir.Call) and n.op in ("exp", "exp2")]
    assert exps and not overflow_risks(terms, classes, view)  # every chosen exponent is x − max x
    blind = TermExtractor(view, c.encoder.axis_order, dict(c.program.axes), c.encoder.loads, c.encoder.syms,
                          overflow_risk=0.0)  # priced by work alone, the unshifted exp(x) is cheaper
    assert overflow_risks(*blind.best_shared(roots), view)


def test_torch_softmax_never_enters_the_stabilise_phase():
    c = compile_program(capture(lambda x: torch.log_softmax(x, -1), torch.randn(2, 8)).program)
    assert not c.overflow_risks and "stabilise" not in " ".join(str(r) for r in c.saturator.reports)


# ---------------------------------------------------------------- cancellation: E[x²] − E[x]²


def moments_variance(x):
    return (x * x).mean(-1) - x.mean(-1) ** 2


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float16, 2e-3)])
def test_a_difference_of_moments_is_extracted_centred(dtype, tol):
    """E[x²] − E[x]² at a mean of 1e4 and a spread of 1: float32 computing it as written is wrong by
    tens of times the answer; the centred form the e-graph holds matches float64, and explain() says so."""
    torch.manual_seed(5)
    x = (1e4 + torch.randn(3, 700)).to(dtype)
    c = capture(moments_variance, x)
    p = compile_ir(c.program)
    want = moments_variance(x.double())
    if dtype == torch.float32:  # what the formula as written gives in float32
        assert ((moments_variance(x).double() - want).abs() / want).max() > 1.0
    got = c.call_with(p.run, (x,))
    assert torch.allclose(got.double(), want, rtol=tol, atol=0), (got, want)
    assert "the centred form was chosen" in p.explain()
    comp = p.compilation
    assert comp.numerics_notes and not comp.cancel_risks
    view = build_view(comp.egraph)
    roots = [class_of(comp.egraph, view, comp.roots[n]) for n in comp.roots]
    blind = TermExtractor(view, comp.encoder.axis_order, dict(comp.program.axes), comp.encoder.loads,
                          comp.encoder.syms, cancel_risk=0.0)  # priced by work alone, the difference is cheaper
    assert cancellation_risks(*blind.best_shared(roots), view)


def test_a_centred_variance_never_enters_the_stabilise_phase():
    c = compile_program(capture(lambda x: x.var(-1), torch.randn(2, 8)).program)
    assert not c.cancel_risks and "stabilise" not in " ".join(str(r) for r in c.saturator.reports)
