"""A sixth out-of-sample sweep (session 71): programs from model code no earlier sweep, bench/beyond or
examples/ held — attention pooling over a sequence (one learned query), a gated MLP (SwiGLU, three
products), an MoE router's softmax with its load-balancing loss (a narrow product, then reductions
over rows and over columns), CosFace's margin cross-entropy over normalised embeddings, sentence
embeddings (a masked mean, then an L2 normalisation), per-sequence perplexity, SDPA followed by an
output gate, the Gaussian NLL, the cosine embedding loss, and cross-attention from a few latents to a
long sequence — compiled untuned, every output and gradient checked against float64, then timed
beside eager PyTorch and torch.compile (the harness of `bench/sweep_unseen.py`).

    python bench/sweep_sixth.py [--only NAME ...] [--skip-compile] [--out sweep.json]
    TRITON_INTERPRET=1 python bench/sweep_sixth.py --dry       # CPU: tiny sizes, every code path
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_third import _heads
from sweep_unseen import Row, _randn, _shape, main

# ---------------------------------------------------------------- the programs, as a user writes them


def attention_pool(x, q):
    """Attention pooling (a learned query over the sequence): softmax over L of x·q/√D, the weighted
    sum of x — x read twice by eager code, once by a rolling softmax."""
    w = torch.softmax(x @ q / x.shape[-1] ** 0.5, dim=1)
    return (w.unsqueeze(-1) * x).sum(1)


def swiglu_mlp(x, w1, w3, w2):
    """LLaMA's gated MLP: silu(x W1) ⊙ (x W3), then W2."""
    return (F.silu(x @ w1) * (x @ w3)) @ w2


def router_aux(x, wr):
    """An MoE router's probabilities (softmax of a 64-wide product) and Switch's load-balancing
    loss E·Σ_e mean_i(p)² — the mean over tokens of a softmax over experts."""
    p = torch.softmax((x @ wr).float(), dim=-1)
    return p.shape[-1] * (p.mean(0) ** 2).sum()


def cosface(x, w, target):
    """CosFace: cosine logits of normalised embeddings and class centres, a margin at the target,
    scaled, cross-entropy."""
    cos = (F.normalize(x, dim=-1) @ F.normalize(w, dim=-1).T).float()
    hit = torch.arange(cos.shape[1], device=cos.device)[None, :] == target[:, None]
    return F.cross_entropy(30.0 * torch.where(hit, cos - 0.35, cos), target)


def sentence_embedding(h, mask):
    """Sentence-transformers' pooling: the mean of the unmasked tokens, then L2-normalised."""
    m = mask.unsqueeze(-1).to(h.dtype)
    emb = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)
    return F.normalize(emb.float(), dim=-1)


def seq_perplexity(logits, target, mask):
    """Per-sequence perplexity: exp of the masked mean of the tokens' cross-entropies."""
    b, t, v = logits.shape
    nll = F.cross_entropy(logits.reshape(b * t, v).float(), target.reshape(b * t), reduction="none").view(b, t)
    return torch.exp((nll * mask).sum(1) / mask.sum(1))


def gated_sdpa(q, k, v, g):
    """Causal SDPA with an output gate (Qwen3-Next's gated attention): out ⊙ sigmoid(g)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True) * torch.sigmoid(g)


def gaussian_nll(mu, y, var):
    """Heteroscedastic regression: F.gaussian_nll_loss, the mean of ½(log var + (y − μ)²/var)."""
    return F.gaussian_nll_loss(mu.float(), y.float(), var.float())


def cosine_embedding(x1, x2, y):
    """F.cosine_embedding_loss: 1 − cos for similar pairs, max(0, cos − 0.2) for dissimilar ones."""
    return F.cosine_embedding_loss(x1, x2, y, margin=0.2)


def latent_cross_attention(q, k, v):
    """Perceiver-style cross-attention: 64 latents attend to a long sequence (few queries, many keys)."""
    return F.scaled_dot_product_attention(q, k, v)


# ---------------------------------------------------------------- inputs


def _bf16(*shape, device, g):
    return _randn(*shape, dtype=torch.bfloat16, device=device, g=g)


def _pool_make(device, g, dry):
    b, n, d = (3, 45, 24) if dry else (64, 4096, 1024)
    return _bf16(b, n, d, device=device, g=g), _bf16(d, device=device, g=g)


def _mlp_make(device, g, dry):
    n, d, f = (37, 24, 40) if dry else (4096, 2048, 5632)
    return (_randn(n, d, dtype=torch.bfloat16, device=device, g=g),
            _randn(d, f, dtype=torch.bfloat16, device=device, g=g, scale=d ** -0.5),
            _randn(d, f, dtype=torch.bfloat16, device=device, g=g, scale=d ** -0.5),
            _randn(f, d, dtype=torch.bfloat16, device=device, g=g, scale=f ** -0.5))


def _router_make(device, g, dry):
    n, d, e = (45, 24, 8) if dry else (65536, 2048, 64)
    return (_randn(n, d, dtype=torch.bfloat16, device=device, g=g),
            _randn(d, e, dtype=torch.bfloat16, device=device, g=g, scale=d ** -0.5))


def _cosface_make(device, g, dry):
    n, d, c = (37, 24, 101) if dry else (8192, 512, 32768)
    return (_bf16(n, d, device=device, g=g), _bf16(c, d, device=device, g=g),
            torch.randint(0, c, (n,), generator=g, device=device))


def _sentence_make(device, g, dry):
    b, n, d = (3, 45, 24) if dry else (64, 512, 1024)
    mask = torch.rand(b, n, generator=g, device=device) < 0.7
    mask[:, 0] = True
    return _randn(b, n, d, dtype=torch.bfloat16, device=device, g=g), mask


def _ppl_make(device, g, dry):
    b, t, v = (3, 13, 101) if dry else (8, 1024, 32000)
    mask = (torch.rand(b, t, generator=g, device=device) < 0.9).float()
    mask[:, 0] = 1.0
    return (_randn(b, t, v, dtype=torch.bfloat16, device=device, g=g, scale=2.0),
            torch.randint(0, v, (b, t), generator=g, device=device), mask)


def _gaussian_make(device, g, dry):
    n, d = _shape(dry, (16384, 4096), (37, 45))
    return (_bf16(n, d, device=device, g=g), _bf16(n, d, device=device, g=g),
            (0.1 + torch.rand(n, d, generator=g, device=device) * 2).to(torch.bfloat16))


def _cos_emb_make(device, g, dry):
    n, d = _shape(dry, (65536, 768), (37, 45))
    y = torch.where(torch.rand(n, generator=g, device=device) < 0.5, 1.0, -1.0)
    return (_bf16(n, d, device=device, g=g), _bf16(n, d, device=device, g=g),
            y.to(torch.bfloat16))


ATTN = ("eager", "compile")
ROWS = [
    Row("attention_pool 64x4096x1024 bf16", attention_pool, _pool_make),
    Row("attention_pool fwd+bwd 64x4096x1024 bf16", attention_pool, _pool_make, backward=True),
    Row("swiglu_mlp 4096x2048->5632->2048 bf16", swiglu_mlp, _mlp_make),
    Row("swiglu_mlp fwd+bwd 4096x2048->5632->2048 bf16", swiglu_mlp, _mlp_make, backward=True),
    Row("router_aux fwd+bwd 65536x2048->64 bf16", router_aux, _router_make, backward=True),
    Row("cosface fwd+bwd 8192x512 vs 32768 bf16", cosface, _cosface_make, backward=True),
    Row("sentence_embedding 64x512x1024 bf16", sentence_embedding, _sentence_make),
    Row("seq_perplexity fwd+bwd 8x1024x32000 bf16", seq_perplexity, _ppl_make, backward=True, buffers=(2,)),
    Row("gated_sdpa fwd+bwd 2x16 L2048 d128 bf16", gated_sdpa,
        _heads(*[(2, 16, 2048, 128)] * 4, dtype=torch.bfloat16, tiny=[(1, 2, 45, 16)] * 4), peers=ATTN,
        backward=True),
    Row("gaussian_nll fwd+bwd 16384x4096 bf16", gaussian_nll, _gaussian_make, backward=True),
    Row("cosine_embedding fwd+bwd 65536x768 bf16", cosine_embedding, _cos_emb_make, backward=True, buffers=(2,)),
    Row("latent_cross_attention 8x16 Lq64 Lk16384 d64 bf16", latent_cross_attention,
        _heads((8, 16, 64, 64), (8, 16, 16384, 64), (8, 16, 16384, 64), dtype=torch.bfloat16,
               tiny=((1, 2, 5, 16), (1, 2, 77, 16), (1, 2, 77, 16))), peers=ATTN),
]


if __name__ == "__main__":
    sys.exit(main(rows=ROWS))
