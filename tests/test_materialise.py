"""Materialised GEMM operands (extract/materialise.py): a computed operand of a contraction (a
norm's output feeding a matmul) written once by a map pass and read by the GEMM as data. The
plans run in the interpreter on ragged sizes against float64; at H100 sizes the cost model prefers
them where the operand is costly to recompute per output tile (compile only)."""

from dataclasses import replace

import pytest
import torch

from neptune_eq import dsl as ne
from neptune_eq import ir
from neptune_eq.device import H100
from neptune_eq.pipeline import Options, compile_program
from neptune_eq.runtime import compile_ir


def _layernorm_matmul(m=40, k=72, n=48, dtype="bfloat16"):
    """(x − μ)·rstd·γ + β, then @ W: the bias keeps rstd inside the operand."""
    P = ne.program("ln_matmul")
    i, d, e = P.axes(i=m, d=k, e=n)
    x, g, b, W = (P.input("x", i, d, dtype=dtype), P.input("g", d, dtype=dtype), P.input("b", d, dtype=dtype),
                  P.input("W", d, e, dtype=dtype))
    mu = ne.sum(x, d) * (1.0 / k)
    var = ne.sum((x - mu) * (x - mu), d) * (1.0 / k)
    P.output("o", ne.sum(((x - mu) * ne.rsqrt(var + 1e-5) * g + b) * W, d), (i, e), dtype=dtype)
    return P.build()


def _inputs(program, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(*(program.axes[a] for a in spec.axes), generator=g).to(getattr(torch, spec.dtype))
            for name, spec in program.inputs.items()}


def _reference(inputs):
    x, g, b, W = (inputs[n].double() for n in "xgbW")
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, eps=1e-5) @ W


def _materialised(prog):
    return [a for a in prog.alternatives if any(b.operand for b in a.plan.buffers.values())]


@pytest.fixture(scope="module")
def ln():
    return compile_ir(_layernorm_matmul())


def test_the_normalised_rows_are_written_once_and_read_as_data(ln):
    alts = _materialised(ln)
    assert alts, [a.structure for a in ln.alternatives]
    plan = alts[0].plan
    (buf,) = [b for b in plan.buffers.values() if b.operand]
    assert buf.axes == ("i", "d") and buf.dtype == "bfloat16"  # A[m, k], in the dtype the dot takes
    gemm = plan.kernels[-1]
    (comp,) = [c for p in gemm.passes() for c in p.comps]
    loads = {n.tensor for n in ir.walk(comp.core) if isinstance(n, ir.Load)}
    assert loads == {buf.name, "W"}  # the GEMM reads two operands and computes none
    writer = [k for k in plan.kernels if any(st.target == buf.name for p in k.passes() for st in p.stores)]
    assert writer and writer[0] is not gemm and set(writer[0].grid) == {"i"}
    assert any("materialise" in line for line in plan.derivation)


def test_materialised_plans_match_float64_on_ragged_sizes(ln):
    inputs = _inputs(ln.program)
    ref = _reference(inputs)
    plain = next(a for a in ln.alternatives if a not in _materialised(ln))
    errs = {}
    for a in [*_materialised(ln)[:3], plain]:
        out = ln.pin(a.id).run(inputs)["o"]
        errs[a.structure] = float((out.double() - ref).norm() / ref.norm())
    assert max(errs.values()) < 1e-2, errs
    # the same bf16 operand the fused kernel casts to: no error beyond the plain plan's
    assert all(e <= errs[plain.structure] * 1.05 + 1e-6 for e in errs.values()), errs


def test_a_float32_operand_is_not_materialised():
    # a computed float32 operand is multiplied at the schedule's precision (ieee); a float32 buffer
    # read as data would go to the tensor cores as a plain fp32 operand (tf32): no plan writes one
    prog = compile_ir(_layernorm_matmul(dtype="float32"))
    assert not _materialised(prog)


def test_the_model_writes_the_operand_once_at_h100_sizes():
    best = compile_program(_layernorm_matmul().with_extents({"i": 4096, "d": 8192, "e": 8192}),
                           Options(device=H100)).best
    assert any(b.operand for b in best.plan.buffers.values()), best.structure
    assert any(s.group > 1 for s in best.schedules)  # the GEMM keeps its 2-D grouped tiles


def test_a_materialised_operand_is_read_through_a_tensor_descriptor(ln):
    # the plan allocates the buffer contiguous with 16-byte rows (72 bf16 values): a descriptor can
    # read it, and the result is the pointer loads'
    a = _materialised(ln)[0]
    prog = ln.pin(a.id)
    inputs = _inputs(prog.program, seed=1)
    plain = prog.run(inputs)["o"]
    gemm = len(a.plan.kernels) - 1
    scheds = list(prog._schedules("interpreter"))
    scheds[gemm] = replace(scheds[gemm], tma=True)
    prog = ln.pin(a.id)
    prog.schedules["interpreter"] = scheds
    _, kernels = prog.lowered("interpreter")
    mat = next(n for n, b in a.plan.buffers.items() if b.operand)
    assert mat in kernels[gemm].descriptors
    torch.testing.assert_close(prog.run(inputs)["o"], plain)
    assert float((plain.double() - _reference(inputs)).norm() / _reference(inputs).norm()) < 1e-2
