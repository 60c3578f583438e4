"""neptune_eq.grad_delta: a one-hot sum over a slice's rows becomes its one term, and a clamp its guard
makes inactive is dropped only where the load stays in range over the axis' whole extent; the
backwards of slices and concatenations match torch's autograd in float64."""

from __future__ import annotations

import torch

from neptune_eq import ir
from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program
from neptune_eq.grad_delta import eliminate_deltas, unclamp_guarded
from neptune_eq.ir import Call, Const, Index, Load, Reduce
from neptune_eq.reference import evaluate

PROGRAMS = {
    "halves": (lambda x: (x[:3] - x[3:]).exp().sum(-1), [(6, 5)]),
    "halves_of_rowsums": (lambda x: torch.sigmoid(x.sum(-1)[:2] - 2 * x.sum(-1)[2:]).sum(), [(4, 7)]),
    "cat": (lambda a, b: torch.cat([a, b * 2], 0).softmax(-1), [(2, 5), (3, 5)]),
    "shifted": (lambda x: (x[1:] * x[:-1]).sum(0), [(5, 4)]),
    "odd_split": (lambda x: x[:2].sum(0) * x[2:4].logsumexp(0) + x[4:].amax(0), [(7, 3)]),
}


def _c(op, *args):
    return Call(op, tuple(args))


def test_a_one_hot_sum_becomes_its_term_guarded_and_clamped():
    """Σ_k where(k + 4 = b ∧ x[k] > 0, g[k], 0) over k < 4, for every b < 8: no sum left, the same value
    (0 where b < 4, the one term otherwise), every load in range at every b."""
    k, b = Index("k"), Index("b")
    body = _c("where", _c("and", _c("eq", _c("add", k, Const(4)), b), _c("gt", Load("x", (k,)), Const(0))),
              Load("g", (k,)), Const(0.0))
    out = eliminate_deltas(Reduce("sum", "k", body), {"k": 4, "b": 8})
    assert not any(isinstance(n, Reduce) for n in ir.walk(out))
    x, g = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    for bv in range(8):
        want = sum(float(g[kv]) for kv in range(4) if kv + 4 == bv and x[kv] > 0)
        env = {"b": bv}
        assert abs(_eval(out, env, {"x": x, "g": g}) - want) < 1e-12


def test_an_equality_with_no_integer_solution_keeps_its_sum():
    k, b = Index("k"), Index("b")
    body = _c("where", _c("eq", _c("add", k, Const(4)), _c("add", b, Const(0.5))), Load("g", (k,)), Const(0.0))
    r = Reduce("sum", "k", body)
    assert eliminate_deltas(r, {"k": 4, "b": 8}) == r


def _eval(n, env, tensors):
    """A scalar evaluator of index expressions and loads (what the guard and the clamp compute)."""
    if isinstance(n, Const):
        return n.value
    if isinstance(n, Index):
        return env[n.axis]
    if isinstance(n, Load):
        idx = tuple(int(_eval(e, env, tensors)) for e in n.index)
        assert all(0 <= i < d for i, d in zip(idx, tensors[n.tensor].shape)), (n, idx)  # (computed at every b)
        return float(tensors[n.tensor][idx])
    a = [_eval(x, env, tensors) for x in n.args]
    ops = {"add": lambda p, q: p + q, "eq": lambda p, q: p == q, "gt": lambda p, q: p > q,
           "ge": lambda p, q: p >= q, "le": lambda p, q: p <= q, "and": lambda p, q: p and q,
           "min2": min, "max2": max, "where": lambda c, p, q: p if c else q}
    return float(ops[n.op](*a))


def test_a_clamp_is_dropped_only_where_the_load_stays_in_range():
    b = Index("b")
    half = _c("add", _c("max2", _c("add", b, Const(-4)), Const(0)), Const(4))  # max(b − 4, 0) + 4
    low = _c("max2", _c("add", b, Const(-4)), Const(0))  # max(b − 4, 0)
    expr = _c("where", _c("ge", b, Const(4)), _c("add", Load("x", (half,)), Load("s", (low,))), Const(0.0))
    out = unclamp_guarded(expr, {"b": 8}, {"x": (8,), "s": (4,)})
    loads = {n.tensor: n.index[0] for n in ir.walk(out) if isinstance(n, Load)}
    assert loads["x"] == b  # b ≥ 4: max(b − 4, 0) + 4 = b, and b is in range of x everywhere
    assert loads["s"] == low  # b − 4 would read s[−4] where b < 4 (computed there too): kept
    assert unclamp_guarded(Load("x", (half,)), {"b": 8}, {"x": (8,)}) == Load("x", (half,))  # no guard


def test_backwards_of_slices_and_concatenations_match_torch_in_float64():
    for name, (fn, shapes) in PROGRAMS.items():
        gen = torch.Generator().manual_seed(1)
        args = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]
        leaves = [a.clone().requires_grad_() for a in args]
        out = fn(*leaves)
        g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        out.backward(g)
        c = capture(fn, *args)
        inputs = c.inputs(*args)
        back = backward_program(c.program)
        feed = {**inputs, back.cotangents["out0"]: g.reshape(c.program.output_shape(c.program.outputs[0]))}
        got = evaluate(back.program, feed)
        for leaf, arg in zip(leaves, c.program.inputs):
            want = leaf.grad.reshape(c.program.input_shape(arg))
            assert torch.allclose(got[back.grads[arg]], want, rtol=1e-10, atol=1e-12), (name, arg)
