"""Every alternative of masked programs whose masked axis fits one tile exactly (64 wide) and not
(37 wide), in the interpreter against float64. A row held whole in one exact tile had no loop
range, and the components' affine masks — evaluated only on a loop's edge tiles — were dropped:
causal softmax of 64-wide rows was silently wrong (rel. err. 1.0), and so were two sums over one
pass with complementary masks (the gradient of torch.stack: where(e < 1, g, 0) summed over e)."""

from __future__ import annotations

import pytest
import torch

import neptune_eq
from neptune_eq.frontend.compiled import CompiledFunction


def causal_softmax(s):
    keep = torch.arange(s.shape[-1])[None, :] <= torch.arange(s.shape[-2])[:, None]
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1)


def complementary_sums(x):
    j = torch.arange(x.shape[-1])[None, :]
    return torch.where(j < 3, x, 0.0).sum(-1) + 3 * torch.where(j >= 3, x, 0.0).sum(-1)


@pytest.mark.parametrize("fn", [causal_softmax, complementary_sums])
@pytest.mark.parametrize("width", [64, 37])
def test_every_alternative_keeps_its_masks(fn, width):
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(0))
    want = fn(x.double())
    prog = neptune_eq.compile(fn, x)
    base = prog.program.pin(0)
    assert any("resident" in a.structure for a in base.alternatives)
    for a in base.alternatives:
        got = CompiledFunction(prog.captured, base.pin(a.id))(x)
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-6, a.structure
