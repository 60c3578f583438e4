"""A second out-of-sample sweep (session 44): programs written after the engine and its benchmarks
were — losses and attention variants of current models that no test, rule or schedule was made for —
compiled untuned and timed beside eager PyTorch and torch.compile (and SDPA / Liger where they have
the operation), with the checking and timing of `bench/sweep_unseen.py`.

    python bench/sweep_fresh.py [--only NAME ...] [--skip-compile] [--out sweep.json]
    TRITON_INTERPRET=1 python bench/sweep_fresh.py --dry       # CPU: tiny sizes, every code path
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_unseen import Row, _randn, _shape, _two_rows, main, rows_make

# ---------------------------------------------------------------- the programs, as a user writes them


def clip_loss(a, b):
    """CLIP's symmetric contrastive loss: normalised embeddings, a similarity matrix, cross-entropy
    down its rows and down its columns."""
    a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    logits = (a @ b.T) * 14.285
    labels = torch.arange(a.shape[0], device=a.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def z_loss_cross_entropy(logits, target):
    """Cross-entropy plus PaLM's z-loss (1e-4 · lse²), mean over tokens."""
    lse = torch.logsumexp(logits.float(), dim=-1)
    return F.cross_entropy(logits.float(), target) + 1e-4 * (lse ** 2).mean()


def jsd(student, teacher):
    """Jensen-Shannon divergence of two distributions given by logits (distillation), mean over rows."""
    p, q = torch.softmax(student.float(), -1), torch.softmax(teacher.float(), -1)
    m = (p + q) / 2
    return ((p * (p.log() - m.log())).sum(-1) + (q * (q.log() - m.log())).sum(-1)).mean() / 2


def softmax_entropy(x):
    """The entropy of each row's softmax."""
    return -(torch.softmax(x.float(), -1) * torch.log_softmax(x.float(), -1)).sum(-1)


def gemma_attention(q, k, v):
    """Gemma-2-style local layer: logit soft-capping, a causal sliding window of 1024, grouped-query heads."""
    s = (q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = 50.0 * torch.tanh(s / 50.0)
    i = torch.arange(q.shape[2], device=q.device)
    keep = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < 1024)
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
    return p @ v.repeat_interleave(q.shape[1] // v.shape[1], 1)


def sink_attention(q, k, v, sink):
    """Causal attention with a learnable per-head sink logit (gpt-oss): the sink takes probability mass
    in the softmax and contributes no value."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[2], device=q.device)
    s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    col = sink[None, :, None, None].expand(q.shape[0], -1, q.shape[2], 1).to(s.dtype)
    p = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    return p @ v


def mla_causal(q, k, v):
    """DeepSeek-style heads: queries and keys of 192 dims (128 + 64 rotary), values of 128."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[2], device=q.device)
    s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v


def t5_bias_attention(q, k, v, table):
    """Attention with a learnable relative-position bias: table[h, clamp(j − i, −64, 64) + 64]."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[2], device=q.device)
    rel = (i[None, :] - i[:, None]).clamp(-64, 64) + 64
    return torch.softmax(s + table[:, rel], -1) @ v


def sigmoid_attention(q, k, v):
    """Sigmoid attention (Ramapuram et al. 2024): σ(q·kᵀ/√d − log L) in place of the softmax."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5 - math.log(k.shape[2])
    return torch.sigmoid(s) @ v


def diff_attention(q1, k1, q2, k2, v):
    """Differential attention: the difference of two softmax maps over the same values (λ = 0.8)."""
    scale = q1.shape[-1] ** -0.5
    a1 = torch.softmax((q1 @ k1.transpose(-1, -2)) * scale, -1)
    a2 = torch.softmax((q2 @ k2.transpose(-1, -2)) * scale, -1)
    return (a1 - 0.8 * a2) @ v


def masked_mean_pool(x, mask):
    """Mean over the tokens a padding mask keeps: Σ_l x·m / Σ_l m."""
    m = mask.to(x.dtype)[..., None]
    return (x * m).sum(1) / m.sum(1).clamp_min(1)


# ---------------------------------------------------------------- inputs


def _heads(*specs, dtype, tiny):
    """Tensors [b, h, l, d] for each (b, h, l, d) of `specs` (the tiny ones in a dry run)."""
    def make(device, g, dry):
        return tuple(_randn(*s, dtype=dtype, device=device, g=g) for s in _shape(dry, specs, tiny))
    return make


def _clip_make(device, g, dry):
    n, d = (37, 24) if dry else (8192, 512)
    return tuple(_randn(n, d, dtype=torch.bfloat16, device=device, g=g) for _ in range(2))


def _ce_make(shape_big, shape_tiny):
    def make(device, g, dry):
        n, v = _shape(dry, shape_big, shape_tiny)
        return (_randn(n, v, dtype=torch.bfloat16, device=device, g=g, scale=2.0),
                torch.randint(0, v, (n,), generator=g, device=device))
    return make


def _sink_make(device, g, dry):
    b, h, l, d = (1, 3, 45, 16) if dry else (2, 32, 2048, 64)
    q, k, v = (_randn(b, h, l, d, dtype=torch.bfloat16, device=device, g=g) for _ in range(3))
    return q, k, v, _randn(h, dtype=torch.float32, device=device, g=g)


def _t5_make(device, g, dry):
    b, h, l, d = (1, 3, 45, 16) if dry else (2, 16, 2048, 64)
    q, k, v = (_randn(b, h, l, d, dtype=torch.float16, device=device, g=g) for _ in range(3))
    return q, k, v, _randn(h, 129, dtype=torch.float16, device=device, g=g, scale=0.5)


def _pool_make(device, g, dry):
    b, l, d = (3, 37, 50) if dry else (32, 4096, 1024)
    x = _randn(b, l, d, dtype=torch.bfloat16, device=device, g=g)
    lens = torch.randint(0, l + 1, (b,), generator=g, device=device)
    return x, torch.arange(l, device=device)[None, :] < lens[:, None]


def _liger_ce_z(xs):
    from liger_kernel.transformers import functional as lf
    logits, t = xs
    return lambda: lf.liger_cross_entropy(logits, t, lse_square_scale=1e-4)


ATTN = ("eager", "compile")
_GEMMA = _heads((2, 16, 4096, 128), (2, 8, 4096, 128), (2, 8, 4096, 128), dtype=torch.bfloat16,
                tiny=((1, 4, 45, 16), (1, 2, 45, 16), (1, 2, 45, 16)))
_MLA = _heads((1, 32, 4096, 192), (1, 32, 4096, 192), (1, 32, 4096, 128), dtype=torch.bfloat16,
              tiny=((1, 2, 45, 24), (1, 2, 45, 24), (1, 2, 45, 16)))
ROWS = [
    Row("clip_loss fwd+bwd 8192x512 bf16", clip_loss, _clip_make, backward=True),
    Row("z_loss_ce fwd+bwd 8192x32000 bf16", z_loss_cross_entropy, _ce_make((8192, 32000), (37, 101)), backward=True,
        liger=_liger_ce_z),
    # (Liger's JSD gives the teacher no gradient: no peer of a row that checks both)
    Row("jsd fwd+bwd 8192x32000 bf16", jsd, _two_rows((8192, 32000), (37, 101), torch.bfloat16),
        backward=True),
    Row("softmax_entropy fwd+bwd 16384x32000 bf16", softmax_entropy,
        rows_make((16384, 32000), (37, 101), torch.bfloat16), backward=True),
    Row("gemma_attention 2x16/8 L4096 d128 bf16", gemma_attention,
        _GEMMA, peers=ATTN),
    Row("gemma_attention fwd+bwd 2x16/8 L4096 d128 bf16", gemma_attention,
        _GEMMA, peers=ATTN, backward=True),
    Row("sink_attention 2x32 L2048 d64 bf16", sink_attention, _sink_make, peers=ATTN),
    Row("sink_attention fwd+bwd 2x32 L2048 d64 bf16", sink_attention, _sink_make, peers=ATTN, backward=True),
    Row("mla_causal 1x32 L4096 d192/128 bf16", mla_causal,
        _MLA, peers=ATTN),
    Row("mla_causal fwd+bwd 1x32 L4096 d192/128 bf16", mla_causal,
        _MLA, peers=ATTN, backward=True),
    Row("t5_bias_attention fwd+bwd 2x16 L2048 d64 fp16", t5_bias_attention, _t5_make, peers=ATTN, backward=True),
    Row("sigmoid_attention fwd+bwd 2x16 L4096 d64 bf16", sigmoid_attention,
        _heads(*[(2, 16, 4096, 64)] * 3, dtype=torch.bfloat16, tiny=[(1, 2, 45, 16)] * 3), peers=ATTN, backward=True),
    Row("diff_attention 2x16 L4096 d64 fp16", diff_attention,
        _heads(*[(2, 16, 4096, 64)] * 5, dtype=torch.float16, tiny=[(1, 2, 45, 16)] * 5), peers=ATTN),
    Row("masked_mean_pool 32x4096x1024 bf16", masked_mean_pool, _pool_make),
]


if __name__ == "__main__":
    sys.exit(main(rows=ROWS))
