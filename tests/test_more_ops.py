"""Ops that were refused before: clamp with tensor bounds, pow with any exponent (tensor, non-integer,
scalar base), any / all, hypot, and uint8 / int8 / int16 arguments. Each forward against float64 torch
on random and edge values (zeros, negatives, ±inf, NaN), each gradient against float64 torch autograd
(interpreter, tiny shapes)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_gradients_match

import neptune_eq
from neptune_eq.frontend import CaptureError

INF, NAN = math.inf, math.nan


def _row(*vals) -> torch.Tensor:
    return torch.tensor([list(vals)], dtype=torch.float32)


def _assert_same(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-5) -> None:
    """Equal NaN and ±inf positions (signs included), finite values within rtol of float64 torch."""
    got, want = got.double(), want.double()
    assert got.shape == want.shape and torch.equal(got.isnan(), want.isnan()), (got, want)
    inf = want.isinf()
    assert torch.equal(got.isinf(), inf) and torch.equal(got[inf], want[inf]), (got, want)
    ok = ~want.isnan() & ~inf
    assert torch.allclose(got[ok], want[ok], rtol=rtol, atol=1e-6), (got, want)


def _edge_grads(fn, *xs, rtol: float = 1e-5):
    """Our gradients of fn under a random cotangent against float64 torch's, NaN and ±inf included."""
    prog = neptune_eq.compile(fn, *xs)
    ours, ref = [x.clone().requires_grad_() for x in xs], [x.double().requires_grad_() for x in xs]
    want = fn(*ref)
    cot = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    prog(*ours).backward(cot.float())
    want.backward(cot)
    for a, b in zip(ours, ref):
        if b.grad is None:  # an argument fn does not read
            assert a.grad is None or not a.grad.any(), a.grad
            continue
        _assert_same(a.grad, b.grad, rtol)


# ---------------------------------------------------------------- clamp with tensor bounds

# x, lo, hi: inside, below, above, NaN in each, ties, lo = hi, lo > hi (torch gives hi), NaN x with lo > hi
_CLAMP = (_row(0.0, 2.0, -2.0, NAN, 0.0, 0.0, 1.0, 1.0, 5.0, -5.0, 0.0, 1.0, 1.0, NAN, 3.0, 0.0),
          _row(-1.0, -1.0, -1.0, -1.0, NAN, -1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 0.0, 2.0, 2.0, 1.0),
          _row(1.0, 1.0, 1.0, 1.0, 1.0, NAN, 1.0, 1.0, 1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0))


@pytest.mark.parametrize("fn", [lambda x, lo, hi: torch.clamp(x, lo, hi), lambda x, lo, hi: torch.clamp(x, min=lo),
                                lambda x, lo, hi: torch.clamp(x, max=hi), lambda x, lo, hi: x.clamp(hi, lo)],
                         ids=["both", "min", "max", "swapped"])
def test_clamp_with_tensor_bounds_is_torchs(fn):
    """Values as torch's (NaN in any operand is NaN, min > max gives max) and the gradient to the side
    torch gives it: x where lo ≤ x ≤ hi, lo where x < lo < hi, hi where x > hi or hi < lo, none where
    x < lo = hi or a NaN comes from x or a bound."""
    _assert_same(neptune_eq.compile(fn, *_CLAMP)(*_CLAMP), fn(*(t.double() for t in _CLAMP)))
    _edge_grads(fn, *_CLAMP)


def test_clamp_with_broadcast_tensor_bounds():
    """Per-column bounds beside a [rows, cols] input, random values (their gradients summed over rows)."""
    g = torch.Generator().manual_seed(0)
    x, lo = torch.randn(4, 6, generator=g), torch.randn(6, generator=g) - 0.5
    hi = lo + torch.rand(6, generator=g)
    assert_gradients_match(lambda x, lo, hi: torch.clamp(x, lo, hi) * x, [x, lo, hi], atol=1e-5)


# ---------------------------------------------------------------- pow

_BASES = _row(-2.0, -2.0, 0.0, 0.0, 2.0, NAN, 1.0, -0.0, INF, -INF, -1.0, -8.0, 0.5, 3.0, -INF, 1e-3)
_EXPONENTS = _row(3.0, 0.5, -1.0, 0.0, 1.5, 0.0, NAN, -3.0, -1.0, 3.0, INF, 1 / 3, -INF, -2.5, 0.5, 2.5)


def test_pow_of_tensors_has_torchs_special_values():
    """C's pow, as torch's: a negative base to an integer exponent is real (−2³ = −8, (−0)⁻³ = −∞),
    to any other NaN (also −8^⅓); 0⁻¹ = ∞, x⁰ = 1ᵖ = (−1)^∞ = 1 with NaN, (−∞)^½ = ∞."""
    got = neptune_eq.compile(torch.pow, _BASES, _EXPONENTS)(_BASES, _EXPONENTS)
    _assert_same(got, torch.pow(_BASES.double(), _EXPONENTS.double()))


@pytest.mark.parametrize("p", [1.5, 0.5, -1.5, -0.5, 2.5, -2.0, 5.0, 0.0, 1 / 3, -1.0])
def test_pow_with_a_constant_exponent(p):
    """x ** p for any float p: random values, negatives and zeros among them; gradient p·x^(p−1)
    (0 for p = 0, ∞ at x = 0 for p < 1, NaN for a negative x to a non-integer p, as torch's)."""
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1)) * 2
    # (x ** -0.5 is rsqrt, torch's forward too: at −0 its derivative is −½·rsqrt(−0)³ = +∞·ḡ, where
    # torch's pow backward takes −½·(−0)^−1.5 = −∞·ḡ)
    x[0, :4] = torch.tensor([0.0, 0.0 if p == -0.5 else -0.0, 1.0, -1.0])
    got = neptune_eq.compile(lambda t: t**p, x)(x)
    _assert_same(got, x.double() ** p)
    if p == 0:  # x⁰ = 1 everywhere: no gradient reaches x, and the output does not require one
        assert not neptune_eq.compile(lambda t: t**p, x)(x.clone().requires_grad_()).requires_grad
        return
    _edge_grads(lambda t: t**p, x)


def test_pow_gradients_at_the_edges():
    """∂x = p·x^(p−1), 0 where p = 0; ∂p = xᵖ·log x, 0 where x = 0 and p ≥ 0 (torch's convention), −∞
    for 0 to a negative p, NaN for a negative base; against torch on a grid of edges and random values."""
    x = _row(0.0, 0.0, -2.0, 2.0, 0.0, -1.0, 1.5, 0.0, 3.0, 0.7)
    p = _row(0.0, 2.0, 3.0, 0.5, -1.0, 0.5, -1.5, 0.5, 0.0, -0.3)
    _edge_grads(torch.pow, x, p)
    g = torch.Generator().manual_seed(2)
    base, expo = torch.rand(4, 8, generator=g) + 0.1, torch.randn(8, generator=g)
    assert_gradients_match(lambda b, e: (b**e).sum(-1), [base, expo], atol=1e-4)


@pytest.mark.parametrize("base", [-2.0, 0.0, 3.0, 2.0])
def test_pow_of_a_scalar_base(base):
    """torch.pow(b, y): a non-positive base is the pow op (real for an integer y, NaN otherwise; 0 to a
    negative y is ∞), a positive one e^(y·log b); gradients as torch's (0 where b = 0 and y ≥ 0)."""
    y = _row(3.0, 0.5, -1.0, 0.0, 2.0, -3.0, 1.5, -0.5)
    _assert_same(neptune_eq.compile(lambda t: torch.pow(base, t), y)(y), torch.pow(base, y.double()))
    _edge_grads(lambda t: torch.pow(base, t), y)


def test_pow_of_integers_to_an_integer_result_is_refused():
    """n ** 5 and n ** k of int64 tensors would be computed in floats: refused naming pow; an integer
    tensor to a float power (a float result) is captured."""
    n = torch.arange(6).reshape(2, 3)
    with pytest.raises(CaptureError, match="pow"):
        neptune_eq.compile(lambda t: t**5, n)
    with pytest.raises(CaptureError, match="pow"):
        neptune_eq.compile(lambda t, k: t**k, n, n)
    _assert_same(neptune_eq.compile(lambda t: t**1.5, n)(n), n.double() ** 1.5)


# ---------------------------------------------------------------- any / all


def test_any_and_all_of_masks():
    """Over one dimension, several, all, with keepdim; a float input counts NaN and nonzeros; a row with
    no True is False for any and True only where every element is True for all."""
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(4))
    x[0] = -1.0
    x[1, 2] = 1.0
    x[2, :, 0] = NAN
    fns = [lambda t: (t > 0).any(), lambda t: (t > 0).all(), lambda t: torch.any(t > 0, -1),
           lambda t: torch.all(t > 0, 1, keepdim=True), lambda t: (t > 0).any(dim=(0, 2)),
           lambda t: torch.all(t < 0, -1), lambda t: t.isnan().any(-1), lambda t: torch.any(t.clamp(min=0), -1)]
    for fn in fns:
        got, want = neptune_eq.compile(fn, x)(x), fn(x)
        assert got.dtype == torch.bool and torch.equal(got, want), (got, want)


def test_adding_masks_is_a_logical_or():
    """torch adds bool tensors as a logical or (True + True is True): counted, as a mask, beside a
    Python True, through torch.add; a sum of the numbers 0/1/2 had been taken (silently wrong)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 9, generator=g)
    a, b = torch.rand(3, 9, generator=g) > 0.5, torch.rand(3, 9, generator=g) > 0.5
    fns = [lambda x, a, b: (a + b).sum(-1), lambda x, a, b: x.masked_fill(a + b, 0.0).sum(-1),
           lambda x, a, b: (x * ((x > 0) + (x > 1))).sum(-1), lambda x, a, b: (a + True).sum(-1),
           lambda x, a, b: torch.add(a, b).float().mean(-1)]
    for fn in fns:
        got, want = neptune_eq.compile(fn, x, a, b)(x, a, b), fn(x.double(), a, b)
        _assert_same(got, want)


@pytest.mark.parametrize("fn", [lambda a: torch.softmax(a, -1), lambda a: torch.log_softmax(a, -1),
                                lambda a: a.var(-1), lambda a: a.std(-1), torch.nn.functional.hardswish,
                                lambda a: (a.abs() + 1) ** -1, lambda a: torch.softmax(a > 0, -1)],
                         ids=["softmax", "log_softmax", "var", "std", "hardswish", "pow-1", "bool-softmax"])
def test_float_only_ops_of_integers_are_refused(fn):
    """torch raises on these of an int64 or bool tensor; the fake-tensor trace gave an integer result,
    which the compile computed and truncated (softmax of int64: all 0) with no error."""
    i = torch.randint(-3, 5, (4, 7), generator=torch.Generator().manual_seed(0))
    with pytest.raises((RuntimeError, NotImplementedError)):
        fn(i)
    with pytest.raises(CaptureError, match="convert to float first"):
        neptune_eq.compile(fn, i)


def test_integers_converted_for_a_softmax_still_compile():
    i = torch.randint(-3, 5, (4, 7), generator=torch.Generator().manual_seed(0))
    for fn in (lambda a: torch.softmax(a, -1, dtype=torch.float32), lambda a: a.float().var(-1)):
        _assert_same(neptune_eq.compile(fn, i)(i), fn(i))


# ---------------------------------------------------------------- hypot


def test_hypot_values_and_gradient():
    """√(a² + b²) without overflow (1e30) or underflow (1e-30); ∞ beside NaN as C's; gradient a/h, b/h
    (NaN at (0, 0), torch's)."""
    a = _row(0.0, 3.0, -0.0, 1e30, 1e-30, INF, NAN, -INF, NAN, 2.0, -5.0)
    b = _row(0.0, -4.0, 2.0, 1e30, 1e-30, NAN, INF, 1.0, 1.0, 1e-8, 12.0)
    _assert_same(neptune_eq.compile(torch.hypot, a, b)(a, b), torch.hypot(a.double(), b.double()))
    _edge_grads(torch.hypot, a[:, [0, 1, 2, 9, 10]], b[:, [0, 1, 2, 9, 10]])
    g = torch.Generator().manual_seed(5)
    assert_gradients_match(lambda u, v: torch.hypot(u, v).sum(-1), [torch.randn(3, 8, generator=g),
                                                                    torch.randn(8, generator=g)], atol=1e-5)


# ---------------------------------------------------------------- narrow integer arguments


def test_uint8_images_convert_to_float():
    """The preprocessing idiom img.float() / 255 and its neighbours: exact values of every uint8 (0 and
    255 included), comparisons, int64 sums and products that torch computes without wrapping."""
    img = torch.arange(256, dtype=torch.uint8).reshape(4, 64)
    fns = [lambda t: t.float() / 255, lambda t: (t / 255.0 - 0.5) * 2, lambda t: t > 128,
           lambda t: t.long() * t.long() + t.long(), lambda t: t.sum(-1), lambda t: t[:, ::2].double().mean(-1),
           lambda t: t[1:3]]
    for fn in fns:
        got, want = neptune_eq.compile(fn, img)(img), fn(img)
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        assert torch.equal(got, want) if not want.is_floating_point() else torch.allclose(got, want, atol=1e-6), (
            got, want)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16])
def test_signed_narrow_integers(dtype):
    info = torch.iinfo(dtype)
    t = torch.tensor([[info.min, -1, 0, 1, info.max, 7]], dtype=dtype)
    for fn in (lambda v: v.float() * 0.5, lambda v: v.long() * v.long(), lambda v: v + 1.5, lambda v: v.sum(-1)):
        got, want = neptune_eq.compile(fn, t)(t), fn(t)
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


@pytest.mark.parametrize("fn", [lambda t: t + 1, lambda t: t * 2, lambda t: -t, lambda t: t - t, lambda t: t.amax(-1),
                                lambda t: torch.where(t > 3, t, 0), lambda t: t.long().to(torch.uint8)],
                         ids=["add", "mul", "neg", "sub", "amax", "where", "to_uint8"])
def test_narrow_integer_arithmetic_that_wraps_is_refused(fn):
    """torch's uint8 arithmetic wraps (255 + 1 = 0): an op with a uint8 result is refused, naming it,
    unless it only moves values."""
    img = torch.arange(8, dtype=torch.uint8).reshape(2, 4)
    with pytest.raises(CaptureError, match="uint8 result is not supported"):
        neptune_eq.compile(fn, img)


def test_int32_arguments_widened_by_long_do_not_wrap():
    """Flat offsets computed after .long() (the idiom that avoids int32 overflow) are int64 as in torch:
    the kernels read int32 tensors as int64 (they had summed in int32: -2^31 for 3·2^31)."""
    a = torch.tensor([[2**30, 5, -7, 2**31 - 1]], dtype=torch.int32)
    b = torch.tensor([[2**30, 3, 9, 1]], dtype=torch.int32)

    def fn(a, b):
        return (a.long() + b.long()) * 3

    got = neptune_eq.compile(fn, a, b)(a, b)
    assert got.dtype == torch.int64 and torch.equal(got, fn(a, b))


@pytest.mark.parametrize("which", ["min", "max"])
def test_clamp_min_and_max_with_a_tensor_bound_pass_a_tie_to_x(which):
    """clamp_min(x, t) at x == t passes the whole gradient to x (torch's clamp), not half and half as a
    maximum of two tensors does; NaN in x gives NaN and no gradient."""
    x = torch.tensor([[0.5, -1.0, 2.0, float("nan"), 0.25]], dtype=torch.float64)
    t = torch.tensor([[0.5, 0.0, 1.0, 0.0, 0.25]], dtype=torch.float64)

    def fn(x, t):
        return torch.clamp_min(x, t) if which == "min" else torch.clamp_max(x, t)

    a, b = x.clone().requires_grad_(), t.clone().requires_grad_()
    a2, b2 = x.clone().requires_grad_(), t.clone().requires_grad_()
    out, want = neptune_eq.compile(fn, x, t)(a, b), fn(a2, b2)
    torch.testing.assert_close(out, want, equal_nan=True)
    g = torch.arange(1.0, 6.0, dtype=torch.float64)[None]
    out.backward(g)
    want.backward(g)
    torch.testing.assert_close(a.grad, a2.grad)
    torch.testing.assert_close(b.grad, b2.grad)


def test_a_value_computed_from_data_may_overflow_where_a_mask_is_split():
    """sum(exp(x) == inf) and sum(isinf(x.half())): the mask split samples loaded values far out, so an
    overflow of what the program computes is not taken for 'never true' (the sums were 0)."""
    x = torch.tensor([[70000.0, 1.0, -80000.0, 5.0, 800.0]])
    for fn in (lambda x: (torch.exp(x) == float("inf")).sum(-1), lambda x: torch.isinf(x.half()).sum(-1),
               lambda x: torch.isposinf(x.half()).sum(-1) - torch.isneginf(x.half()).sum(-1)):
        assert torch.equal(neptune_eq.compile(fn, x)(x), fn(x))


_TIES = torch.tensor([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4999, -0.3, 3.7, -3.7, float("inf"), -float("inf"),
                       float("nan"), 1e10, -0.0, 8388609.0]])


@pytest.mark.parametrize("name", ["floor", "ceil", "trunc", "round", "frac", "div_trunc"])
def test_roundings_to_integral_values_are_torchs(name):
    """Ties to even (torch.round), negative values, ±inf, NaN, values past 2^23; integer tensors pass."""
    fn = {"floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "round": torch.round, "frac": torch.frac,
          "div_trunc": lambda x: torch.div(x, 0.7, rounding_mode="trunc")}[name]
    got, want = neptune_eq.compile(fn, _TIES)(_TIES), fn(_TIES)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~want.isnan()], want[~want.isnan()])
    if name in ("floor", "ceil", "trunc", "round"):
        n = torch.tensor([[-3, 0, 7]])
        assert torch.equal(neptune_eq.compile(fn, n)(n), fn(n))


def test_fake_quantisation_by_round_and_its_straight_through_gradient():
    y = torch.randn(4, 33) * 3

    def quant(y):
        return (torch.round(y / 0.1).clamp(-128, 127) * 0.1).sum(-1)

    def ste(y):
        return (y + (torch.round(y * 4) / 4 - y).detach()).pow(2).sum(-1)

    torch.testing.assert_close(neptune_eq.compile(quant, y)(y), quant(y))
    assert_gradients_match(ste, [y], atol=1e-5)


@pytest.mark.parametrize("p", [3, 2.5, 0.5, -1.5, 0])
def test_vector_norms_of_any_order(p):
    """torch.linalg.vector_norm / F.normalize of order p (refused but for 1, 2, ±inf): (Σ|x|ᵖ)^(1/p), the
    nonzero count at p = 0; gradients as torch's, a zero row's 0."""
    x = torch.randn(4, 12, dtype=torch.float64)
    x[1] = 0.0
    x[2, :5] = 0.0

    def fn(x):
        return torch.linalg.vector_norm(x, ord=p, dim=-1)

    got, want = neptune_eq.compile(fn, x)(x), fn(x)
    torch.testing.assert_close(got, want)
    if p >= 1:
        assert_gradients_match(fn, [x], atol=1e-6)


def test_round_to_decimals_is_torchs():
    x = torch.tensor([[1.005, 2.675, -0.125, 1234.5678, 0.5, -77.25]])
    for d in (2, 0, -2):
        fn = lambda x, d=d: torch.round(x, decimals=d)  # noqa: E731
        # (the same rounding to integers; the division by 10^d may become a product by 10^-d: an ulp)
        torch.testing.assert_close(neptune_eq.compile(fn, x)(x), fn(x), rtol=1e-6, atol=0)


def test_eye_is_an_index_comparison():
    """torch.eye (SigLIP's labels 2·eye(n) − 1; it was refused at aten.eye): 1 on the diagonal, also
    rectangular and as bool; the loss trains."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=g)
    f = lambda x: (torch.eye(5, 7) * x).sum(0) + torch.eye(5, 7, dtype=torch.bool).float().sum(1, keepdim=True)  # noqa: E731
    assert torch.equal(neptune_eq.compile(f, x)(x), f(x))

    def siglip(x, y):
        x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)
        logits = 10 * (x @ y.T) - 5
        labels = 2 * torch.eye(x.shape[0]) - 1
        return -F.logsigmoid(labels * logits).sum() / x.shape[0]

    assert_gradients_match(siglip, [torch.randn(9, 6, generator=g), torch.randn(9, 6, generator=g)], 1e-5)


@pytest.mark.parametrize("fn", [
    lambda s, v: torch.searchsorted(s, v),
    lambda s, v: torch.searchsorted(s, v, right=True),
    lambda s, v: torch.searchsorted(s, v, side="right", out_int32=True),
    lambda s, v: torch.bucketize(v, s),
    lambda s, v: torch.bucketize(v, s, right=True) * 2 - 1,
], ids=["left", "right", "side_int32", "bucketize", "bucketize_right"])
def test_searchsorted_and_bucketize_count_as_torch_searches(fn):
    """Ties on both sides, values below and above every element, ±inf and NaN (sorted last)."""
    s = torch.tensor([-2.0, 0.0, 0.0, 1.5, 3.0])
    v = torch.tensor([[-3.0, -2.0, 0.0, 0.5], [1.5, 3.0, 4.0, INF], [-INF, NAN, 2.0, 0.0]])
    got, want = neptune_eq.compile(fn, s, v)(s, v), fn(s, v)
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
    ints = torch.tensor([0, 5, 5, 18]), torch.arange(20)
    assert torch.equal(neptune_eq.compile(fn, *ints)(*ints), fn(*ints))


def test_searchsorted_refuses_what_it_does_not_count():
    with pytest.raises(CaptureError, match="sequence of 2 dimensions"):
        neptune_eq.compile(lambda s, v: torch.searchsorted(s, v), torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(CaptureError, match="sorter"):
        neptune_eq.compile(lambda s, v: torch.searchsorted(s, v, sorter=torch.argsort(s)), torch.zeros(3),
                           torch.zeros(4))


# ---------------------------------------------------------------- nansum, nanmean, count_nonzero, logit (session 64)


_NAN_FNS = [lambda x: torch.nansum(x * x, -1), lambda x: torch.nanmean(x, -1), lambda x: torch.nansum(x, (0, 1)),
            lambda x: x.nansum(-1, keepdim=True) * x]


@pytest.mark.parametrize("fn", _NAN_FNS)
def test_nan_ignoring_reductions_are_torchs(fn):
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    x[1, 2], x[3, 0], x[4] = NAN, NAN, NAN  # (row 4 all NaN: nansum 0, nanmean NaN)
    _assert_same(neptune_eq.compile(fn, x)(x), fn(x.double()))
    # the gradient: 0 at NaN, as torch's. (Where torch's is NaN ours may be a number, README's guarantee:
    # of an all-NaN row torch's nanmean gives 0·∞, and through nansum·x a NaN row sum times nansum's 0)
    if fn(x).dim() and fn is not _NAN_FNS[3]:
        _edge_grads(fn, x[:4].clone())


@pytest.mark.parametrize("fn", [lambda x: torch.count_nonzero(torch.relu(x), -1),
                                lambda x: torch.relu(x) * torch.count_nonzero(x > 0.5, dim=1)[:, None],
                                lambda x: torch.count_nonzero(x)])
def test_count_nonzero_counts_as_torch(fn):
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(1))
    x[2, 3], x[0, :] = NAN, 0.0  # (NaN is nonzero)
    got, want = neptune_eq.compile(fn, x)(x), fn(x)
    assert got.dtype == want.dtype, (got, want)
    if want.is_floating_point():
        _assert_same(got, fn(x.double()))
    else:
        assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_logit_values_and_gradient(eps):
    x = torch.tensor([[0.0, 1e-4, 0.25, 0.5, 0.999, 1.0, 1e-3, 1 - 1e-3, 2.0, -1.0]])
    def fn(x):
        return torch.logit(x, eps=eps) * 2.0

    _assert_same(neptune_eq.compile(fn, x)(x), fn(x.double()))
    inner = torch.rand(4, 8, generator=torch.Generator().manual_seed(2)) * 0.98 + 0.01
    _edge_grads(fn, inner)
