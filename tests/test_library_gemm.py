"""A kernel that is a plain matrix product may run as the vendor's GEMM (lower/library.py): offered
only where nothing is fused into the product, priced by the cost model beside the generated tiles,
and computing what the generated kernel computes (float32 accumulation, one rounding)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from neptune_eq import dsl as ne
from neptune_eq import ir
from neptune_eq.device import H100
from neptune_eq.frontend import capture
from neptune_eq.lower.library import _as_mm, library_gemm
from neptune_eq.pipeline import Options, compile_program
from neptune_eq.runtime import compile_ir
from neptune_eq.tune import _fits, _schedule_from, _schedule_to

BF16 = "bfloat16"


def _rms_matmul(m=40, k=96, n=72, dtype=BF16):
    P = ne.program("rms_matmul")
    i, d, e = P.axes(i=m, d=k, e=n)
    x, w, W = P.input("x", i, d, dtype=dtype), P.input("w", d, dtype=dtype), P.input("W", d, e, dtype=dtype)
    r = ne.rsqrt(ne.sum(x * x, d) * (1.0 / k) + 1e-6)
    P.output("o", ne.sum(x * r * w * W, d), (i, e), dtype=dtype)
    return P.build()


def _product(a_axes, b_axes, out_axes, extents, dtype=BF16, mask=False, scale=None, out_dtype=None):
    """out[out_axes] = Σ_k a[a_axes]·b[b_axes] (k the axis both read and out lacks)."""
    P = ne.program("product")
    ax = dict(zip(extents, P.axes(**extents)))
    a = P.input("a", *(ax[x] for x in a_axes), dtype=dtype)
    b = P.input("b", *(ax[x] for x in b_axes), dtype=dtype)
    (k,) = set(a_axes) & set(b_axes) - set(out_axes)
    body = a * b
    if scale is not None:
        body = body * scale
    if mask:
        body = ne.where(ax[k].index <= ax[out_axes[0]].index, body, 0.0)
    P.output("o", ne.sum(body, ax[k]), tuple(ax[x] for x in out_axes), dtype=out_dtype or dtype)
    return P.build()


def _library(prog):
    alt = next((a for a in prog.alternatives if "library GEMM" in a.kind), None)
    return None if alt is None else prog.pin(alt.id)


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def _inputs(program, g):
    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    return {n: torch.randn(*(program.axes[a] for a in s.axes), generator=g).to(dt[s.dtype])
            for n, s in program.inputs.items()}


def _torch_rms_matmul(x, w, W):
    rms = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    return (x * rms.to(x.dtype) * w) @ W


def test_a_norm_feeding_a_matmul_runs_its_product_as_a_library_gemm():
    g = torch.Generator().manual_seed(1)
    x, w, W = (torch.randn(*s, generator=g).bfloat16() for s in ((40, 96), (96,), (96, 72)))
    prog = _library(capture(_torch_rms_matmul, x, w, W).compile().compiled)
    assert prog is not None and "operand" in prog.alternative.structure  # x̂ written once, then the product
    src = prog.source
    gemm = [line for line in src.splitlines() if "library GEMM" in line]
    assert len(gemm) == 1 and "Σ_d" in gemm[0] and gemm[0].split(":")[0] == "# " + prog.kernels[-1].name
    assert sum("@triton.jit\ndef " in part for part in src.split("\n\n")) == len(prog.kernels) - 1 + src.count(
        "@triton.jit\ndef _")  # (one generated kernel, the norm's, beside the helpers)
    ref = _torch_rms_matmul(*(t.double() for t in (x, w, W)))
    out = prog.run(dict(zip(prog.program.inputs, (x, w, W))))
    out = next(iter(out.values()))
    assert out.dtype == torch.bfloat16 and _rel(out.reshape(ref.shape), ref) < 1e-2


@pytest.mark.parametrize("a_axes, b_axes, out_axes, direct", [
    (("i", "d"), ("d", "e"), ("i", "e"), True),              # A @ B
    (("d", "i"), ("e", "d"), ("i", "e"), True),              # Aᵀ @ Bᵀ: strided views, no copy
    (("i", "e"), ("i", "d"), ("d", "e"), True),              # a weight's gradient: Bᵀ @ A, no copy
    (("b", "i", "d"), ("b", "d", "e"), ("b", "i", "e"), True),  # batched
    (("i", "b", "d"), ("e", "d", "b"), ("e", "b", "i"), False),  # any order: einsum, then a copy
])
def test_every_layout_of_a_plain_product_matches_float64(a_axes, b_axes, out_axes, direct):
    extents = {"b": 3, "i": 33, "d": 70, "e": 19}
    extents = {a: n for a, n in extents.items() if a in {*a_axes, *b_axes}}
    program = _product(a_axes, b_axes, out_axes, extents)
    prog = _library(compile_ir(program))
    assert prog is not None
    xs = _inputs(program, torch.Generator().manual_seed(2))
    spec = "{},{}->{}".format(*("".join(axes) for axes in (a_axes, b_axes, out_axes)))
    ref = torch.einsum(spec, xs["a"].double(), xs["b"].double())
    assert _rel(prog.run(xs)["o"], ref) < 1e-2
    g = library_gemm(prog.plan.kernels[-1], prog.plan, prog.program)
    out = torch.empty(*(extents[a] for a in out_axes), dtype=torch.bfloat16)
    assert (_as_mm(g, xs[g.a], xs[g.b], out) is not None) == direct  # (a copy of the output costs a pass)


@pytest.mark.parametrize("dtype, scale, batched, out_dtype", [
    ("float32", None, False, None),  # an SGEMM at torch's float32 matmul precision
    ("float32", 0.5, False, None),
    (BF16, 0.5, False, None),  # alpha · Σ: addmm's float32 epilogue, one rounding to bf16 as the generated kernel
    (BF16, -3.0, True, None),  # baddbmm
    (BF16, None, False, "float32"),  # the float32 sum of bf16 operands, unrounded (aten's mm with out_dtype)
    ("float16", 2.0, True, "float32"),
])
def test_a_float32_or_constant_scaled_product_is_a_library_gemm_matching_float64(dtype, scale, batched, out_dtype):
    """CLIP's loss of `.float()` features: its fp32 logits and their gradients' products (dL/dx̂ = 10 · Σ_j
    dS·ŷ) had run as generated IEEE dots, 124.9 ms against torch.compile's 6.7 (H100); a float32 buffer of
    fp16 logits (retrieval scores before their softmax) had been a generated GEMM."""
    b = ("b",) if batched else ()
    extents = {"b": 3, "i": 33, "d": 70, "e": 19} if batched else {"i": 33, "d": 70, "e": 19}
    program = _product((*b, "i", "d"), (*b, "d", "e"), (*b, "i", "e"), extents, dtype=dtype, scale=scale,
                       out_dtype=out_dtype)
    prog = _library(compile_ir(program))
    assert prog is not None
    g = library_gemm(prog.plan.kernels[-1], prog.plan, prog.program)
    assert g.dtype == dtype and g.alpha == (scale or 1.0) and g.stored == (out_dtype or dtype)
    xs = _inputs(program, torch.Generator().manual_seed(3))
    ref = torch.einsum("...id,...de->...ie", xs["a"].double(), xs["b"].double()) * (scale or 1.0)
    out = prog.run(xs)["o"]
    assert out.dtype == getattr(torch, out_dtype or dtype)
    assert _rel(out, ref) < (1e-6 if (out_dtype or dtype) == "float32" else 1e-2)


@pytest.mark.parametrize("case", ["masked", "fp32 operands, bf16 out", "fused norm"])
def test_only_a_product_with_nothing_fused_qualifies(case):
    extents = {"i": 32, "d": 64, "e": 32}
    program = {"masked": lambda: _product(("i", "d"), ("d", "e"), ("i", "e"), extents, mask=True),
               "fp32 operands, bf16 out": lambda: _product(("i", "d"), ("d", "e"), ("i", "e"), extents,
                                                           dtype="float32", out_dtype=BF16),
               "fused norm": lambda: _rms_matmul()}[case]()
    prog = compile_ir(program)
    if case == "fused norm":  # the one-kernel plan fuses the norm's statistics into the product
        alts = [a for a in prog.alternatives if len(a.plan.kernels) == 1]
        assert alts and all("library" not in a.kind for a in alts)
        return
    if case == "fp32 operands, bf16 out":
        # the float32 sum rounded to bf16 is no library store; split from that rounding (extract/gemm_split.py)
        # the product is, into a float32 buffer a map kernel rounds
        whole = [a for a in prog.alternatives if len(a.plan.kernels) == 1]
        assert whole and all(library_gemm(k, a.plan, prog.program) is None for a in whole for k in a.plan.kernels)
        split = next(a for a in prog.alternatives if "library" in a.kind)
        assert [k.name for k in split.plan.kernels] == ["k0", "k0_epilogue"], split.structure
        xs = _inputs(program, torch.Generator().manual_seed(4))
        out = prog.pin(split.id).run(xs)["o"]
        assert out.dtype == torch.bfloat16 and _rel(out, xs["a"].double() @ xs["b"].double()) < 1e-2
        return
    assert _library(prog) is None
    assert all(library_gemm(k, a.plan, prog.program) is None for a in prog.alternatives for k in a.plan.kernels)


def _rms_factored(sum_too=False, m=40, k=96, n=72):
    """r·Σ_d (x·w)·W: RMSNorm's 1/rms outside the sum, as the e-graph factors torch's F.rms_norm → matmul."""
    P = ne.program("rms_factored")
    i, d, e = P.axes(i=m, d=k, e=n)
    x, w, W = P.input("x", i, d, dtype=BF16), P.input("w", d, dtype=BF16), P.input("W", d, e, dtype=BF16)
    r = ne.rsqrt(ne.sum(x * x, d) * (1.0 / k) + 1e-6)
    y = ne.sum(x * w * W, d)
    P.output("o", y * r, (i, e), dtype=BF16)
    if sum_too:  # the unscaled sum read as well: its value may not change
        P.output("u", y, (i, e), dtype="float32")
    return P.build()


def _scaled(prog):
    return [a for a in prog.alternatives if any(b.endswith("_scaled") for b in a.plan.buffers)]


def test_a_row_factor_after_the_sum_is_written_into_the_operand_and_the_product_runs_as_a_library_gemm():
    prog = compile_ir(_rms_factored())
    scaled = _scaled(prog)
    assert scaled, [a.structure for a in prog.alternatives]
    plan = scaled[0].plan
    (buf,) = [b for b in plan.buffers.values() if b.operand]
    stored = next(st.expr for k in plan.kernels for p in k.passes() for st in p.stores if st.target == buf.name)
    assert any(isinstance(n, ir.StateRef) for n in ir.walk(stored))  # r·x·w: the row's statistic is written in
    gemm = next(k for k in plan.kernels if library_gemm(k, plan, prog.program) is not None)
    assert library_gemm(gemm, plan, prog.program).alpha == 1.0  # nothing left after the dot
    lib = [a for a in scaled if "library GEMM" in a.kind]
    assert lib, [a.structure for a in scaled]
    g = torch.Generator().manual_seed(3)
    inputs = _inputs(prog.program, g)
    x, w, W = (inputs[n].double() for n in ("x", "w", "W"))
    ref = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w) @ W
    for a in (lib[0], next(a for a in scaled if "library" not in a.kind)):
        out = prog.pin(a.id).run(inputs)["o"]
        assert _rel(out, ref) < 1e-2, a.structure


def _guarded_rows(x, W):
    """Rows scaled by 1/‖x‖₁ after the product, 0 where that norm is 0 (softmax's guard of a row with no key)."""
    n = x.abs().sum(-1, keepdim=True)
    return torch.where(n == 0, 0.0, (x @ W) / n)


def test_a_guarded_row_factor_is_written_with_its_condition():
    g = torch.Generator().manual_seed(5)
    x, W = torch.randn(40, 96, generator=g).bfloat16(), torch.randn(96, 72, generator=g).bfloat16()
    x[7] = 0  # a row the guard selects
    prog = capture(_guarded_rows, x, W).compile().compiled
    scaled = _scaled(prog)
    assert scaled and any("library GEMM" in a.kind for a in scaled), [a.structure for a in prog.alternatives]
    ref = _guarded_rows(x.double(), W.double())
    for a in scaled[:2]:
        out = next(iter(prog.pin(a.id).run({"x": x, "W": W}).values())).reshape(ref.shape)
        assert _rel(out, ref) < 1e-2 and not out[7].any(), a.structure


def test_a_sum_read_elsewhere_keeps_its_factor_after_the_dot():
    prog = compile_ir(_rms_factored(sum_too=True))
    assert prog.alternatives and not _scaled(prog)


def test_the_cost_model_takes_the_library_gemm_where_the_product_is_large():
    small = compile_ir(_rms_matmul())
    assert "library" not in small.alternatives[0].kind  # a library call's host time outweighs a tiny GEMM
    x, w, W = (torch.empty(*s, dtype=torch.bfloat16) for s in ((4096, 8192), (8192,), (8192, 8192)))
    program = capture(_torch_rms_matmul, x, w, W).program
    large = compile_program(program, Options(device=H100))
    assert "library GEMM" in large.alternatives[0].kind
    lib = next(c for c in large.alternatives[0].cost.kernels if c.tensor_flops > 0)
    assert lib.tensor_flops == 2 * 4096 * 8192 * 8192


def test_a_tuned_library_schedule_round_trips_and_is_checked():
    program = _product(("i", "d"), ("d", "e"), ("i", "e"), {"i": 32, "d": 64, "e": 32})
    s = _library(compile_ir(program)).alternative.schedules[-1]
    assert s.library and _schedule_from(_schedule_to(s)) == s
    with pytest.raises(ValueError, match="library"):
        _schedule_from({**_schedule_to(s), "library": "yes"})
    # a cached entry applies only to a kernel of its own kind: it never makes a generated kernel a GEMM call
    assert _fits(s, s) and not _fits(s, replace(s, library=False)) and not _fits(replace(s, library=False), s)


def test_a_dynamic_length_reaches_the_library_gemm(tmp_path):
    import neptune_eq

    def fn(x, W):
        return x @ W

    g = torch.Generator().manual_seed(3)
    x, W = torch.randn(40, 64, generator=g).bfloat16(), torch.randn(64, 48, generator=g).bfloat16()
    # (a device whose library calls cost the host nothing: the model then takes the library GEMM at this size)
    f = neptune_eq.compile(fn, x, W, dynamic={0: [0]}, device=H100.scaled(library_call_s=0.0), cache_dir=tmp_path)
    assert "library GEMM" in f.explain()
    for n in (40, 33, 57):  # (one bucket of lengths: 33-64)
        xs = torch.randn(n, 64, generator=g).bfloat16()
        assert _rel(f(xs, W), xs.double() @ W.double()) < 1e-2
    assert f.stats()["compiles"] == 1


def test_library_gemm_false_generates_every_kernel():
    program = _product(("i", "d"), ("d", "e"), ("i", "e"), {"i": 32, "d": 64, "e": 32})
    assert _library(compile_ir(program)) is not None
    off = compile_program(program, Options(library_gemm=False))
    assert off.alternatives and not any(s.library for a in off.alternatives for s in a.schedules)


def test_training_under_torch_compile_runs_its_gradient_products_as_library_gemms(tmp_path):
    import neptune_eq

    g = torch.Generator().manual_seed(5)
    x, w, W = (torch.randn(*s, generator=g).bfloat16() for s in ((48, 64), (64,), (64, 40)))
    prog = neptune_eq.compile(_torch_rms_matmul, x, w, W, device=H100.scaled(library_call_s=0.0), cache_dir=tmp_path)
    model = torch.compile(lambda a, b, c: prog(a, b, c).float().sum())
    leaves = [t.clone().requires_grad_() for t in (x, w, W)]
    model(*leaves).backward()
    ref = [t.double().requires_grad_() for t in (x, w, W)]
    _torch_rms_matmul(*ref).sum().backward()
    assert all(_rel(a.grad, b.grad) < 1e-2 for a, b in zip(leaves, ref))
    backward = prog.explain().split("backward:", 1)[1]
    assert backward.count("library GEMM") == 2  # the input's and the weight's gradient products


def test_a_batched_fp16_product_matches_float64():
    program = _product(("b", "i", "d"), ("b", "d", "e"), ("b", "i", "e"), {"b": 2, "i": 33, "d": 70, "e": 19},
                       dtype="float16")
    prog = _library(compile_ir(program))
    xs = _inputs(program, torch.Generator().manual_seed(6))
    out = prog.run(xs)["o"]
    assert out.dtype == torch.float16 and _rel(out, xs["a"].double() @ xs["b"].double()) < 2e-3
