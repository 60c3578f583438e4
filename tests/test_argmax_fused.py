"""An argmax in its max's own pass (fusion/reset.py): a reduction over the elements attaining a running
max is repaired by keeping its state where the max did not move and restarting it where it did — no
logits written, one pass. Every fused alternative of each program is run (Triton's interpreter) and
must give torch's exact answer: the first index attaining the max across tiles and split-K chunks,
ties planted in different tiles, rows of −∞, NaN."""

from __future__ import annotations

import torch

from neptune_eq.frontend import capture
from neptune_eq.runtime import compile_ir


def _fused(fn, *xs, split_too=True):
    """The alternatives of fn's compile running a max and a reduction comparing with it in one pass: two
    whole, two split (split-K: its chunks' states combined by the same repair)."""
    c = capture(fn, *xs)
    prog = compile_ir(c.program)
    rolled = [a.id for a in prog.alternatives if any(len(comps) > 1 for _, comps, _ in a.plan.groups)
              and any("selection_reset" in line for line in a.plan.derivation)]
    assert rolled, "no alternative fuses the argmax into its max's pass"
    split = [i for i in rolled if any(len(comps) > 1 and n > 1 for _, comps, n in prog.alternatives[i].plan.groups)]
    assert split or not split_too, "no fused alternative splits the pass"
    return c, prog, [*[i for i in rolled if i not in split][:2], *split[:2]]


def _ints(*shape, seed=0, lo=-3, hi=4):
    return torch.randint(lo, hi, shape, generator=torch.Generator().manual_seed(seed)).float()


def test_argmax_of_a_matmul_finds_the_first_tie_across_tiles():
    """Integer-valued operands: the logits are exact, and a row's max is planted at columns 20 and 1050
    (tiles and chunks apart): torch's answer, the first, in every fused plan."""
    x, w = _ints(7, 16, seed=1), _ints(16, 1100, seed=2)
    w[:, 1050] = w[:, 20]
    x[:3] = w[:, 20] * 2  # (rows whose max is column 20's: x·w₂₀ = 2|w₂₀|² beats every other column)
    fn = lambda x, w: (x @ w).argmax(-1)  # noqa: E731
    c, prog, rolled = _fused(fn, x, w)
    want = fn(x, w)
    assert (want[:3] == 20).all()
    for i in rolled:
        got = prog.pin(i).run(dict(zip(c.program.inputs, (x, w))))
        assert torch.equal(next(iter(got.values())), want), (i, prog.alternatives[i].plan.show())


def test_argmax_of_masked_rows_at_minus_infinity_is_their_first_index():
    """A row every element of which is −∞ (all masked) attains its max everywhere: index 0, as torch
    says. A guard that restarts the state while the max is still −∞ gave the last tile's first index."""
    x, w = _ints(6, 8, seed=3), _ints(8, 1100, seed=4)
    keep = torch.arange(1100)[None, :] < torch.tensor([1100, 0, 7, 630, 0, 1099])[:, None]
    fn = lambda x, w, keep: (x @ w).masked_fill(~keep, float("-inf")).argmax(-1)  # noqa: E731
    c, prog, rolled = _fused(fn, x, w, keep)
    want = fn(x, w, keep)
    for i in rolled:
        got = prog.pin(i).run(dict(zip(c.program.inputs, (x, w, keep))))
        assert torch.equal(next(iter(got.values())), want), (i, prog.alternatives[i].plan.show())


def test_argmax_over_a_nan_is_its_first_nan():
    """torch's argmax counts NaN as the max: the first NaN's index, even with larger values before it."""
    x = _ints(5, 1100, seed=5)
    x[1, 200], x[1, 750], x[3, 3] = float("nan"), float("nan"), float("nan")
    x[1, 10] = 100.0
    fn = lambda x: (x * 2).argmax(-1)  # noqa: E731
    c, prog, rolled = _fused(fn, x)
    want = fn(x)
    assert want[1] == 200
    for i in rolled:
        got = prog.pin(i).run({next(iter(c.program.inputs)): x})
        assert torch.equal(next(iter(got.values())), want), (i, prog.alternatives[i].plan.show())


def test_the_count_of_a_rows_maxima_in_its_pass():
    """Σ [x = max x]: a sum over the attaining elements restarts at 0 where the max moves."""
    x, w = _ints(7, 16, seed=6), _ints(16, 300, seed=7)
    w[:, 150], w[:, 280] = w[:, 20], w[:, 20]
    x[:3] = w[:, 20] * 2
    fn = lambda x, w: (lambda s: (s == s.amax(-1, keepdim=True)).sum(-1))(x @ w)  # noqa: E731
    c, prog, rolled = _fused(fn, x, w, split_too=False)
    want = fn(x, w)
    assert (want[:3] == 3).all()
    for i in rolled:
        got = prog.pin(i).run(dict(zip(c.program.inputs, (x, w))))
        assert torch.equal(next(iter(got.values())).to(want.dtype), want), (i, prog.alternatives[i].plan.show())


def test_nearest_point_values_and_indices_in_one_pass():
    """d.min(2) of a pairwise squared distance (Chamfer's nearest neighbour): values and indices."""
    p, q = _ints(2, 9, 3, seed=8), _ints(2, 300, 3, seed=9)
    fn = lambda p, q: ((p[:, :, None] - q[:, None]) ** 2).sum(-1).min(2)  # noqa: E731
    c, prog, rolled = _fused(fn, p, q, split_too=False)
    want = fn(p, q)
    for i in rolled:
        got = list(prog.pin(i).run(dict(zip(c.program.inputs, (p, q)))).values())
        assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices), i
