"""A reduction over a short axis of static length (a point's 3 coordinates) is written out term by term
(lower/kernel.py: KernelWriter.unrolled): the body at d = 0, 1, 2 holds no d axis, so the kernel has no
tile padded to 4 along it and no cross-lane reduction. Every alternative computing such a reduction per
element (inline) must match float64, NaN included; an integer body keeps its exact int64 count."""

from __future__ import annotations

import re

import torch

from neptune_eq.frontend import capture
from neptune_eq.runtime import compile_ir
from neptune_eq.verify import rel_err


def _inline_alternatives(fn, *xs, most=3):
    c = capture(fn, *xs)
    prog = compile_ir(c.program)
    picked = [a.id for a in prog.alternatives if a.plan.inline][:most]
    assert picked, "no alternative computes the short reduction inline"
    return c, prog, picked


def _run(c, prog, i, xs):
    got = prog.pin(i).run(dict(zip(c.program.inputs, xs)))
    return next(iter(got.values()))


def _check(fn, xs, tol=1e-5, loads_short_tile=False, most=3):
    c, prog, picked = _inline_alternatives(fn, *xs, most=most)
    want = fn(*(x.double() if x.is_floating_point() else x for x in xs))
    short = [a for a, n in c.program.axes.items() if n <= 8]
    for i in picked:
        src = prog.pin(i).source
        # the short axis is read one coordinate at a time: no load of a block along it
        assert loads_short_tile or not any(re.search(rf"tl\.load\([^\n]*offs_{a}\b", src) for a in short), src
        got = _run(c, prog, i, xs)
        assert torch.equal(got.isnan(), want.isnan()), (i, got, want)
        err, bad = rel_err(got, want)
        assert err < tol and bad == 0, (i, err, bad, prog.alternatives[i].plan.show())


def _pts(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_nearest_point_distance_over_three_coordinates():
    """Chamfer's half: each point's squared distance to its nearest point of the other cloud; a NaN
    coordinate makes its point's distances NaN (and every min it reaches)."""
    p, q = _pts(2, 70, 3, seed=1), _pts(2, 45, 3, seed=2)
    q[1, 7, 2] = float("nan")
    fn = lambda p, q: ((p[:, :, None, :] - q[:, None, :, :]) ** 2).sum(-1).amin(2)  # noqa: E731
    _check(fn, (p, q))


def test_max_over_a_short_axis_under_a_mask_of_it():
    """A max over 5 features whose last two are masked out (a mask tensor over the axis, read per term)."""
    x, w = _pts(33, 5, seed=3), _pts(40, 5, seed=4)
    keep = torch.arange(5) < 3

    def fn(x, w, keep):
        s = torch.where(keep, x[:, None, :] * w[None, :, :], float("-inf"))
        return s.amax(-1).sum(-1)

    _check(fn, (x, w, keep))


def test_an_integer_count_over_a_short_axis_stays_exact():
    """How many of 4 coordinates are positive, weighted per row: counted in int64, not per term."""
    x, y = _pts(37, 50, 4, seed=5), _pts(37, 50, seed=6)
    fn = lambda x, y: ((x > 0).sum(-1) * y).sum(-1)  # noqa: E731
    _check(fn, (x, y), loads_short_tile=True)


def test_nearest_point_in_l1_whole_and_split():
    """Each of 40 points' L1 distance to the nearest of 3000 (split-K alternatives too), a NaN planted in
    one query point (its row alone is NaN) and a tail tile, against float64."""
    x, y = _pts(40, 3, seed=7), _pts(3000, 3, seed=8)
    x[5, 1] = float("nan")
    fn = lambda x, y: (x[:, None, :] - y[None, :, :]).abs().sum(-1).amin(1)  # noqa: E731
    _check(fn, (x, y))


def test_ties_with_a_min_recomputed_in_another_kernel_are_counted_exactly():
    """How many points of the other cloud are nearest, with exact ties planted (a duplicated point): the
    distance is compared with its min computed in other kernels. Written out in index order by kernels
    that contract no multiply-add (exact_arith), it has the same bits everywhere, so plans computing it
    per element qualify (extract/exact_tests.py; before, only plans writing it once did)."""
    p, q = _pts(2, 40, 3, seed=9), _pts(2, 3000, 3, seed=10)
    q[:, 2900] = q[:, 17]
    p[:, 3] = q[:, 17] + 1e-3  # (its nearest points: the two copies, tiles and chunks apart)

    def fn(p, q):
        d = ((p[:, :, None, :] - q[:, None, :, :]) ** 2).sum(-1)
        return (d == d.amin(2, keepdim=True)).sum(2)

    c = capture(fn, p, q)
    prog = compile_ir(c.program)
    apart = [a.id for a in prog.alternatives if a.plan.inline and not any(
        len(comps) > 1 for _, comps, _ in a.plan.groups)][:3]
    assert apart, "no plan computes the distance per element in the min's pass and again in the count's"
    want = fn(p, q)
    assert int(want[:, 3].min()) == 2
    for i in apart:
        kernels = prog.pin(i).lowered("cuda")[1]
        assert all(k.exact_arith for k in kernels if "_nan_min" in k.source or "== " in k.source), \
            prog.pin(i).source
        got = _run(c, prog, i, (p, q))
        assert torch.equal(got, want), (i, prog.alternatives[i].plan.show())
