"""Training at every length from one compile (issues 13 and 14): a mean, variance or count over a
dynamic axis keeps it dynamic (its length is len(axis), a kernel argument), and a call needing
gradients runs its bucket's training op, whose backward is derived once per bucket — eagerly and
inside torch.compile(dynamic=True). Interpreter, small shapes, float64 against torch's autograd."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq import autograd

LENGTHS = (24, 19, 30)  # one bucket (32): no lengths a tile divides


def causal(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    L, S = s.shape[-2:]
    keep = torch.arange(S)[None, :] <= torch.arange(L)[:, None]
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


def rms_matmul(x, w, W):
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w) @ W


def cross_entropy(x, t):
    return F.cross_entropy(x, t)


def self_attention(x):  # one tensor read along two tied dynamic axes, a softmax over one of them
    return torch.softmax(x @ x.transpose(-2, -1) / math.sqrt(x.shape[-1]), dim=-1) @ x


def z_loss(logits, labels):  # a shifted cross-entropy and PaLM's z-loss on the same logits
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    return ce + 1e-2 * torch.logsumexp(logits, -1).pow(2).mean()


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


CASES = {  # name → (fn, inputs at length n, the inputs that require grad)
    "causal": (causal, lambda n: [_randn(2, n, 8, seed=n + k) for k in range(3)], (0, 1, 2)),
    "rms_matmul": (rms_matmul, lambda n: [_randn(n, 16, seed=n), _randn(16, seed=1), _randn(16, 12, seed=2)],
                   (0, 1, 2)),
    "cross_entropy": (cross_entropy, lambda n: [_randn(n, 24, seed=n),
                                                torch.randint(0, 24, (n,), generator=torch.Generator().manual_seed(n))],
                      (0,)),
    # (the gradients of the two reads are summed over one axis: a reduction renamed apart takes the
    # length of the axis it was renamed from, Program.same_length; each had trained per length)
    "self_attention": (self_attention, lambda n: [_randn(2, n, 8, seed=n)], (0,)),
    "z_loss": (z_loss, lambda n: [_randn(2, n, 12, seed=n),
                                  torch.randint(0, 12, (2, n), generator=torch.Generator().manual_seed(n))], (0,)),
}


def _grads(fn, xs, wrt, scale=1.5):
    xs = [x.detach().requires_grad_(k in wrt) for k, x in enumerate(xs)]
    out = fn(*xs)
    return torch.autograd.grad(out.sum() * scale, [xs[k] for k in wrt])


def _compiles(prog) -> int:
    s = prog.stats()
    return s["captures"] + s["compiles"] + s["cache_hits"]


@pytest.mark.parametrize("fn", [lambda x, y: F.mse_loss(x, y), lambda x, y: (x * y).mean(0),
                                lambda x, y: (x.var(0), y.std(0, correction=0)),
                                lambda x, y: (y[0].expand_as(x).sum(0), torch.logsumexp(x[0].expand_as(y), 0))],
                         ids=["mse_loss", "mean", "var_std", "broadcast_sum_logsumexp"])
def test_a_length_the_translation_divides_by_stays_dynamic(fn):
    """mean, var, std and a sum over a broadcast dimension divide or multiply by a length: written as
    len(axis) the row axis stays dynamic (it had been specialised: a compile per length)."""
    xs = [_randn(24, 6, seed=1), _randn(24, 6, seed=2)]
    prog = neptune_eq.compile(fn, *xs, dynamic=True)
    assert prog.family is not None and prog.family.lengths.groups
    assert "len(" in prog.family.captured.program.text()
    before = _compiles(prog)
    for n in LENGTHS:
        ys = [_randn(n, 6, seed=n), _randn(n, 6, seed=n + 1)]
        got, want = fn(*ys), prog(*ys)
        for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert _compiles(prog) == before


@pytest.mark.parametrize("name", list(CASES))
def test_training_at_new_lengths_compiles_nothing(name):
    """The first call needing gradients derives and compiles the bucket's backward; later lengths of
    the bucket train on it (no capture, no compile), with float64-exact gradients."""
    fn, make, wrt = CASES[name]
    prog = neptune_eq.compile(fn, *make(LENGTHS[0]), dynamic=True)
    seen = None
    for n in LENGTHS:
        xs = make(n)
        got = _grads(prog, xs, wrt)
        for a, b in zip(got, _grads(fn, xs, wrt)):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
        seen = _compiles(prog) if seen is None else seen
        assert _compiles(prog) == seen, prog.stats()
    assert prog.stats()["signatures"] == 0 and prog.family.no_training is None


def test_a_backward_whose_dynamic_axis_has_no_length_falls_back_to_per_length_training():
    """log_softmax over the keys of x @ x.mT beside a mean over the queries: the derived backward
    renamed every read of the key axis away, its copies kept it as their length, and the first training
    call raised a NeptuneError from the launcher (session 56's hunt). Such a backward is NoBackward:
    each length trains through a compile of its own, as before, with torch's gradients."""
    def fn(x):
        return torch.log_softmax(x @ x.mT, -1).mean(-2).sum(-1)

    prog = neptune_eq.compile(fn, _randn(2, 12, 8), dynamic=True)
    for n in (12, 9):
        for a, b in zip(_grads(prog, [_randn(2, n, 8, seed=n)], (0,)), _grads(fn, [_randn(2, n, 8, seed=n)], (0,))):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_torch_compile_trains_across_lengths_in_one_graph():
    """torch.compile(dynamic=True) around a dynamic function traces one graph whose training op runs
    each call's bucket; its gradients match eager torch's at every length."""
    from torch._dynamo.utils import counters

    fn, make, wrt = CASES["causal"]
    prog = neptune_eq.compile(fn, *make(LENGTHS[0]), dynamic=True)
    step = torch.compile(lambda *xs: prog(*xs) * 1.5, dynamic=True, fullgraph=True)
    counters.clear()
    seen = None
    for n in LENGTHS:
        xs = make(n)
        for a, b in zip(_grads(step, xs, wrt, scale=1.0), _grads(fn, xs, wrt)):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
        seen = _compiles(prog) if seen is None else seen
        assert _compiles(prog) == seen
    assert counters["stats"]["unique_graphs"] == 1
    from neptune_eq import train_dynamic

    name = train_dynamic.training_key(prog.family.op.qualname, (True, True, True))
    xs = [x.requires_grad_() for x in make(21)]
    checks = torch.library.opcheck(train_dynamic._TRAIN_OPS[name], (xs,))
    assert set(checks.values()) == {"SUCCESS"}, checks


def test_no_backward_at_every_length_trains_per_length(monkeypatch):
    """Where no backward is derived for the dynamic program, a call needing gradients compiles for its
    own length, as before (correct, and said in `family.no_training`), never a detached result."""
    from helpers import refuse_dynamic_backwards

    refuse_dynamic_backwards(monkeypatch)
    _, make, wrt = CASES["cross_entropy"]
    fn = lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1)  # noqa: E731  (derived by no other test)
    prog = neptune_eq.compile(fn, *make(LENGTHS[0]), dynamic=True)
    xs = make(LENGTHS[1])
    for a, b in zip(_grads(prog, xs, wrt), _grads(fn, xs, wrt)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    assert "no backward at every length" in prog.family.no_training
    assert prog.stats()["signatures"] == 1
    torch.testing.assert_close(prog(*make(21)), fn(*make(21)))  # (inference still serves every length)


def test_tuning_a_bucket_feeds_its_kernels_the_call_lengths():
    """tune() at a length of a bucket times the bucket's training kernels on tensors of that length
    (the backward's cotangents too; a run stands in for the GPU's timing here)."""
    fn, make, _ = CASES["cross_entropy"]
    prog = neptune_eq.compile(fn, *make(LENGTHS[0]), dynamic=True)
    xs = make(LENGTHS[1])
    ns = prog.family.serves(xs)
    inputs = prog.family.inputs(xs, ns)
    ran = []
    mode = autograd.tune_training(prog.family.bucket_training(ns).qualname, inputs,
                                  lambda compiled, feed: ran.append(compiled.run(feed)), {"x"})
    assert mode in ("saved", "recompute") and len(ran) == 2
    assert all(t.shape[0] == LENGTHS[1] for t in ran[1].values())  # (dx at the call's length, not the bucket's)


def test_flex_attention_with_dynamic_serves_every_length():
    """neptune_eq.attention(..., dynamic=True): one compile per bucket for a score_mod and mask_mod
    (FlexAttention recompiles, or needs its own dynamic shapes), with return_lse and gradients."""
    def alibi(score, b, h, q_idx, kv_idx):
        return score + 0.25 * (kv_idx - q_idx)

    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def ref(q, k, v):
        i, j = torch.arange(q.shape[2])[:, None], torch.arange(k.shape[2])[None, :]
        s = alibi(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), None, None, i, j)
        keep = j <= i
        s = s.masked_fill(~keep, float("-inf"))
        return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)

    def attn(q, k, v):
        return neptune_eq.attention(q, k, v, score_mod=alibi, mask_mod=causal_mask, return_lse=True, dynamic=True)

    counts = None
    for n in LENGTHS[:2]:
        q, k, v = (_randn(1, 2, n, 8, seed=n + s).requires_grad_() for s in range(3))
        (out, lse), (ro, rl) = attn(q, k, v), ref(q, k, v)
        torch.testing.assert_close(lse.double(), rl, rtol=1e-6, atol=1e-6)  # (float32, as FlexAttention's)
        got = torch.autograd.grad(out.sum() * 1.5, (q, k, v))
        want = torch.autograd.grad(ro.sum() * 1.5, (q, k, v))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
        compiled = next(c for c in neptune_eq.api._ATTENTION_DYNAMIC.values() if c.fn.__name__ == "flex_attention")
        counts = _compiles(compiled) if counts is None else counts
        assert _compiles(compiled) == counts


def test_a_sliced_read_beside_a_contraction_over_its_dimension():
    """((x @ w) * x[:, :3]): the adjoint of x[i, e] is read at x's own axis d, and it holds Σ_d x[i, d]·
    w[d, e]; the one-hot sum's elimination had substituted e → d under that Σ_d (captured), so x's
    gradient was silently wrong — statically and at every length. The inner sum binds a fresh axis."""
    def fn(x, w):
        return (x @ w) * x[:, :3]

    w = _randn(5, 3, seed=1)
    for dynamic in (None, True):
        prog = neptune_eq.compile(fn, _randn(20, 5), w, dynamic=dynamic)
        for n in (20, 17) if dynamic else (20,):
            xs = [_randn(n, 5, seed=n), w]
            for a, b in zip(_grads(prog, xs, (0, 1)), _grads(fn, xs, (0, 1))):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
