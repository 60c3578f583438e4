"""Grouped-query heads train over (kv head, member) axes (neptune_eq.regroup): the kv gradients are sums
over the member axis, not one-hot sums over every query head; the training op views its tensors so at
its boundary. Gradients against float64 in the interpreter."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq import ir
from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program
from neptune_eq.kernel_terms import inner_axes
from neptune_eq.regroup import regroup
from neptune_eq.runtime import compile_ir


def _gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _alibi_gqa(q, k, v, slopes):
    """Each query head its own learnable slope (read at h), k and v shared by 2 heads (read at h // 2)."""
    L = q.shape[-2]
    pos = torch.arange(L)
    bias = -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs().to(q.dtype)
    s = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    return torch.softmax(s, -1) @ v.repeat_interleave(2, dim=1)


def _grads(fn, xs, seed):
    g = torch.Generator().manual_seed(seed)
    prog = neptune_eq.compile(fn, *xs)
    ours = [x.clone().requires_grad_() for x in xs]
    ref = [x.double().requires_grad_() for x in xs]
    out = prog(*ours)
    cot = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (out.double() * cot).sum().backward()
    (fn(*ref) * cot).sum().backward()
    return prog, [(a.grad, b.grad) for a, b in zip(ours, ref)]


def test_grouped_query_heads_split_into_group_and_member_axes():
    """q[b, h, i, d] becomes q[b, h0, h1, i, d] (a view), k[b, h // 4, j, d] becomes k[b, h0, j, d] (no
    gather left), and dK = Σ_h1 Σ_i …: its group sum reads each query head once (a pass over h1, several
    keys per program), where the one-hot Σ_h [h // 4 = h0]·dK_h read all 16 per kv head. (At 256
    positions: up to 128 the model prefers two kernels, the member loop's contraction held on the ALUs
    in blocks within BLOCK_VALUES, launches dominating.)"""
    xs = [torch.randn(2, h, 256, 16) for h in (16, 4, 4)]
    program = capture(_gqa, *xs).program
    got = regroup(program)
    assert got is not None
    p2, rg = got
    assert rg.size == 4 and rg.dims == {"q": 1, "out0": 1}, rg
    assert p2.inputs["q"].axes == ("b", rg.group, rg.member, "i", "d") and p2.inputs["k"].axes[1] == rg.group
    loads = [n for o in p2.outputs for n in ir.walk(o.expr) if isinstance(n, ir.Load)]
    assert all(isinstance(e, ir.Index) for ld in loads for e in ld.index)
    back = backward_program(p2, saved=True).program
    grad_k = next(o for o in back.outputs if o.name == "grad_k").expr
    assert isinstance(grad_k, ir.Reduce) and grad_k.axis == rg.member
    assert "//" not in "".join(ir.show(o.expr) for o in back.outputs)
    # the group sum's program takes several key rows: one row, [4, 16] fp32 blocks (at d 128, 172 against
    # 52 µs for 4 rows on the H100: bench/probe_group_sum.py)
    alt = compile_ir(back).alternative
    (ks,) = [s for kp, s in zip(alt.plan.kernels, alt.schedules)
             if not inner_axes(kp, alt.plan) and [p.axis for p in kp.passes()] == [rg.member]]
    assert ks.tiles["j"] > 1, ks
    q = torch.randn(2, 3, 5, 7)
    assert torch.equal(rg.merge("q", rg.split("q", q.repeat(1, 4, 1, 1))), q.repeat(1, 4, 1, 1))


def _gqa_inputs(seed: int) -> list[torch.Tensor]:  # (one shape and dtype: the tests below share a compile)
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, h, 19, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2)]


def test_grouped_query_attention_gradients_match_float64():
    prog, grads = _grads(_gqa, _gqa_inputs(1), 2)
    assert "h1 (sum_h1" in prog.explain()  # (the backward trained regrouped)
    for a, b in grads:
        assert a.shape == b.shape and ((a.double() - b).norm() / b.norm()).item() < 1e-9


def test_a_head_index_read_whole_and_grouped_trains_with_its_slopes():
    """A per-query-head slope tensor (read at h) beside k and v read at h // 2: the slopes are viewed
    [h0, h1] and their gradient laid back out as [h]."""
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(1, h, 9, 8, generator=g) for h in (4, 2, 2)] + [torch.rand(4, generator=g)]
    program = capture(_alibi_gqa, *xs).program
    assert regroup(program) is not None
    _, grads = _grads(_alibi_gqa, xs, 4)
    for a, b in grads:
        assert a.shape == b.shape and ((a.double() - b).norm() / b.norm()).item() < 1e-5


def test_an_axis_reduced_over_is_not_regrouped():
    """A sum over the query heads (the output lacks h): regrouping would need Σ_h0 Σ_h1, not built."""
    def summed(q, k):
        return (q @ k.repeat_interleave(2, dim=1).transpose(-1, -2)).sum(1)

    xs = [torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)]
    assert regroup(capture(summed, *xs).program) is None


def test_torch_compile_traces_the_regrouped_training():
    """Under torch.compile (AOTAutograd) the training op's outputs are views of what the regrouped
    program wrote, laid back out as the user's: the gradients match float64 autograd."""
    xs = _gqa_inputs(5)
    prog = neptune_eq.compile(_gqa, *xs)
    ours = [x.clone().requires_grad_() for x in xs]
    torch.compile(lambda q, k, v: prog(q, k, v).pow(2).sum(), backend="aot_eager")(*ours).backward()
    ref = [x.double().requires_grad_() for x in xs]
    _gqa(*ref).pow(2).sum().backward()
    for a, b in zip(ours, ref):
        assert ((a.grad - b.grad).norm() / b.grad.norm()).item() < 1e-9


def test_opcheck_of_a_regrouped_training_op():
    xs = _gqa_inputs(6)
    ops = neptune_eq.compile(_gqa, *xs).library_ops()
    torch.library.opcheck(ops["training"], ([x.clone().requires_grad_() for x in xs],))
