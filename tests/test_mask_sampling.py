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


def test_a_cat_of_a_cats_inner_piece_is_no_mask():
    """cat([cat([w·rsqrt(mean w²), w]) twice]) twice: the last normalised piece is where
    max2(max2(e − 12, 0) − 6, 0) < 3 ∧ e ≥ 18, i.e. e in [18, 21), an interval no constant of the body
    names. Index samples near 12, 6 and 3 met it at a few points, none with the rest nonzero, so
    split_mask took that piece's gradient for 0 (fuzz seed 1499: off by 6.8). The points where a test of
    one index flips are sampled now (masks._index_breakpoints), and the split keeps the piece."""
    from neptune_eq import ir
    from neptune_eq.masks import split_mask

    e, d = ir.Index("e"), ir.Index("d")

    def c(op, *a):
        return ir.Call(op, tuple(x if isinstance(x, ir.Node) else ir.Const(float(x)) for x in a))

    inner = c("max2", c("add", c("max2", c("add", e, -12), 0), -6), 0)  # e − 18 on [18, 21)
    g = ir.Load("g", (ir.Index("i"), e))
    body = c("where", c("lt", inner, 3), c("where", c("lt", c("max2", c("add", e, -12), 0), 6), 0,
                                           c("where", c("lt", e, 12), 0, g)), 0)
    body = c("where", c("eq", c("min2", inner, 2), d), body, 0)
    preds, core = split_mask(body, "sum")
    assert core == g, (ir.show(core), [ir.show(p) for p in preds])
    shown = [ir.show(p) for p in preds]
    assert "~(e < 12)" in shown and "e < 12" not in shown, shown

    def cats(w):
        t1 = torch.cat([w * torch.rsqrt((w * w).mean(-1, keepdim=True)), w], -1)
        t3 = torch.cat([t1, t1], -1)
        return torch.cat([t3, t3], -1)

    w = torch.randn(4, 3, generator=torch.Generator().manual_seed(1499))
    gout = torch.randn(4, 24, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want = w.double().requires_grad_()
    cats(want).backward(gout)
    got = w.clone().requires_grad_()
    neptune_eq.compile(cats, w)(got).backward(gout.float())
    assert torch.allclose(got.grad.double(), want.grad, atol=1e-5), (got.grad, want.grad)
