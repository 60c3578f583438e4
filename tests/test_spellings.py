"""The e-graph decides, not the capture: every spelling of a program reaches the same plans.

The frontend translates what the user wrote. Moving a softmax's 1/l after the P·V sum (sum_div_out)
and a norm's per-row factor out of a contraction (sum_assoc, then sum_factor once the analysis proves
rsqrt(mean(x²) + ε) finite) are found by saturation, and chosen because work inside a loop is costed
over the loop's whole iteration space (extract/terms.py).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from egglog import EGraph, run
from neptune_eq.rules.analysis import ANALYSIS

from neptune_eq import ir
from neptune_eq.egg_write import write
from neptune_eq.frontend import capture
from neptune_eq.pipeline import compile_program
from neptune_eq.plan import Pass
from neptune_eq.runtime import CompiledProgram
from neptune_eq.terms import Encoder, finite

# ---------------------------------------------------------------- attention: where 1/l is applied


def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def softmax_then_pv(q, k, v):
    return torch.softmax(_scores(q, k), dim=-1) @ v


def normalised_then_pv(q, k, v):
    s = _scores(q, k)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p / p.sum(-1, keepdim=True)) @ v


def pv_then_normalised(q, k, v):
    s = _scores(q, k)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p @ v) / p.sum(-1, keepdim=True)


ATTENTION = [softmax_then_pv, normalised_then_pv, pv_then_normalised]


def _qkv(L=40, D=16):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, L, D, generator=g) for _ in range(3))


@pytest.fixture(scope="module")
def attention_compiles():
    args = _qkv()
    return {fn.__name__: compile_program(capture(fn, *args).program) for fn in ATTENTION}


def _by_a_reduction(m: ir.Node) -> bool:
    return isinstance(m, ir.Call) and m.op == "div" and any(isinstance(r, ir.Reduce) for r in ir.walk(m.args[1]))


def _divided_sums(node: ir.Node) -> list[ir.Reduce]:
    """Sums whose body divides by another reduction (a normalisation applied inside the loop)."""
    return [n for n in ir.walk(node)
            if isinstance(n, ir.Reduce) and n.op == "sum" and any(_by_a_reduction(m) for m in ir.walk(n.body))]


def test_the_capture_keeps_the_normalisation_where_it_was_written(attention_compiles):
    for name in ("softmax_then_pv", "normalised_then_pv"):
        out = attention_compiles[name].program.outputs[0].expr
        assert _divided_sums(out), f"{name}: the frontend moved 1/l itself"


@pytest.mark.parametrize("name", [fn.__name__ for fn in ATTENTION])
def test_every_attention_spelling_delays_the_normalisation(attention_compiles, name):
    c = attention_compiles[name]
    assert not _divided_sums(c.representative["out0"])
    best = c.alternatives[0]
    assert best.plan.structure() == "1 kernel, rolling over j (max_j, sum_j, sum_j2)"
    (store,) = best.plan.kernels[-1].epilogue
    assert "/ fin:sum_j" in ir.show(store.expr)  # 1/l applied once per output, after the loop


def test_attention_spellings_reach_the_same_plans(attention_compiles):
    spaces = {name: sorted(a.structure for a in c.alternatives) for name, c in attention_compiles.items()}
    assert len({tuple(s) for s in spaces.values()}) == 1, spaces
    shows = {name: attention_compiles[name].alternatives[0].plan.show()
             for name in ("normalised_then_pv", "pv_then_normalised")}
    assert len(set(shows.values())) == 1, shows


@pytest.mark.slow
def test_normalised_before_the_sum_verifies(attention_compiles):
    assert CompiledProgram(attention_compiles["normalised_then_pv"]).verify().passed


# ---------------------------------------------------------------- norms feeding a matmul


def rms_mm(x, w, W):
    r = x * torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w
    return r @ W


def rms_mm_scaled_after(x, w, W):
    return ((x * w) @ W) * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)


def _one_pass_plans(c, comps: int):
    """Alternatives of one kernel making one pass over d that carries `comps` independent reductions."""
    out = []
    for k, a in enumerate(c.alternatives):
        passes = [p for kern in a.plan.kernels for p in kern.phases if isinstance(p, Pass) and p.comps]
        if len(a.plan.kernels) == 1 and len(passes) == 1 and passes[0].kind == "pass" and len(passes[0].comps) == comps:
            out.append((k, a, passes[0]))
    return out


def _rms_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(40, 96, generator=g), torch.randn(96, generator=g), torch.randn(96, 72, generator=g)


@pytest.fixture(scope="module")
def rms_compile():
    return compile_program(capture(rms_mm, *_rms_inputs()).program)


def test_rmsnorm_factor_leaves_the_contraction(rms_compile):
    plans = _one_pass_plans(rms_compile, 2)
    assert plans, [a.structure for a in rms_compile.alternatives]
    _, alt, ps = plans[0]
    assert all("rsqrt" not in ir.show(comp.core) for comp in ps.comps)  # nothing per-row inside the loop
    (store,) = alt.plan.kernels[0].epilogue
    assert "rsqrt(fin:" in ir.show(store.expr)  # r applied to the accumulator after the loop
    assert any(line.startswith("horizontal_fusion") for line in alt.plan.derivation)


@pytest.mark.slow
def test_rmsnorm_one_pass_plan_verifies(rms_compile):
    k, _, _ = _one_pass_plans(rms_compile, 2)[0]
    assert CompiledProgram(rms_compile, k).verify().passed


def test_a_kernel_boundary_buffers_the_small_result(rms_compile):
    # Σ_d x² [i] and Σ_d x·w·W [i, e] are independent: the row sums go first and through HBM, the
    # contraction stays with the output (not a [i, e] buffer of partial products)
    # (a plan may also write the normalised operand x̂[i, d] once: an operand buffer, not partial products)
    split = [a for a in rms_compile.alternatives if len(a.plan.kernels) == 2 and a.plan.kernels[0].chunks == 1]
    assert split and all(b.axes == ("i",) for a in split for b in a.plan.buffers.values() if not b.operand)
    assert any([b.axes for b in a.plan.buffers.values()] == [("i",)] for a in split)


def test_rmsnorm_spellings_reach_the_same_plans(rms_compile):
    other = compile_program(capture(rms_mm_scaled_after, *_rms_inputs()).program)
    assert sorted(a.structure for a in other.alternatives) == sorted(a.structure for a in rms_compile.alternatives)
    assert other.alternatives[0].structure == rms_compile.alternatives[0].structure


def test_layernorm_rstd_leaves_the_contraction():
    def ln_mm(x, g, W):
        return F.layer_norm(x, x.shape[-1:], g) @ W

    x, g, W = _rms_inputs()
    c = compile_program(capture(ln_mm, x, g, W).program)
    # the mean is needed inside both remaining sums (x − μ); rstd is not: Σ_d (x − μ)·γ·W and
    # Σ_d (x − μ)² share the second pass and rstd multiplies the result
    shared = [a for a in c.alternatives if "pass over d (sum_d2, sum_d3)" in a.structure]
    assert shared, [a.structure for a in c.alternatives]
    store = shared[0].plan.kernels[-1].epilogue[0]
    assert "rsqrt(fin:" in ir.show(store.expr)


# ---------------------------------------------------------------- the analysis behind it


def _finite(node: ir.Node) -> bool:
    eg = EGraph()
    enc = Encoder(eg, ("i", "d"), {"i": 4, "d": 8})
    t = enc.encode(node)
    enc.flush()
    write(eg, t)
    eg.run(run(ANALYSIS).saturate())
    return eg.check_bool(finite(t))


def test_rsqrt_of_a_mean_square_plus_eps_is_finite():
    x = ir.Load("x", (ir.Index("i"), ir.Index("d")))
    ms = ir.Call("mul", (ir.Reduce("sum", "d", ir.Call("mul", (x, x))), ir.Const(1 / 8)))
    assert _finite(ir.Call("rsqrt", (ir.Call("add", (ms, ir.Const(1e-6))),)))
    assert not _finite(ir.Call("rsqrt", (ms,)))  # rsqrt(0) = inf: no ε, no factoring out of a sum
    assert not _finite(ir.Call("rsqrt", (ir.Call("add", (ir.Reduce("sum", "d", x), ir.Const(1e-6))),)))  # Σx may be < 0
