"""The programs of the fourth out-of-sample sweep (bench/sweep_fourth.py), as current training and
inference code writes them: the functions alone, so probes can import one without the sweep's rows."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

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
