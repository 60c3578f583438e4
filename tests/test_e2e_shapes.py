"""End to end through the Triton interpreter with sizes that are not multiples of the tiles."""

import math

import pytest
import torch

from neptune_eq import dsl as ne
from neptune_eq import library as lib
from neptune_eq.runtime import compile_ir


def attention_program(I, J, D, E, *, mask=None, heads=2, softcap=None, alibi=False, dtype="float32"):
    P = ne.program("attn_odd")
    b, h, i, j, d, e = P.axes(b=1, h=heads, i=I, j=J, d=D, e=E)
    q, k, v = (P.input(n, b, h, x, y, dtype=dtype) for n, x, y in (("q", i, d), ("k", j, d), ("v", j, e)))
    m = None
    if mask == "causal":
        m = j.index <= i.index
    elif mask == "window":
        m = (j.index <= i.index) & (i.index - j.index < 7)
    slopes = P.input("slope", h) if alibi else None

    def mod(s):
        if softcap:
            s = softcap * ne.tanh(s / softcap)
        if alibi:
            s = s + slopes * (j.index - i.index)
        return s

    P.output("o", lib.attention(q, k, v, key_axis=j, dim_axis=d, scale=1 / math.sqrt(D), mask=m, score_mod=mod),
             (b, h, i, e))
    return P.build()


@pytest.mark.parametrize("shape", [(37, 53, 24, 20), (1, 77, 16, 16), (70, 70, 40, 8)])
@pytest.mark.parametrize("mask", [None, "causal", "window"])
def test_attention_odd_sizes(shape, mask):
    prog = compile_ir(attention_program(*shape, mask=mask))
    report = prog.verify(seed=11)
    assert report.passed, str(report)


def test_softcap_and_alibi():
    prog = compile_ir(attention_program(33, 45, 16, 16, mask="causal", softcap=20.0, alibi=True))
    assert len(prog.kernels) == 1
    assert prog.verify(seed=12).passed


def test_fully_masked_rows_give_zero():
    """Rows whose keys are all masked: the library's attention returns 0 there (like FlexAttention)."""
    P = ne.program("masked_rows")
    b, h, i, j, d, e = P.axes(b=1, h=1, i=20, j=30, d=16, e=16)
    q, k, v = P.input("q", b, h, i, d), P.input("k", b, h, j, d), P.input("v", b, h, j, e)
    keep = j.index < i.index - 5  # rows i <= 5 see no key at all
    P.output("o", lib.attention(q, k, v, key_axis=j, dim_axis=d, scale=0.25, mask=keep), (b, h, i, e))
    prog = compile_ir(P.build())
    x = {n: torch.randn(s) for n, s in (("q", (1, 1, 20, 16)), ("k", (1, 1, 30, 16)), ("v", (1, 1, 30, 16)))}
    out = prog(**x)
    assert torch.all(out[0, 0, :6] == 0) and torch.isfinite(out).all()
    assert prog.verify(seed=13).passed


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_inputs(dtype):
    prog = compile_ir(attention_program(40, 50, 32, 32, mask="causal", dtype=dtype))
    report = prog.verify(seed=14, tolerance=2e-3 if dtype == "float16" else 1e-2)
    assert report.passed, str(report)


def test_stress_inputs_stay_accurate():
    prog = compile_ir(attention_program(30, 41, 16, 16, mask="causal"))
    report = prog.verify(seed=15, sets=("normal", "offset", "wide"))
    assert report.worst < 1e-3, str(report)


def test_multiple_outputs_and_logsumexp():
    P = ne.program("two_outputs")
    i, j = P.axes(i=13, j=301)
    x = P.input("x", i, j)
    P.output("lse", lib.logsumexp(x, j))
    P.output("y", lib.log_softmax(x, j))
    prog = compile_ir(P.build())
    assert len(prog.kernels) == 1
    assert prog.verify(seed=16, sets=("normal", "offset", "wide")).passed
