"""What a user would otherwise run for each program of bench/beyond, set up on the case's inputs.

    eager    the plain PyTorch function
    compile  torch.compile of the same function
    sdpa     F.scaled_dot_product_attention (attention only): a dense bias as attn_mask, is_causal,
             enable_gqa
    flex     torch.compile(flex_attention) (attention only): the bias read by a score_mod, causality
             as a mask_mod with a block mask, enable_gqa; on a CPU flex_attention runs uncompiled
    liger    Liger-Kernel where it has the operation: softmax; RMSNorm / LayerNorm then torch.mm;
             the fused linear cross-entropy

A builder returns a Peer (a thunk computing the program's output and a note) or a Skipped with its
reason ("not applicable: …" where the peer has no such operation, "not available: …" where its
package is missing or cannot run here). Packages are imported when a builder runs, never at import.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .programs import EPS, Case


@dataclass(frozen=True)
class Peer:
    run: Callable[[], torch.Tensor]
    note: str


@dataclass(frozen=True)
class Skipped:
    reason: str


Builder = Callable[[Case, tuple], "Peer | Skipped"]


def _fresh_dynamo() -> None:
    """Each torch.compile'd peer starts from a reset dynamo cache with a high recompile limit
    (past the limit dynamo silently falls back to eager; see bench/peers.py)."""
    import torch._dynamo

    torch._dynamo.reset()
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)


def eager(case: Case, xs: tuple) -> Peer | Skipped:
    fn = case.program.fn
    return Peer(lambda: fn(*xs), "the plain PyTorch function")


def compiled(case: Case, xs: tuple) -> Peer | Skipped:
    _fresh_dynamo()
    fn = torch.compile(case.program.fn, dynamic=False)
    return Peer(lambda: fn(*xs), "torch.compile(plain function)")


def sdpa(case: Case, xs: tuple) -> Peer | Skipped:
    spec = case.program.attention
    if spec is None:
        return Skipped("not applicable: not attention")
    q, k, v = xs[:3]
    gqa = q.shape[1] != k.shape[1]
    if spec.bias_input is not None:
        bias = xs[spec.bias_input][None]  # (1, heads, L, S): added to the scaled scores
        return Peer(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=gqa),
                    "dense bias as attn_mask")
    return Peer(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=spec.causal, enable_gqa=gqa),
                "native" + (" is_causal" if spec.causal else "") + (" enable_gqa" if gqa else ""))


def flex(case: Case, xs: tuple) -> Peer | Skipped:
    spec = case.program.attention
    if spec is None:
        return Skipped("not applicable: not attention")
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        return Skipped(f"not available: {e}")
    q, k, v = xs[:3]
    gqa = q.shape[1] != k.shape[1]
    L, S = q.shape[-2], k.shape[-2]
    score_mod = block_mask = None
    if spec.bias_input is not None:
        bias = xs[spec.bias_input]

        def score_mod(score, b, h, qi, kv):
            return score + bias[h, qi, kv]

    if spec.causal:
        def causal(b, h, qi, kv):
            return kv <= qi

        block_mask = create_block_mask(causal, None, None, L, S, device=q.device.type)
    if q.is_cuda:
        _fresh_dynamo()
        fn, note = torch.compile(flex_attention, dynamic=False), "torch.compile(flex_attention)"
    else:  # inductor's CPU flex kernels take minutes to build; the dry mode only checks the call
        fn, note = _uncompiled(flex_attention), "flex_attention uncompiled (CPU)"

    def run():
        return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)

    return Peer(run, note + (" + score_mod" if score_mod else "") + (" + block mask" if block_mask is not None else ""))


def _uncompiled(flex_attention):
    def call(*args, **kw):
        with warnings.catch_warnings():  # "materializes the full scores matrix": as meant, on a CPU
            warnings.simplefilter("ignore", UserWarning)
            return flex_attention(*args, **kw)

    return call


def liger(case: Case, xs: tuple) -> Peer | Skipped:
    op = case.program.liger
    if op is None:
        return Skipped("not applicable: Liger-Kernel has no such operation")
    try:
        from liger_kernel.transformers import functional as lf
    except Exception as e:  # ImportError, or a Liger that cannot load with this torch / triton
        return Skipped(f"not available: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
    if op in ("rms_norm", "layer_norm") and not xs[0].is_cuda:
        return Skipped("not available: Liger's norm kernels do not run in Triton's CPU interpreter")
    if op == "softmax":
        (x,) = xs
        return Peer(lambda: lf.liger_softmax(x), "liger_softmax")
    if op == "rms_norm":
        x, w, W = xs
        # in_place only concerns the backward pass
        return Peer(lambda: torch.mm(lf.liger_rms_norm(x, w, EPS, in_place=False), W), "liger_rms_norm + torch.mm")
    if op == "layer_norm":
        x, g, b, W = xs
        return Peer(lambda: torch.mm(lf.liger_layer_norm(x, g, b, EPS), W), "liger_layer_norm + torch.mm")
    if op == "fused_linear_ce":
        h, W, target = xs
        return Peer(lambda: lf.liger_fused_linear_cross_entropy(h, W, target), "liger_fused_linear_cross_entropy")
    raise ValueError(f"unknown Liger operation {op!r}")


PEERS: dict[str, Builder] = {"eager": eager, "compile": compiled, "sdpa": sdpa, "flex": flex, "liger": liger}
