"""A fifth out-of-sample sweep: losses and reductions written with torch functions no earlier sweep,
bench/beyond or examples/ used — regression and multi-label losses (Poisson NLL, multi-label soft
margin, BCE with pos_weight, the L1 loss), metric learning (triplet margin, pairwise distance, the
multi-class hinge), classification variants (class-weighted cross-entropy, NLL with weights and an
ignore index, PaLM's z-loss beside cross-entropy, focal loss, an entropy regulariser, distillation's
KL with log targets, CLIP's symmetric loss), a Frobenius-norm penalty, torch's native F.rms_norm
before a projection, standardisation by the population std, retrieval's cosine-similarity softmax,
and SDPA called with enable_gqa and with an explicit scale — compiled untuned, every output and
gradient checked against float64, then timed beside eager PyTorch and torch.compile (the harness of
`bench/sweep_unseen.py`). Session 64 ran each of these programs at small shapes on the CPU first
(forward and gradients against float64: all right).

    python bench/sweep_fifth.py [--only NAME ...] [--skip-compile] [--out sweep.json]
    TRITON_INTERPRET=1 python bench/sweep_fifth.py --dry       # CPU: tiny sizes, every code path
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_third import _heads
from sweep_unseen import Row, _randn, _shape, main, rows_make

# ---------------------------------------------------------------- the programs, as a user writes them


def poisson_nll(log_rate, counts):
    """Count regression (F.poisson_nll_loss on log-rates): mean of exp(x) − y·x."""
    return F.poisson_nll_loss(log_rate.float(), counts, log_input=True)


def multilabel_soft_margin(logits, labels):
    """Multi-label classification (F.multilabel_soft_margin_loss): per-sample mean of the labels'
    log-sigmoids, then the batch mean."""
    return F.multilabel_soft_margin_loss(logits.float(), labels)


def bce_pos_weight(logits, labels, pos_weight):
    """Multi-label BCE with a per-class positive weight (imbalanced classes)."""
    return F.binary_cross_entropy_with_logits(logits.float(), labels, pos_weight=pos_weight)


def l1_loss(x, y):
    return F.l1_loss(x, y)


def triplet_margin(anchor, positive, negative):
    """Metric learning (F.triplet_margin_loss): two pairwise distances per triplet, a hinge, the mean."""
    return F.triplet_margin_loss(anchor, positive, negative, margin=1.0)


def pairwise_distance(x, y):
    return F.pairwise_distance(x, y)


def hinge_multiclass(logits, target):
    """Crammer–Singer-style multi-class hinge written by hand: Σ_j relu(1 + z_j − z_t), the mean."""
    z = logits.float()
    return torch.relu(1 + z - z.gather(1, target[:, None])).sum(-1).mean()


def ce_class_weight(logits, target, weight):
    """Cross-entropy with class weights: a weighted mean over the tokens."""
    return F.cross_entropy(logits.float(), target, weight=weight)


def nll_weight_ignore(logits, target, weight):
    """NLL of a log-softmax with class weights and ignore_index = 0 (a padding class)."""
    return F.nll_loss(F.log_softmax(logits.float(), -1), target, weight=weight, ignore_index=0)


def ce_z_loss(logits, target):
    """PaLM's auxiliary z-loss, 1e-4·mean(logsumexp²), beside the cross-entropy of the same logits."""
    z = logits.float()
    return F.cross_entropy(z, target) + 1e-4 * torch.logsumexp(z, -1).pow(2).mean()


def focal_loss(logits, target):
    """Focal loss (γ = 2) of a softmax classifier: −(1 − p_t)²·log p_t, the mean."""
    logp = F.log_softmax(logits.float(), -1).gather(-1, target[:, None]).squeeze(-1)
    return (-(1 - logp.exp()) ** 2 * logp).mean()


def entropy_regulariser(logits):
    """Mean entropy of a softmax policy, −Σ p·log p (an exploration bonus)."""
    z = logits.float()
    return -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1).mean()


def distill_kl(student, teacher):
    """Distillation: KL(teacher ‖ student) of two log-softmaxes, log_target=True, batchmean."""
    return F.kl_div(F.log_softmax(student.float(), -1), F.log_softmax(teacher.float(), -1), log_target=True,
                    reduction="batchmean")


def clip_loss(img, txt):
    """CLIP's symmetric contrastive loss: cosine logits ×10, cross-entropy over rows and over columns."""
    s = F.normalize(img.float(), dim=-1) @ F.normalize(txt.float(), dim=-1).T * 10
    t = torch.arange(s.shape[0], device=s.device)
    return (F.cross_entropy(s, t) + F.cross_entropy(s.T, t)) / 2


def frobenius_penalty(w):
    """A weight penalty by torch.linalg.matrix_norm (Frobenius) over a stack of matrices."""
    return torch.linalg.matrix_norm(w).sum()


def native_rms_norm_matmul(x, w, W):
    """torch's own F.rms_norm (PyTorch ≥ 2.4) before a projection."""
    return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6) @ W


def std_standardise(x):
    """(x − mean) / std (population std, clamped), as data pipelines write it."""
    return (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True, correction=0).clamp_min(1e-5)


def cosine_retrieval(q, keys):
    """Retrieval scores: the softmax over keys of cosine similarities (normalised queries and keys)."""
    return (F.normalize(q, dim=-1) @ F.normalize(keys, dim=-1).T * 20).softmax(-1)


def sdpa_enable_gqa(q, k, v):
    """Grouped-query causal attention through SDPA's enable_gqa (no repeat_interleave)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def sdpa_explicit_scale(q, k, v):
    """SDPA with a scale other than 1/√d (muP-style 1/d)."""
    return F.scaled_dot_product_attention(q, k, v, scale=1.0 / q.shape[-1])


# ---------------------------------------------------------------- inputs


def _labels_make(big, tiny, dtype=torch.bfloat16, binary=True):
    def make(device, g, dry):
        n, c = _shape(dry, big, tiny)
        x = _randn(n, c, dtype=dtype, device=device, g=g, scale=2.0)
        y = (torch.rand(n, c, generator=g, device=device) < 0.1).float() if binary else \
            torch.poisson(torch.rand(n, c, generator=g, device=device) * 3)
        return x, y
    return make


def _bce_make(device, g, dry):
    x, y = _labels_make((8192, 4096), (37, 45))(device, g, dry)
    return x, y, 0.5 + torch.rand(x.shape[-1], generator=g, device=device) * 4


def _targets_make(big, tiny, weighted=False):
    def make(device, g, dry):
        n, c = _shape(dry, big, tiny)
        x = _randn(n, c, dtype=torch.bfloat16, device=device, g=g, scale=2.0)
        t = torch.randint(0, c, (n,), generator=g, device=device)
        if not weighted:
            return x, t
        return x, t, 0.5 + torch.rand(c, generator=g, device=device)
    return make


def _pair_make(big, tiny, dtype, count=2):
    """`count` tensors of one shape (sweep_third._heads with the shape repeated)."""
    return _heads(*[big] * count, dtype=dtype, tiny=[tiny] * count)


def _rms_mm_make(device, g, dry):
    n, d, e = (37, 45, 23) if dry else (4096, 4096, 4096)
    x = _randn(n, d, dtype=torch.bfloat16, device=device, g=g)
    w = (1 + 0.1 * _randn(d, dtype=torch.float32, device=device, g=g)).to(torch.bfloat16)
    return x, w, _randn(d, e, dtype=torch.bfloat16, device=device, g=g, scale=d ** -0.5)


def _retrieval_make(device, g, dry):
    (n, d), m = ((37, 16), 45) if dry else ((4096, 768), 16384)
    return (_randn(n, d, dtype=torch.float16, device=device, g=g),
            _randn(m, d, dtype=torch.float16, device=device, g=g))


ATTN = ("eager", "compile")
ROWS = [
    # regression and multi-label
    Row("poisson_nll fwd+bwd 16384x1024 bf16", poisson_nll, _labels_make((16384, 1024), (37, 45), binary=False),
        backward=True, buffers=(1,)),
    Row("multilabel_soft_margin fwd+bwd 8192x4096 bf16", multilabel_soft_margin,
        _labels_make((8192, 4096), (37, 45)), backward=True, buffers=(1,)),
    Row("bce_pos_weight fwd+bwd 8192x4096 bf16", bce_pos_weight, _bce_make, backward=True, buffers=(1, 2)),
    Row("l1_loss fwd+bwd 16384x4096 bf16", l1_loss, _pair_make((16384, 4096), (37, 45), torch.bfloat16),
        backward=True),
    # metric learning
    Row("triplet_margin fwd+bwd 65536x512 fp32", triplet_margin,
        _pair_make((65536, 512), (37, 45), torch.float32, count=3), backward=True),
    Row("pairwise_distance 65536x1024 bf16", pairwise_distance, _pair_make((65536, 1024), (37, 45), torch.bfloat16)),
    Row("hinge_multiclass fwd+bwd 8192x32000 bf16", hinge_multiclass, _targets_make((8192, 32000), (37, 101)),
        backward=True),
    # classification variants
    Row("ce_class_weight fwd+bwd 8192x32000 bf16", ce_class_weight,
        _targets_make((8192, 32000), (37, 101), weighted=True), backward=True, buffers=(2,)),
    Row("nll_weight_ignore fwd+bwd 8192x32000 bf16", nll_weight_ignore,
        _targets_make((8192, 32000), (37, 101), weighted=True), backward=True, buffers=(2,)),
    Row("ce_z_loss fwd+bwd 8192x128256 bf16", ce_z_loss, _targets_make((8192, 128256), (37, 101)), backward=True),
    Row("focal_loss fwd+bwd 65536x1000 bf16", focal_loss, _targets_make((65536, 1000), (37, 101)), backward=True),
    Row("entropy_regulariser fwd+bwd 8192x32000 bf16", entropy_regulariser,
        rows_make((8192, 32000), (37, 101), torch.bfloat16, scale=2.0), backward=True),
    Row("distill_kl fwd+bwd 8192x32000 bf16", distill_kl, _pair_make((8192, 32000), (37, 101), torch.bfloat16),
        backward=True, buffers=(1,)),
    Row("clip_loss fwd+bwd 8192x768 bf16", clip_loss, _pair_make((8192, 768), (37, 45), torch.bfloat16),
        backward=True),
    # norms and penalties
    Row("frobenius_penalty fwd+bwd 64x1024x1024 fp32", frobenius_penalty,
        rows_make((64, 1024, 1024), (3, 23, 45), torch.float32), backward=True),
    Row("native_rms_norm_matmul 4096x4096->4096 bf16", native_rms_norm_matmul, _rms_mm_make),
    Row("native_rms_norm_matmul fwd+bwd 4096x4096->4096 bf16", native_rms_norm_matmul, _rms_mm_make,
        backward=True),
    Row("std_standardise fwd+bwd 16384x4096 fp32", std_standardise,
        rows_make((16384, 4096), (37, 45), torch.float32, scale=3.0), backward=True),
    Row("cosine_retrieval 4096x768 vs 16384 fp16", cosine_retrieval, _retrieval_make),
    # attention through SDPA's keywords
    Row("sdpa_enable_gqa fwd+bwd 2x32/8 L2048 d128 bf16", sdpa_enable_gqa,
        _heads((2, 32, 2048, 128), (2, 8, 2048, 128), (2, 8, 2048, 128), dtype=torch.bfloat16,
               tiny=((1, 4, 45, 16), (1, 2, 45, 16), (1, 2, 45, 16))), peers=ATTN, backward=True),
    Row("sdpa_explicit_scale 4x16 L4096 d64 fp16", sdpa_explicit_scale,
        _heads(*[(4, 16, 4096, 64)] * 3, dtype=torch.float16, tiny=[(1, 2, 45, 16)] * 3), peers=ATTN),
]


if __name__ == "__main__":
    sys.exit(main(rows=ROWS))
