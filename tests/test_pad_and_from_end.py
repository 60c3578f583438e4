"""F.pad in constant mode and positions counted from the end (frontend/ops_index.py), found by a hunt:
each test is a small program a user would write, compared against eager float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq.frontend.source import CaptureError


def _x(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def test_a_slice_starting_before_the_axis_is_clamped_to_its_start():
    """x[:, -3:-1] at length 2 is x[:, 0:1] (torch clamps the start to 0), not a read at -1."""
    fn = lambda x: x[:, -3:-1].sum(1)  # noqa: E731
    x = _x(2, 2)
    torch.testing.assert_close(neptune_eq.compile(fn, x)(x), fn(x), rtol=1e-9, atol=1e-12)


def test_last_token_pooling_by_a_summed_mask_is_refused_naming_the_reduction():
    """h[arange(b), mask.sum(1) - 1] read h at an index no kernel computes first: an internal KeyError
    at extraction; now a CaptureError naming the reduction (the index passed in works)."""
    fn = lambda h, m: h[torch.arange(h.shape[0]), m.sum(1) - 1]  # noqa: E731
    h, m = _x(2, 4, 3), torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(CaptureError, match=r"reduction \(sum_"):
        neptune_eq.compile(fn, h, m)
    given = lambda h, last: h[torch.arange(h.shape[0]), last]  # noqa: E731
    last = m.sum(1) - 1
    torch.testing.assert_close(neptune_eq.compile(given, h, last)(h, last), given(h, last), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("fn", [
    lambda x: F.pad(x, (0, 0, -1, 1)) + x,                 # a crop and a pad: x[min2(i + 1, 4 - 1)]
    lambda x: F.pad(x[:, 1:], (0, 0, 0, 1), value=2.0) - x,  # the next token: x[min2(i, 3 - 1) + 1]
])
def test_the_gradient_of_a_padded_shift_is_a_shift_back(fn):
    """F.pad clamps its read by the length less one, written `n - 1` of constants in a static capture:
    the shifted-read adjoint did not fold it, found no clamped shift and refused (NoBackward)."""
    x = _x(2, 4, 3).requires_grad_()
    want = x.detach().clone().requires_grad_()
    (neptune_eq.compile(fn, x)(x) ** 2).sum().backward()
    (fn(want) ** 2).sum().backward()
    torch.testing.assert_close(x.grad, want.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("fn", [
    lambda x: x[:, :1] * x,                              # x[b, 0, d] against x[b, i, d]
    lambda x: F.pad(x[:, 1:], (0, 0, 0, 1)) - x,         # at length 2: x[b, 1, d], a constant position
])
def test_the_gradient_of_a_fixed_position_read_beside_its_whole_axis(fn):
    """The cotangent varies along the axis named as x's gathered dimension, which a constant index
    does not read: it is summed out before the one-hot test (had refused: 'would reuse an axis')."""
    x = _x(2, 2, 3).requires_grad_()
    want = x.detach().clone().requires_grad_()
    (neptune_eq.compile(fn, x)(x) ** 2).sum().backward()
    (fn(want) ** 2).sum().backward()
    torch.testing.assert_close(x.grad, want.grad, rtol=1e-9, atol=1e-12)


def test_a_float64_backward_whose_dot_operand_is_a_mask_alone():
    """Padding three dimensions: the backward contracts a cotangent with a mask's indicator, a bare
    1.0 under tl.where — a float32 operand of a float64 tl.dot (Triton: 'must be same dtype')."""
    fn = lambda x: F.pad(x, (1, 1, 1, 0, 0, 2), value=0.25).sum((1, 2))  # noqa: E731
    x = _x(2, 2, 3, 2).requires_grad_()
    want = x.detach().clone().requires_grad_()
    (neptune_eq.compile(fn, x)(x) ** 2).sum().backward()
    (fn(want) ** 2).sum().backward()
    torch.testing.assert_close(x.grad, want.grad, rtol=1e-9, atol=1e-12)
