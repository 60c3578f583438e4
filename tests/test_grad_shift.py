"""The proof that a reduction is a shift the outputs do not see (neptune_eq/grad_shift.py): it covers
programs too large for the numerical test (a relative-position bias gathered at clamp(j − i) pins both
position axes at full length) and attention with a sink column, and proves nothing it should not."""

from __future__ import annotations

import torch

import neptune_eq
from neptune_eq import ir
from neptune_eq.frontend import capture
from neptune_eq.grad_shift import proves_shift_invariant


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _maxes(program: ir.Program) -> set[ir.Reduce]:
    return {n for o in program.outputs for n in ir.walk(o.expr) if isinstance(n, ir.Reduce) and n.op == "max"}


def _proofs(fn, *xs, extents=None) -> list[bool]:
    """One proof per max of the captured program (a max under a reduction that keeps its axis free is
    captured over a renamed copy of that axis: two spellings of one row max, each proved alone)."""
    program = capture(fn, *xs).program
    if extents:
        program = program.with_extents(extents)
    outputs = [o.expr for o in program.outputs]
    return [proves_shift_invariant(outputs, m) for m in _maxes(program)]


def _proved(fn, *xs, extents=None) -> bool:
    proofs = _proofs(fn, *xs, extents=extents)
    return bool(proofs) and all(proofs)


def _refuted(fn, *xs) -> bool:
    proofs = _proofs(fn, *xs)
    return bool(proofs) and not any(proofs)


def t5_bias(q, k, v, table):
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[-2])
    rel = (i[None, :] - i[:, None]).clamp(-4, 4) + 4
    return torch.softmax(s + table[:, rel], -1) @ v


def sink(q, k, v, s0):
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[-2])
    s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    col = s0[:, None, None].expand(-1, q.shape[-2], 1)
    return torch.softmax(torch.cat([s, col], -1), -1)[..., :-1] @ v


def test_the_shifts_of_softmax_forms_are_proved():
    x = _randn(3, 7)
    assert _proved(lambda a: torch.softmax(a, -1), x)
    assert _proved(lambda a: torch.log_softmax(a, -1), x)
    assert _proved(lambda a: torch.logsumexp(a, -1), x)
    assert _proved(lambda a: torch.exp2(a - a.amax(-1, keepdim=True)).sum(-1).log2() + a.amax(-1), x)
    q, k, v = _randn(2, 5, 4), _randn(2, 5, 4, seed=1), _randn(2, 5, 4, seed=2)
    # at 8192 positions: the gather clamp(j − i) pins both axes, too large for the numerical test
    assert _proved(t5_bias, q, k, v, _randn(2, 9, seed=3), extents={"i": 8192, "j": 8192})
    assert _proved(sink, q, k, v, _randn(2, seed=3))


def test_what_sees_the_shift_is_not_proved():
    x = _randn(3, 7)
    assert _refuted(lambda a: a - a.amax(-1, keepdim=True), x)
    assert _refuted(lambda a: (torch.exp(a - a.amax(-1, keepdim=True)) + 1).sum(-1), x)
    # normalised down the other axis: the shift of row i is summed with the other rows'
    assert _refuted(lambda a: (e := torch.exp(a - a.amax(-1, keepdim=True))) / e.sum(0), x)
    d = torch.arange(7)
    assert _refuted(lambda a: torch.where(d >= 4, a - a.amax(-1, keepdim=True), torch.softmax(a, -1)), x)


def test_relative_bias_and_sink_attention_train():
    """Both were refused (NoBackward: no gradient through the max) before the proof; their gradients,
    the bias table's (a scatter over the diagonals) and the sink's included, match float64."""
    g = torch.Generator().manual_seed(7)
    for fn, extra in ((t5_bias, (2, 9)), (sink, (2,))):
        xs = [torch.randn(2, 9, 8, generator=g) for _ in range(3)] + [torch.randn(*extra, generator=g)]
        leaves = [x.clone().requires_grad_() for x in xs]
        ref = [x.double().requires_grad_() for x in xs]
        gout = torch.randn(2, 9, 8, generator=g)
        neptune_eq.compile(fn, *xs)(*leaves).backward(gout)
        fn(*ref).backward(gout.double())
        for a, b in zip(leaves, ref):
            assert torch.allclose(a.grad.double(), b.grad, atol=2e-5, rtol=1e-4), fn.__name__


def test_a_sink_column_past_the_sampled_indices_is_not_masked():
    """where(f < 100, causal-masked score, sink): the mask sampler drew indices in [−64, 64) only, so
    the sink branch never showed and the causal predicate was taken for the mask of the whole body —
    the sink masked away for every row but the last (silently wrong on the GPU at 2048 keys)."""
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(1, 100, 8, generator=g) for _ in range(3)] + [torch.randn(1, generator=g)]
    got = neptune_eq.compile(sink, *xs)(*xs)
    assert torch.allclose(got.double(), sink(*[x.double() for x in xs]), atol=1e-5)
