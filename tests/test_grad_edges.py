"""Gradients at the edges of their functions, against float64 torch (interpreter, tiny shapes): an
exponential that overflows where its cotangent is 0, a norm or standard deviation of a zero row, a
variance with no degree of freedom, an argument written in place that requires grad."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq.frontend import capture
from neptune_eq.grad import NoBackward, backward_program


def _grad(fn, x):
    """(our gradient of fn(x).sum(), float64 torch's)."""
    prog = neptune_eq.compile(fn, x)
    a, b = x.clone().requires_grad_(), x.double().requires_grad_()
    prog(a).sum().backward()
    fn(b).sum().backward()
    return a.grad.double(), b.grad


@pytest.mark.parametrize("fn", [torch.sigmoid, F.silu, F.softplus], ids=["sigmoid", "silu", "softplus"])
def test_an_overflowing_exponential_keeps_a_zero_cotangent(fn):
    """σ(x) = 1/(1 + e⁻ˣ) at x = −100: e¹⁰⁰ overflows, the quotient's cotangent is 0, and 0·∞ was NaN."""
    x = torch.tensor([[-100.0, -20.0, 0.0, 20.0, 100.0]])
    ours, ref = _grad(lambda t: fn(t).sum(-1), x)
    assert torch.isfinite(ours).all() and torch.allclose(ours, ref, atol=1e-6), (ours, ref)


def test_softmax_and_attention_backwards_gain_no_select():
    """An exponential shifted by its row maximum (softmax's, attention's saved log-sum-exp) is at most
    1: its derivative keeps no zero guard, so their backward loops have no extra select."""
    def attn(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v

    xs = [torch.randn(2, 5, 8) for _ in range(3)]
    back = backward_program(capture(attn, *xs).program, saved=True).program
    assert "== 0, 0," not in str(back), back


@pytest.mark.parametrize("fn", [lambda x: x.norm(dim=-1), lambda x: x.std(-1),
                                lambda x: F.normalize(x, dim=-1, eps=1e-3)], ids=["norm", "std", "normalize"])
def test_a_zero_row_has_torchs_gradient(fn):
    """‖x‖ and std at a zero (or constant) row: torch's gradient is 0 there (F.normalize's 1/eps); the
    chain rule through √0 had given ∞·0 = NaN for the whole row."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    x[1] = 0.0
    ours, ref = _grad(fn, x)
    assert torch.isfinite(ours).all() and torch.allclose(ours, ref, rtol=1e-4, atol=1e-5), (ours, ref)


def test_a_variance_with_no_degree_of_freedom_is_torchs():
    """torch divides by max(0, n − correction): NaN over one element, ∞ where the correction exceeds n
    (a size-1 dimension had given 0, a correction of 5 over 3 elements a negative variance)."""
    x = torch.randn(3, 3, generator=torch.Generator().manual_seed(1))
    for fn in (lambda t: t[:, :1].var(-1), lambda t: t.var(-1, correction=5), lambda t: t.std(-1, correction=5)):
        got, want = neptune_eq.compile(fn, x)(x), fn(x.double())
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), (got, want)


def test_an_argument_written_in_place_that_requires_grad_is_refused():
    """The backward would read the value the call overwrites (autograd raised inside our backward)."""
    def scale(x):
        x.mul_(2)
        return torch.softmax(x, -1)

    x = torch.randn(4, 5)
    prog = neptune_eq.compile(scale, x.clone())
    with pytest.raises(NoBackward, match=r"argument 'x' is written in place .* requires grad"):
        prog(torch.randn(4, 5, requires_grad=True) * 1)


@pytest.mark.parametrize("fn", [F.relu, F.relu6, F.hardtanh, lambda x: x.clamp(0.0, 1.0), lambda x: x.clamp_min(0.0)],
                         ids=["relu", "relu6", "hardtanh", "clamp", "clamp_min"])
def test_kinks_take_torchs_side(fn):
    """At a kink the gradient is torch's: 0 for ReLU at 0 and hardtanh at its bounds, 1 for clamp at its
    bounds (a tie of max2 had split it in halves); NaN and ±inf pass through the forward as torch's."""
    x = torch.tensor([[0.0, 1.0, 0.5, -1.0, 6.0, 7.0, float("nan"), float("inf"), -float("inf")]])
    got = neptune_eq.compile(lambda t: fn(t) * 1.0, x)(x)
    want = fn(x.double())
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()].double(), want[~want.isnan()])
    finite = x[:, :6]
    ours, ref = _grad(lambda t: fn(t).sum(-1), finite)
    assert torch.equal(ours, ref), (ours, ref)
