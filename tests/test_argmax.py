"""argmax / argmin and the indices of max(dim) / min(dim): the first index attaining the extreme,
a NaN counting as the extreme, row-major over several dimensions, as torch's (interpreter, tiny
shapes; integer outputs compared exactly)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_eq


def _edgy() -> torch.Tensor:
    """Rows with a NaN, all ties, a tie between two elements, ±inf and plain random values."""
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(0))
    x[1, 3] = x[1, 6] = float("nan")
    x[2, :] = 1.0
    x[3, 2] = x[3, 7] = 5.0
    x[4, 5], x[4, 1] = float("inf"), float("-inf")
    return x


@pytest.mark.parametrize("fn", [
    lambda x: x.argmax(-1),
    lambda x: x.argmin(-1),
    lambda x: x.argmax(0),
    lambda x: x.argmin(),                        # over the flattened tensor
    lambda x: x.argmax(1, keepdim=True) * 2,
    lambda x: x.max(-1),                         # values and indices
    lambda x: x.min(0).indices,
    lambda x: (x * 3 - 1).tanh().argmax(-1),     # of an elementwise value
    lambda x: x.reshape(3, 2, 9).argmax(1),
], ids=["argmax", "argmin", "argmax0", "argmin_all", "keepdim", "max_dim", "min_dim_indices", "elementwise",
        "reshaped"])
def test_indices_match_torch_exactly(fn):
    x = _edgy()
    got, want = neptune_eq.compile(fn, x)(x), fn(x)
    if isinstance(want, tuple):
        assert torch.equal(got[1], want[1]) and torch.allclose(got[0], want[0], equal_nan=True)
    else:
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


def test_argmax_over_two_dimensions_flattens_them_row_major():
    x = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(1))
    fn = lambda x: x.flatten(2).argmax(-1)  # noqa: E731
    assert torch.equal(neptune_eq.compile(fn, x)(x), fn(x))


def test_argmax_of_a_matmuls_logits_sees_the_max_s_bits_on_every_plan():
    """The max and the comparison must see the same bits: a plan computing the logits per element, once
    for the max and again in another kernel for the test, found no element equal to the max. Every plan
    writes them once (extract/exact_tests.py), or computes them per tile in the max's own pass, where
    the argmax reads the same tile (fusion/reset.py): each alternative gives torch's index."""
    def greedy(h, w):
        return (h @ w).argmax(-1)
    h, w = torch.randn(4, 64, generator=torch.Generator().manual_seed(2)), torch.randn(64, 300)
    prog = neptune_eq.compile(greedy, h, w).program
    want = greedy(h.double(), w.double())
    for alt in prog.alternatives:
        inline = any(name.startswith("sum_") for name in alt.plan.inline)  # (the logits)
        assert not inline or any(set(comps) == {"max_e", "min_e"} for _, comps, _ in alt.plan.groups), alt.structure
        (got,) = prog.pin(alt.id).run({"h": h, "w": w}).values()
        assert torch.equal(got.long(), want), (alt.structure, got)


def test_a_top1_gate_on_logits_trains_with_torchs_gradients():
    """`logits == logits.amax(-1)` (a switch router's one-hot) beside the softmax shifted by the same max:
    the max's adjoint is 0 along every differentiable path (the test is a step), so it is dropped, not
    refused; the forward saves no such max, the backward recomputes it from logits it writes once."""
    def router(x, w):
        logits = x @ w
        top1 = (logits == logits.amax(-1, keepdim=True)).float()
        return (torch.softmax(logits, -1) * top1).sum(-1).mean()
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 32, generator=g), torch.randn(32, 8, generator=g) / 6
    xs = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    neptune_eq.compile(router, x, w)(*xs).backward()
    ds = [x.double().requires_grad_(), w.double().requires_grad_()]
    router(*ds).backward()
    for a, b in zip(xs, ds):
        assert torch.allclose(a.grad.double(), b.grad, atol=1e-6), (a.grad - b.grad).abs().max()


def test_accuracy_beside_a_loss_trains_and_needs_no_gradient():
    def loss_and_accuracy(x, t):
        return F.cross_entropy(x, t), (x.argmax(-1) == t).float().mean()
    x, t = torch.randn(7, 10, requires_grad=True), torch.randint(0, 10, (7,))
    t[:3] = x.detach()[:3].argmax(-1)
    loss, acc = neptune_eq.compile(loss_and_accuracy, x, t)(x, t)
    loss.backward()
    xr = x.detach().double().requires_grad_()
    ref_loss, ref_acc = loss_and_accuracy(xr, t)
    ref_loss.backward()
    assert abs(acc.item() - ref_acc.item()) < 1e-6 and acc.item() > 0.4 and not acc.requires_grad
    assert torch.allclose(x.grad.double(), xr.grad, atol=1e-6)


def test_argmax_over_a_dynamic_length_serves_every_length_from_one_compile():
    def token_accuracy(x, t):
        return (x.argmax(-1) == t).float().mean(-1)
    prog = neptune_eq.compile(token_accuracy, torch.randn(2, 20, 7), torch.randint(0, 7, (2, 20)), dynamic=True)
    for n in (20, 29, 17):
        x, t = torch.randn(2, n, 7), torch.randint(0, 7, (2, n))
        t[:, ::2] = x[:, ::2].argmax(-1)
        assert torch.equal(prog(x, t), token_accuracy(x, t))
    stats = prog.stats()
    assert stats["compiles"] + stats["cache_hits"] == 1


def test_attention_around_each_rows_top_key_compiles_and_matches_float64():
    """A mask built from an argmax of the scores ((j − top).abs() > 2) compares a value its plan writes
    once (extract/exact_tests.py) as a buffer: the data-bound analysis read that buffer as a program
    input and raised a bare KeyError (session 56, a hunt)."""
    def local_top(q, k, v):
        s = q @ k.transpose(-1, -2)
        top = s.argmax(-1, keepdim=True)
        j = torch.arange(k.shape[-2])
        return torch.softmax(s.masked_fill((j - top).abs() > 2, float("-inf")), -1) @ v

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(9, 8, generator=g), torch.randn(13, 8, generator=g), torch.randn(13, 8, generator=g)
    out = neptune_eq.compile(local_top, q, k, v)(q, k, v)
    assert (out.double() - local_top(q.double(), k.double(), v.double())).abs().max().item() < 1e-5


@pytest.mark.parametrize("fn", [
    lambda x, y: torch.gather(x, -1, x.argmax(-1, keepdim=True)),
    lambda x, y: torch.gather(y, 0, x.argmin(0, keepdim=True)),
    lambda x, y: y[torch.arange(x.shape[0]), x.argmax(1)],
    lambda x, y: torch.log_softmax(y, -1).gather(-1, x.max(-1).indices[:, None]).mean(),
], ids=["gather_own_argmax", "gather_at_argmin", "advanced_index", "greedy_logprob"])
def test_a_read_at_an_argmax_selects_its_first_index_with_torchs_gradient(fn):
    """A tensor read at an argmax or argmin (the greedy token's log-probability) was refused as a gather
    at an index computed by a reduction (extended fuzz level 2). The index is always in range, so the
    read is a one-hot selection Σ_j [j = argmax]·y[j], the index computed in a pass before it: the first
    tie, a NaN's position as torch's, and the gradient to that one element (amax would share it)."""
    x = _edgy()
    y = torch.randn(6, 9, generator=torch.Generator().manual_seed(1))
    prog = neptune_eq.compile(fn, x, y)
    a, b = (x.clone().requires_grad_(), y.clone().requires_grad_()), (x.double().requires_grad_(),
                                                                        y.double().requires_grad_())
    got, want = prog(*a), fn(*b)
    assert torch.allclose(got.double(), want, atol=1e-6, equal_nan=True), (got, want)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got.backward(g.float())
    want.backward(g)
    for u, v in zip(a, b):
        gu = u.grad if u.grad is not None else torch.zeros_like(u)
        gv = v.grad if v.grad is not None else torch.zeros_like(v)
        assert torch.allclose(gu.double(), gv, atol=1e-6, equal_nan=True), (gu, gv)


def test_a_read_at_an_argmax_over_a_dynamic_length():
    def greedy(x):
        return torch.gather(x, -1, x.argmax(-1, keepdim=True)).squeeze(-1) - x.logsumexp(-1)
    prog = neptune_eq.compile(greedy, torch.randn(3, 20), dynamic={0: [1]})  # (the vocabulary's length)
    for n in (20, 29, 17):
        x = torch.randn(3, n)
        assert torch.allclose(prog(x), greedy(x), atol=1e-5)
    assert prog.stats()["compiles"] + prog.stats()["cache_hits"] == 1


def test_a_read_at_a_count_is_still_refused_by_name():
    def last_token(h, m):
        return h[torch.arange(h.shape[0]), m.sum(1) - 1]
    with pytest.raises(neptune_eq.ir.NeptuneError, match="computed by a reduction"):
        neptune_eq.compile(last_token, torch.randn(3, 5), torch.ones(3, 5, dtype=torch.long))
