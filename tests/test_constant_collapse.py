"""An e-graph that equates two numbers is never extracted from (phases.saturated): a refinement
guarded by not_zero(b) fires before the algebra proves b = 0, and 0/0 then merges every constant the
rule met (a hunt, session 56: a 0/0 compiled to −3.3e−4, a 1/0 to −6.3e16, verify() passed)."""

from __future__ import annotations

import torch
from neptune_eq.extract.view import EGraphView, ENode, merged_constants

import neptune_eq
from neptune_eq import dsl as ne
from neptune_eq.ir import NeptuneError
from neptune_eq.runtime import compile_ir


def _view(*classes: list[float]) -> EGraphView:
    return EGraphView(classes={k: [ENode("const", (v,), "Term") for v in vals] for k, vals in enumerate(classes)})


def test_merged_constants_tells_rounding_from_a_collapse():
    assert merged_constants(_view([6.249890000000001, 6.24989], [2.0])) is None  # (two foldings' rounding)
    assert merged_constants(_view([-9e-10, 7e-10, 0.0])) is None  # (0 to every kernel)
    assert merged_constants(_view([0.0, -0.0])) is None
    assert merged_constants(_view([3.0], [0.0, 1.0])) == [0.0, 1.0]
    assert merged_constants(_view([-7e19, 3e19])) is not None


def _nan_or_refused(run) -> None:
    """Either answer is right, never a number: which one depends on how far the saturations get before
    their time budgets (the second, without the refinements, may still equate numbers, or not)."""
    try:
        out = run()
    except NeptuneError as e:
        assert "equates the numbers" in str(e)
    else:
        assert torch.isnan(out).all(), out


def test_a_value_divided_by_a_sum_the_algebra_proves_zero_is_nan_or_refused():
    P = ne.program("zero_over_zero")
    i, j = P.axes(i=1, j=5)
    x = P.input("x", i, j)
    P.output("r", ne.sum(x - x, j) / ne.sum(x - x, j))
    x = torch.randn(1, 5)
    _nan_or_refused(lambda: compile_ir(P.build()).run({"x": x})["r"])

    def fn(x):
        s = (x - x).sum(-1)
        return s / s

    _nan_or_refused(lambda: neptune_eq.compile(fn, torch.randn(2, 5))(torch.randn(2, 5)))


def test_a_zero_sum_beside_another_output_stays_zero_to_rounding():
    P = ne.program("beside")
    i, j = P.axes(i=3, j=5)
    x = P.input("x", i, j)
    P.output("r", ne.sum(x - x, j))
    P.output("s", ne.sum(ne.exp(x) * ne.exp(-x), j))
    out = compile_ir(P.build()).run({"x": torch.randn(3, 5)})
    assert out["r"].abs().max().item() < 1e-6
    assert torch.allclose(out["s"], torch.full((3,), 5.0))


def test_constants_rounded_two_ways_are_not_a_refusal():
    """Extended fuzz seed 42: logaddexp(x / max(|x|, 1e-3), x). Folding 1/1e-3 and log2(e) into products
    in two orders rounds one real number two ways; an ulp's difference times 1000⁶ (−2.3e14) was equated
    with the 0 another path proved, with or without the refinements, and the program was refused. Saturated
    again without the float64 folds it compiles, and matches torch."""
    def fn(x):
        return torch.logaddexp(x / x.abs().clamp_min(1e-3), x)

    x = torch.randn(7, 4, generator=torch.Generator().manual_seed(0))
    prog = neptune_eq.compile(fn, x)
    assert torch.allclose(prog(x), fn(x), atol=1e-6)
    assert "without folding constants" in prog.explain()
