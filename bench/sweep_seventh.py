"""Sweep 7 (session 72): programs whose parameters are tables read at data indices — their gradients
add rows into the table (neptune_eq/scatter.py): word2vec's skip-gram with negative sampling, a
fastText-style bag of embeddings classified by cross-entropy, and the centre loss of face recognition
— compiled untuned, every output and gradient checked against float64, then timed beside eager
PyTorch and torch.compile (the harness of `bench/sweep_unseen.py`).

    python bench/sweep_seventh.py [--only NAME ...] [--skip-compile] [--out sweep.json]
    TRITON_INTERPRET=1 python bench/sweep_seventh.py --dry       # CPU: tiny sizes, every code path
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_unseen import Row, _randn, main

# ---------------------------------------------------------------- the programs, as a user writes them


def skipgram_ns(emb_in, emb_out, center, context, negatives):
    """word2vec's skip-gram with negative sampling: −log σ(u_c·v_o) − Σ_k log σ(−u_c·v_k), the mean."""
    u = F.embedding(center, emb_in)
    pos = (u * F.embedding(context, emb_out)).sum(-1)
    neg = (u[:, None, :] * F.embedding(negatives, emb_out)).sum(-1)
    return -(F.logsigmoid(pos) + F.logsigmoid(-neg).sum(-1)).mean()


def bag_classifier(emb, ids, w, target):
    """fastText: the mean of a document's token embeddings, a linear classifier, cross-entropy."""
    h = F.embedding(ids, emb).mean(1)
    return F.cross_entropy(h @ w, target)


def center_loss(x, centers, labels):
    """Centre loss (Wen et al. 2016): half the mean squared distance of each feature to its class centre."""
    return 0.5 * ((x - centers[labels]) ** 2).sum(-1).mean()


# ---------------------------------------------------------------- inputs


def _sgns_make(device, g, dry):
    v, d, n, k = (97, 24, 45, 5) if dry else (100000, 300, 32768, 5)
    ids = lambda *s: torch.randint(0, v, s, generator=g, device=device)  # noqa: E731
    return (_randn(v, d, dtype=torch.float32, device=device, g=g, scale=0.1),
            _randn(v, d, dtype=torch.float32, device=device, g=g, scale=0.1),
            ids(n), ids(n), ids(n, k))


def _bag_make(device, g, dry):
    v, d, b, t, c = (97, 24, 6, 13, 11) if dry else (200000, 256, 4096, 128, 1000)
    return (_randn(v, d, dtype=torch.float32, device=device, g=g, scale=0.1),
            torch.randint(0, v, (b, t), generator=g, device=device),
            _randn(d, c, dtype=torch.float32, device=device, g=g, scale=d ** -0.5),
            torch.randint(0, c, (b,), generator=g, device=device))


def _center_make(device, g, dry):
    n, d, c = (45, 24, 97) if dry else (65536, 512, 10000)
    return (_randn(n, d, dtype=torch.bfloat16, device=device, g=g),
            _randn(c, d, dtype=torch.bfloat16, device=device, g=g),
            torch.randint(0, c, (n,), generator=g, device=device))


ROWS = [
    Row("skipgram_ns fwd+bwd V100000 d300 32768x(1+5)", skipgram_ns, _sgns_make, backward=True),
    Row("bag_classifier fwd+bwd V200000 d256 4096x128 -> 1000", bag_classifier, _bag_make, backward=True),
    Row("center_loss fwd+bwd 65536x512 vs 10000 bf16", center_loss, _center_make, backward=True),
]


if __name__ == "__main__":
    sys.exit(main(rows=ROWS))
