"""neptune_eq.attention and attention-shaped programs at their edges (a hunt, session 56; interpreter,
tiny shapes, against float64)."""

from __future__ import annotations

import math

import torch

import neptune_eq as ne


def _qkv(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for _ in range(3)]


def _ref(q, k, v, scale):
    s = q.double() @ k.double().transpose(-1, -2) * scale
    return torch.softmax(s, -1) @ v.double()


def test_a_tensor_scale_is_read_at_every_call_and_learns():
    """scale=<tensor> (an annealed or learnable temperature) had been read once with float(scale): a
    write in place kept serving the old value (off by 1.5), and a scale requiring grad was detached."""
    q, k, v = _qkv(1, 2, 7, 8)
    t = torch.tensor(0.5)
    assert (ne.attention(q, k, v, scale=t).double() - _ref(q, k, v, 0.5)).abs().max() < 1e-5
    t.fill_(3.0)
    assert (ne.attention(q, k, v, scale=t).double() - _ref(q, k, v, 3.0)).abs().max() < 1e-5
    tg = torch.tensor(0.7, requires_grad=True)
    out = ne.attention(q, k, v, scale=tg)
    assert out.requires_grad
    out.sum().backward()
    td = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    _ref(q, k, v, td).sum().backward()
    assert abs(tg.grad.item() - td.grad.item()) < 1e-4 * max(1.0, abs(td.grad.item()))


def test_a_float32_tensor_in_a_bf16_score_mod_follows_flex_attention():
    """A score_mod reading a float32 tensor promotes a bf16 score; the probabilities meet v in bf16, as
    FlexAttention's do (it had failed to trace: float32 @ bf16, reported at neptune_eq's own line)."""
    q, k, v = _qkv(1, 2, 8, 16, dtype=torch.bfloat16)
    slopes = torch.tensor([0.5, 0.25])

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    out = ne.attention(q, k, v, score_mod=alibi)
    i = torch.arange(8)
    s = q.double() @ k.double().transpose(-1, -2) / 4 + slopes.double()[None, :, None, None] * (i[None, :] - i[:, None])
    assert out.dtype == torch.bfloat16
    assert (out.double() - torch.softmax(s, -1) @ v.double()).abs().max() < 3e-2


def test_a_learnable_sink_logit_trains_beside_the_keys():
    """gpt-oss's sink: a per-head logit concatenated to the scores. With k and the sink both requiring
    grad the backward's kernel had a dot with a bare constant operand, tl.broadcast_to(1.0, …), which
    failed to compile."""
    def sink_attn(q, k, v, sink):
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        sk = sink[None, :, None, None].expand(s.shape[0], -1, s.shape[-2], 1)
        return torch.softmax(torch.cat([s, sk], -1), -1)[..., :-1] @ v

    q, k, v = _qkv(2, 2, 9, 8)
    sink = torch.randn(2, generator=torch.Generator().manual_seed(1))
    prog = ne.compile(sink_attn, q, k, v, sink)
    kk, ss = k.clone().requires_grad_(), sink.clone().requires_grad_()
    prog(q, kk, v, ss).sum().backward()
    kd, sd = k.double().requires_grad_(), sink.double().requires_grad_()
    sink_attn(q.double(), kd, v.double(), sd).sum().backward()
    assert (kk.grad - kd.grad).abs().max() < 1e-5 and (ss.grad - sd.grad).abs().max() < 1e-5


def test_queries_sliced_from_the_tensor_that_is_keys_and_values_match_float64():
    """(x[:-1] @ x.mT).softmax(-1) @ x contracts x's feature axis inside an output over that same axis
    (Σ_d nested in out[j, d]): sound IR, but a plan read the inner d as the output's (off by 2.6, and
    verify() failing, at a static compile; a Triton shape error in a dynamic bucket). Reductions that
    shadow an axis are made over fresh copies first (Program.unshadowed)."""
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def fn(x):
        return (x[:-1] @ x.mT).softmax(-1) @ x

    assert (ne.compile(fn, x)(x) - fn(x)).abs().max() < 1e-10

    def batched(x):
        return (x[:, :-1] @ x.mT).softmax(-1) @ x

    prog = ne.compile(batched, torch.randn(2, 12, 8, dtype=torch.float64), dynamic=True)
    for n in (12, 9, 20):
        x = torch.randn(2, n, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
        assert (prog(x) - batched(x)).abs().max() < 1e-10, n
