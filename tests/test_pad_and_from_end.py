"""F.pad in constant mode and positions counted from the end (frontend/ops_index.py), found by a hunt:
each test is a small program a user would write, compared against eager float64."""

from __future__ import annotations

import torch

import neptune_eq


def _x(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def test_a_slice_starting_before_the_axis_is_clamped_to_its_start():
    """x[:, -3:-1] at length 2 is x[:, 0:1] (torch clamps the start to 0), not a read at -1."""
    fn = lambda x: x[:, -3:-1].sum(1)  # noqa: E731
    x = _x(2, 2)
    torch.testing.assert_close(neptune_eq.compile(fn, x)(x), fn(x), rtol=1e-9, atol=1e-12)
