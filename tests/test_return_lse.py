"""Issue 14, item 4: neptune_eq.attention(..., return_lse=True) returns (out, lse) like FlexAttention,
from one compiled program with two outputs (the row max and sum shared), gradients through both."""

from __future__ import annotations

import math

import torch

import neptune_eq


def _reference(q, k, v, keep, scale):
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~keep, -math.inf)
    return torch.softmax(s, -1).nan_to_num(0.0) @ v, torch.logsumexp(s, -1)


def test_return_lse_matches_float64_with_empty_rows():
    L, D = 37, 8  # not a tile multiple; rows 0-2 keep no key
    q, k, v = (torch.randn(1, 2, L, D, generator=torch.Generator().manual_seed(s), dtype=torch.float16)
               for s in range(3))

    def mask(b, h, qi, kv):
        return (qi >= kv) & (qi > 2)

    out, lse = neptune_eq.attention(q, k, v, mask_mod=mask, return_lse=True)
    i = torch.arange(L)
    keep = (i[:, None] >= i[None, :]) & (i[:, None] > 2)
    ref_out, ref_lse = _reference(q.double(), k.double(), v.double(), keep, 1 / math.sqrt(D))
    assert out.dtype == torch.float16 and lse.dtype == torch.float32 and lse.shape == (1, 2, L)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) and (lse[..., :3] == -math.inf).all()
    fin = torch.isfinite(ref_lse)
    assert (lse.double()[fin] - ref_lse[fin]).abs().max() < 1e-5
    assert (out.double() - ref_out).abs().max() < 2e-3


def test_gradients_flow_through_out_and_lse():
    L, D = 9, 4
    q, k, v = (torch.randn(1, 2, L, D, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
               for s in range(3))

    def causal(b, h, qi, kv):
        return qi >= kv

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = neptune_eq.attention(*leaves, mask_mod=causal, return_lse=True)
    (out.pow(2).sum() + (lse * torch.linspace(-1, 1, L)).sum()).backward()
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    i = torch.arange(L)
    r_out, r_lse = _reference(*ref, i[:, None] >= i[None, :], 0.5)
    (r_out.pow(2).sum() + (r_lse * torch.linspace(-1, 1, L)).sum()).backward()
    for a, b in zip(leaves, ref):
        assert torch.allclose(a.grad, b.grad, atol=1e-9), (a.grad - b.grad).abs().max()
