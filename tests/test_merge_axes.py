"""Neighbouring dimensions reduced together are one axis of the captured program
(neptune_eq/frontend/merge_axes.py): the kernels match float64 (interpreter, sizes that are not tile
multiples), gradients flow through the merged binding, and axes used otherwise are never merged."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq import ir
from neptune_eq.frontend import capture


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _reduced_axes(program: ir.Program) -> set[str]:
    return {n.axis for o in program.outputs for n in ir.walk(o.expr) if isinstance(n, ir.Reduce)}


def test_a_mean_over_the_last_two_dims_is_one_reduction_and_matches_float64():
    def pool(x):
        return x.mean((2, 3))

    x = _randn(3, 5, 7, 9)
    program = capture(pool, x).program
    assert _reduced_axes(program) == {"id"} and program.inputs["x"].axes[-1] == "id", program
    got = neptune_eq.compile(pool, x)(x)
    assert torch.allclose(got.double(), pool(x.double()), atol=1e-6)


def test_a_layer_norm_over_two_dims_trains_through_the_merged_axis():
    """F.layer_norm over (L, D) with a [L, D] weight: the weight is read over the merged axis too, and
    the gradients of x and w (viewed back to their shapes) match float64 autograd."""
    def ln(x, w):
        return F.layer_norm(x, x.shape[-2:], w, eps=1e-5)

    x, w = _randn(2, 3, 5, 11), 1 + 0.1 * _randn(5, 11, seed=1)
    program = capture(ln, x, w).program
    assert program.inputs["w"].axes == ("id",) and len(_reduced_axes(program)) == 1, program
    prog = neptune_eq.compile(ln, x, w)
    ours = [t.clone().requires_grad_() for t in (x, w)]
    ref = [t.double().requires_grad_() for t in (x, w)]
    cot = _randn(2, 3, 5, 11, seed=2, dtype=torch.float64)
    out = prog(*ours)
    (out.double() * cot).sum().backward()
    (ln(*ref) * cot).sum().backward()
    assert torch.allclose(out.double(), ln(*ref).detach(), atol=1e-5)
    for a, b in zip(ours, ref):
        assert a.grad.shape == b.grad.shape and torch.allclose(a.grad.double(), b.grad, atol=1e-4)


def test_axes_used_otherwise_are_not_merged():
    """A mask on an axis (causal scores), a tensor reading the two in the other order, a gather along
    one, and a max around a sum keep their axes."""
    def causal(q, k):
        s = q @ k.transpose(-1, -2)
        i = torch.arange(s.shape[-1])
        return torch.softmax(s.masked_fill(i[None, :] > i[:, None], float("-inf")), -1)

    def crossed(x, y):
        return (x * y.transpose(-1, -2)).sum((-2, -1))

    def max_of_sums(x):
        return x.sum(-1).amax(-1)

    q = _randn(2, 6, 4)
    assert capture(causal, q, q).program.axes.keys() == capture(causal, q, q, merge=False).program.axes.keys()
    x = _randn(3, 5, 7)
    assert _reduced_axes(capture(crossed, x, _randn(3, 7, 5)).program) == {"i", "d"}
    assert _reduced_axes(capture(max_of_sums, x).program) == {"i", "d"}

    def gathered(x, idx):  # x[b, idx[j], d] summed over (j, d): j is read through the gather alone
        return x[:, idx].sum((1, 2))

    idx = torch.tensor([4, 0, 2])
    assert len(_reduced_axes(capture(gathered, _randn(2, 5, 7), idx).program)) == 2


def test_group_norm_reduces_each_group_over_one_axis_and_matches_float64():
    """Group norm reads x at channel h·3 + j: the channels of a group and its pixels merge into one
    axis read at h·3·35 + jf (a reshape of x), the per-channel weights at h·3 + jf // 35; forward and
    gradients of x, w and b match float64."""
    def gn(x, w, b):
        return F.group_norm(x, 4, w, b, eps=1e-5)

    args = (_randn(2, 12, 5, 7), _randn(12, seed=1), _randn(12, seed=2))
    program = capture(gn, *args).program
    assert len(_reduced_axes(program)) == 1 and len(program.inputs["x"].axes) == 2, program
    assert "// 35" in str(program.outputs[0].expr), program
    prog = neptune_eq.compile(gn, *args)
    ours = [t.clone().requires_grad_() for t in args]
    ref = [t.double().requires_grad_() for t in args]
    cot = _randn(2, 12, 5, 7, seed=3, dtype=torch.float64)
    out = prog(*ours)
    (out.double() * cot).sum().backward()
    want = gn(*ref)
    (want * cot).sum().backward()
    assert torch.allclose(out.double(), want.detach(), atol=1e-5)
    for a, b in zip(ours, ref):
        assert torch.allclose(a.grad.double(), b.grad, atol=1e-4), (a.grad, b.grad)


def test_a_weight_read_along_one_of_the_merged_axes_is_read_by_division():
    """A [L] weight inside a sum over (L, D) of x[b, L, D]: the sum is one axis, the weight read at
    ld // D; and a [D] weight at ld % D. Strided x (a transposed view) is reshaped, not misread."""
    def weighted(x, wl, wd):
        return (x * wl[:, None] * wd).sum((-2, -1))

    x, wl, wd = _randn(3, 6, 5), _randn(6, seed=1), _randn(5, seed=2)
    program = capture(weighted, x, wl, wd).program
    assert len(_reduced_axes(program)) == 1, program
    text = str(program.outputs[0].expr)
    assert "// 5" in text and "% 5" in text, text
    prog = neptune_eq.compile(weighted, x, wl, wd)
    for xx in (x, _randn(3, 5, 6, seed=4).transpose(1, 2)):
        want = weighted(xx.double(), wl.double(), wd.double())
        assert torch.allclose(prog(xx, wl, wd).double(), want, atol=1e-5)


def test_a_dynamic_compile_keeps_every_dimension(tmp_path):
    """A length marked dynamic maps each argument dimension to an axis: such a capture is not merged,
    and one compile serves both lengths."""
    def pool(x):
        return x.sum((1, 2))

    prog = neptune_eq.compile(pool, _randn(3, 6, 5), dynamic={0: [1]}, cache_dir=tmp_path)  # (a fresh cache)
    for n in (6, 9):
        x = _randn(3, n, 5, seed=n)
        assert torch.allclose(prog(x).double(), pool(x.double()), atol=1e-5)
    assert prog.stats()["compiles"] == 1, prog.stats()
