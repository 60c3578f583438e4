"""Gradients through shifted gathers (slices, torch.cat, rotate-half: neptune_eq/grad_gather.py),
sin/cos, and a backward derived for the inputs that require grad alone (neptune_eq/autograd.py).
Every check runs the generated kernels (Triton's interpreter) against float64 autograd."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq import autograd, ir
from neptune_eq.frontend import capture
from neptune_eq.grad import NoBackward, backward_program
from neptune_eq.grad_gather import zero_on
from neptune_eq.index_shift import Shift, clamped_shift
from neptune_eq.ir import Call, Const, Index


def _rot(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


def rope(x, cos, sin):
    return x * cos + _rot(x) * sin


def rope_attention(q, k, v, cos, sin):
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v


def _angles(n, d):
    ang = torch.arange(n, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(d // 2) / (d // 2))[None]
    ang = torch.cat([ang, ang], -1)
    return ang.cos(), ang.sin()


def _grads(fn, args, wants, prog=None):
    """(compiled gradients, float64 autograd's) of Σ out·ḡ for a random cotangent ḡ."""
    ours = [a.clone().float().requires_grad_(w) for a, w in zip(args, wants)]
    ref = [a.clone().double().requires_grad_(w) for a, w in zip(args, wants)]
    prog = prog or neptune_eq.compile(fn, *[a.float() for a in args])
    out, want = prog(*ours), fn(*ref)
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out.double() * cot).sum().backward()
    (want * cot).sum().backward()
    assert (out.double() - want).abs().max() < 1e-5
    return [a.grad for a in ours if a.requires_grad], [a.grad for a in ref if a.requires_grad]


def test_clamped_shifts_are_read_from_slices_and_cat():
    d = Index("d")
    assert clamped_shift(d) == Shift("d", 0, -math.inf, math.inf)
    e = Call("add", (Call("min2", (d, Const(7.0))), Const(8.0)))  # cat's second piece: min(d, 7) + 8
    assert clamped_shift(e) == Shift("d", 8, -math.inf, 15)
    e = Call("add", (Call("max2", (Call("add", (d, Const(-8.0))), Const(0.0))), Const(0.0)))
    assert clamped_shift(e) == Shift("d", -8, 0, math.inf)
    assert clamped_shift(Call("mul", (d, Const(2.0)))) is None  # a stride is not a shift
    assert clamped_shift(Call("add", (d, Index("i")))) is None


def test_zero_on_reads_a_where_of_the_axis():
    d = Index("d")
    g = Call("neg", (Call("where", (Call("lt", (d, Const(8.0))), Call("exp", (Index("i"),)), Const(0.0))),))
    assert zero_on(g, "d", list(range(8, 16)))
    assert not zero_on(g, "d", [7, 8])
    assert not zero_on(Call("exp", (d,)), "d", [3])


def test_rotate_half_gradient_is_a_shift_back_not_a_one_hot_sum():
    x, (cos, sin) = torch.randn(5, 8, dtype=torch.float64), _angles(5, 8)
    back = backward_program(capture(rope, x, cos, sin).program, ["x"]).program
    (out,) = back.outputs
    # every clamped edge of the cat's pieces reads the other piece's zero branch: no sum over d
    assert not any(isinstance(n, ir.Reduce) for n in ir.walk(out.expr)), ir.show(out.expr)
    leaves = [t.clone().requires_grad_() for t in (x, cos, sin)]
    prog = neptune_eq.compile(rope, x, cos, sin)
    assert torch.autograd.gradcheck(lambda *a: prog(*a), leaves, eps=1e-6, atol=1e-6, fast_mode=True)


def test_a_shifted_window_keeps_its_clamped_edges():
    """x[..., 1:] − x[..., :-1] padded by cat to the full width: the edge terms are real (not pruned)."""
    def diff(x):
        return torch.cat([x[:, 1:] - x[:, :-1], x[:, -1:]], -1).pow(2).sum(-1)

    x = torch.randn(4, 7, dtype=torch.float64)
    got, want = _grads(diff, (x,), (True,))
    assert torch.allclose(got[0].double(), want[0], atol=1e-5)


def test_sin_and_cos_are_ops_with_gradients():
    def f(x, pos, w):
        ang = pos[:, None] * w[None, :]
        return (x * torch.cos(ang) + torch.sin(ang) * x * x).sum(-1)

    x, w = torch.randn(6, 5, dtype=torch.float64), torch.rand(5, dtype=torch.float64)
    pos = torch.arange(6, dtype=torch.float64) * 3000.0  # angles of 10⁴ radians: full argument reduction
    prog = neptune_eq.compile(f, x, pos, w)
    assert torch.allclose(prog(x, pos, w), f(x, pos, w), atol=1e-9)
    leaves = [t.clone().requires_grad_() for t in (x, pos, w)]
    assert torch.autograd.gradcheck(lambda *a: prog(*a), leaves, eps=1e-6, atol=1e-5, fast_mode=True)


def test_rope_attention_gradients():
    """q, k, v get their gradients through the rotations; cos and sin, buffers, none (not computed)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 8, generator=g, dtype=torch.float64) for _ in range(3))
    cos, sin = _angles(7, 8)
    got, want = _grads(rope_attention, (q, k, v, cos, sin), (True, True, True, False, False))
    assert len(got) == 3
    for a, b in zip(got, want):
        assert torch.allclose(a.double(), b, atol=2e-5), (a - b).abs().max()


def test_an_input_read_over_two_axes_sums_both_gradients():
    """w is read beside the queries (w[i, d]) and beside the keys (w[j, d]): the key side's
    contribution holds Σ over queries, renamed to a fresh axis before j is read as i (RoPE's cos and
    sin when they require grad)."""
    def f(q, k, w):
        return torch.softmax((q * w) @ (k * w).transpose(-1, -2), -1)

    g = torch.Generator().manual_seed(2)
    q, k, w = (torch.randn(6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    back = backward_program(capture(f, q, k, w).program, ["w"]).program
    assert len(back.axes) == 4  # i, j, d and the renamed queries
    got, want = _grads(f, (q, k, w), (True, True, True))
    for a, b in zip(got, want):
        assert torch.allclose(a.double(), b, atol=2e-5), (a - b).abs().max()


def test_the_backward_computes_the_gradients_required_alone():
    """A buffer that needs no gradient costs no reduction, and one whose gradient is not derived (a
    diagonal) does not stop the inputs that need theirs; requiring it names the cause."""
    def f(x, w):
        return torch.softmax(x * torch.diagonal(w), -1)

    x, w = torch.randn(3, 4), torch.randn(4, 4)
    prog = neptune_eq.compile(f, x, w)
    xg = x.clone().requires_grad_()
    prog(xg, w).pow(2).sum().backward()
    ref = x.double().requires_grad_()
    f(ref, w.double()).pow(2).sum().backward()
    assert torch.allclose(xg.grad.double(), ref.grad, atol=1e-5)
    qualname = prog._first().op.qualname
    back = autograd._TRAINING[autograd._LAST[qualname]].recompute.program
    assert [o.name for o in back.outputs] == ["grad_x"]
    with pytest.raises(NoBackward, match="axis read twice"):
        prog(x, w.clone().requires_grad_())


def test_rope_attention_keeps_a_two_dimensional_tensor_core_dot():
    """cos and sin [L, d] lack batch and heads but are a sliver of the streamed bytes: the tile keeps
    one batch and head per program, and the two computed bf16 operands are rounded to bf16 for the
    dot (an fp32 IEEE dot before: 1.86 s on the H100 where torch.compile took 0.2 ms)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    cos, sin = (t.to(torch.bfloat16) for t in _angles(256, 64))
    comp = neptune_eq.compile(rope_attention, q, k, v, cos, sin).program
    (sched,) = comp._schedules("cuda")
    assert sched.tiles["b"] == 1 and sched.tiles["h"] == 1, sched.tiles
    src, _ = comp.lowered("cuda")
    assert "tl.dot(" in src and 'input_precision="ieee"' not in src


def test_a_relative_position_table_gets_its_gradient_along_diagonals():
    """table[h, clamp(j − i, −4, 4) + 4]: the gradient of entry f is the diagonal j = i + f − 4 summed
    over i, plus the two clamped triangles at f = 0 and f = 8 — no one-hot test of every (i, j) against
    every f (129 entries of a T5 table made that 129 times attention's backward). The batch the table
    is shared by is summed outside the diagonal and the triangles: Σ_b dS recomputed per (i, j) held
    the batch as a padded ALU axis in their kernels (305 G operations predicted at L 2048, against 17
    G). Against float64 autograd, the reference evaluator (no kernels), at 23 positions (both clamps
    reached)."""
    from neptune_eq.reference import evaluate

    def rel_bias(q, k, table):
        i = torch.arange(q.shape[-2])
        rel = (i[None, :] - i[:, None]).clamp(-4, 4) + 4
        return torch.softmax(q @ k.transpose(-1, -2) + table[:, rel], -1)

    g = torch.Generator().manual_seed(2)
    q, k, table = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((3, 2, 23, 5), (3, 2, 23, 5), (2, 9)))
    back = backward_program(capture(rel_bias, q, k, table).program)
    grad = next(o for o in back.program.outputs if o.name == back.grads["table"])
    f = Index(back.program.inputs["table"].axes[1])  # the table's position axis
    assert not any(isinstance(n, Call) and n.op == "eq" and f in n.args
                   and not any(isinstance(a, Const) for a in n.args) for n in ir.walk(grad.expr))
    batch = back.program.inputs["q"].axes[0]
    positions = set(back.program.inputs["q"].axes[2:3]) | set(back.program.inputs["k"].axes[2:3])
    for r in ir.walk(grad.expr):
        if isinstance(r, ir.Reduce) and r.axis in positions:
            assert not any(isinstance(m, ir.Reduce) and m.axis == batch for m in ir.walk(r.body)), ir.show(r)
    gout = torch.randn(3, 2, 23, 23, generator=g, dtype=torch.float64)
    got = evaluate(back.program, {"q": q, "k": k, "table": table, back.cotangents["out0"]: gout})
    leaves = [x.clone().requires_grad_() for x in (q, k, table)]
    rel_bias(*leaves).backward(gout)
    for name, leaf in zip(("q", "k", "table"), leaves):
        assert torch.allclose(got[back.grads[name]], leaf.grad, atol=1e-10), name


@pytest.mark.parametrize("fn", [
    lambda x, t, idx: torch.logsumexp(x + t[idx], -1),
    lambda x, t, idx: torch.softmax(x + t[idx], -1),
    lambda x, t, idx: x * t[idx] * t[idx].sum(-1, keepdim=True),
], ids=["logsumexp", "softmax", "row_sum"])
def test_an_unclamped_relative_position_read_gets_its_gradient_without_capture(fn):
    """t[i − d + L − 1] read beside a reduction over d: the table's adjoint reads the cotangent at
    i = f − L + 1 + d, whose row statistics sum over d themselves — substituted as they were, they summed
    x[f − L + 1 + d, d] over their own d (table gradients off by the whole, or NaN, until session 55).
    They are bound to a fresh axis first. Float64 autograd through the compiled kernels."""
    n = 6
    idx = torch.arange(n)[:, None] - torch.arange(n)[None, :] + n - 1

    def f(x, t):
        return fn(x, t, torch.arange(x.shape[0])[:, None] - torch.arange(x.shape[0])[None, :] + x.shape[0] - 1)

    g = torch.Generator().manual_seed(4)
    x, t = torch.randn(n, n, generator=g), torch.randn(2 * n - 1, generator=g)
    xs = [x.clone().requires_grad_(), t.clone().requires_grad_()]
    out = neptune_eq.compile(f, x, t)(*xs)
    cot = torch.randn(out.shape, generator=g)
    (out * cot).sum().backward()
    ds = [x.double().requires_grad_(), t.double().requires_grad_()]
    (fn(*ds, idx) * cot.double()).sum().backward()
    for a, b in zip(xs, ds):
        assert torch.allclose(a.grad.double(), b.grad, atol=1e-5), (a.grad.double() - b.grad).abs().max()


def test_a_learnable_relative_bias_score_mod_and_a_sliding_window_read_train():
    """FlexAttention's `bias[h, q_idx − kv_idx + L − 1]` through neptune_eq.attention, and a softmax over
    the windows x[i + k] of a sequence (unfold by hand): both were silently wrong (see above)."""
    n, d = 5, 8
    g = torch.Generator().manual_seed(5)
    table = torch.randn(2, 2 * n - 1, generator=g, requires_grad=True)
    q, k, v = (torch.randn(1, 2, n, d, generator=g) for _ in range(3))

    def rel(s, b, h, i, j):
        return s + table[h, i - j + n - 1]
    out = neptune_eq.attention(q, k, v, score_mod=rel)
    cot = torch.randn(out.shape, generator=g)
    (out * cot).sum().backward()
    td = table.detach().double().requires_grad_()
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(d) + td[:, i - j + n - 1]
    (torch.softmax(s, -1) @ v.double() * cot.double()).sum().backward()
    assert torch.allclose(table.grad.double(), td.grad, atol=1e-5)

    def windows(x):
        w = torch.arange(8)[:, None] + torch.arange(3)[None, :]
        return torch.softmax(x[w], -1)
    x = torch.randn(10, generator=g)
    xx, xd = x.clone().requires_grad_(), x.double().requires_grad_()
    out = neptune_eq.compile(windows, x)(xx)
    cot = torch.randn(out.shape, generator=g)
    (out * cot).sum().backward()
    (windows(xd) * cot.double()).sum().backward()
    assert torch.allclose(xx.grad.double(), xd.grad, atol=1e-5)


def test_a_split_dimension_gets_its_gradient_over_its_digits():
    """x[b, i·3 + j, d] and w[i·3 + j] (a view splitting the channels into groups), and a weight read
    at i·3 + jd // 5 after the sum over (j, d) is merged: the gradient is g over the digit axes,
    reshaped — no one-hot test [i·3 + j == c] summed over every (i, j) for every c — and matches
    float64 through the compiled kernels, fwd and bwd."""
    def grouped(x, w):
        return (x.view(2, 4, 3, 5).softmax(-1) * w.view(4, 3, 1)).sum(2)

    def blocks(x, w):
        return (x * w.view(4, 3, 1)).sum((2, 3))

    g = torch.Generator().manual_seed(3)
    for fn, shape in ((grouped, (2, 12, 5)), (blocks, (2, 4, 3, 5))):
        x, w = torch.randn(*shape, generator=g), torch.randn(12, generator=g)
        program = capture(fn, x, w).program
        back = backward_program(program)
        out = next(o for o in back.program.outputs if o.name == back.grads["w"])
        assert len(out.axes) == 2 and not any(isinstance(n, Call) and n.op == "eq" and Index(
            program.inputs["w"].axes[0]) in n.args for n in ir.walk(out.expr)), out
        ours = [t.clone().requires_grad_() for t in (x, w)]
        ref = [t.double().requires_grad_() for t in (x, w)]
        cot = torch.randn(fn(x, w).shape, generator=g, dtype=torch.float64)
        got = neptune_eq.compile(fn, x, w)(*ours)
        (got.double() * cot).sum().backward()
        (fn(*ref) * cot).sum().backward()
        for a, b in zip(ours, ref):
            assert a.grad.shape == b.grad.shape and torch.allclose(a.grad.double(), b.grad, atol=1e-5), fn.__name__


def test_cross_entropy_of_a_tensor_scored_against_itself_trains():
    """F.cross_entropy(y @ y.mT, labels) gathers y at the label's row, the logits' row axis being y's
    own: the one-hot gradient's position takes a fresh copy of that axis (it had been refused, "would
    reuse an axis", found by scripts/fuzz_programs.py)."""
    def self_scored(y, lab):
        return F.cross_entropy(y @ y.mT, lab, label_smoothing=0.1)

    g = torch.Generator().manual_seed(3)
    y, lab = torch.randn(7, 4, generator=g), torch.randint(0, 7, (7,), generator=g)
    leaf, ref = y.clone().requires_grad_(), y.double().requires_grad_()
    neptune_eq.compile(self_scored, y, lab)(leaf, lab).backward()
    self_scored(ref, lab).backward()
    assert torch.allclose(leaf.grad.double(), ref.grad, atol=1e-6)
