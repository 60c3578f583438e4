"""masks.split_mask proves by sampling that a select's branch gives the reduction's identity; a branch
that is reached only when several equality tests hold at once (a gathered one-hot `j == b & t == d`)
must be sampled there, or the split drops it (sweep 4: DPO's gradient of the chosen half was 0)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import neptune_eq


def dpo(x, labels, ref):
    m = labels != -100
    d = (torch.gather(x, 2, torch.where(m, labels, 0)[..., None]).squeeze(2) * m).sum(-1) - ref
    n = d.shape[0] // 2
    return -F.logsigmoid(d[:n] - d[n:]).sum()


def test_dpo_gradient_of_both_halves():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 7, generator=g)
    labels = torch.randint(0, 7, (4, 5), generator=g)
    labels[:, :2] = -100
    ref = torch.randn(4, generator=g)
    want = x.double().requires_grad_()
    dpo(want, labels, ref.double()).backward()
    got = x.clone().requires_grad_()
    neptune_eq.compile(dpo, x, labels, ref)(got, labels, ref).backward()
    assert torch.allclose(got.grad.double(), want.grad, atol=1e-5), (got.grad.norm(dim=(1, 2)),
                                                                     want.grad.norm(dim=(1, 2)))
