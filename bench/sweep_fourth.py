"""A fourth out-of-sample sweep: programs none of the earlier sweeps, bench/beyond or
examples/ hold, written as current training and inference code writes them — RL and preference losses
(chosen-token log-probs, verl's entropy, GRPO's clipped objective with the k3 KL, DPO on summed masked
log-probs), cross-entropy with ignore_index and other reductions, contrastive losses (SigLIP, MoCo's
InfoNCE with a queue), vision blocks (squeeze-excitation, avg+max pooling, ConvNeXt's channel
LayerNorm, F.normalize over channels, Swin-v2 cosine attention), attention variants (block-local,
sliding window + GQA through SDPA, SSMax, softmax-off-by-one, per-head temperatures, HF's additive
float mask, a packed-documents bool mask through SDPA), norms and reductions (LayerNorm without affine,
torch.var_mean, Gemma's (1 + w) RMSNorm, weight standardisation, the ∞-norm, logsumexp over two dims,
softmax over a 0-d temperature) and MoE router losses — compiled untuned and checked (and timed)
with the harness of `bench/sweep_unseen.py`.

    python bench/sweep_fourth.py [--only NAME ...] [--skip-compile] [--out sweep.json]
    TRITON_INTERPRET=1 python bench/sweep_fourth.py --dry       # CPU: tiny sizes, every code path
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_third import _heads
from sweep_unseen import Row, _randn, _shape, main, rows_make

# ---------------------------------------------------------------- the programs, as a user writes them

# RL / preference losses


def token_logprobs(logits, ids):
    """Per-token log-probabilities of the sampled tokens (RLHF / GRPO rollouts, TRL's selective_log_softmax
    spelled plainly): gather of log_softmax over the vocabulary."""
    return torch.gather(F.log_softmax(logits.float(), -1), -1, ids[..., None]).squeeze(-1)


def verl_entropy(logits, mask):
    """verl's entropy_from_logits (logsumexp − Σ p·z) averaged over the response tokens of a mask: the
    policy-entropy bonus of PPO / GRPO training."""
    z = logits.float()
    pd = torch.softmax(z, -1)
    entropy = torch.logsumexp(z, -1) - torch.sum(pd * z, -1)
    return (entropy * mask).sum() / mask.sum()


def grpo_loss(logits, ids, old_logp, ref_logp, adv, mask):
    """GRPO (TRL's GRPOTrainer): PPO's clipped surrogate of exp(logp − old) with per-sequence advantages,
    plus β·k3 KL to the reference (exp(ref − logp) − (ref − logp) − 1), averaged over each sequence's
    response tokens, then over sequences."""
    logp = torch.gather(F.log_softmax(logits.float(), -1), -1, ids[..., None]).squeeze(-1)
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    ratio = torch.exp(logp - old_logp)
    pg1 = ratio * adv[:, None]
    pg2 = torch.clamp(ratio, 1 - 0.2, 1 + 0.2) * adv[:, None]
    per_token = -torch.min(pg1, pg2) + 0.04 * kl
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def dpo_loss(logits, labels, ref_logps):
    """DPO (TRL's concatenated forward): chosen and rejected sequences stacked on the batch, labels −100
    on prompt and padding, summed masked token log-probs, −logsigmoid(β·(policy − reference margins))."""
    loss_mask = labels != -100
    labels = torch.where(loss_mask, labels, 0)
    per_token = torch.gather(logits.float().log_softmax(-1), 2, labels[..., None]).squeeze(2)
    logps = (per_token * loss_mask).sum(-1)
    n = logps.shape[0] // 2
    pc, pr = logps[:n], logps[n:]
    rc, rr = ref_logps[:n], ref_logps[n:]
    return -F.logsigmoid(0.1 * ((pc - rc) - (pr - rr))).mean()


def ce_ignore_index(logits, target):
    """LM cross-entropy where prompt and padding targets are −100 (ignore_index), mean over the rest."""
    return F.cross_entropy(logits.float(), target, ignore_index=-100)


def ce_sum(logits, target):
    """Cross-entropy summed over tokens (reduction='sum'; the caller divides by a global token count)."""
    return F.cross_entropy(logits.float(), target, reduction="sum")


def ce_none(logits, target):
    """Per-token cross-entropy of [B, L, V] logits flattened with .view (reduction='none'), reshaped back
    for per-sequence weighting."""
    b, l, v = logits.shape
    return F.cross_entropy(logits.float().view(-1, v), target.view(-1), reduction="none").view(b, l)


# contrastive


def siglip_loss(x, y, t, b):
    """SigLIP (open_clip's SigLipLoss): L2-normalised image and text embeddings, logits exp(t)·x·yᵀ + b,
    labels +1 on the diagonal and −1 off it, −Σ logsigmoid(labels·logits) / n."""
    x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)
    logits = t.exp() * (x @ y.T).float() + b
    n = x.shape[0]
    labels = 2 * torch.eye(n, device=x.device, dtype=logits.dtype) - torch.ones(n, n, device=x.device,
                                                                                 dtype=logits.dtype)
    return -F.logsigmoid(labels * logits).sum() / n


def siglip_loss_arange(x, y, t, b):
    """SigLIP with the ±1 labels built from an arange comparison instead of torch.eye (as big_vision
    ports and several re-implementations write them)."""
    x, y = F.normalize(x, dim=-1), F.normalize(y, dim=-1)
    logits = t.exp() * (x @ y.T).float() + b
    i = torch.arange(x.shape[0], device=x.device)
    labels = 2 * (i[:, None] == i[None, :]).float() - 1
    return -F.logsigmoid(labels * logits).sum() / x.shape[0]


def moco_infonce(q, k, queue):
    """MoCo v2's InfoNCE: the positive logit q·k, negatives q·queueᵀ, concatenated, temperature 0.2,
    cross-entropy towards column 0 (k and the queue come from the momentum encoder: no gradient)."""
    q = F.normalize(q, dim=1)
    l_pos = (q * k).sum(-1, keepdim=True)
    l_neg = q @ queue.T
    logits = torch.cat([l_pos, l_neg], dim=1) / 0.2
    labels = torch.zeros(logits.shape[0], dtype=torch.long, device=q.device)
    return F.cross_entropy(logits.float(), labels)


# vision


def se_gate(x, w1, b1, w2, b2):
    """Squeeze-excitation (SENet / EfficientNet): spatial mean, Linear → ReLU → Linear → sigmoid, scale x."""
    s = x.mean((2, 3))
    s = torch.sigmoid(F.linear(F.relu(F.linear(s, w1, b1)), w2, b2))
    return x * s[:, :, None, None]


def avg_max_pool(x):
    """timm's 'catavgmax' head: global average and global max pooling of [N, C, H, W], concatenated."""
    return torch.cat([x.mean((2, 3)), x.amax((2, 3))], 1)


def channels_layer_norm(x, w, b):
    """ConvNeXt's LayerNorm over the channels of NCHW written with permutes around F.layer_norm."""
    return F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), w, b, 1e-6).permute(0, 3, 1, 2)


def channels_first_layer_norm(x, w, b):
    """ConvNeXt's 'channels_first' LayerNorm written by hand: mean and biased variance over dim 1."""
    u = x.mean(1, keepdim=True)
    s = (x - u).pow(2).mean(1, keepdim=True)
    x = (x - u) / torch.sqrt(s + 1e-6)
    return w[:, None, None] * x + b[:, None, None]


def normalize_nchw(x):
    """F.normalize over the channels (dim=1) of NCHW features (feature matching, CLIP-style dense heads)."""
    return F.normalize(x, dim=1)


def swinv2_cosine_attention(q, k, v, logit_scale):
    """Swin-v2 window attention: cosine similarity of normalised q and k, times a learnable per-head
    logit scale clamped at log(100) and exponentiated, softmax, values; the logits in float32 (a scale up
    to 100 leaves bf16 logits no precision)."""
    attn = F.normalize(q.float(), dim=-1) @ F.normalize(k.float(), dim=-1).transpose(-2, -1)
    scale = torch.clamp(logit_scale, max=math.log(1.0 / 0.01)).exp()
    attn = torch.softmax(attn * scale, -1)
    return attn.to(v.dtype) @ v


# attention variants


def block_local_attention(q, k, v):
    """Block-local (chunked) attention: each query sees only keys of its own 64-token block."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[2], device=q.device)
    keep = (i[:, None] // 64) == (i[None, :] // 64)
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def sliding_gqa_sdpa(q, k, v):
    """Mistral-style sliding-window causal attention over grouped-query heads: the window mask built as
    HF builds it, passed to SDPA with enable_gqa (window 1024; 16 at the dry run's 45 tokens)."""
    L = q.shape[2]
    window = 1024 if L > 256 else 16
    i = torch.arange(L, device=q.device)
    keep = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)


def ssmax_attention(q, k, v, s):
    """Scalable-Softmax (SSMax, Nakanishi 2025) in causal attention: query row i's logits multiplied by a
    learnable per-head s times log(i + 1), the number of keys it sees."""
    L = q.shape[2]
    n = torch.log(torch.arange(1, L + 1, device=q.device, dtype=torch.float32))
    scale = s.view(1, -1, 1, 1) * n.view(1, 1, -1, 1)
    return F.scaled_dot_product_attention(q * scale.to(q.dtype), k, v, is_causal=True)


def softmax_one_attention(q, k, v):
    """'Attention is off by one' (softmax₁: exp(s) / (1 + Σ exp(s))) written by hand with the row max
    subtracted: exp(s − m) / (exp(−m) + Σ exp(s − m)), in float32."""
    s = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    m = s.max(-1, keepdim=True).values
    e = torch.exp(s - m)
    p = e / (torch.exp(-m) + e.sum(-1, keepdim=True))
    return p.to(v.dtype) @ v


def head_temperature_attention(q, k, v, tau):
    """Causal attention with a learnable temperature per head: softmax(q·kᵀ / τ_h), in float32."""
    s = (q @ k.transpose(-1, -2)).float() / tau.view(1, -1, 1, 1)
    i = torch.arange(q.shape[2], device=q.device)
    s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    return torch.softmax(s, -1).to(v.dtype) @ v


def additive_mask_attention(q, k, v, mask):
    """HF BERT / RoBERTa self-attention: scores plus the 'extended attention mask', a float [B, 1, 1, L]
    tensor of 0 and finfo(dtype).min, softmax, values."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(s + mask, dim=-1) @ v


def packed_sdpa_attention(q, k, v, mask):
    """Encoder attention over packed sequences: a bool [B, 1, L, L] block-diagonal mask (same document)
    given to SDPA with dropout_p=0.0."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)


# norms and reductions


def layer_norm_plain(x):
    """F.layer_norm without affine weights (elementwise_affine=False, as DiT's adaLN writes it)."""
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6)


def var_mean_standardize(x):
    """Standardisation with torch.var_mean (unbiased, the default correction) over the last dim."""
    var, mean = torch.var_mean(x, -1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5)


def gemma_rms_norm(x, w):
    """Gemma's RMSNorm: float32, weight stored as an offset (1 + w), cast back with type_as."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (out * (1.0 + w.float())).type_as(x)


def weight_standardize(w):
    """BiT's StdConv2d weight standardisation: var_mean over dims 1..3 of [O, I, kh, kw], unbiased=False."""
    v, m = torch.var_mean(w, dim=[1, 2, 3], keepdim=True, unbiased=False)
    return (w - m) / torch.sqrt(v + 1e-10)


def inf_norm(x):
    """Per-token absmax for FP8 / int8 activation scales: torch.linalg.vector_norm(ord=inf) over dim -1."""
    return torch.linalg.vector_norm(x, ord=float("inf"), dim=-1)


def logsumexp_two_dims(x):
    """The log-partition of a 2-D grid per batch entry (Sinkhorn / CRF-style): logsumexp over (-2, -1)."""
    return torch.logsumexp(x, dim=(-2, -1))


def scalar_temperature_softmax(x, t):
    """softmax(logits.float() / T) with the temperature a learnable 0-d float32 tensor (distillation,
    sampling)."""
    return torch.softmax(x.float() / t, -1)


def moe_aux_loss(router_logits, selected):
    """Mixtral's load_balancing_loss_func (one layer): E · Σ mean_t(one_hot(top-k experts)) ·
    mean_t(softmax(router logits)); the top-k choice is given."""
    e = router_logits.shape[-1]
    routing_weights = torch.softmax(router_logits, dim=-1)
    expert_mask = F.one_hot(selected, e)
    tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * e


def moe_router_losses(router_logits, selected):
    """The router's two auxiliary losses of a training step: 0.01 · Mixtral's load balancing plus
    0.001 · ST-MoE's z-loss (mean squared logsumexp of the router logits)."""
    z = torch.logsumexp(router_logits, dim=-1)
    return 0.01 * moe_aux_loss(router_logits, selected) + 0.001 * (z ** 2).mean()


# ---------------------------------------------------------------- inputs


def _chosen(logits, ids):
    return torch.gather(F.log_softmax(logits.float(), -1), -1, ids[..., None]).squeeze(-1)


def _response_mask(b, l, device, g):
    """Prompt tokens masked off, then a response of random length (at least one token) per sequence."""
    prompt = l // 4
    lens = torch.randint(prompt + 1, l + 1, (b,), generator=g, device=device)
    i = torch.arange(l, device=device)
    return (i[None, :] >= prompt) & (i[None, :] < lens[:, None])


def _logprob_make(device, g, dry):
    b, l, v = (2, 19, 101) if dry else (4, 1024, 151936)
    return (_randn(b, l, v, dtype=torch.bfloat16, device=device, g=g, scale=2.0),
            torch.randint(0, v, (b, l), generator=g, device=device))


def _entropy_make(device, g, dry):
    b, l, v = (2, 19, 101) if dry else (4, 2048, 32000)
    return (_randn(b, l, v, dtype=torch.bfloat16, device=device, g=g, scale=2.0),
            _response_mask(b, l, device, g))


def _grpo_make(device, g, dry):
    b, l, v = (3, 19, 101) if dry else (8, 1024, 32000)
    logits = _randn(b, l, v, dtype=torch.bfloat16, device=device, g=g, scale=2.0)
    ids = torch.randint(0, v, (b, l), generator=g, device=device)
    lp = _chosen(logits, ids)
    old = lp + 0.1 * torch.randn(b, l, generator=g, device=device)
    ref = lp + 0.2 * torch.randn(b, l, generator=g, device=device)
    adv = torch.randn(b, generator=g, device=device)
    return logits, ids, old, ref, adv, _response_mask(b, l, device, g)


def _dpo_make(device, g, dry):
    b, l, v = (4, 19, 101) if dry else (8, 1024, 32000)
    logits = _randn(b, l, v, dtype=torch.bfloat16, device=device, g=g, scale=2.0)
    ids = torch.randint(0, v, (b, l), generator=g, device=device)
    labels = torch.where(_response_mask(b, l, device, g), ids, -100)
    keep = labels != -100
    ref = (_chosen(logits, labels.clamp_min(0)) * keep).sum(-1) + torch.randn(b, generator=g, device=device)
    return logits, labels, ref


def _ce_ignore_make(device, g, dry):
    n, v = (37, 101) if dry else (16384, 128256)
    t = torch.randint(0, v, (n,), generator=g, device=device)
    t = torch.where(torch.rand(n, generator=g, device=device) < 0.3, -100, t)
    return _randn(n, v, dtype=torch.bfloat16, device=device, g=g, scale=2.0), t


def _ce_plain_make(shape_big, shape_tiny):
    def make(device, g, dry):
        *lead, v = _shape(dry, shape_big, shape_tiny)
        return (_randn(*lead, v, dtype=torch.bfloat16, device=device, g=g, scale=2.0),
                torch.randint(0, v, tuple(lead), generator=g, device=device))
    return make


def _siglip_make(device, g, dry):
    n, d = (37, 24) if dry else (8192, 768)
    x, y = (_randn(n, d, dtype=torch.bfloat16, device=device, g=g) for _ in range(2))
    return (x, y, torch.tensor(math.log(10.0), device=device), torch.tensor(-10.0, device=device))


def _moco_make(device, g, dry):
    n, kq, d = (37, 101, 24) if dry else (1024, 65536, 128)
    q = _randn(n, d, dtype=torch.bfloat16, device=device, g=g)
    k = F.normalize(_randn(n, d, dtype=torch.float32, device=device, g=g), dim=1).to(torch.bfloat16)
    queue = F.normalize(_randn(kq, d, dtype=torch.float32, device=device, g=g), dim=1).to(torch.bfloat16)
    return q, k, queue


def _se_make(device, g, dry):
    n, c, hh, ww, r = (2, 12, 5, 7, 3) if dry else (64, 256, 56, 56, 16)
    x = _randn(n, c, hh, ww, dtype=torch.bfloat16, device=device, g=g)
    w1 = _randn(r, c, dtype=torch.bfloat16, device=device, g=g, scale=c ** -0.5)
    w2 = _randn(c, r, dtype=torch.bfloat16, device=device, g=g, scale=r ** -0.5)
    return (x, w1, _randn(r, dtype=torch.bfloat16, device=device, g=g, scale=0.1), w2,
            _randn(c, dtype=torch.bfloat16, device=device, g=g, scale=0.1))


def _nchw_affine_make(device, g, dry):
    n, c, hh, ww = (2, 12, 5, 7) if dry else (32, 96, 56, 56)
    x = _randn(n, c, hh, ww, dtype=torch.bfloat16, device=device, g=g, scale=2.0)
    return (x, (1 + 0.1 * _randn(c, dtype=torch.float32, device=device, g=g)).to(torch.bfloat16),
            _randn(c, dtype=torch.bfloat16, device=device, g=g, scale=0.1))


def _swin_make(device, g, dry):
    b, h, l, d = (3, 2, 49, 16) if dry else (2048, 6, 64, 32)
    q, k, v = (_randn(b, h, l, d, dtype=torch.bfloat16, device=device, g=g) for _ in range(3))
    scale = torch.log(10 * torch.ones(h, 1, 1, device=device)) + 0.3 * torch.randn(h, 1, 1, generator=g,
                                                                                     device=device)
    scale[0] = 5.0  # one head over the clamp (log 100 = 4.6): no gradient there
    return q, k, v, scale


def _ssmax_make(device, g, dry):
    b, h, l, d = (1, 3, 45, 16) if dry else (2, 16, 4096, 64)
    q, k, v = (_randn(b, h, l, d, dtype=torch.bfloat16, device=device, g=g) for _ in range(3))
    s = (0.3 + 0.05 * torch.randn(h, generator=g, device=device)) * d ** -0.5 * 4  # ≈ a 1/√d scale at L ~ e⁴
    return q, k, v, s


def _head_temp_make(device, g, dry):
    b, h, l, d = (1, 3, 45, 16) if dry else (2, 16, 2048, 128)
    q, k, v = (_randn(b, h, l, d, dtype=torch.float16, device=device, g=g) for _ in range(3))
    tau = math.sqrt(d) * (1 + 0.2 * torch.rand(h, generator=g, device=device))
    return q, k, v, tau


def _additive_mask_make(device, g, dry):
    b, h, l, d = (2, 2, 45, 16) if dry else (32, 12, 512, 64)
    q, k, v = (_randn(b, h, l, d, dtype=torch.float16, device=device, g=g) for _ in range(3))
    lens = torch.randint(1, l + 1, (b,), generator=g, device=device)
    attention_mask = (torch.arange(l, device=device)[None, :] < lens[:, None]).long()
    ext = (1.0 - attention_mask[:, None, None, :].to(torch.float16)) * torch.finfo(torch.float16).min
    return q, k, v, ext


def _packed_make(device, g, dry):
    b, h, l, d = (2, 2, 45, 16) if dry else (4, 16, 2048, 64)
    q, k, v = (_randn(b, h, l, d, dtype=torch.bfloat16, device=device, g=g) for _ in range(3))
    starts = torch.rand(b, l, generator=g, device=device) < (8 / l if not dry else 0.1)  # ~8 documents
    doc = starts.long().cumsum(-1)
    return q, k, v, doc[:, None, :, None] == doc[:, None, None, :]


def _gemma_rms_make(device, g, dry):
    n, d = (37, 45) if dry else (16384, 2304)
    return (_randn(n, d, dtype=torch.bfloat16, device=device, g=g),
            _randn(d, dtype=torch.bfloat16, device=device, g=g, scale=0.1))


def _temp_make(device, g, dry):
    n, v = (37, 101) if dry else (8192, 32000)
    return _randn(n, v, dtype=torch.bfloat16, device=device, g=g, scale=3.0), torch.tensor(0.7, device=device)


def _router_make(device, g, dry):
    t, e, k = (101, 13, 2) if dry else (65536, 64, 2)
    logits = _randn(t, e, dtype=torch.float32, device=device, g=g)
    selected = torch.topk(logits + torch.randn(t, e, generator=g, device=device), k, -1).indices
    return logits, selected


ATTN = ("eager", "compile")
_SW_GQA = _heads((2, 32, 4096, 128), (2, 8, 4096, 128), (2, 8, 4096, 128), dtype=torch.bfloat16,
                 tiny=((1, 4, 45, 16), (1, 2, 45, 16), (1, 2, 45, 16)))
_ENC = _heads(*[(8, 16, 1024, 64)] * 3, dtype=torch.bfloat16, tiny=[(1, 2, 45, 16)] * 3)
ROWS = [
    # RL / preference losses
    Row("token_logprobs 4x1024x151936 bf16", token_logprobs, _logprob_make),
    Row("token_logprobs fwd+bwd 4x1024x151936 bf16", token_logprobs, _logprob_make, backward=True),
    Row("verl_entropy fwd+bwd 4x2048x32000 bf16", verl_entropy, _entropy_make, backward=True),
    Row("grpo_loss fwd+bwd 8x1024x32000 bf16", grpo_loss, _grpo_make, backward=True, buffers=(2, 3, 4)),
    Row("dpo_loss fwd+bwd 8x1024x32000 bf16", dpo_loss, _dpo_make, backward=True, buffers=(2,)),
    Row("ce_ignore_index fwd+bwd 16384x128256 bf16", ce_ignore_index, _ce_ignore_make, backward=True),
    Row("ce_sum 8192x50257 bf16", ce_sum, _ce_plain_make((8192, 50257), (37, 101))),
    Row("ce_none fwd+bwd 8x1024x32000 bf16", ce_none, _ce_plain_make((8, 1024, 32000), (3, 13, 101)),
        backward=True),
    # contrastive
    Row("siglip_loss fwd+bwd 8192x768 bf16", siglip_loss, _siglip_make, backward=True),
    Row("siglip_loss_arange fwd+bwd 8192x768 bf16", siglip_loss_arange, _siglip_make, backward=True),
    Row("moco_infonce fwd+bwd 1024x65536 d128 bf16", moco_infonce, _moco_make, backward=True, buffers=(1, 2)),
    # vision
    Row("se_gate 64x256x56x56 bf16", se_gate, _se_make),
    Row("se_gate fwd+bwd 64x256x56x56 bf16", se_gate, _se_make, backward=True),
    Row("avg_max_pool 128x2048x7x7 bf16", avg_max_pool, rows_make((128, 2048, 7, 7), (2, 12, 5, 7), torch.bfloat16)),
    Row("channels_layer_norm fwd+bwd 32x96x56x56 bf16", channels_layer_norm, _nchw_affine_make, backward=True),
    Row("channels_first_layer_norm 32x96x56x56 bf16", channels_first_layer_norm, _nchw_affine_make),
    Row("normalize_nchw 32x256x64x64 fp16", normalize_nchw, rows_make((32, 256, 64, 64), (2, 12, 5, 7), torch.float16)),
    Row("swinv2_cosine_attention 2048x6 N64 d32 bf16", swinv2_cosine_attention, _swin_make, peers=ATTN),
    Row("swinv2_cosine_attention fwd+bwd 2048x6 N64 d32 bf16", swinv2_cosine_attention, _swin_make, peers=ATTN,
        backward=True),
    # attention variants
    Row("block_local_attention 2x16 L4096 d64 fp16", block_local_attention,
        _heads(*[(2, 16, 4096, 64)] * 3, dtype=torch.float16, tiny=[(1, 2, 150, 16)] * 3), peers=ATTN),
    Row("sliding_gqa_sdpa fwd+bwd 2x32/8 L4096 d128 bf16", sliding_gqa_sdpa, _SW_GQA, peers=ATTN, backward=True),
    Row("ssmax_attention fwd+bwd 2x16 L4096 d64 bf16", ssmax_attention, _ssmax_make, peers=ATTN, backward=True),
    Row("softmax_one_attention fwd+bwd 2x16 L2048 d64 bf16", softmax_one_attention,
        _heads(*[(2, 16, 2048, 64)] * 3, dtype=torch.bfloat16, tiny=[(1, 2, 45, 16)] * 3), peers=ATTN,
        backward=True),
    Row("head_temperature_attention fwd+bwd 2x16 L2048 d128 fp16", head_temperature_attention, _head_temp_make,
        peers=ATTN, backward=True),
    Row("additive_mask_attention 32x12 L512 d64 fp16", additive_mask_attention, _additive_mask_make, peers=ATTN),
    Row("packed_sdpa_attention 8x16 L1024 d64 bf16", packed_sdpa_attention, _packed_make, peers=ATTN),
    Row("packed_sdpa_attention fwd+bwd 8x16 L1024 d64 bf16", packed_sdpa_attention, _packed_make, peers=ATTN,
        backward=True),
    # norms and reductions
    Row("layer_norm_plain fwd+bwd 8x4096x1152 fp16", layer_norm_plain,
        rows_make((8, 4096, 1152), (3, 23, 45), torch.float16, scale=2.0), backward=True),
    Row("var_mean_standardize fwd+bwd 16384x4096 fp32", var_mean_standardize,
        rows_make((16384, 4096), (37, 45), torch.float32, scale=3.0), backward=True),
    Row("gemma_rms_norm fwd+bwd 16384x2304 bf16", gemma_rms_norm, _gemma_rms_make, backward=True),
    Row("weight_standardize fwd+bwd 1024x512x3x3 fp32", weight_standardize,
        rows_make((1024, 512, 3, 3), (12, 5, 3, 3), torch.float32, scale=0.05), backward=True),
    Row("inf_norm 65536x4096 bf16", inf_norm, rows_make((65536, 4096), (37, 45), torch.bfloat16)),
    Row("logsumexp_two_dims fwd+bwd 64x512x512 fp32", logsumexp_two_dims,
        rows_make((64, 512, 512), (3, 23, 37), torch.float32, scale=3.0), backward=True),
    Row("scalar_temperature_softmax fwd+bwd 8192x32000 bf16", scalar_temperature_softmax, _temp_make,
        backward=True),
    Row("moe_aux_loss 65536x64 top2 fp32", moe_aux_loss, _router_make),
    Row("moe_router_losses fwd+bwd 65536x64 top2 fp32", moe_router_losses, _router_make, backward=True),
]


if __name__ == "__main__":
    sys.exit(main(rows=ROWS))
