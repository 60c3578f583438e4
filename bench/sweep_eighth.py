"""Sweep 8 (session 73): reduction chains of metric learning, self-supervision and geometry that no
earlier sweep held — the Chamfer distance of point clouds (a min over a pairwise distance, both ways),
the supervised contrastive loss (a log-softmax over similarities without the diagonal, averaged over
each anchor's positives), SwAV's Sinkhorn–Knopp assignment (three alternating column and row
normalisations, in place, as its code has them), the batch-hard triplet loss (the hardest positive and
negative of each anchor by label), greedy decoding's argmax of an LM head and exact maximum-inner-product
search (an argmax in its max's pass: fusion/reset.py), log-sum-exp pooling over time into a multi-label loss, ArcFace's
additive angular margin, and linear attention with elu + 1 features — compiled untuned, every output
and gradient checked against float64, then timed beside eager PyTorch and torch.compile (the harness
of `bench/sweep_unseen.py`).

    python bench/sweep_eighth.py [--only NAME ...] [--skip-compile] [--out sweep.json]
    TRITON_INTERPRET=1 python bench/sweep_eighth.py --dry       # CPU: tiny sizes, every code path
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_unseen import Row, _randn, main

# ---------------------------------------------------------------- the programs, as a user writes them


def chamfer(p, q):
    """Chamfer distance of two batches of point clouds: each point's squared distance to its nearest
    point of the other cloud, averaged, both ways."""
    d = ((p[:, :, None, :] - q[:, None, :, :]) ** 2).sum(-1)
    return d.min(2).values.mean() + d.min(1).values.mean()


def supcon(z, labels):
    """Supervised contrastive loss (Khosla et al. 2020) at temperature 0.1: each anchor's log-softmax
    over the others' similarities, averaged over the anchors of its label."""
    z = F.normalize(z, dim=-1)
    sim = (z @ z.T).float() / 0.1
    n = sim.shape[0]
    self_mask = torch.eye(n, dtype=torch.bool, device=z.device)
    sim = sim.masked_fill(self_mask, -1e9)
    log_prob = sim - torch.logsumexp(sim, dim=1, keepdim=True)
    pos = (labels[:, None] == labels[None, :]) & ~self_mask
    return -((log_prob * pos).sum(1) / pos.sum(1).clamp_min(1)).mean()


def sinkhorn(scores):
    """SwAV's Sinkhorn–Knopp (Caron et al. 2020): codes of a batch over prototypes at ε 0.05, three
    iterations, written in place as SwAV's code has it."""
    q = torch.exp(scores / 0.05).t()
    k, b = q.shape
    q /= q.sum()
    for _ in range(3):
        q /= q.sum(dim=1, keepdim=True)
        q /= k
        q /= q.sum(dim=0, keepdim=True)
        q /= b
    return (q * b).t()


def batch_hard_triplet(e, labels):
    """Batch-hard triplet loss (Hermans et al. 2017), margin 0.3: for each anchor its farthest positive
    and nearest negative by Euclidean distance."""
    sq = (e.float() ** 2).sum(1)
    d = (sq[:, None] + sq[None, :] - 2.0 * (e @ e.T).float()).clamp_min(1e-12).sqrt()
    same = labels[:, None] == labels[None, :]
    hardest_pos = torch.where(same, d, torch.zeros_like(d)).amax(1)
    hardest_neg = torch.where(same, torch.full_like(d, 1e9), d).amin(1)
    return F.relu(hardest_pos - hardest_neg + 0.3).mean()


def lse_pool_bce(frames, target):
    """Multi-instance tagging: log-sum-exp pooling of frame logits over time at sharpness 5, then a
    multi-label binary cross-entropy."""
    clip = torch.logsumexp(5.0 * frames.float(), dim=1) / 5.0
    return F.binary_cross_entropy_with_logits(clip, target)


def arcface(x, w, target):
    """ArcFace (Deng et al. 2019): cos(θ + 0.5) at the target class where θ + 0.5 < π (else cos θ − the
    margin's sine times 0.5), scaled by 64, cross-entropy."""
    cos = (F.normalize(x, dim=-1) @ F.normalize(w, dim=-1).T).float().clamp(-1.0, 1.0)
    m = 0.5
    sin = torch.sqrt((1.0 - cos * cos).clamp_min(1e-7))
    phi = cos * math.cos(m) - sin * math.sin(m)
    phi = torch.where(cos > math.cos(math.pi - m), phi, cos - math.sin(math.pi - m) * m)
    hit = torch.arange(cos.shape[1], device=cos.device)[None, :] == target[:, None]
    return F.cross_entropy(64.0 * torch.where(hit, phi, cos), target)


def greedy_tokens(h, w):
    """Greedy decoding's next tokens: the argmax of the LM head's logits."""
    return (h @ w.T).argmax(-1)


def nearest_keys(queries, keys):
    """Maximum-inner-product search, exact: each query's best key. (Reading its label at that index in
    the same function is refused by name: an index computed by a reduction.)"""
    return (queries @ keys.T).argmax(-1)


def linear_attention(q, k, v):
    """Linear attention (Katharopoulos et al. 2020), non-causal, φ = elu + 1: φ(q)(φ(k)ᵀv) over φ(q)·Σφ(k)."""
    fq, fk = F.elu(q.float()) + 1.0, F.elu(k.float()) + 1.0
    kv = torch.einsum("bhld,bhle->bhde", fk, v.float())
    z = 1.0 / (torch.einsum("bhld,bhd->bhl", fq, fk.sum(2)) + 1e-6)
    return (torch.einsum("bhld,bhde->bhle", fq, kv) * z[..., None]).to(q.dtype)


# ---------------------------------------------------------------- inputs


def _chamfer_make(device, g, dry):
    b, n, m = (3, 37, 29) if dry else (16, 4096, 4096)
    return (_randn(b, n, 3, dtype=torch.float32, device=device, g=g),
            _randn(b, m, 3, dtype=torch.float32, device=device, g=g))


def _labelled(n, d, classes, dtype):
    def make(device, g, dry):
        nn, dd, cc = (45, 24, 7) if dry else (n, d, classes)
        return (_randn(nn, dd, dtype=dtype, device=device, g=g),
                torch.randint(0, cc, (nn,), generator=g, device=device))
    return make


def _sinkhorn_make(device, g, dry):
    b, k = (37, 23) if dry else (8192, 3000)
    return (_randn(b, k, dtype=torch.float32, device=device, g=g, scale=0.05),)


def _lse_pool_make(device, g, dry):
    b, t, c = (5, 37, 23) if dry else (256, 1024, 527)
    return (_randn(b, t, c, dtype=torch.bfloat16, device=device, g=g),
            (torch.rand(b, c, generator=g, device=device) < 0.05).float())


def _arcface_make(device, g, dry):
    n, d, c = (37, 24, 97) if dry else (8192, 512, 32768)
    return (_randn(n, d, dtype=torch.bfloat16, device=device, g=g),
            _randn(c, d, dtype=torch.bfloat16, device=device, g=g),
            torch.randint(0, c, (n,), generator=g, device=device))


def _linear_attention_make(device, g, dry):
    b, h, n, d = (2, 3, 37, 16) if dry else (4, 16, 4096, 64)
    return tuple(_randn(b, h, n, d, dtype=torch.float16, device=device, g=g) for _ in range(3))


def _planted(rows: torch.Tensor, n: int, g, scale: float) -> torch.Tensor:
    """n queries, each `scale` times a random row of `rows` plus noise: its best row wins by a margin no
    rounding of the products flips, so the float64 argmax is every implementation's."""
    pick = torch.randint(0, rows.shape[0], (n,), generator=g, device=rows.device)
    noise = torch.randn(n, rows.shape[1], generator=g, device=rows.device) * rows.float().std()
    return (rows[pick].float() * scale + noise).to(rows.dtype)


def _greedy_make(device, g, dry):
    t, d, v = (5, 24, 301) if dry else (2048, 4096, 128256)
    w = _randn(v, d, dtype=torch.bfloat16, device=device, g=g, scale=d ** -0.5)
    return _planted(w, t, g, 3.0), w


def _knn_make(device, g, dry):
    n, m, d = (9, 301, 16) if dry else (8192, 65536, 256)
    keys = _randn(m, d, dtype=torch.float16, device=device, g=g)
    return _planted(keys, n, g, 2.0), keys


ROWS = [
    Row("chamfer 16x4096 vs 4096 points fp32", chamfer, _chamfer_make),
    Row("chamfer fwd+bwd 16x4096 vs 4096 points fp32", chamfer, _chamfer_make, backward=True),
    Row("greedy_tokens 2048x4096 -> 128256 bf16", greedy_tokens, _greedy_make),
    Row("nearest_keys 8192 vs 65536 d256 fp16", nearest_keys, _knn_make),
    Row("supcon fwd+bwd 8192x256 bf16", supcon, _labelled(8192, 256, 100, torch.bfloat16), backward=True),
    Row("sinkhorn 8192x3000 fp32", sinkhorn, _sinkhorn_make),
    Row("batch_hard_triplet fwd+bwd 8192x512 fp16", batch_hard_triplet, _labelled(8192, 512, 512, torch.float16),
        backward=True),
    Row("lse_pool_bce fwd+bwd 256x1024x527 bf16", lse_pool_bce, _lse_pool_make, backward=True, buffers=(1,)),
    Row("arcface fwd+bwd 8192x512 vs 32768 bf16", arcface, _arcface_make, backward=True),
    Row("linear_attention fwd+bwd 4x16 L4096 d64 fp16", linear_attention, _linear_attention_make, backward=True),
]


if __name__ == "__main__":
    sys.exit(main(rows=ROWS))
