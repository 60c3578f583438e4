"""Gradients at the edges of their functions, against float64 torch (interpreter, tiny shapes): an
exponential that overflows where its cotangent is 0, a norm or standard deviation of a zero row, a
variance with no degree of freedom, an argument written in place that requires grad."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_gradients_match

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


@pytest.mark.parametrize("fn", [F.relu, F.relu6, F.hardtanh, lambda x: x.clamp(0.0, 1.0), lambda x: x.clamp_min(0.0),
                                lambda x: torch.maximum(x, torch.zeros_like(x)), F.logsigmoid,
                                lambda x: F.hardswish(x.clamp(-9.0) * 3), lambda x: F.hardsigmoid(x * 3)],
                         ids=["relu", "relu6", "hardtanh", "clamp", "clamp_min", "maximum", "logsigmoid", "hardswish",
                              "hardsigmoid"])
def test_kinks_take_torchs_side(fn):
    """At a kink the gradient is torch's: 0 for ReLU at 0 and hardtanh at its bounds, 1 for clamp at its
    bounds, ½ for torch.maximum's tie with a zero tensor, 0 and 1 for hardswish at ∓3, 0 for
    hardsigmoid at ±3; log σ is smooth at 0 (½ there: its stable form min(x, 0) − log1p(e^−|x|) has a
    kink in each term that must not be taken from one side in one and split in the other). NaN and
    ±inf pass through the forward as torch's."""
    x = torch.tensor([[0.0, 1.0, 0.5, -1.0, 6.0, 7.0, float("nan"), float("inf"), -float("inf")]])
    got = neptune_eq.compile(lambda t: fn(t) * 1.0, x)(x)
    want = fn(x.double())
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.allclose(got[~got.isnan()].double(), want[~want.isnan()], rtol=1e-6, atol=1e-7)
    finite = x[:, :6]
    ours, ref = _grad(lambda t: fn(t).sum(-1), finite)
    assert torch.allclose(ours, ref, rtol=1e-6, atol=1e-7), (ours, ref)


def test_detached_values_take_no_gradient():
    """x.detach() inside the compiled function: the forward is the same program (the detached row max
    still fuses), the gradient stops there as torch's; an embedding's padding row gets none; a
    torch.no_grad() block, which the traced graph does not record, is refused when gradients are
    needed, naming its line (a call without gradients runs)."""
    x = torch.randn(3, 6)
    for fn in (lambda t: t * t.detach().mean(), lambda t: (t - t.detach()).exp(), lambda t: t * t.data.mean(),
               lambda t: torch.softmax(t - t.amax(-1, keepdim=True).detach(), -1) * t):
        ours, ref = _grad(fn, x)
        assert torch.allclose(ours, ref, atol=1e-6), (ours, ref)
    ids = torch.tensor([[0, 1, 2], [0, 3, 3]])
    w = torch.randn(4, 3)
    ours, ref = _grad(lambda t: F.embedding(ids, t, padding_idx=0) * 2, w)
    assert torch.equal(ours[0], torch.zeros(3, dtype=torch.float64)) and torch.allclose(ours, ref, atol=1e-6)
    with pytest.raises(neptune_eq.NeptuneError, match=r"scale_grad_by_freq"):
        neptune_eq.compile(lambda t: F.embedding(ids, t, scale_grad_by_freq=True), w)

    def blocked(t):
        with torch.no_grad():
            m = t.amax(-1, keepdim=True)
        return (t - m).exp().sum(-1)

    prog = neptune_eq.compile(blocked, x)
    assert torch.allclose(prog(x), blocked(x), atol=1e-6)
    with pytest.raises(NoBackward, match=r"turns gradients off inside \(test_grad_edges\.py:\d+: with torch"):
        prog(x.clone().requires_grad_())

    def inferred(t):
        with torch.inference_mode():
            m = t.amax(-1, keepdim=True)
        return (t - m).exp().sum(-1)

    with pytest.raises(NoBackward, match=r"turns gradients off inside \(test_grad_edges\.py:\d+: m = t.amax"):
        neptune_eq.compile(inferred, x)(x.clone().requires_grad_())


def test_a_spread_of_zero_has_torchs_gradient_and_no_literal_division_by_zero():
    """std of a value constant along its axis (broadcast, or x·0): its backward divides a literal 0 by 0,
    which Triton's Python would raise on; folded to NaN and guarded, the gradient is torch's."""
    for fn, shape in ((lambda t: t.expand(5, 4).std(-1), (5, 1)), (lambda t: (t * 0).std(-1) + t.sum(-1), (5, 4))):
        ours, ref = _grad(fn, torch.randn(*shape))
        assert torch.equal(ours, ref), (ours, ref)


def test_a_slice_reduced_over_two_dims_keeps_its_gradient_outside_the_slice():
    """x[:, -3:].var((1, 2)) and F.layer_norm over a slice: rows outside the slice get gradient 0 (not
    NaN), and a product with a slice is summed over both dimensions."""
    x = torch.randn(2, 5, 7)
    for fn in (lambda t: t[:, -3:].var((1, 2)), lambda t: F.layer_norm(t[:, 1:4], (3, 7))):
        ours, ref = _grad(fn, x)
        assert torch.allclose(ours, ref, atol=1e-5), (ours, ref)
    y = torch.randn(2, 3, 7)
    assert torch.allclose(neptune_eq.compile(lambda a, b: (a[:, :3] * b).sum((1, 2)), x, y)(x, y),
                          (x[:, :3] * y).sum((1, 2)), atol=1e-5)


def test_an_argument_read_with_as_strided_must_come_contiguous():
    """as_strided of contiguous strides is captured as a reshape of the logical values; a call with a
    transposed argument would read its storage in eager PyTorch: refused, naming the argument."""
    def view(t):
        return torch.as_strided(t, (5, 7), (7, 1)) * 2

    prog = neptune_eq.compile(view, torch.randn(5, 7))
    x = torch.arange(35.0).reshape(7, 5).t()
    assert torch.equal(prog(x.contiguous()), view(x.contiguous()))
    with pytest.raises(neptune_eq.NeptuneError, match=r"argument 't' is read with as_strided"):
        prog(x)


def test_amax_over_dims_apart_shares_its_ties_over_all_of_them():
    """amax over dims 0 and 2 (not adjacent: a max of maxes) had no gradient (NoBackward: a max of a value
    holding a reduction); torch shares it among every element attaining the max over both dims, here a
    three-way tie spread over dim 0 and a row of ReLU zeros."""
    x = torch.randn(3, 4, 5)
    x[1, 2, 3] = x[0, 2, 1] = x[2, 2, 0] = 5.0
    x[:, 3] = x[:, 3].clamp(max=0)
    ours, ref = _grad(lambda t: torch.relu(t).amin(dim=(0, 2)) * 3 + (t * 2).amax(dim=(0, 2)), x)
    assert torch.allclose(ours, ref, atol=1e-6), (ours, ref)
    assert ref[:, 2].abs().sum() > 0 and (ref[:, 2] != 0).sum() == 3  # (the tie is there to share)


def test_softmax_over_a_single_key_is_one_and_trains():
    """Attention over one key (a decode step's first token, a dynamic length of 1): softmax over a
    dimension of size 1 was refused (CaptureError); it is 1, 0 for a masked −inf (FlexAttention's
    convention, as a wider fully masked row), and log-softmax 0."""
    def attend(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v

    assert_gradients_match(attend, [torch.randn(2, 1, 8) for _ in range(3)], atol=1e-6)
    x = torch.tensor([[-math.inf], [2.0], [-3.0]])
    got = neptune_eq.compile(lambda t: torch.softmax(t, -1) + torch.log_softmax(t[1:], -1).sum(), x)(x)
    assert got.flatten().tolist() == [0.0, 1.0, 1.0]


def test_an_output_no_gradient_reaches_does_not_require_grad():
    """An output computed from detached values or a comparison's mean (no gradient path) came back
    requiring grad (torch: False); the others still do, and their gradients are torch's."""
    x = torch.randn(4, 9)

    def fn(t):
        return torch.softmax(t, -1), torch.logsumexp(t, -1).detach(), (t > 0).float().mean(-1)

    a, b = x.clone().requires_grad_(), x.double().requires_grad_()
    got, want = neptune_eq.compile(fn, x)(a), fn(b)
    assert [o.requires_grad for o in got] == [o.requires_grad for o in want] == [True, False, False]
    c = torch.randn(4, 9, dtype=torch.float64)
    (got[0] * c.float()).sum().backward()
    (want[0] * c).sum().backward()
    assert torch.allclose(a.grad.double(), b.grad, atol=1e-6)


def test_a_learnable_scalar_from_the_environment_gets_its_gradient():
    """A 0-d parameter fn reads from its module or closure (CLIP's logit scale, a temperature) was baked
    in as a constant: no gradient, silently. It is an input now, read at every call."""
    temp = torch.tensor(0.7, requires_grad=True)
    x = torch.randn(3, 8)
    prog = neptune_eq.compile(lambda x: torch.logsumexp(x / temp, -1).sum(), x)
    prog(x).backward()
    got = temp.grad.clone()
    temp.grad = None
    torch.logsumexp(x / temp, -1).sum().backward()
    torch.testing.assert_close(got, temp.grad)
    with torch.no_grad():
        temp.add_(0.3)  # an optimizer step: the next call reads the new value
    torch.testing.assert_close(prog(x), torch.logsumexp(x / temp, -1).sum())


def test_a_row_holding_nan_gives_the_max_and_min_gradients_torch_gives():
    """torch's amax / amin share the gradient among the elements equal to the result, (g/count)·mask: on
    a row holding NaN no element equals it (NaN == NaN is false), count is 0 and ∞·0 makes the whole
    row's gradient NaN. Ours gave 0 there, silently. Rows of ties, of +∞ and of −∞ keep theirs."""
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, nan, 3.0, 3.0], [1.0, 2.0, 3.0, 3.0], [-inf, -inf, -inf, -inf], [1.0, inf, 2.0, 0.0],
                      [nan, 0.0, -1.0, -1.0]])
    ours, ref = _grad(lambda t: t.amax(-1) + (t - t.amin(-1, keepdim=True)).sum(-1), x)
    assert torch.equal(ours.isnan(), ref.isnan()) and ref[0].isnan().all() and ref[4].isnan().all(), (ours, ref)
    assert torch.allclose(ours[~ref.isnan()], ref[~ref.isnan()], atol=1e-6), (ours, ref)
