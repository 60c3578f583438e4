"""FlexAttention-compatible entry: score_mod/mask_mod combinations against a plain-PyTorch
reference that applies the modifiers elementwise with torch.vmap (as FlexAttention does)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from test_frontend import calls, nodes, randn, rel_err

from neptune_eq import ir, masks
from neptune_eq.frontend import CaptureError, attention_capture, attention_program

B, HQ, HKV, L, D = 2, 4, 2, 12, 8
SLOPES = torch.exp2(-8.0 * (torch.arange(HQ, dtype=torch.float64) + 1) / HQ)
DOC_IDS = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2])
OFFSETS = torch.tensor([[0, 1, 2, 3], [1, 0, 2, 1]])


def alibi(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def softcap(score, b, h, q_idx, kv_idx):
    return 20 * torch.tanh(score / 20)


def relative(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx - kv_idx > 2, score - 0.5, score * 1.5)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 4)


def document(b, h, q_idx, kv_idx):
    return (DOC_IDS[q_idx] == DOC_IDS[kv_idx]) & (q_idx >= kv_idx)


def per_head_offset(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx + OFFSETS[b, h]


def leading_rows_empty(b, h, q_idx, kv_idx):
    return (q_idx >= 3) & ~(kv_idx > q_idx)


def flex_reference(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """Plain PyTorch: modifiers applied per element through vmap; fully masked rows give 0."""
    b_, hq, lq, d = q.shape
    lkv = k.shape[2]
    g = hq // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(d) if scale is None else scale)
    grid = torch.meshgrid(torch.arange(b_), torch.arange(hq), torch.arange(lq), torch.arange(lkv), indexing="ij")
    flat = [x.reshape(-1) for x in grid]
    if score_mod is not None:
        s = torch.vmap(score_mod)(s.reshape(-1), *flat).reshape(s.shape)
    if mask_mod is not None:
        keep = torch.vmap(mask_mod)(*flat).reshape(s.shape)
        s = s.masked_fill(~keep, -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v


def qkv(hkv=HKV, lq=L):
    return randn(B, HQ, lq, D), randn(B, hkv, L, D, seed=1), randn(B, hkv, L, D + 2, seed=2)


COMBOS = [
    (None, None),
    (None, causal),
    (alibi, causal),
    (softcap, sliding),
    (relative, document),
    (alibi, per_head_offset),
    (softcap, leading_rows_empty),
]


@pytest.mark.parametrize(("score_mod", "mask_mod"), COMBOS,
                         ids=[f"{getattr(s, '__name__', 'none')}-{getattr(m, '__name__', 'none')}" for s, m in COMBOS])
def test_flex_combos_match_reference(score_mod, mask_mod):
    q, k, v = qkv()
    c = attention_capture(q, k, v, score_mod=score_mod, mask_mod=mask_mod, enable_gqa=True)
    want = flex_reference(q, k, v, score_mod, mask_mod)
    assert rel_err(c.reference(q, k, v), want) < 1e-10


def test_flex_program_shape_and_gqa_index():
    q, k, v = qkv()
    prog = attention_program(q, k, v, score_mod=alibi, mask_mod=causal, enable_gqa=True)
    assert prog.outputs[0].axes == ("b", "h", "i", "e")
    assert prog.inputs["q"].axes == ("b", "h", "i", "d")
    k_loads = [n for n in nodes(prog, ir.Load) if n.tensor == "k"]
    assert all(n.index[1] == ir.Call("floordiv", (ir.Index("h"), ir.Const(HQ // HKV))) for n in k_loads)
    slope_loads = [n for n in nodes(prog, ir.Load) if n.tensor == "SLOPES"]
    assert slope_loads and all(n.index == (ir.Index("h"),) for n in slope_loads)


def test_flex_masks_are_affine():
    q, k, v = qkv()
    prog = attention_program(q, k, v, mask_mod=sliding, enable_gqa=True)
    (w,) = {n for n in calls(prog, "where") if n.args[2] == ir.Const(-math.inf)}
    assert masks.affine(w.args[0]) is not None, ir.show(w.args[0])


def test_flex_document_ids_are_int_input():
    q, k, v = qkv()
    c = attention_capture(q, k, v, mask_mod=document, enable_gqa=True)
    assert c.program.inputs["DOC_IDS"].dtype == "int64"
    assert torch.equal(c.constants["DOC_IDS"], DOC_IDS)


def test_flex_fully_masked_rows_give_zero():
    q, k, v = qkv()
    c = attention_capture(q, k, v, mask_mod=leading_rows_empty, enable_gqa=True)
    out = c.reference(q, k, v)
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3]))


def test_flex_scale_and_decode():
    q, k, v = qkv(hkv=HQ, lq=1)
    c = attention_capture(q, k, v, score_mod=alibi, scale=0.3)
    assert rel_err(c.reference(q, k, v), flex_reference(q, k, v, alibi, scale=0.3)) < 1e-10
    assert "i" not in c.program.inputs["q"].axes  # one query row: not an axis


def test_flex_matches_torch_flex_attention():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    q, k, v = qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        block_mask = flex.create_block_mask(document, B, HQ, L, L, device="cpu")
        want = flex.flex_attention(q, k, v, score_mod=alibi, block_mask=block_mask, enable_gqa=True)
    c = attention_capture(q, k, v, score_mod=alibi, mask_mod=document, enable_gqa=True)
    assert rel_err(c.reference(q, k, v), want) < 1e-10


def test_flex_gqa_needs_flag():
    with pytest.raises(CaptureError, match="enable_gqa"):
        attention_program(*qkv())


def test_flex_unsupported_modifier_names_line():
    def bad(score, b, h, q_idx, kv_idx):
        return torch.cumsum(score, -1)

    with pytest.raises(CaptureError, match=r"aten\.cumsum at test_frontend_flex\.py:\d+: return torch\.cumsum"):
        attention_program(*qkv(), score_mod=bad, enable_gqa=True)


@pytest.mark.slow
def test_flex_end_to_end_through_triton():
    q, k, v = (t.float() for t in qkv(hkv=HQ))
    slopes = SLOPES.float()

    def alibi32(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    run = attention_capture(q, k, v, score_mod=alibi32, mask_mod=sliding).compile()
    want = flex_reference(q.double(), k.double(), v.double(), alibi, sliding)
    assert rel_err(run(q, k, v), want) < 1e-4
