"""FlexAttention-compatible entry: the `score_mod(score, b, h, q_idx, kv_idx)` and
`mask_mod(b, h, q_idx, kv_idx)` callables of torch.nn.attention.flex_attention, translated to
the IR.

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    prog = attention_program(q, k, v, score_mod=alibi, mask_mod=causal)

The modifiers are called once, on broadcasting tensors instead of scalars: `score` is the scaled
score [B, H, Lq, Lkv], b/h/q_idx/kv_idx are `torch.arange` views of shapes [B,1,1,1], [1,H,1,1],
[1,1,Lq,1] and [1,1,1,Lkv]. Modifiers written with elementwise tensor operations behave as under
FlexAttention's vmap: arithmetic, comparisons, &, |, ~, torch.where, torch.tanh, indexing
captured tensors (slopes[h], doc_ids[q_idx], offsets[b, h]); Python control flow on the
arguments fails in both. Index arithmetic and comparisons become
expressions of the program's axes (b, h, i for the query, j for the key), so masks such as
`q_idx >= kv_idx` or `q_idx - kv_idx < w` stay affine. Tensors the modifiers capture become
extra program inputs named after their variables (`slopes`, `doc_ids`); `attention_capture`
keeps their values and calls the program like `flex_attention(q, k, v)`.

Semantics follow FlexAttention: scale defaults to 1/sqrt(head_dim), the modifier sees the scaled
score, h is the query head, masked scores are -inf, and a query row with every key masked gives
0. Grouped-query attention (Hq = G·Hkv, enable_gqa=True) reads kv head h // G.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import torch

from .. import ir
from .capture import Captured, capture
from .source import CaptureError


def attention_function(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score_mod: Callable | None = None,
                       mask_mod: Callable | None = None, enable_gqa: bool = False,
                       scale: float | None = None, return_lse: bool = False) -> Callable:
    """flex attention with these modifiers as a plain PyTorch function of (q, k, v) at these shapes:
    what attention_capture traces, and what runs eagerly where there is nothing to compile (a
    zero-size dimension). With return_lse it returns (out, lse): lse [B, Hq, Lq] float32, the natural
    log-sum-exp of each row's modified, masked scores (-inf for a row with no kept key)."""
    _check_shapes(q, k, v, enable_gqa)
    if scale is None and q.shape[-1] == 0:
        raise CaptureError("the default scale 1/sqrt(head_dim) needs head_dim > 0; pass scale=")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)

    def flex_attention(q, k, v):
        batch, heads, lq, _ = q.shape
        lkv = k.shape[2]
        group = heads // k.shape[1]
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        score = (q @ k.transpose(-2, -1)) * scale
        b = torch.arange(batch, device=q.device).view(batch, 1, 1, 1)
        h = torch.arange(heads, device=q.device).view(1, heads, 1, 1)
        q_idx = torch.arange(lq, device=q.device).view(1, 1, lq, 1)
        kv_idx = torch.arange(lkv, device=q.device).view(1, 1, 1, lkv)
        if score_mod is not None:
            score = score_mod(score, b, h, q_idx, kv_idx)
        if mask_mod is not None:
            keep = mask_mod(b, h, q_idx, kv_idx)
            if not isinstance(keep, torch.Tensor):
                keep = torch.tensor(bool(keep), device=q.device)
            score = torch.where(keep, score, -math.inf)
        # a row with every key masked gives 0, as FlexAttention (torch.softmax would give nan)
        p = torch.ops.aten._safe_softmax(score, -1)
        # (a modifier reading a float32 tensor promotes a bf16 score: the probabilities meet v in v's
        # dtype, as FlexAttention's kernel casts them; it had failed to trace, float32 @ bf16)
        out = (p if p.dtype == v.dtype else p.to(v.dtype)) @ v
        return (out, torch.logsumexp(score.float(), -1)) if return_lse else out

    return flex_attention


_SCALED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scale tensor → {score_mod: its tensor_scale}


def tensor_scale(score_mod: Callable | None, scale: torch.Tensor) -> Callable:
    """score_mod of the score scaled by tensor `scale` (an annealed temperature, a learnable one): the
    tensor is captured like any tensor a modifier reads, so it is read at every call (its value had been
    taken once, float(scale), and an in-place write ignored) and gets its gradient (it had been
    detached). One function per (tensor, score_mod), so calls keep hitting one compile."""
    per = _SCALED.setdefault(scale, {})
    if score_mod not in per:
        def scaled(score, b, h, q_idx, kv_idx):
            score = score * scale
            return score if score_mod is None else score_mod(score, b, h, q_idx, kv_idx)

        per[score_mod] = scaled
    return per[score_mod]


def attention_capture(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score_mod: Callable | None = None,
                      mask_mod: Callable | None = None, enable_gqa: bool = False,
                      scale: float | None = None, return_lse: bool = False) -> Captured:
    """Trace flex attention with these modifiers at the shapes of q [B, Hq, Lq, D], k [B, Hkv, Lkv, D],
    v [B, Hkv, Lkv, Dv]; call the result's `reference(q, k, v)` or `compile()` like flex_attention.
    What the modifiers read from their environment (a captured `cap`, a `slopes` tensor) is guarded:
    a compiled call re-captures when it changes."""
    fn = attention_function(q, k, v, score_mod, mask_mod, enable_gqa, scale, return_lse)
    return capture(fn, q, k, v, name="flex_attention")


def attention_program(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score_mod: Callable | None = None,
                      mask_mod: Callable | None = None, enable_gqa: bool = False,
                      scale: float | None = None) -> ir.Program:
    """The ir.Program of flex_attention(q, k, v, score_mod, block_mask from mask_mod, scale,
    enable_gqa) at these shapes: inputs q, k, v plus the tensors the modifiers capture; output
    out0 over [b, h, i, e] (size-1 dimensions, such as b for batch 1, are not axes)."""
    return attention_capture(q, k, v, score_mod, mask_mod, enable_gqa, scale).program


def _check_shapes(q, k, v, enable_gqa: bool) -> None:
    if not (q.dim() == k.dim() == v.dim() == 4):
        raise CaptureError(f"q, k, v must be [B, H, L, D]; got shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                           f"{tuple(v.shape)}")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise CaptureError(f"incompatible q, k, v shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        if not enable_gqa:
            raise CaptureError(f"q has {hq} heads and k/v {hkv}; pass enable_gqa=True for grouped-query attention")
        if hq % hkv:
            raise CaptureError(f"grouped-query attention needs q heads ({hq}) divisible by kv heads ({hkv})")
