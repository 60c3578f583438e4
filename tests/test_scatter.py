"""One-hot sums of a gathered table's gradient run as a scatter of rows (neptune_eq/scatter.py): the
split program's rows and indices, finished by scatter_rows, equal the dense sum in float64 — with
indices outside the table, in deterministic mode — and a training call's table gradient is so derived
and matches float64 autograd (Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq import autograd, ir, scatter
from neptune_eq.ir import Call, Const, Index, Load, Reduce
from neptune_eq.program import Output, Program, TensorSpec
from neptune_eq.reference import evaluate


def _ld(t, *axes):
    return Load(t, tuple(Index(a) for a in axes))


def _embedding_grad(rows: int) -> Program:
    """∂table[v, d] = Σ_t [max(ids[t], 0) = v]·g[t, d]·2 + 0.5·table[v, d] − Σ_t [ids[t] = v]·g[t, d]."""
    hit = Call("eq", (Call("max2", (Load("ids", (Index("t"),)), Const(0.0))), Index("v")))
    one = Reduce("sum", "t", Call("where", (hit, Call("mul", (_ld("g", "t", "d"), Const(2.0))), Const(0.0))))
    two = Reduce("sum", "t", Call("where", (Call("eq", (Index("v"), Load("ids", (Index("t"),)))),
                                            _ld("g", "t", "d"), Const(0.0))))
    expr = Call("sub", (Call("add", (one, Call("mul", (Const(0.5), _ld("table", "v", "d"))))), two))
    return Program("emb", {"t": 37, "v": rows, "d": 8},
                   {"ids": TensorSpec("ids", ("t",), "int64"), "g": TensorSpec("g", ("t", "d"), "float64"),
                    "table": TensorSpec("table", ("v", "d"), "float64")},
                   [Output("grad", ("v", "d"), expr, "float64")]).validate()


def _finished(p: Program, inputs: dict, deterministic: bool = False) -> torch.Tensor:
    s = scatter.split(p)
    assert s is not None
    res = evaluate(s.inner, inputs)
    res = {o.name: (res[o.name].long() if o.dtype == "int64" else res[o.name]) for o in s.inner.outputs}
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        return s.finish(res, {})["grad"]
    finally:
        torch.use_deterministic_algorithms(prev)


@pytest.mark.parametrize("deterministic", [False, True])
def test_split_equals_the_dense_sum(deterministic):
    p = _embedding_grad(100)
    s = scatter.split(p)
    # both one-hot sums leave (the two spellings of the same index each their own scatter); the
    # dense part keeps the table term alone
    assert len(s.outputs) == 1 and s.outputs[0].dense is not None
    assert {o.name for o in s.inner.outputs} == {"grad_dense", "grad_rows", "grad_at", "grad_rows2", "grad_at2"}
    assert not any(isinstance(n, Reduce) for o in s.inner.outputs for n in ir.walk(o.expr))
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 100, (37,), generator=g)
    ids[:4] = torch.tensor([-5, 100, 250, 99])  # outside the table: nothing added (as in the dense sum)
    ids[4:9] = 7  # repeated rows add up
    inputs = {"ids": ids, "g": torch.randn(37, 8, generator=g, dtype=torch.float64),
              "table": torch.randn(100, 8, generator=g, dtype=torch.float64)}
    want = evaluate(p, inputs)["grad"]
    got = _finished(p, inputs, deterministic)
    assert got.dtype == torch.float64
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


def test_small_table_and_score_sized_rows_stay_dense():
    assert scatter.split(_embedding_grad(scatter.MIN_ROWS - 1)) is None
    # a bucketed bias's gradient: rows over (i, j, h) outnumber every tensor the program moves
    bucket = Call("min2", (Call("max2", (Call("add", (Call("sub", (Index("i"), Index("j"))), Const(70.0))),
                                         Const(0.0))), Const(127.0)))
    score = Reduce("sum", "d", Call("mul", (_ld("q", "h", "i", "d"), _ld("k", "h", "j", "d"))))
    expr = Reduce("sum", "i", Reduce("sum", "j", Call("where", (Call("eq", (bucket, Index("b"))), score,
                                                                 Const(0.0)))))
    p = Program("bias", {"h": 2, "i": 96, "j": 96, "d": 4, "b": 128},
                {"q": TensorSpec("q", ("h", "i", "d")), "k": TensorSpec("k", ("h", "j", "d"))},
                [Output("grad_b", ("b", "h"), expr)]).validate()
    assert scatter.split(p) is None


def table_score(table, ids, x):
    return torch.logsumexp((F.embedding(ids, table) * x).sum(-1), 0)


def test_training_scatters_the_table_gradient():
    g = torch.Generator().manual_seed(0)
    table = torch.randn(80, 16, generator=g).requires_grad_()
    ids = torch.randint(0, 80, (13,), generator=g)
    ids[:3] = 5
    x = torch.randn(13, 16, generator=g).requires_grad_()
    prog = neptune_eq.compile(table_score, table, ids, x)
    prog(table, ids, x).backward()
    t64, x64 = table.detach().double().requires_grad_(), x.detach().double().requires_grad_()
    table_score(t64, ids, x64).backward()
    assert torch.allclose(table.grad.double(), t64.grad, atol=1e-5)
    assert torch.allclose(x.grad.double(), x64.grad, atol=1e-5)
    qual = prog._first().op.qualname
    assert "scattered to j at j = ids[i] (scatter_rows)" in autograd.training_report(qual)
    runs = [r for k, r in autograd._RUNNERS.items() if k.startswith(qual)]
    assert any(isinstance(r, scatter.ScatterRun) for r in runs)


def test_a_sum_the_index_does_not_read_stays_inside_the_rows():
    """Σ_i Σ_k [c(i) = j]·g[i, k, d] (a skip-gram's centre row, read beside each of its negatives): rows
    Σ_k g[i, k, d] at c(i), over the points i alone; Σ_i Σ_k [n(i, k) = j]·… keeps both as points, and
    with a value free of k (a bag of embeddings' mean) its rows are over i, each added at every k."""
    one = Reduce("sum", "i", Reduce("sum", "k", Call("where", (
        Call("eq", (Load("c", (Index("i"),)), Index("j"))), _ld("g", "i", "k", "d"), Const(0.0)))))
    two = Reduce("sum", "i", Reduce("sum", "k", Call("where", (
        Call("eq", (Load("n", (Index("i"), Index("k"))), Index("j"))), _ld("g", "i", "k", "d"), Const(0.0)))))
    three = Reduce("sum", "i", Reduce("sum", "k", Call("where", (
        Call("eq", (Load("n", (Index("i"), Index("k"))), Index("j"))), _ld("h", "i", "d"), Const(0.0)))))
    p = Program("sg", {"i": 23, "k": 5, "j": 70, "d": 6},
                {"c": TensorSpec("c", ("i",), "int64"), "n": TensorSpec("n", ("i", "k"), "int64"),
                 "g": TensorSpec("g", ("i", "k", "d"), "float64"), "h": TensorSpec("h", ("i", "d"), "float64")},
                [Output("grad", ("j", "d"), Call("add", (Call("add", (one, two)), three)), "float64")]).validate()
    s = scatter.split(p)
    assert [(sc.points, sc.row_points) for sc in s.outputs[0].scatters] == [
        (("i",), ("i",)), (("i", "k"), ("i", "k")), (("i", "k"), ("i",))]
    g = torch.Generator().manual_seed(5)
    inputs = {"c": torch.randint(0, 70, (23,), generator=g), "n": torch.randint(0, 70, (23, 5), generator=g),
              "g": torch.randn(23, 5, 6, generator=g, dtype=torch.float64),
              "h": torch.randn(23, 6, generator=g, dtype=torch.float64)}
    assert torch.allclose(_finished(p, inputs), evaluate(p, inputs)["grad"], atol=1e-12, rtol=0)


def _pad_lookup(table, ids, x):
    return (F.embedding(ids, table, padding_idx=3) * x).sum(-1).sigmoid().mean()


def _shifted_lookup(table, ids, x):
    return torch.logsumexp(table[(ids + 5) % table.shape[0]] @ x.T, -1).sum()


def _pair_lookup(table, ids, x):
    return (table[ids % 10, ids % 9][:, None] * x).tanh().sum()


def _bag_mean(table, ids, x):
    return torch.logsumexp(F.embedding(ids.view(-1, 5)[:3], table).mean(1) @ x.T, -1).sum()


def _gathered_keys(table, ids, x):
    return torch.softmax(x @ table[ids].T / 4.0, -1).square().sum()


@pytest.mark.parametrize("fn", [_pad_lookup, _shifted_lookup, _pair_lookup, _gathered_keys, _bag_mean],
                         ids=["padding_idx", "shifted_index", "two_index_table", "gathered_dot_operand", "bag_mean"])
def test_table_gradients_match_float64(fn):
    """Table gradients through a padding index, index arithmetic, a table indexed in two dimensions
    (its rows linearised), and gathered rows as a dot operand (the split training's map backward)."""
    g = torch.Generator().manual_seed(11)
    table = torch.randn(10, 9, generator=g) if fn is _pair_lookup else torch.randn(70, 16, generator=g)
    ids = torch.randint(0, 70, (20,), generator=g)
    ids[:4] = 3
    x = torch.randn(20, 16, generator=g)
    args = [table.clone().requires_grad_(), ids, x.clone().requires_grad_()]
    prog = neptune_eq.compile(fn, *args)
    prog(*args).backward()
    ref = [table.double().requires_grad_(), ids, x.double().requires_grad_()]
    fn(*ref).backward()
    for got, want in ((args[0].grad, ref[0].grad), (args[2].grad, ref[2].grad)):
        assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-4)
    assert "(scatter_rows)" in autograd.training_report(prog._first().op.qualname)


def test_a_one_hot_beside_a_dense_sum_over_the_same_points_stays():
    """Linear cross-entropy's dW = Σ_i p_ij·h_id + Σ_i [t_i = j]·c_i·h_id: the one-hot merges into the
    GEMM's operand at no cost (extract/merge.py); taken out it had made the backward's dense part a
    float32 output and its chunks 1.5 GiB (against 1.0), at 8192 tokens × 128256."""
    from neptune_eq.frontend import capture
    from neptune_eq.grad import backward_program

    def lce(h, w, t):
        return F.cross_entropy(h @ w.T, t)

    xs = (torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(500, 32, dtype=torch.bfloat16),
          torch.randint(0, 500, (64,)))
    for saved in (False, True):
        back = backward_program(capture(lce, *xs).program, saved=saved).program
        assert any(isinstance(n, Reduce) and n.axis == "i" for o in back.outputs if o.name == "grad_w"
                   for n in ir.walk(o.expr))
        assert scatter.split(back) is None
