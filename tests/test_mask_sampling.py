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


def banded_cat_softmax(w):
    t = torch.where((torch.arange(w.shape[-1])[None, :] - torch.arange(w.shape[-2])[:, None]).abs() <= 1, w, -1e4)
    t = torch.cat([t.mT, t.mT], -1)
    return torch.softmax(-t * t, -1)


def test_a_band_read_by_half_a_cat_is_no_mask_of_the_other_half():
    """The first half's band |d − min(e, 3)| ≤ 1 selected w, its fill gave 0: it looked like a mask of
    every element, the second half's e ≥ 4 ∧ |d − (e − 4)| ≤ 1 held at 2 of 512 samples drawn apart,
    and w's gradient lost the second half's share of the row sum (fuzz seed 986: off by 0.3). A quarter
    of the index samples come from one small window now."""
    g = torch.Generator().manual_seed(10986)
    w = torch.randn(4, 3, generator=g)
    gout = torch.randn(3, 8, generator=g, dtype=torch.float64)
    want = w.double().requires_grad_()
    banded_cat_softmax(want).backward(gout)
    got = w.clone().requires_grad_()
    neptune_eq.compile(banded_cat_softmax, w)(got).backward(gout.float())
    assert torch.allclose(got.grad.double(), want.grad, atol=1e-5), (got.grad, want.grad)
