"""Split-K's combine folds several chunk states a loop step (lower/combine.combine_unroll): the loads
of a step are independent, the fold into the state stays in chunk order."""

from __future__ import annotations

import re

import torch

from neptune_eq import dsl as ne
from neptune_eq.lower.combine import COMBINE_UNROLL, combine_unroll
from neptune_eq.runtime import compile_ir


def test_the_unroll_divides_the_chunk_count():
    assert COMBINE_UNROLL == 8
    assert [combine_unroll(n) for n in (1, 2, 4, 8, 12, 64, 128, 7, 6)] == [1, 2, 4, 8, 4, 8, 8, 1, 2]


def _softmax_stats(m=2, n=16384):
    P = ne.program("softmax_stats")
    i, d = P.axes(i=m, d=n)
    x = P.input("x", i, d)
    mx = ne.max(x, d)
    P.output("lse", ne.log(ne.sum(ne.exp(x - mx), d)) + mx, (i,))
    return P.build()


def test_every_split_of_a_rolling_pass_combines_to_float64():
    prog = compile_ir(_softmax_stats())
    x = torch.randn(2, 16384, generator=torch.Generator().manual_seed(4)) * 4
    ref = torch.logsumexp(x.double(), -1)
    seen = set()
    for alt in prog.alternatives:
        chunks = next((k.chunks for k in alt.plan.kernels if k.chunks > 1), 1)
        if chunks == 1 or chunks in seen:
            continue
        seen.add(chunks)
        pinned = prog.pin(alt.id)
        steps = re.findall(r"for chunk0 in range\(0, CHUNKS, (\d+)\)", pinned.source)
        assert steps == [str(combine_unroll(chunks))], (chunks, steps)
        out = pinned.run({"x": x})["lse"]
        assert float((out.double() - ref).abs().max()) < 1e-4, chunks
    assert any(c % COMBINE_UNROLL == 0 for c in seen) and any(c % COMBINE_UNROLL for c in seen), seen


def test_plain_sums_fold_more_chunks_a_step():
    from neptune_eq.lower.combine import PLAIN_COMBINE_UNROLL

    assert PLAIN_COMBINE_UNROLL == 32
    assert [combine_unroll(n, plain=True) for n in (1, 8, 12, 64, 128, 256, 96)] == [1, 8, 4, 32, 32, 32, 32]


def test_a_split_column_sum_combines_many_chunks_a_step_to_float64():
    """A column sum split into 64 chunks of rows: its combine folds 32 chunk states a step (no
    correction to apply), columns not a tile multiple."""
    from neptune_eq.pipeline import Options

    P = ne.program("column_sums")
    i, d = P.axes(i=4096, d=45)
    x = P.input("x", i, d)
    P.output("s", ne.sum(x * x, i), (d,))
    prog = compile_ir(P.build(), Options(min_chunk=32))
    x = torch.randn(4096, 45, generator=torch.Generator().manual_seed(5))
    ref = (x.double() ** 2).sum(0)
    split = [a for a in prog.alternatives if any(k.chunks == 64 for k in a.plan.kernels)]
    assert split, [a.structure for a in prog.alternatives]
    pinned = prog.pin(split[0].id)
    assert re.findall(r"for chunk0 in range\(0, CHUNKS, (\d+)\)", pinned.source) == ["32"]
    out = pinned.run({"x": x})["s"]
    assert float(((out.double() - ref) / ref).abs().max()) < 1e-5
