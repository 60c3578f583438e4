"""A max or min over a value that holds a reduction trains (it had been refused, session 73): its adjoint
goes to the elements attaining it, found by comparing each with the max — exact where both come from
one computation. The backward's plan writes such a value once (extract/exact_tests.py) and takes the
max from it, never from the forward, whose kernels summed it in another order (grad_saved.save). Every
check runs the generated kernels (Triton's interpreter) against torch's autograd in float64."""

from __future__ import annotations

import pytest
import torch

import neptune_eq
from neptune_eq import ir
from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _grads_match(fn, xs, rtol=1e-5):
    ins = [x.clone().requires_grad_() for x in xs]
    out = neptune_eq.compile(fn, *xs)(*ins)
    got = torch.autograd.grad(out.sum(), ins)
    ref_in = [x.double().requires_grad_() for x in xs]
    want = torch.autograd.grad(fn(*ref_in).sum(), ref_in)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=rtol, atol=rtol * float(w.abs().max()))


def gram_amax(x):
    return (x @ x.T).amax(-1)


def test_a_max_over_a_gram_matrix_finds_its_diagonal():
    """x @ xᵀ's row max is its diagonal: x_i reaches it as both factors. Read from the forward (saved),
    the max had been summed in another order than the backward's recomputed x_i·x_i, and half the
    gradient was lost (2x_i expected, x_i given)."""
    x = _randn(3, 5)
    assert torch.equal(gram_amax(x), (x @ x.T).diagonal())  # (the case: every row's max on the diagonal)
    _grads_match(gram_amax, (x,))


def test_a_saved_backward_reads_no_forward_max_it_compares():
    """The saved backward keeps the forward's outputs and row statistics, but not a max it compares
    with the value it is the max of (the gram matrix's row max is an output: not read)."""
    c = capture(lambda x: (x @ x.T).amax(-1), _randn(3, 5).double())
    back = backward_program(c.program, saved=True)
    read = {n.tensor for o in back.program.outputs for n in ir.walk(o.expr) if isinstance(n, ir.Load)}
    assert c.program.outputs[0].name not in read


def test_a_max_over_attention_features_keeps_its_gradient():
    """The max over attention's output features, float32: its gradient had been silently dropped (the
    output recomputed in other tiles rounded otherwise and equalled no max)."""
    fn = lambda q, k, v: torch.softmax(q @ k.mT / 4, -1).matmul(v).amax(-1)  # noqa: E731
    _grads_match(fn, (_randn(2, 45, 16, seed=1), _randn(2, 70, 16, seed=2), _randn(2, 70, 16, seed=3)))


@pytest.mark.parametrize("spelling", ["min_values", "amin"])
def test_chamfer_distance_trains(spelling):
    """The Chamfer distance of two point clouds: each point's nearest squared distance, both ways."""

    def chamfer(p, q):
        d = ((p[:, :, None] - q[:, None]) ** 2).sum(-1)
        if spelling == "amin":
            return d.amin(2).mean() + d.amin(1).mean()
        return d.min(2).values.mean() + d.min(1).values.mean()

    _grads_match(chamfer, (_randn(2, 37, 3, seed=4), _randn(2, 29, 3, seed=5)))


def test_batch_hard_triplet_trains():
    """Each anchor's farthest positive and nearest negative of a distance built from a matmul."""

    def batch_hard(e, labels):
        sq = (e ** 2).sum(1)
        d = (sq[:, None] + sq[None, :] - 2.0 * (e @ e.T)).clamp_min(1e-12).sqrt()
        same = labels[:, None] == labels[None, :]
        pos = torch.where(same, d, torch.zeros_like(d)).amax(1)
        neg = torch.where(same, torch.full_like(d, 1e9), d).amin(1)
        return torch.relu(pos - neg + 0.3).mean()

    e = _randn(40, 24, seed=6)
    labels = torch.randint(0, 6, (40,), generator=torch.Generator().manual_seed(7))
    ins = e.clone().requires_grad_()
    got = torch.autograd.grad(neptune_eq.compile(batch_hard, e, labels)(ins, labels), ins)[0]
    ref = e.double().requires_grad_()
    want = torch.autograd.grad(batch_hard(ref, labels), ref)[0]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7)
    assert float(want.abs().sum()) > 0


def banded_softmax_amin(x):
    """Fuzz seed 1511: softmax of banded rows, log-softmax over the other axis, the rows' min."""
    t = x.mT
    band = (torch.arange(t.shape[-1])[None, :] - torch.arange(t.shape[-2])[:, None]).abs() <= 1
    p = torch.softmax(t.masked_fill(~band, float("-inf")), -1)
    return torch.log_softmax(p, -2).amin(-1)


def test_a_min_of_a_value_divided_in_two_layouts_keeps_its_gradient():
    """The value p / Σp is computed in the min's kernel (Σp per row: one reciprocal, a multiply per
    element) and in the kernel comparing it with the min (Σp varying along the tile: a division). The
    two rounded apart and a row lost the min's gradient (off by 0.06 of 1.1); the reciprocal is now
    taken whatever the layout, and those kernels contract no multiply-add (lower/exact.py). (Rounding
    decides which inputs show it: seed 11 is the one of seeds 0-59 that did before the change.)"""
    _grads_match(banded_softmax_amin, (_randn(2, 7, 4, seed=11),))


def test_only_kernels_meeting_a_compared_state_give_up_fma():
    """Kernels comparing a computed value with a min, or computing that min, are compiled without FMA
    contraction; a softmax's kernels (its max only a shift) keep it."""
    from neptune_eq.runtime import compile_ir

    def kernels(fn, *xs):
        return compile_ir(capture(fn, *xs).program).lowered("cuda")[1]

    x = _randn(6, 40, seed=3)
    def ties(x):
        v = torch.softmax(x * 2.0, -1) * 3.0 + 1.0
        return (v == v.amin(-1, keepdim=True)).sum(-1)

    tested = kernels(ties, x)
    plain = kernels(lambda x: torch.softmax(x * 2.0, -1), x)
    assert not any(k.exact_arith for k in plain)
    assert tested and all(k.exact_arith for k in tested if "_nan_min" in k.source)


def variance_layer_norm_amax(x):
    return torch.nn.functional.layer_norm(x.var(-2, keepdim=True, unbiased=False), (4,)).amax(-1, keepdim=True)


def _spelled_as_its_pass(plan) -> list[str]:
    """The comparisons of `plan` whose value differs, as written, from the core of the max or min it is
    compared with (buffer loads read as the states they hold)."""
    from neptune_eq.extract.exact_tests import computed

    from neptune_eq.ops import COMPARISONS

    held = {st.target: st.expr for k in plan.kernels for st in k.epilogue
            if isinstance(st.expr, ir.StateRef) and st.expr.kind is ir.RefKind.FINAL}
    cores = {c.name: c.core for k in plan.kernels for ps in k.passes() for c in ps.comps
             if c.op in ("max", "min") and c.mask is None}

    def read(e):
        return ir.substitute(e, {ld: held[ld.tensor] for ld in ir.walk(e)
                                 if isinstance(ld, ir.Load) and ld.tensor in held})

    bad = []
    for k in plan.kernels:
        for e in k.exprs():
            for n in ir.walk(read(e)):
                if isinstance(n, ir.Call) and n.op in COMPARISONS:
                    for a, b in (n.args, n.args[::-1]):
                        if isinstance(b, ir.StateRef) and b.name in cores and computed(a) and a != read(cores[b.name]):
                            bad.append(f"{k.name}: {ir.show(a)} against {ir.show(read(cores[b.name]))}")
    return bad


def test_every_plan_compares_a_max_with_its_value_spelled_as_its_pass_reduces_it():
    """A layer norm's amax: its backward compares each normalised variance with their max, recomputed
    from the saved sums. The chosen plan reduced rsqrt(v)·(s − m/4)·0.1 in the max's pass and compared
    (s·0.1 − m·0.025)·rsqrt(v) with it in the map writing the gradient — equal on the reals, an ulp apart
    in float32, and the rows where they differed lost the max's gradient (fuzz seed 1552, off by 1.66 of
    1.69). Every alternative now spells the compared value as the max's pass does."""
    from neptune_eq.runtime import compile_ir

    back = backward_program(capture(variance_layer_norm_amax, _randn(2, 10, 4)).program, saved=True).program
    alts = compile_ir(back).alternatives
    assert len(alts) > 1
    for a in alts:
        assert _spelled_as_its_pass(a.plan) == [], a.plan.show()


def test_a_layer_norms_amax_keeps_its_gradient():
    """The same training run (seed 0 lost a row's gradient before the change)."""
    _grads_match(variance_layer_norm_amax, (_randn(2, 10, 4, seed=0),))


def test_a_kernel_reading_a_compared_max_from_a_buffer_gives_up_fma():
    """The kernel writing the layer norm's gradient compares each value with the max another kernel
    wrote to a buffer: it too is compiled without FMA contraction (it had been only where it read the
    max as a state of its own)."""
    from neptune_eq.lower.exact import exact_kernels
    from neptune_eq.runtime import compile_ir

    back = backward_program(capture(variance_layer_norm_amax, _randn(2, 10, 4)).program, saved=True).program
    plan = compile_ir(back).pin(0).plan
    reads = [k.name for k in plan.kernels for e in k.exprs() for n in ir.walk(e)
             if isinstance(n, ir.Load) and n.tensor == "buf_max_d"]
    assert reads and set(reads) <= exact_kernels(plan)
