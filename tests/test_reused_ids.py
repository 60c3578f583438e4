"""Memo tables keyed by id(): an object freed while its entry is kept leaves its id free for another
object, which would then find that entry. Session 61's suite met it once: a training forward's rolling
sum came out of plan extraction as exp(cur:max_d − max) instead of exp(x − max) — every rolling plan of
that compile silently wrong, and written to the disk cache — after the process happened to give a new
term the id of a freed one. The memos now keep their keys' objects and check them on a hit; these
tests give every object the same id, the worst case, and ask for the right answer."""

from __future__ import annotations

import torch

from neptune_eq import dsl as ne
from neptune_eq import ir
from neptune_eq.frontend import exprs
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir


def _logsumexp_rows(m: int, n: int):
    P = ne.program("lse_rows")
    i, d = P.axes(i=m, d=n)
    x = P.input("x", i, d)
    m = ne.max(x, d)
    P.output("out", m + ne.log(ne.sum(ne.exp(x - m), d)), (i,))
    return P.build()


def test_plan_extraction_decodes_each_term_even_when_ids_repeat(monkeypatch):
    import neptune_eq.pipeline as pipeline

    program = _logsumexp_rows(5, 37)
    monkeypatch.setattr(pipeline, "id", lambda obj: 0, raising=False)  # every term the same id
    c = compile_ir(program, Options())
    monkeypatch.undo()
    rolling = [a for a in c.alternatives if "rolling" in a.structure]
    assert rolling, [a.structure for a in c.alternatives]
    for a in rolling:  # the rolling sum is Σ_d exp(x − running max)
        sums = [cp for k in a.plan.kernels for ph in k.passes() for cp in ph.comps if cp.op == "sum"]
        assert sums and all(any(isinstance(n, ir.Call) and n.op == "exp" for n in ir.walk(cp.core))
                            for cp in sums), (a.structure, [ir.show(cp.core) for cp in sums])
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(0))
    want = torch.logsumexp(x.double(), -1)
    for a in c.alternatives:
        got = c.pin(a.id).run({"x": x})["out"]
        assert torch.allclose(got.double(), want, atol=1e-5), a.structure


def test_index_substitution_gives_each_node_its_own_result_even_when_ids_repeat(monkeypatch):
    """Σ_j x[i, j]·y[j] with i ↦ j + 1: the bound j is renamed (a fresh axis) so the replacement is not
    captured, which builds and frees nodes as it goes."""
    i, j = ir.Index("i"), ir.Index("j")
    node = ir.Call("add", (ir.Reduce("sum", "j", ir.Call("mul", (ir.Load("x", (i, j)), ir.Load("y", (j,))))),
                           ir.Load("z", (i,))))
    mapping = {"i": ir.Call("add", (j, ir.Const(1.0)))}
    names = iter(f"f{k}" for k in range(100))
    want = exprs.substitute(node, mapping, lambda a: next(names))
    names = iter(f"f{k}" for k in range(100))
    monkeypatch.setattr(exprs, "id", lambda obj: 0, raising=False)
    got = exprs.substitute(node, mapping, lambda a: next(names))
    assert got == want, (ir.show(got), ir.show(want))
    assert ir.show(want) == "sum_f0(x[j + 1, f0] * y[f0]) + z[j + 1]", ir.show(want)
