"""Masks written with a finite fill (`masked_fill(~m, -1e9)`, BERT's −10000, finfo.min) on a row whose
every element is masked: torch gives the softmax of equal values (uniform), not the 0 of a row of −inf
(FlexAttention's convention, which the compiler keeps for −inf). Interpreter, tiny shapes, against
float64 torch; each failed before (0 rows, −inf, +inf, attention's dV off by 1.6)."""

from __future__ import annotations

import torch

import neptune_eq


def _mask(L=7):
    g = torch.Generator().manual_seed(5)
    m = torch.rand(L, L, generator=g) > 0.5
    m[0, 0] = True
    m[2] = False  # row 2: every key masked
    return m


def _check(fn, *xs, grad=True, rtol=1e-6, atol=1e-5):
    prog = neptune_eq.compile(fn, *xs)
    a = [x.clone().requires_grad_(grad and x.is_floating_point()) for x in xs]
    b = [x.double().requires_grad_(grad) if x.is_floating_point() else x for x in xs]
    got, want = prog(*a), fn(*b)
    assert torch.allclose(got.double(), want, rtol=rtol, atol=atol), (got, want)
    if grad:
        c = torch.randn(want.shape, dtype=torch.float64)
        got.backward(c.float())
        want.backward(c)
        for x, y in zip(a, b):
            if x.requires_grad:
                assert torch.allclose(x.grad.double(), y.grad, atol=1e-5), (x.grad, y.grad)


def test_softmax_and_attention_of_a_fully_masked_row_with_a_finite_fill():
    m = _mask()
    _check(lambda x, m: torch.softmax(x.masked_fill(~m, -1e9), -1), torch.randn(3, 7, 7), m)

    def attend(q, k, v, m):
        return torch.softmax((q @ k.transpose(-1, -2) * 0.35).masked_fill(~m, -1e9), -1) @ v

    _check(attend, *(torch.randn(2, 7, 8) for _ in range(3)), m)  # (dV: the saved log-sum-exp lost log n)


def test_attention_of_a_fully_masked_row_filled_with_finfo_min():
    """Hugging Face's fill, torch.finfo(dtype).min, after a scale: exp(s − m) written as exp2 distributed
    its log₂e over the difference, s·log₂e − m·log₂e, and finfo.min·log₂e is −∞ in float32, so a fully
    masked row came out 0 (session 51; torch's is the mean of v). The distribution now needs both sides
    free of such constants (rules/analysis.py BOUNDED); −1e9 and −∞ masks keep their plans."""
    m, fill = _mask(), torch.finfo(torch.float32).min

    def attend(q, k, v, m):
        return torch.softmax((q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~m, fill), -1) @ v

    _check(attend, *(torch.randn(2, 7, 8) for _ in range(3)), m)


def test_logsumexp_log_softmax_and_an_additive_mask_with_a_finite_fill():
    m, x = _mask(), torch.randn(3, 7, 7)
    # (fp32 holds −1e9 to 64 and x − 10⁴ to 1e-3: relative tolerances; a wrong row is off by 1 or ∞)
    _check(lambda x, m: torch.logsumexp(x.masked_fill(~m, -1e4), -1), x, m, grad=False, rtol=1e-6)
    # (log-softmax keeps x − (m + log Σ): beside −1e9 fp32 rounds its −log n away on a row of fills —
    # torch's (x − m) − log Σ order cost log-softmax its resident plans, 498 → 623 µs predicted)
    _check(lambda x, m: torch.log_softmax(x.masked_fill(~m, -1e3), -1), x, m, grad=False, atol=1e-3)
    _check(lambda x, m: torch.softmax(x + (1.0 - m.float()) * -10000.0, -1), x, m, grad=False, atol=1e-3)


def test_cosine_embedding_loss_fills_then_subtracts_in_place():
    """F.cosine_embedding_loss builds its 1 − cos as empty_like().fill_(1).sub_(cos): it was refused as
    a read of uninitialised values ("read by aten.fill_.Scalar", which only writes)."""
    import torch.nn.functional as F

    y = torch.tensor([1.0, -1, 1, -1, 1, 1])
    _check(lambda a, b: F.cosine_embedding_loss(a, b, y.to(a.dtype), margin=0.2),
           torch.randn(6, 12), torch.randn(6, 12))


def test_a_causal_mask_with_a_finite_fill_still_bounds_the_loop():
    """masked_fill(~causal, -1e9) keeps an element of every row (j = 0 ≤ i): its select splits off as a
    mask as −inf's does, so the key loop stops at the diagonal (the same loop bounds), and the max takes
    the kept scores over the fill. Without the proof the finite fill stayed in the body: every key tile
    streamed (2× the kernel time of the −inf spelling on the H200 at L 2048)."""
    import math as m_

    def make(fill):
        def fn(q, k, v):
            s = q @ k.transpose(-1, -2) / 4
            keep = torch.arange(40)[None, :] <= torch.arange(40)[:, None]
            return torch.softmax(s.masked_fill(~keep, fill), -1) @ v
        return fn

    xs = [torch.randn(2, 40, 16) for _ in range(3)]
    bounds = []
    for fill in (-m_.inf, -1e9):
        prog = neptune_eq.compile(make(fill), *xs)
        bounds.append([ln.strip() for ln in prog.program.source.splitlines() if "hi_j =" in ln])
        got, want = prog(*xs), make(fill)(*(x.double() for x in xs))
        assert torch.allclose(got.double(), want, atol=1e-5)
    assert bounds[0] == bounds[1] and "t_i" in bounds[1][0], bounds
