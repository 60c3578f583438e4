"""F.scaled_dot_product_attention is traced as its math on every device: CUDA tensors would dispatch
to fused backends (cuDNN, flash) whose aten ops the capture cannot read, so a GPU user's SDPA call
was refused (H100, 2026-11-27: `aten._scaled_dot_product_cudnn_attention`). Each of its arguments
against float64 SDPA, and the plan it gets is the hand-written attention's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_frontend import check_capture, randn

import neptune_eq
from neptune_eq.frontend import CaptureError, capture


def _qkv(b=2, hq=4, hkv=4, lq=9, s=11, e=8):
    return randn(b, hq, lq, e), randn(b, hkv, s, e, seed=1), randn(b, hkv, s, e, seed=2)


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"scale": 0.3}, {"enable_gqa": True},
                                    {"enable_gqa": True, "is_causal": True}])
def test_sdpa_arguments_match_float64(kwargs):
    q, k, v = _qkv(hkv=2 if kwargs.get("enable_gqa") else 4)
    captured = check_capture(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), q, k, v)
    ops = {str(n.target) for n in captured.graph.graph.nodes}
    assert not any("scaled_dot_product" in op for op in ops), ops


def test_sdpa_masks_match_float64():
    q, k, v = _qkv()
    keep = torch.rand(2, 1, 9, 11, generator=torch.Generator().manual_seed(3)) > 0.3
    keep[..., 0] = True  # (eager's math SDPA gives NaN on a row with no key; the capture gives 0)
    check_capture(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, keep)
    check_capture(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v,
                  randn(9, 11, seed=4))


def test_sdpa_refuses_dropout_by_name():
    q, k, v = _qkv()
    with pytest.raises(CaptureError, match=r"dropout_p=0.1.*test_frontend_sdpa.py"):
        capture(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1), q, k, v)


def test_sdpa_gets_the_plan_of_the_attention_written_out():
    def written(q, k, v):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        return torch.softmax(s.masked_fill(~keep, -math.inf), dim=-1) @ v

    q, k, v = (x.to(torch.float16) for x in _qkv(b=1, hq=2, hkv=2, lq=256, s=256, e=64))
    ours = neptune_eq.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)
    want = neptune_eq.compile(written, q, k, v)
    assert ours.alternatives[0].structure == want.alternatives[0].structure
    assert ours.alternatives[0].cost.time == pytest.approx(want.alternatives[0].cost.time)
