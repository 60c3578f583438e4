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


def test_a_float32_operand_is_written_once_and_multiplied_at_ieee_precision():
    """Beside a float32 input, a computed float32 operand and a float32 buffer of it are both multiplied
    at the schedule's precision (IEEE: `tl.dot(..., input_precision="ieee")` for loaded float32 tiles too),
    so writing it once keeps the values; CLIP's loss of `.float()` features writes its logits' gradient so
    and runs its two products as the vendor's SGEMM."""
    prog = compile_ir(_layernorm_matmul(dtype="float32"))
    alts = _materialised(prog)
    assert alts and all(b.dtype == "float32" for b in alts[0].plan.buffers.values() if b.operand)
    pinned = prog.pin(alts[0].id)
    dots = [line for line in pinned.source.splitlines() if "tl.dot(" in line]
    assert dots and all('input_precision="ieee"' in line for line in dots)
    xs = _inputs(pinned.program)
    x, g, b, W = (xs[n].double() for n in "xgbW")
    ref = torch.nn.functional.layer_norm(x, (72,), g, b, eps=1e-5) @ W
    assert float((pinned.run(xs)["o"].double() - ref).norm() / ref.norm()) < 1e-6


def test_the_model_writes_the_operand_once_at_h100_sizes():
    program = _layernorm_matmul().with_extents({"i": 4096, "d": 8192, "e": 8192})
    best = compile_program(program, Options(device=H100)).best
    assert any(b.operand for b in best.plan.buffers.values()), best.structure
    assert best.schedules[-1].library  # the product of the written rows, nothing fused: the vendor's GEMM
    generated = compile_program(program, Options(device=H100, library_gemm=False)).best
    assert any(b.operand for b in generated.plan.buffers.values()), generated.structure
    assert any(s.group > 1 for s in generated.schedules)  # generated, the GEMM keeps its 2-D grouped tiles


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


def _masked_gemm(m=40, n=56, k=48):
    """o[j, d] = Σ_i [t_i ≠ −1]·e^(s[i, j] − μ_i)·h[i, d] − Σ_i [t_i = j]·h[i, d]: a softmax-like
    operand and a one-hot, each under conditions (a cross-entropy's dW, with its ignored rows)."""
    P = ne.program("masked_gemm")
    i, j, d = P.axes(i=m, j=n, d=k)
    s, mu = P.input("s", i, j, dtype="float32"), P.input("mu", i, dtype="float32")
    t, h = P.input("t", i, dtype="int64"), P.input("h", i, d, dtype="bfloat16")
    p = ne.where(t != -1, ne.exp(s - mu), 0.0)
    P.output("o", ne.sum(p * h, i) - ne.sum(ne.where(t == j.index, h, 0.0), i), (j, d), dtype="float32")
    return P.build()


def _masked_inputs(program, seed=0):
    g = torch.Generator().manual_seed(seed)
    m, n, k = (program.axes[a] for a in "ijd")
    s = torch.randn(m, n, generator=g)
    t = torch.randint(0, n, (m,), generator=g)
    t[::5] = -1
    s[5, 3] = 1000.0  # e^1000 = inf on an ignored row: the select must keep it out of every column
    return {"s": s, "mu": torch.randn(m, generator=g), "t": t,
            "h": torch.randn(m, k, generator=g).bfloat16()}


def _masked_reference(x):
    keep = (x["t"] != -1)[:, None]
    p = torch.where(keep, torch.exp(x["s"].double() - x["mu"].double()[:, None]), 0.0)
    onehot = (x["t"][:, None] == torch.arange(x["s"].shape[1])[None, :]).double()
    return (p - onehot).T @ x["h"].double()


def test_an_operand_under_conditions_is_written_with_them():
    prog = compile_ir(_masked_gemm())
    alts = _materialised(prog)
    assert alts, [a.structure for a in prog.alternatives]
    plan = alts[0].plan
    stores = [st for k in plan.kernels for st in [*k.epilogue, *(s for p in k.passes() for s in p.stores)]
              if st.target in plan.buffers and plan.buffers[st.target].operand]
    # each condition is stored with the operand it is over: masked lanes of the buffer hold 0
    assert stores and all(any(isinstance(n, ir.Call) and n.op == "where" for n in ir.walk(st.expr)) for st in stores)
    gemms = [c for k in plan.kernels for p in k.passes() for c in p.comps if c.op == "sum"]
    assert all(not any(isinstance(n, ir.Call) and n.op == "exp" for n in ir.walk(c.core)) for c in gemms)
    inputs = _masked_inputs(prog.program)
    ref = _masked_reference(inputs)
    for a in [*alts[:2], next(a for a in prog.alternatives if a not in alts)]:
        out = prog.pin(a.id).run(inputs)["o"].double()
        assert torch.isfinite(out).all(), a.structure
        assert float((out - ref).norm() / ref.norm()) < 1e-2, a.structure


def _gemm_fed_operand(m=40, n=56, k=48, e=24):
    """o[j, d] = Σ_i [t_i ≠ −1]·e^(Σ_e x[i, e]·V[j, e] − μ_i)·h[i, d]: the operand reads a GEMM's
    result (a cross-entropy's softmax of its logits)."""
    P = ne.program("gemm_fed")
    i, j, d, ee = P.axes(i=m, j=n, d=k, e=e)
    x, V = P.input("x", i, ee, dtype="bfloat16"), P.input("V", j, ee, dtype="bfloat16")
    mu, t, h = P.input("mu", i, dtype="float32"), P.input("t", i, dtype="int64"), P.input("h", i, d, dtype="bfloat16")
    p = ne.where(t != -1, ne.exp(ne.sum(x * V, ee) - mu), 0.0)
    P.output("o", ne.sum(p * h, i), (j, d), dtype="float32")
    return P.build()


def test_an_operand_of_a_gemm_result_is_written_by_that_gemm():
    prog = compile_ir(_gemm_fed_operand())
    alts = [a for a in _materialised(prog) if any(st.target in a.plan.buffers and a.plan.buffers[st.target].operand
                                                  for k in a.plan.kernels for st in k.epilogue)]
    assert alts, [a.structure for a in prog.alternatives]
    plan = alts[0].plan
    (writer,) = [k for k in plan.kernels if any(plan.buffers.get(st.target) is not None
                                                and plan.buffers[st.target].operand for st in k.epilogue)]
    assert set(writer.grid) == {"i", "j"} and any(p.axis == "e" for p in writer.passes())  # the logits GEMM
    assert not any(b.startswith("buf_") for b in plan.buffers)  # the logits themselves are not written
    g = torch.Generator().manual_seed(0)
    x = {"x": torch.randn(40, 24, generator=g).bfloat16(), "V": torch.randn(56, 24, generator=g).bfloat16(),
         "mu": torch.randn(40, generator=g), "t": torch.randint(0, 5, (40,), generator=g) - 1,
         "h": torch.randn(40, 48, generator=g).bfloat16()}
    s = x["x"].double() @ x["V"].double().T
    ref = torch.where((x["t"] != -1)[:, None], torch.exp(s - x["mu"].double()[:, None]), 0.0).T @ x["h"].double()
    for a in alts[:2]:
        out = prog.pin(a.id).run(x)["o"].double()
        assert float((out - ref).norm() / ref.norm()) < 1e-2, a.structure


def test_one_operand_read_by_two_gemms_is_written_once():
    # a[i, d] = Σ_j p[i, j]·W[j, d] and b[e, j] = Σ_i h[i, e]·p[i, j]: the same p, in the same [i, j]
    # layout for both (A[m, k] of the first, B[k, n] of the second), is one buffer
    P = ne.program("two_gemms")
    i, j, d, e = P.axes(i=40, j=56, d=32, e=24)
    s, mu = P.input("s", i, j, dtype="float32"), P.input("mu", i, dtype="float32")
    W, h = P.input("W", j, d, dtype="bfloat16"), P.input("h", i, e, dtype="bfloat16")
    p = ne.where(s > 0.5, ne.exp(s - mu), 0.0)
    P.output("a", ne.sum(p * W, j), (i, d), dtype="float32")
    P.output("b", ne.sum(h * p, i), (e, j), dtype="float32")
    prog = compile_ir(P.build())
    alts = [a for a in _materialised(prog) if sum(b.operand for b in a.plan.buffers.values()) == 1
            and len([c for k in a.plan.kernels for p in k.passes() for c in p.comps if c.op == "sum"]) == 2]
    assert alts, [(a.structure, list(a.plan.buffers)) for a in _materialised(prog)]
    g = torch.Generator().manual_seed(0)
    x = {"s": torch.randn(40, 56, generator=g), "mu": torch.randn(40, generator=g),
         "W": torch.randn(56, 32, generator=g).bfloat16(), "h": torch.randn(40, 24, generator=g).bfloat16()}
    pr = torch.where(x["s"] > 0.5, torch.exp(x["s"].double() - x["mu"].double()[:, None]), 0.0)
    out = prog.pin(alts[0].id).run(x)
    for name, ref in (("a", pr @ x["W"].double()), ("b", x["h"].double().T @ pr)):
        assert float((out[name].double() - ref).norm() / ref.norm()) < 1e-2, name


def test_an_operand_of_inputs_alone_is_offered_from_an_epilogue_and_from_a_map_kernel():
    # y[i, d] = Σ_e g[i, e]·W[d, e] and z[d, f] = Σ_i x[i, d]·r[i]·h[i, f] (RMSNorm's backward: dY·Wᵀ,
    # then x̂ᵀ·dY): x̂ = x·r reads no reduction, so y's GEMM may write it from its epilogue, or a map
    # kernel of its own (a program per tile of [i, d]) may; both plans are offered (the model ranks
    # them) and both match float64
    P = ne.program("two_stage")
    i, d, e, f = P.axes(i=40, d=48, e=24, f=64)  # (z the larger: y's GEMM runs first)
    g, W = P.input("g", i, e, dtype="bfloat16"), P.input("W", d, e, dtype="bfloat16")
    x, r = P.input("x", i, d, dtype="bfloat16"), P.input("r", i, dtype="float32")
    h = P.input("h", i, f, dtype="bfloat16")
    P.output("y", ne.sum(g * W, e), (i, d), dtype="float32")
    P.output("z", ne.sum(x * r * h, i), (d, f), dtype="float32")
    prog = compile_ir(P.build())

    def written_by(a):
        (buf,) = [n for n, b in a.plan.buffers.items() if b.operand]
        return {"epilogue" if k.passes() else "map"
                for k in a.plan.kernels for st in [*k.epilogue, *(s for p in k.passes() for s in p.stores)]
                if st.target == buf}

    kinds = {}
    for a in _materialised(prog):
        kinds.setdefault(frozenset(written_by(a)), a)
    assert {frozenset({"epilogue"}), frozenset({"map"})} <= set(kinds), [a.structure for a in _materialised(prog)]
    mapped = next(k for k in kinds[frozenset({"map"})].plan.kernels if not k.passes())
    assert set(mapped.grid) == {"i", "d"}, mapped.grid  # every element in the grid, no loop
    gen = torch.Generator().manual_seed(0)
    xs = {"g": torch.randn(40, 24, generator=gen).bfloat16(), "W": torch.randn(48, 24, generator=gen).bfloat16(),
          "x": torch.randn(40, 48, generator=gen).bfloat16(), "r": torch.rand(40, generator=gen) + 0.5,
          "h": torch.randn(40, 64, generator=gen).bfloat16()}
    dbl = {k: v.double() for k, v in xs.items()}
    refs = {"y": dbl["g"] @ dbl["W"].T, "z": (dbl["x"] * dbl["r"][:, None]).T @ dbl["h"]}
    for a in kinds.values():
        out = prog.pin(a.id).run(xs)
        for name, ref in refs.items():
            assert float((out[name].double() - ref).norm() / ref.norm()) < 1e-2, (a.structure, name)


def test_factors_free_of_the_contraction_are_written_with_the_operand():
    """o[i, d] = Σ_j c_i·e^(z_ij − m_i)/s_i·W[j, d] with c_i = [t_i ≠ −100]·[g ≠ 0]·g/n (linear CE's dH: a
    scalar cotangent over a count, its guards, a row factor) as extracted under a tight budget (the
    algebra never took the factors out of the sum): the scalars, the row factor and the guards are
    stored with the computed operand, once per element, and the GEMM only accumulates (tl.dot into its
    own accumulator). Applied to each K step's dot tile they kept linear CE's dH at 250 TF/s (H200)."""
    from neptune_eq.saturate import Budget

    P = ne.program("scaled_operand")
    i, j, d = P.axes(i=40, j=56, d=32)
    z, m, s2 = P.input("z", i, j, dtype="float32"), P.input("m", i, dtype="float32"), P.input("s2", i, dtype="float32")
    t, g, n = P.input("t", i, dtype="int64"), P.input("g", dtype="float32"), P.input("n", dtype="float32")
    W = P.input("W", j, d, dtype="bfloat16")
    c1 = -ne.where(t == -100, 0.0, ne.where(g == 0, 0.0, g / n))
    P.output("o", ne.sum(ne.where(-c1 == 0, 0.0, -c1 / s2) * ne.exp(z - m) * W, j), (i, d), dtype="float32")
    prog = compile_ir(P.build(), Options(budget=Budget(max_iterations=1)))
    alts = _materialised(prog)
    assert alts, [a.structure for a in prog.alternatives]
    gemm = next(c for k in alts[0].plan.kernels for p in k.passes() for c in p.comps if c.op == "sum")
    assert {n.tensor for n in ir.walk(gemm.core) if isinstance(n, ir.Load)} <= {"W", *alts[0].plan.buffers}, gemm.core
    assert gemm.mask is None, gemm.mask
    dots = [ln for ln in prog.pin(alts[0].id).source.splitlines() if "tl.dot(" in ln]
    assert dots and all(ln.count(",") >= 2 for ln in dots), dots  # tl.dot(a, b, acc): accumulated in place
    gen = torch.Generator().manual_seed(0)
    x = {"z": torch.randn(40, 56, generator=gen), "m": torch.randn(40, generator=gen),
         "s2": torch.rand(40, generator=gen) + 0.5, "t": torch.randint(0, 4, (40,), generator=gen) - 1,
         "g": torch.tensor(0.7), "n": torch.tensor(3.0), "W": torch.randn(56, 32, generator=gen).bfloat16()}
    x["t"][::5] = -100
    row = torch.where(x["t"] == -100, 0.0, 0.7 / 3.0) / x["s2"].double()
    ref = (row[:, None] * torch.exp(x["z"].double() - x["m"].double()[:, None])) @ x["W"].double()
    for a in alts[:2]:
        out = prog.pin(a.id).run(x)["o"].double()
        assert float((out - ref).norm() / ref.norm()) < 1e-2, a.structure
    x["g"] = torch.tensor(0.0)
    assert prog.pin(alts[0].id).run(x)["o"].abs().max() == 0
