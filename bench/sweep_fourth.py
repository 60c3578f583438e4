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
from sweep_fourth_programs import (
    additive_mask_attention,
    avg_max_pool,
    block_local_attention,
    ce_ignore_index,
    ce_none,
    ce_sum,
    channels_first_layer_norm,
    channels_layer_norm,
    dpo_loss,
    gemma_rms_norm,
    grpo_loss,
    head_temperature_attention,
    inf_norm,
    layer_norm_plain,
    logsumexp_two_dims,
    moco_infonce,
    moe_aux_loss,
    moe_router_losses,
    normalize_nchw,
    packed_sdpa_attention,
    scalar_temperature_softmax,
    se_gate,
    siglip_loss,
    siglip_loss_arange,
    sliding_gqa_sdpa,
    softmax_one_attention,
    ssmax_attention,
    swinv2_cosine_attention,
    token_logprobs,
    var_mean_standardize,
    verl_entropy,
    weight_standardize,
)
from sweep_third import _heads
from sweep_unseen import Row, _randn, _shape, main, rows_make

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
