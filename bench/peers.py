"""The implementations a user would otherwise pick, set up for each benchmark case.

    sdpa     torch.nn.functional.scaled_dot_product_attention: natively (is_causal, enable_gqa) where
             the operator fits, with a dense mask where it does not and the mask fits in memory;
             not applicable to soft-capping (a modifier of the scores, not a mask)
    flex     torch.compile'd flex_attention with score_mod / block masks
    compile  torch.compile of the same plain PyTorch function neptune_eq compiles

Each builder returns (callable, note) or (None, reason).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from cases import WINDOW, Case, neptune_ops

_MASK_LIMIT_BYTES = 24 * 2**30


def _alibi_bias(case: Case, q, k) -> torch.Tensor:
    hq = case.hq_hkv[0]
    L, S = q.shape[-2], k.shape[-2]
    slopes = neptune_ops.alibi_slopes(hq, q.device).to(q.dtype)
    q_pos = torch.arange(L, device=q.device)[:, None] + (S - L)
    k_pos = torch.arange(S, device=q.device)[None, :]
    bias = slopes[:, None, None] * (k_pos - q_pos).to(q.dtype)
    if case.kind == "pf":
        bias = bias.masked_fill(k_pos > q_pos, float("-inf"))
    return bias[None]


def sdpa(case: Case, q, k, v):
    gqa = case.hq_hkv[0] != case.hq_hkv[1]
    op = case.op
    if op.startswith("softcap") or op == "window_pf":
        return None, "SDPA has no score modifier (soft-capping; window_pf soft-caps too)"
    if op in ("global_pf", "causal_dc"):
        return (lambda: F.scaled_dot_product_attention(q, k, v)), "native"
    if op in ("causal_pf", "gqa_pf"):
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)), "native"
    if op == "gqa_dc":
        return (lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)), "native"
    if op.startswith("alibi"):
        nbytes = case.hq_hkv[0] * q.shape[-2] * k.shape[-2] * q.element_size()
        if nbytes > _MASK_LIMIT_BYTES:
            return None, f"dense ALiBi mask of {nbytes / 2**30:.0f} GiB does not fit"
        bias = _alibi_bias(case, q, k)
        return (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias)), "dense bias mask"
    return None, "not applicable"


def _fresh_dynamo() -> None:
    """Dynamo caches compiled frames per code object across torch.compile wrappers; after its
    recompile limit it silently falls back to eager (for flex: the unfused path that materialises
    the scores). Each case therefore starts from a reset cache and a high limit."""
    import torch._dynamo

    torch._dynamo.reset()
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)


def _flex_fn():
    from torch.nn.attention.flex_attention import flex_attention

    _fresh_dynamo()
    return torch.compile(flex_attention, dynamic=False)


def flex(case: Case, q, k, v):
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError:
        return None, "flex_attention unavailable"
    hq, hkv = case.hq_hkv
    gqa = hq != hkv
    L, S = q.shape[-2], k.shape[-2]
    offset = S - L
    slopes = neptune_ops.alibi_slopes(hq, q.device).float()
    cap = 50.0

    def causal(b, h, qi, kv):
        return kv <= qi + offset

    def window(b, h, qi, kv):
        return (kv <= qi + offset) & (qi + offset - kv < WINDOW)

    def alibi(score, b, h, qi, kv):
        return score + slopes[h] * (kv - qi - offset)

    def softcap(score, b, h, qi, kv):
        return cap * torch.tanh(score / cap)

    score_mod = {"alibi_pf": alibi, "alibi_dc": alibi, "softcap_pf": softcap, "softcap_dc": softcap,
                 "window_pf": softcap}.get(case.op)
    mask_mod = {"causal_pf": causal, "alibi_pf": causal, "gqa_pf": causal, "softcap_pf": causal,
                "window_pf": window}.get(case.op)
    block_mask = create_block_mask(mask_mod, None, None, L, S, device=q.device) if mask_mod else None
    fn = _flex_fn()

    def run():
        return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)

    return run, "torch.compile(flex_attention)" + (" + block mask" if block_mask is not None else "")


def compiled(case: Case, q, k, v):
    _fresh_dynamo()
    fn = torch.compile(case.fn, dynamic=False)
    return (lambda: fn(q, k, v)), "torch.compile(plain function)"


PEERS = {"sdpa": sdpa, "flex": flex, "compile": compiled}
