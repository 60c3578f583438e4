"""A third out-of-sample sweep (session 45): programs written after the first two sweeps — attention
variants of current models (QK-norm, key-padding masks, cross-attention, prefix-LM masks, multi-query
heads, learnable symmetric ALiBi), losses (label smoothing, Gemma's logit soft-cap, KL distillation),
norms written by hand and by torch (fused residual RMSNorm with two outputs, LayerNorm, group norm;
session 46: instance norm, batch norm over a batch, a spatial mean) and softmaxes over non-last axes —
compiled untuned and timed beside eager PyTorch and torch.compile, with the checking and timing of
`bench/sweep_unseen.py`. The last rows hold operations the engine is not
expected to compile (a cumulative sum, top-k, dropout, a median): there the right answer is a clear
refusal naming the operation.

    python bench/sweep_third.py [--only NAME ...] [--skip-compile] [--out sweep.json]
    TRITON_INTERPRET=1 python bench/sweep_third.py --dry       # CPU: tiny sizes, every code path
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_fresh import _ce_make
from sweep_unseen import Row, _randn, _shape, _two_rows, main, rows_make

# ---------------------------------------------------------------- the programs, as a user writes them


def _rms(x, w):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def _causal(s):
    i = torch.arange(s.shape[-2], device=s.device)
    j = torch.arange(s.shape[-1], device=s.device)
    return s.masked_fill(j[None, :] > i[:, None], float("-inf"))


def qk_norm_attention(q, k, v, wq, wk):
    """Qwen3 / OLMo2 heads: RMSNorm (in float32) of q and of k over the head dimension with learnable
    weights, then causal softmax attention."""
    q, k = _rms(q, wq), _rms(k, wk)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(_causal(s), -1) @ v


def key_padding_attention(q, k, v, valid):
    """BERT-style attention with a key padding mask: valid [b, Lk] bool, padded keys get −∞."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~valid[:, None, None, :], float("-inf")), -1) @ v


def cross_attention(q, k, v):
    """Encoder-decoder cross-attention: Lq queries over Lk ≠ Lq keys, no mask."""
    return torch.softmax((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5, -1) @ v


def prefix_lm_attention(q, k, v):
    """Prefix-LM (T5 / UniLM / PaliGemma): bidirectional over the first P = L/4 positions, causal after."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[2], device=q.device)
    keep = (i[None, :] <= i[:, None]) | (i[None, :] < q.shape[2] // 4)
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def mqa_attention(q, k, v):
    """Multi-query attention (PaLM, Falcon): one key/value head expanded over every query head, causal."""
    k, v = k.expand(-1, q.shape[1], -1, -1), v.expand(-1, q.shape[1], -1, -1)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(_causal(s), -1) @ v


def mqa_repeat_attention(q, k, v):
    """Multi-query attention with the kv head tiled by .repeat (as many ports of MQA write it), causal."""
    k, v = k.repeat(1, q.shape[1], 1, 1), v.repeat(1, q.shape[1], 1, 1)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(_causal(s), -1) @ v


def label_smoothing_ce(logits, target):
    """Cross-entropy with label smoothing 0.1: (1 − ε)·NLL + ε·mean_c(−log p_c), mean over tokens."""
    return F.cross_entropy(logits.float(), target, label_smoothing=0.1)


def softcap_ce(logits, target):
    """Gemma-2's final-logit soft-cap 30·tanh(z/30), then cross-entropy."""
    return F.cross_entropy(30.0 * torch.tanh(logits.float() / 30.0), target)


def add_rms_norm(x, r, w):
    """The fused residual add + RMSNorm of Llama-style blocks: h = x + r; returns (h, rmsnorm(h)·w)."""
    h = x + r
    return h, _rms(h, w)


def manual_layer_norm(x, w, b):
    """LayerNorm written by hand with torch.mean and torch.var(unbiased=False), in float32."""
    xf = x.float()
    mu = xf.mean(-1, keepdim=True)
    var = torch.var(xf, -1, keepdim=True, unbiased=False)
    return ((xf - mu) * torch.rsqrt(var + 1e-5)).to(x.dtype) * w + b


def torch_layer_norm(x, w, b):
    """F.layer_norm over the last dimension of [b, l, d]."""
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def cosine_rows(a, b):
    """F.cosine_similarity of matching rows over the last dimension."""
    return F.cosine_similarity(a, b, dim=-1)


def normalize_3d(x):
    """F.normalize (L2, eps 1e-12) over the last dimension of [b, l, d]."""
    return F.normalize(x, dim=-1)


def kl_distill(student, teacher):
    """Distillation KL: F.kl_div(log_softmax(student), log_softmax(teacher), log_target=True, batchmean)."""
    return F.kl_div(F.log_softmax(student.float(), -1), F.log_softmax(teacher.float(), -1), reduction="batchmean",
                    log_target=True)


def softmax_middle(x):
    """Softmax over dim 1 of [b, n, m] (neither the first nor the last axis)."""
    return torch.softmax(x, dim=1)


def log_softmax_first(x):
    """log_softmax over dim 0 of [n, b, m]."""
    return torch.log_softmax(x.float(), dim=0)


def group_norm(x, w, b):
    """F.group_norm with per-channel affine weights on [N, C, H, W] (32 groups; 4 at the dry run's 12 channels)."""
    return F.group_norm(x, 4 if x.shape[1] % 32 else 32, w, b, eps=1e-5)


def instance_norm(x):
    """F.instance_norm of [N, C, H, W]: each (sample, channel) over its pixels, no affine."""
    return F.instance_norm(x, eps=1e-5)


def batch_norm_1d(x, w, b):
    """BatchNorm1d in training, by hand: each feature normalised over the batch (a column reduction)."""
    mu = x.float().mean(0)
    var = x.float().var(0, unbiased=False)
    return ((x.float() - mu) * torch.rsqrt(var + 1e-5) * w + b).to(x.dtype)


def spatial_mean(x):
    """Global average pooling of a conv net's features: x.mean((2, 3)) of [N, C, H, W]."""
    return x.mean((2, 3))


def alibi_sym_attention(q, k, v, slopes):
    """Bidirectional ALiBi with learnable per-head slopes: softmax(q·kᵀ/√d − m_h·|i − j|)·v."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[2], device=q.device)
    dist = (i[None, :] - i[:, None]).abs().to(s.dtype)
    return torch.softmax(s - slopes[:, None, None].to(s.dtype) * dist, -1) @ v


# programs the engine is not expected to compile: the right result is a refusal naming the operation

def softmax_cdf(x):
    """The running sum of a softmax (top-p sampling's CDF): torch.cumsum."""
    return torch.cumsum(torch.softmax(x.float(), -1), -1)


def topk_softmax(x):
    """Top-k (k = 8) logits kept, the rest −∞, then softmax: torch.topk."""
    kth = x.topk(8, -1).values[..., -1:]
    return torch.softmax(x.masked_fill(x < kth, float("-inf")), -1)


def dropout_attention(q, k, v):
    """Attention with dropout 0.1 on the probabilities (training mode): random, no exact compile."""
    p = torch.softmax((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5, -1)
    return F.dropout(p, 0.1, training=True) @ v


def median_center(x):
    """Rows centred on their median: torch.median."""
    return x - x.median(-1, keepdim=True).values


# ---------------------------------------------------------------- inputs


def _heads(*specs, dtype, tiny):
    """Tensors [b, h, l, d] for each (b, h, l, d) of `specs` (the tiny ones in a dry run)."""
    def make(device, g, dry):
        return tuple(_randn(*s, dtype=dtype, device=device, g=g) for s in _shape(dry, specs, tiny))
    return make


def _qk_norm_make(device, g, dry):
    b, h, l, d = (1, 2, 45, 16) if dry else (2, 16, 2048, 128)
    q, k, v = (_randn(b, h, l, d, dtype=torch.bfloat16, device=device, g=g) for _ in range(3))
    wq, wk = (1 + 0.1 * _randn(d, dtype=torch.float32, device=device, g=g) for _ in range(2))
    return q, k, v, wq.to(torch.bfloat16), wk.to(torch.bfloat16)


def _key_padding_make(device, g, dry):
    b, h, l, d = (2, 2, 45, 16) if dry else (4, 16, 2048, 64)
    q, k, v = (_randn(b, h, l, d, dtype=torch.float16, device=device, g=g) for _ in range(3))
    valid = torch.rand(b, l, generator=g, device=device) < 0.8
    valid[:, 0] = True  # every batch keeps one key
    return q, k, v, valid


def _softcap_make(device, g, dry):
    n, v = (37, 101) if dry else (4096, 256000)
    return (_randn(n, v, dtype=torch.bfloat16, device=device, g=g, scale=20.0),  # logits that reach the cap
            torch.randint(0, v, (n,), generator=g, device=device))


def _add_rms_make(device, g, dry):
    n, d = (37, 45) if dry else (16384, 4096)
    x, r = (_randn(n, d, dtype=torch.bfloat16, device=device, g=g) for _ in range(2))
    return x, r, (1 + 0.1 * _randn(d, dtype=torch.float32, device=device, g=g)).to(torch.bfloat16)


def _ln_make(device, g, dry):
    b, l, d = (3, 23, 45) if dry else (8, 2048, 768)
    x = _randn(b, l, d, dtype=torch.bfloat16, device=device, g=g, scale=2.0)
    w = (1 + 0.1 * _randn(d, dtype=torch.float32, device=device, g=g)).to(torch.bfloat16)
    return x, w, _randn(d, dtype=torch.bfloat16, device=device, g=g, scale=0.1)


def _group_norm_make(device, g, dry):
    n, c, hh, ww = (2, 12, 5, 7) if dry else (16, 256, 64, 64)
    x = _randn(n, c, hh, ww, dtype=torch.bfloat16, device=device, g=g)
    return (x, (1 + 0.1 * _randn(c, dtype=torch.float32, device=device, g=g)).to(torch.bfloat16),
            _randn(c, dtype=torch.bfloat16, device=device, g=g, scale=0.1))


def _alibi_make(device, g, dry):
    b, h, l, d = (1, 3, 45, 16) if dry else (2, 16, 2048, 64)
    q, k, v = (_randn(b, h, l, d, dtype=torch.float16, device=device, g=g) for _ in range(3))
    slopes = 2.0 ** (-8.0 * torch.arange(1, h + 1, device=device, dtype=torch.float32) / h)
    return q, k, v, slopes


ATTN = ("eager", "compile")
_MQA = _heads((2, 32, 2048, 128), (2, 1, 2048, 128), (2, 1, 2048, 128), dtype=torch.bfloat16,
              tiny=((1, 4, 45, 16), (1, 1, 45, 16), (1, 1, 45, 16)))
_CROSS = _heads((4, 16, 1024, 64), (4, 16, 4096, 64), (4, 16, 4096, 64), dtype=torch.bfloat16,
                tiny=((1, 2, 23, 16), (1, 2, 45, 16), (1, 2, 45, 16)))
_LS_CE = _ce_make((8192, 32000), (37, 101))
_KL = _two_rows((8192, 32000), (37, 101), torch.bfloat16)
ROWS = [
    Row("qk_norm_attention 2x16 L2048 d128 bf16", qk_norm_attention, _qk_norm_make, peers=ATTN),
    Row("qk_norm_attention fwd+bwd 2x16 L2048 d128 bf16", qk_norm_attention, _qk_norm_make, peers=ATTN, backward=True),
    Row("key_padding_attention 4x16 L2048 d64 fp16", key_padding_attention, _key_padding_make, peers=ATTN),
    Row("key_padding_attention fwd+bwd 4x16 L2048 d64 fp16", key_padding_attention, _key_padding_make,
        peers=ATTN, backward=True),
    Row("cross_attention 4x16 Lq1024 Lk4096 d64 bf16", cross_attention, _CROSS, peers=ATTN),
    Row("prefix_lm_attention 2x16 L2048 d64 fp16", prefix_lm_attention,
        _heads(*[(2, 16, 2048, 64)] * 3, dtype=torch.float16, tiny=[(1, 2, 45, 16)] * 3), peers=ATTN),
    Row("mqa_attention 2x32/1 L2048 d128 bf16", mqa_attention, _MQA, peers=ATTN),
    Row("mqa_attention fwd+bwd 2x32/1 L2048 d128 bf16", mqa_attention, _MQA, peers=ATTN, backward=True),
    Row("mqa_repeat_attention 2x32/1 L2048 d128 bf16", mqa_repeat_attention, _MQA, peers=ATTN),
    Row("label_smoothing_ce 8192x32000 bf16", label_smoothing_ce, _LS_CE),
    Row("label_smoothing_ce fwd+bwd 8192x32000 bf16", label_smoothing_ce, _LS_CE, backward=True),
    Row("softcap_ce 4096x256000 bf16", softcap_ce, _softcap_make),
    Row("softcap_ce fwd+bwd 4096x256000 bf16", softcap_ce, _softcap_make, backward=True),
    Row("add_rms_norm 16384x4096 bf16", add_rms_norm, _add_rms_make),
    Row("manual_layer_norm 8x2048x768 bf16", manual_layer_norm, _ln_make),
    Row("manual_layer_norm fwd+bwd 8x2048x768 bf16", manual_layer_norm, _ln_make, backward=True),
    Row("torch_layer_norm fwd+bwd 8x2048x768 bf16", torch_layer_norm, _ln_make, backward=True),
    Row("cosine_rows 65536x768 bf16", cosine_rows, _two_rows((65536, 768), (37, 45), torch.bfloat16)),
    Row("normalize_3d 8x2048x768 fp16", normalize_3d, rows_make((8, 2048, 768), (3, 23, 45), torch.float16)),
    Row("kl_distill 8192x32000 bf16", kl_distill, _KL),
    Row("kl_distill fwd+bwd 8192x32000 bf16", kl_distill, _KL, backward=True),
    Row("softmax_middle 32x4096x512 fp16", softmax_middle, rows_make((32, 4096, 512), (3, 37, 23), torch.float16)),
    Row("log_softmax_first 4096x8x1024 bf16", log_softmax_first,
        rows_make((4096, 8, 1024), (37, 3, 23), torch.bfloat16)),
    Row("group_norm 16x256x64x64 bf16", group_norm, _group_norm_make),
    Row("group_norm fwd+bwd 16x256x64x64 bf16", group_norm, _group_norm_make, backward=True),
    Row("instance_norm 32x128x64x64 bf16", instance_norm, rows_make((32, 128, 64, 64), (2, 3, 5, 7), torch.bfloat16)),
    Row("instance_norm fwd+bwd 32x128x64x64 bf16", instance_norm,
        rows_make((32, 128, 64, 64), (2, 3, 5, 7), torch.bfloat16), backward=True),
    Row("batch_norm_1d 65536x1024 bf16", batch_norm_1d,
        rows_make((65536, 1024), (37, 45), torch.bfloat16, extra=("w", "b"))),
    Row("batch_norm_1d fwd+bwd 65536x1024 bf16", batch_norm_1d,
        rows_make((65536, 1024), (37, 45), torch.bfloat16, extra=("w", "b")), backward=True),
    Row("spatial_mean 128x512x28x28 bf16", spatial_mean, rows_make((128, 512, 28, 28), (2, 3, 5, 7), torch.bfloat16)),
    Row("alibi_sym_attention 2x16 L2048 d64 fp16", alibi_sym_attention, _alibi_make, peers=ATTN),
    Row("alibi_sym_attention fwd+bwd 2x16 L2048 d64 fp16", alibi_sym_attention, _alibi_make, peers=ATTN,
        backward=True),
    # expected refusals (a CaptureError / NeptuneError naming the operation)
    Row("refuse softmax_cdf 8192x32000 fp32", softmax_cdf, rows_make((8192, 32000), (37, 101), torch.float32),
        notes={"expect": "refusal: cumsum"}),
    Row("refuse topk_softmax 8192x32000 fp32", topk_softmax, rows_make((8192, 32000), (37, 101), torch.float32),
        notes={"expect": "refusal: topk"}),
    # (no eager peer: dropout's output is random, so no implementation matches the float64 reference)
    Row("refuse dropout_attention 2x16 L2048 d64 fp16", dropout_attention,
        _heads(*[(2, 16, 2048, 64)] * 3, dtype=torch.float16, tiny=[(1, 2, 45, 16)] * 3), peers=(),
        notes={"expect": "refusal: dropout"}),
    Row("refuse median_center 8192x4096 fp32", median_center, rows_make((8192, 4096), (37, 45), torch.float32),
        notes={"expect": "refusal: median"}),
]


if __name__ == "__main__":
    sys.exit(main(rows=ROWS))
