"""A narrow float value read by wider arithmetic is rounded as torch holds it (frontend/rounding.py):
x.bfloat16().float(), fake quantisation, a half overflowing to inf, mixed-precision norms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq.ops import OPS
from neptune_eq.reference import evaluate
from tests.helpers import assert_gradients_match


def _rounds(prog) -> set[str]:
    return {op for o in prog.program.program.outputs for op in ("round_bf16", "round_f16") if op in str(o.expr)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_round_trip_through_a_narrow_dtype_keeps_its_rounding(dtype):
    def fn(x):
        return x.to(dtype).float() - x

    x = torch.randn(5, 37) * 3
    got = neptune_eq.compile(fn, x)(x)
    want = fn(x)
    assert want.abs().max() > 1e-4  # (the rounding error itself is what is compared)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fake_quantisation_forward_and_straight_through_gradient():
    def fn(x, w):
        q = x + (x.to(torch.bfloat16).float() - x).detach()  # straight-through estimator
        return (q * w).sum(-1)

    x, w = torch.randn(6, 40), torch.randn(40)
    prog = neptune_eq.compile(fn, x, w)
    torch.testing.assert_close(prog(x, w), fn(x, w), rtol=1e-6, atol=1e-6)
    assert abs(prog(x, w) - fn(x, w)).max() < abs(fn(x, w) - (x * w).sum(-1)).max() / 10
    assert_gradients_match(fn, [x, w], atol=1e-5)


def test_a_half_that_overflows_is_inf_as_torch_gives():
    def fn(x):
        return torch.sigmoid((x * 1e5).half().float() * 1e-4)

    x = torch.linspace(-3, 3, 64).reshape(2, 32)
    got = neptune_eq.compile(fn, x)(x)
    torch.testing.assert_close(got, fn(x))
    big = x.abs() > 0.66  # |x|·1e5 past the half's largest finite 65504: ±inf, sigmoid 0 or 1
    assert ((got[big] == 0) | (got[big] == 1)).all() and big.any()


def test_each_narrow_operation_rounds_where_a_wider_one_reads_it():
    """round(round(x)·round(y)), not round(x·y): the product is held in bf16 before it widens."""
    def fn(x, y):
        return (x.bfloat16() * y.bfloat16()).float() + x

    x, y = torch.randn(8, 64), torch.randn(8, 64)
    torch.testing.assert_close(neptune_eq.compile(fn, x, y)(x, y), fn(x, y), rtol=0, atol=0)


def test_a_mixed_precision_rms_norm_matches_eager_forward_and_backward():
    """Llama's RMSNorm with an fp32 weight: the normalised bf16 row is rounded before the fp32 product."""
    def rms(h, w):
        dt = h.dtype
        h = h.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(dt)

    h, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64)
    prog = neptune_eq.compile(rms, h, w)
    assert _rounds(prog) == {"round_bf16"}
    torch.testing.assert_close(prog(h, w), rms(h, w), rtol=1e-6, atol=1e-6)
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    g = torch.randn(4, 64)
    prog(hh, ww).backward(g)
    rms(h2, w2).backward(g)
    torch.testing.assert_close(hh.grad.float(), h2.grad.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ww.grad, w2.grad, rtol=1e-5, atol=1e-5)


def test_narrowness_inherited_from_the_inputs_keeps_the_float32_algebra():
    """bf16 scores of bf16 q and k, widened by HF's softmax(dtype=float32), and the bf16 logits of a
    linear cross-entropy's .float(), are not rounded (they compute in float32, as FlashAttention's
    scores): only a narrowing the program itself makes is."""
    def hf_attn(q, k, v):
        s = torch.matmul(q, k.transpose(-2, -1)) * 0.125
        return torch.matmul(F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype), v)

    def linear_ce(h, W, y):
        return F.cross_entropy((h @ W.T).float(), y)

    def requantised(h, W, y):  # the same logits through an fp32 round trip and back: rounded by the program
        return F.cross_entropy((h.float() @ W.float().T).bfloat16().float(), y)

    q = torch.randn(1, 2, 16, 8, dtype=torch.bfloat16)
    assert not _rounds(neptune_eq.compile(hf_attn, q, q, q))
    h, W, y = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(16, 8, dtype=torch.bfloat16), torch.arange(4)
    assert not _rounds(neptune_eq.compile(linear_ce, h, W, y))
    prog = neptune_eq.compile(requantised, h, W, y)
    assert _rounds(prog) == {"round_bf16"}
    torch.testing.assert_close(prog(h, W, y), requantised(h, W, y), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op,dtype", [("round_bf16", torch.bfloat16), ("round_f16", torch.float16)])
def test_the_rounding_ops_agree_with_torch_conversion(op, dtype):
    """numpy evaluator, float64 reference and torch's own conversion agree, ties and overflow included."""
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(2000, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-6, 6, (2000,),
                                                                                              generator=g),
                   torch.tensor([1 + 2.0**-8, 1 + 3 * 2.0**-8, 65520.0, 1e5, -1e39, float("inf"), float("nan")],
                                dtype=torch.float64)])
    want = x.to(torch.float32).to(dtype).to(torch.float64)
    got = torch.from_numpy(np.asarray(OPS[op].numpy(x.numpy())))
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    prog = neptune_eq.ir.Program("r", {"i": len(x)}, {"x": neptune_eq.ir.TensorSpec("x", ("i",), "float64")},
                                 [neptune_eq.ir.Output("out", ("i",), neptune_eq.ir.Call(op, (
                                     neptune_eq.ir.Load("x", (neptune_eq.ir.Index("i"),)),)))])
    torch.testing.assert_close(evaluate(prog, {"x": x})["out"], want, rtol=0, atol=0, equal_nan=True)


def test_verification_holds_a_rounded_output_to_the_rounding_dtype():
    """A value near a bf16 rounding boundary may round one unit apart in the float32 kernel and in
    float64: verify (and tuning) count the rounding's dtype among those the output involves."""
    x = torch.randn(3, 40)
    prog = neptune_eq.compile(lambda x: (x * 3.3).bfloat16().float() + 1, x).program
    report = prog.verify(sets=("normal", "wide"))
    assert report.passed
    assert report.sets[0].tolerance["out0"] == pytest.approx(4 * 2.0**-8)


def test_a_power_of_two_scale_of_a_half_overflows_as_torch_gives():
    """A bf16 value scaled by 2^k needs no rounding (float32's range); an fp16 one may overflow to inf."""
    def fn(x):
        return (x.half() * 1024.0).float()

    x = torch.linspace(-200, 200, 64).reshape(2, 32)
    got = neptune_eq.compile(fn, x)(x)
    assert got.isinf().any()
    torch.testing.assert_close(got, fn(x), rtol=0, atol=0)


def test_comparisons_read_a_narrowed_value_as_torch_holds_it():
    """isfinite of a half that overflowed, equality of values that round alike, a half that underflows
    to 0: a comparison reads the rounded value (a bool result is never rounded later)."""
    x = torch.tensor([[70000.0, 1.0, 1e-8, 1.001, 0.5, -80000.0]])
    y = torch.tensor([[70001.0, 1.0004, 3e-8, 1.0, 0.5, 2.0]])
    for fn in (lambda x, y: torch.isfinite(x.half()).all(-1), lambda x, y: (x.bfloat16() == y.bfloat16()).sum(-1),
               lambda x, y: (x.half() > 0).sum(-1), lambda x, y: torch.isinf(x.half()).sum(-1),
               lambda x, y: (x.bfloat16() > 1.0).float().sum(-1)):
        assert torch.equal(neptune_eq.compile(fn, x, y)(x, y), fn(x, y))


def test_arithmetic_on_narrowed_values_rounds_each_step():
    """x.half() − y.half() of close values cancels: the rounded operands' difference (eager's), not the
    float32 one; uint8 made bf16 and tripled rounds in bf16 (765 is 764)."""
    x, y = torch.tensor([[1000.7, 3.0]]), torch.tensor([[1000.0, 1.0]])
    fn = lambda x, y: x.half() - y.half()  # noqa: E731
    torch.testing.assert_close(neptune_eq.compile(fn, x, y)(x, y), fn(x, y), rtol=0, atol=0)
    img = torch.tensor([[255, 254, 171, 3]], dtype=torch.uint8)
    g = lambda img: (img.bfloat16() * 3).float()  # noqa: E731
    torch.testing.assert_close(neptune_eq.compile(g, img)(img), g(img), rtol=0, atol=0)


def test_a_float64_value_stored_as_bfloat16_in_the_interpreter():
    """The interpreter's bf16 rounding took float32 bits: a float64 program's bf16 store crashed."""
    x = torch.randn(3, 8, dtype=torch.float64)
    fn = lambda x: (x * 1.1).bfloat16()  # noqa: E731
    torch.testing.assert_close(neptune_eq.compile(fn, x)(x), fn(x), rtol=0, atol=0)
    xb = torch.randn(3, 8).bfloat16().requires_grad_()
    out = neptune_eq.compile(lambda x: x.double().sum(-1), xb.detach())(xb)
    out.backward(torch.ones(3, dtype=torch.float64))
    assert torch.equal(xb.grad, torch.ones_like(xb))


def test_a_gathered_narrow_value_is_not_narrowed_by_its_integer_index():
    """W[idx] of bf16 weights is bf16 like W (an integer operand narrows only in a cast, img.bfloat16()):
    an embedding's arithmetic keeps the float32 algebra, no rounding after every operation."""
    W, idx, g = torch.randn(50, 64).bfloat16(), torch.randint(0, 50, (8,)), torch.randn(64).bfloat16()
    prog = neptune_eq.compile(lambda idx, W, g: ((W[idx] * 8.0 + 1.0) * g).float().sum(-1), idx, W, g)
    assert not _rounds(prog)
