"""Issue 13: gradcheck of the ten Neptune operators, torch.library.opcheck of the ops a compiled call
runs, and neptune_eq.attention's backward inside torch.compile (the Triton interpreter, tiny shapes
that are not tile multiples)."""

from __future__ import annotations

import functools
import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import EXAMPLES

import neptune_eq

_SPEC = importlib.util.spec_from_file_location("neptune_ops", EXAMPLES / "neptune_ops.py")
neptune_ops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(neptune_ops)

GROUPED = {"gqa_pf", "gqa_dc", "softcap_pf", "window_pf", "softcap_dc"}


@pytest.mark.parametrize("name", list(neptune_ops.OPS))
def test_gradcheck_of_the_ten_neptune_operators(name):
    fn, _ = neptune_ops.OPS[name]
    if name == "window_pf":
        fn = functools.partial(fn, window=3)
    xs = neptune_ops.example_inputs(name, 6, dtype=torch.float64, head_dim=3, batch=1,
                                    heads=(4, 2) if name in GROUPED else (2, 2))
    prog = neptune_eq.compile(fn, *xs)
    leaves = tuple(x.clone().requires_grad_() for x in xs)
    # (fast mode: a random projection of the Jacobian, a few dozen interpreter calls instead of hundreds)
    assert torch.autograd.gradcheck(lambda *a: prog(*a), leaves, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)


def test_opcheck_of_the_inference_and_training_ops():
    def scaled_softmax(x, w):
        return torch.softmax(x * w, -1)

    x, w = torch.randn(3, 5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    ops = neptune_eq.compile(scaled_softmax, x, w).library_ops()
    assert set(ops) == {"inference", "training"}
    torch.library.opcheck(ops["inference"], ([x, w],))
    # with inputs that need gradients: the autograd formula (the derived backward op) is checked too
    torch.library.opcheck(ops["training"], ([x.clone().requires_grad_(), w.clone().requires_grad_()],))


def test_attention_backward_inside_torch_compile():
    """A learnable ALiBi slope read by the score_mod, causal mask, torch.compile(fullgraph=True): the
    gradients of q, k, v and the slopes match float64; a later in-place write to the slopes is seen."""
    L = 6
    slopes = torch.tensor([0.5, -0.3], requires_grad=True)

    def alibi(s, b, h, qi, kv):
        return s + slopes[h] * (kv - qi)

    def causal(b, h, qi, kv):
        return qi >= kv

    q, k, v = (torch.randn(1, 2, L, 4, generator=torch.Generator().manual_seed(s)) for s in range(3))
    neptune_eq.attention(q, k, v, score_mod=alibi, mask_mod=causal)  # captured once, outside
    step = torch.compile(lambda q, k, v: neptune_eq.attention(q, k, v, score_mod=alibi, mask_mod=causal),
                         backend="aot_eager", fullgraph=True)

    def reference(q, k, v, slopes):
        i = torch.arange(L, dtype=torch.float64)
        s = q @ k.transpose(-1, -2) / 2.0 + slopes[None, :, None, None] * (i[None, :] - i[:, None])
        s = s.masked_fill(i[None, :] > i[:, None], -math.inf)
        return torch.softmax(s, -1) @ v

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    step(*leaves).pow(2).sum().backward()
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v, slopes.detach())]
    reference(*ref_leaves).pow(2).sum().backward()
    for got, ref in zip([*(t.grad for t in leaves), slopes.grad], (t.grad for t in ref_leaves)):
        assert (got.double() - ref).abs().max() < 1e-5
    with torch.no_grad():
        slopes.mul_(2.0)
    out = step(q, k, v)
    assert (out.double() - reference(q.double(), k.double(), v.double(), slopes.detach().double())).abs().max() < 1e-5


def test_tuning_feeds_the_training_kernels_what_they_read():
    """Compiled.tune(...) with inputs that require grad also tunes the training forward and the chosen
    backward (tune.autotune needs a GPU; here a stand-in runs each program on the feed it would get)."""
    from neptune_eq.autograd import tune_training

    def scaled_softmax(x, w):
        return torch.softmax(x * w, -1)

    x, w = torch.randn(3, 5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    prog = neptune_eq.compile(scaled_softmax, x, w)
    seen = []

    def run(compiled, feed):
        seen.append(compiled.program.name)
        assert all(torch.isfinite(v).all() for v in compiled.run(feed).values())

    mode = tune_training(prog._first().op.qualname, {"x": x, "w": w}, run)
    assert mode in ("saved", "recompute") and len(seen) == 2 and seen[1].endswith("_backward"), seen


def test_losses_that_clamp_in_place_train():
    """F.margin_ranking_loss, F.hinge_embedding_loss and F.cosine_embedding_loss clamp an intermediate in
    place; with inputs that require grad their decomposition also leaves an unused clone of it, which made
    it read as used twice: refused at aten.clamp_min_ (hunt8)."""
    g = torch.Generator().manual_seed(0)
    a, b, m = torch.randn(9, generator=g), torch.randn(9, generator=g), torch.randn(5, 7, generator=g)
    y = torch.sign(torch.randn(9, generator=g))
    for fn, xs in ((lambda a, b: F.margin_ranking_loss(a, b, y, margin=0.3), [a, b]),
                   (lambda a: F.hinge_embedding_loss(a, y), [a]),
                   (lambda a, b: F.cosine_embedding_loss(a, b, y[:5]), [m, m.flip(0)])):
        leaves = [x.clone().requires_grad_() for x in xs]  # captured with gradients required
        ref = [x.double().requires_grad_() for x in xs]
        neptune_eq.compile(fn, *leaves)(*leaves).backward()
        fn(*ref).backward()
        for x, r in zip(leaves, ref):
            assert torch.allclose(x.grad.double(), r.grad, atol=1e-6)
