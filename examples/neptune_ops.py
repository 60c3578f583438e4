"""The ten attention operators of the Neptune paper, written as ordinary PyTorch.

Nothing here uses neptune_eq: these are the functions a user hands to
`neptune_eq.frontend.capture`. Inputs are q [B, Hq, Lq, D], k and v [B, Hkv, L, D]; prefill (pf)
has Lq = L, decode (dc) one query row, Lq = 1, which sits at position L - 1. Scores are scaled by
1/sqrt(D) before any modifier. Head counts come from the input shapes (grouped-query attention
when Hq > Hkv), the sliding window and the soft cap are keyword parameters, so tests can run
the same functions at small sizes:

    q, k, v = example_inputs("window_pf", 64, head_dim=16, heads=(4, 2))
    out = window_pf(q, k, v, window=16)

| op         | q heads / kv heads | mask and score modifier                                   |
| global_pf  | 32 / 32            | none                                                      |
| causal_pf  | 32 / 32            | causal (key <= query)                                     |
| alibi_pf   | 32 / 32            | causal; score + slope[h]·(key − query), slope[h] = 2^(−8(h+1)/H) |
| gqa_pf     | 64 / 8             | causal                                                    |
| softcap_pf | 32 / 16            | causal; 50·tanh(score/50)                                 |
| window_pf  | 32 / 8             | causal and query − key < 4096; softcap 50                 |
| causal_dc  | 32 / 32            | none (the one query sees all keys)                        |
| alibi_dc   | 32 / 32            | ALiBi                                                     |
| gqa_dc     | 64 / 8             | none                                                      |
| softcap_dc | 32 / 16            | softcap 50                                                |
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------- prefill


def global_pf(q, k, v):
    """Full (bidirectional) attention with the softmax written out by hand."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    p = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return (p @ v) / p.sum(dim=-1, keepdim=True)


def causal_pf(q, k, v):
    """Causal attention: query i sees keys j <= i."""
    L, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    causal = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def alibi_slopes(n_heads: int, device=None) -> torch.Tensor:
    """slope[h] = 2^(-8 (h + 1) / H)."""
    return 2.0 ** (-8.0 * (torch.arange(n_heads, device=device) + 1) / n_heads)


def alibi_pf(q, k, v):
    """Causal attention with the ALiBi bias slope[h]·(key − query)."""
    _, H, L, D = q.shape
    q_pos = torch.arange(L, device=q.device)[:, None]
    k_pos = torch.arange(k.shape[-2], device=q.device)[None, :]
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(D)
    wide = torch.promote_types(scores.dtype, torch.float32)  # the bias is added in (at least) fp32
    scores = scores.to(wide) + alibi_slopes(H, q.device)[:, None, None] * (k_pos - q_pos)
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    return F.softmax(scores, dim=-1).to(v.dtype) @ v


def gqa_pf(q, k, v):
    """Causal grouped-query attention: each kv head serves Hq / Hkv query heads."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    L, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = torch.arange(S, device=q.device)[None, :] <= torch.arange(L, device=q.device)[:, None]
    scores = torch.where(mask, scores, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def softcap_pf(q, k, v, softcap: float = 50.0):
    """Causal grouped-query attention with logit soft-capping softcap·tanh(score/softcap)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(q.shape[-2], device=q.device)
    j = torch.arange(k.shape[-2], device=q.device)
    scores = scores.masked_fill(j[None, :] > i[:, None], -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def window_pf(q, k, v, window: int = 4096, softcap: float = 50.0):
    """Sliding-window causal grouped-query attention (query − key < window) with soft-capping.
    The kv heads are broadcast to the query heads with expand + reshape."""
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    k = k[:, :, None].expand(B, Hkv, H // Hkv, S, D).reshape(B, H, S, D)
    v = v[:, :, None].expand(B, Hkv, H // Hkv, S, v.shape[-1]).reshape(B, H, S, v.shape[-1])
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    scores = softcap * torch.tanh(scores / softcap)
    q_pos = torch.arange(L, device=q.device).view(L, 1)
    k_pos = torch.arange(S, device=q.device).view(1, S)
    keep = (k_pos <= q_pos) & (q_pos - k_pos < window)
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# ---------------------------------------------------------------- decode (one query row)


def causal_dc(q, k, v):
    """Decode step of causal attention: the newest query sees every cached key."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return scores.softmax(dim=-1) @ v


def alibi_dc(q, k, v):
    """Decode step with the ALiBi bias; the query sits at position L - 1."""
    H, Lq, S = q.shape[1], q.shape[2], k.shape[2]
    q_pos = torch.arange(Lq, device=q.device)[:, None] + (S - Lq)
    k_pos = torch.arange(S, device=q.device)[None, :]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    wide = torch.promote_types(scores.dtype, torch.float32)  # the bias is added in (at least) fp32
    scores = scores.to(wide) + alibi_slopes(H, q.device).view(1, H, 1, 1) * (k_pos - q_pos)
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v


def gqa_dc(q, k, v):
    """Decode step of grouped-query attention, FlashDecoding style: the query heads of one kv head
    are stacked as rows, so each kv head is read once."""
    B, H, Lq, D = q.shape
    Hkv = k.shape[1]
    rows = q.reshape(B, Hkv, (H // Hkv) * Lq, D)
    scores = rows @ k.transpose(-2, -1) / math.sqrt(D)
    out = torch.softmax(scores, dim=-1) @ v
    return out.reshape(B, H, Lq, v.shape[-1])


def softcap_dc(q, k, v, softcap: float = 50.0):
    """Decode step of grouped-query attention with soft-capping."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = softcap * torch.tanh(scores / softcap)
    return torch.softmax(scores, dim=-1) @ v


# ---------------------------------------------------------------- registry and inputs

OPS = {
    "global_pf": (global_pf, "prefill"),
    "causal_pf": (causal_pf, "prefill"),
    "alibi_pf": (alibi_pf, "prefill"),
    "gqa_pf": (gqa_pf, "prefill"),
    "softcap_pf": (softcap_pf, "prefill"),
    "window_pf": (window_pf, "prefill"),
    "causal_dc": (causal_dc, "decode"),
    "alibi_dc": (alibi_dc, "decode"),
    "gqa_dc": (gqa_dc, "decode"),
    "softcap_dc": (softcap_dc, "decode"),
}

HEADS = {  # (query heads, kv heads) at the paper's sizes
    "global_pf": (32, 32), "causal_pf": (32, 32), "alibi_pf": (32, 32), "gqa_pf": (64, 8),
    "softcap_pf": (32, 16), "window_pf": (32, 8), "causal_dc": (32, 32), "alibi_dc": (32, 32),
    "gqa_dc": (64, 8), "softcap_dc": (32, 16),
}


def example_inputs(name: str, L: int, *, dtype=torch.float32, device="cpu", batch: int = 1, head_dim: int = 128,
                   heads: tuple[int, int] | None = None, seed: int = 0):
    """Random (q, k, v) for operator `name` with L keys (and L queries for prefill, 1 for decode).

    `heads=(Hq, Hkv)` overrides the paper's head counts (e.g. (4, 2) in tests)."""
    if name not in OPS:
        raise KeyError(f"unknown operator {name!r}; known: {', '.join(OPS)}")
    hq, hkv = HEADS[name] if heads is None else heads
    lq = L if OPS[name][1] == "prefill" else 1
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)

    return randn(batch, hq, lq, head_dim), randn(batch, hkv, L, head_dim), randn(batch, hkv, L, head_dim)
