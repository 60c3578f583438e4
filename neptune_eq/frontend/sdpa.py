"""`F.scaled_dot_product_attention` traced as its math, the same on every device.

Traced on CUDA tensors, SDPA dispatches to a fused backend chosen for the device (cuDNN, flash,
memory-efficient), whose aten ops are opaque to the capture; on a CPU it reaches a flash op that
has a decomposition. A torch-function mode reads the call before any backend is picked and traces
what the documentation defines instead:

    s = q·kᵀ · scale                      scale = 1/√E unless given
    s = where(tril(ones(L, S)), s, −∞)    is_causal (aligned top-left, as torch's)
    s = where(mask, s, −∞) | s + mask     a boolean mask keeps where True; a float mask is added
    out = softmax(s, −1) · v              k and v repeated over the query heads with enable_gqa

so CPU tests see the program a GPU compile sees. A row with no key left gives 0, like torch's math
backend (its safe softmax) and FlexAttention. Dropout is random: a nonzero `dropout_p` is refused.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .source import CaptureError, describe, user_frame

_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class SdpaAsMath(TorchFunctionMode):
    """Replaces each `F.scaled_dot_product_attention` call by its math while active."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return sdpa_math(**dict(zip(_PARAMS, args)), **kwargs)
        return func(*args, **kwargs)


def _caller() -> str | None:
    f = user_frame()
    return describe(f.f_code.co_filename, f.f_lineno) if f is not None else None


def _repeat_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(…, H_kv, S, E) → (…, heads, S, E), each kv head repeated for its group of query heads."""
    *lead, h_kv, s, e = x.shape
    if heads % h_kv:
        raise CaptureError(f"scaled_dot_product_attention(enable_gqa=True): {heads} query heads are not a "
                           f"multiple of {h_kv} key/value heads", _caller())
    group = heads // h_kv
    return x.unsqueeze(-3).expand(*lead, h_kv, group, s, e).reshape(*lead, heads, s, e)


def sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p != 0.0:
        raise CaptureError(f"scaled_dot_product_attention with dropout_p={dropout_p}: dropout is random, and a "
                           "compiled program is a function of its inputs (pass dropout_p=0.0 in evaluation, or "
                           "apply dropout outside)", _caller())
    if is_causal and attn_mask is not None:
        raise CaptureError("scaled_dot_product_attention: is_causal and attn_mask together (torch refuses them "
                           "too)", _caller())
    length, keys = query.shape[-2], key.shape[-2]
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        key, value = _repeat_heads(key, query.shape[-3]), _repeat_heads(value, query.shape[-3])
    s = (query @ key.transpose(-2, -1)) * (1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)
    if is_causal:
        keep = torch.ones(length, keys, dtype=torch.bool, device=query.device).tril()
        s = s.masked_fill(~keep, -math.inf)
    elif attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask
    return torch.softmax(s, dim=-1) @ value
