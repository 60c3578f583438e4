"""Float32 products are priced where they run: a float32 IEEE `tl.dot` on the FMA pipe, a float32
library GEMM at the SGEMM's rate (extract/cost.py `_dot_precision`, extract/library_cost.py). They had
been priced at the 16-bit tensor-core rate: CLIP's loss of `.float()` features recomputed its 8192²
logits in four generated IEEE GEMMs and ran 124.9 ms against torch.compile's 6.7 (H100, session 64)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import load_example

import neptune_eq
from neptune_eq import autograd
from neptune_eq.device import H100
from neptune_eq.frontend import capture
from neptune_eq.pipeline import Options, compile_program


def _softmax_of_product(x, w):
    return torch.softmax(x @ w, dim=-1)


def _kernels(dtype, **options):
    """(kernel, its cost, its schedule) of every alternative."""
    x, w = torch.empty(2048, 1024, dtype=dtype), torch.empty(1024, 4096, dtype=dtype)
    program = capture(_softmax_of_product, x, w).program
    return [(k, c, s) for a in compile_program(program, Options(device=H100, **options)).alternatives
            for k, c, s in zip(a.plan.kernels, a.cost.kernels, a.schedules)]


def test_a_float32_dot_is_priced_on_the_fma_pipe_and_a_bf16_one_on_the_tensor_cores():
    products = 2048 * 1024 * 4096
    f32 = _kernels(torch.float32)
    ieee = [c for _, c, s in f32 if not s.library and s.input_precision == "ieee"]
    assert any(c.alu_ops >= products for c in ieee)
    assert all(c.tensor_flops == 0 for c in ieee)
    assert any(c.tensor_flops == 2 * products for _, c, s in f32 if s.library)  # (an SGEMM's, at its own rate)
    # TF32×3: three TF32 products (each at half the 16-bit rate) at Triton's measured fraction of it, w's
    # rows along the contraction (not K-major: the slower rate)
    tf32x3 = [c for _, c, s in f32 if s.input_precision == "tf32x3"]
    assert tf32x3 and all(c.alu_ops < products for c in tf32x3)
    slow = H100.tf32_efficiency("tf32x3", k_major=False)
    assert slow < H100.tf32_efficiency("tf32x3", k_major=True)
    assert any(abs(c.tensor_flops - 12 * products / slow) < 1e3 for c in tf32x3)
    bf16 = _kernels(torch.bfloat16)
    assert any(c.tensor_flops >= 2 * products for _, c, s in bf16 if not s.library)
    assert all(s.input_precision == "ieee" for _, _, s in bf16)  # (no float32 tiles: no precision variants)


def test_float32_products_ieee_alone_offers_no_tf32():
    f32 = _kernels(torch.float32, float32_products=("ieee",))
    assert f32 and all(s.input_precision == "ieee" for _, _, s in f32)


def test_the_predicted_time_of_a_float32_product_is_the_fma_pipes():
    products = 2048 * 1024 * 4096
    fast = min(c.time for _, c, _ in _kernels(torch.bfloat16) if c.tensor_flops >= 2 * products)
    slow = min(c.time for _, c, _ in _kernels(torch.float32) if c.tensor_flops >= 2 * products
               or c.alu_ops >= products)
    # 790 TF/s of bf16 against 59 of float32 FMAs (at most half of it a generated dot, 85 % an SGEMM)
    assert slow > 8 * fast


def _clip_loss(img, txt):
    s = F.normalize(img.float(), dim=-1) @ F.normalize(txt.float(), dim=-1).T * 10
    t = torch.arange(s.shape[0])
    return (F.cross_entropy(s, t) + F.cross_entropy(s.T, t)) / 2


def test_float32_logits_read_by_two_log_sum_exps_are_written_once():
    """CLIP's training forward (split at its normalised operands, neptune_eq.grad_prologue): the
    policy inlining the logits in both log-sum-exps had taken the whole room of covers, and the unfused
    policy — the logits a GEMM of their own, written once — was never enumerated (0 of 1540 plans)."""
    x, y = torch.empty(4096, 512, dtype=torch.bfloat16), torch.empty(4096, 512, dtype=torch.bfloat16)
    prog = neptune_eq.compile(_clip_loss, x, y)
    _, training = autograd._variant(prog._first().op.qualname, None)
    alts = compile_program(training.forward, Options(device=H100)).alternatives
    assert any(not a.plan.inline for a in alts)
    # and priced at the FMA pipe, computing the float32 logits twice loses to writing them once
    assert not alts[0].plan.inline, alts[0].structure


def _fp32_prefill():
    return load_example("decode_attention", "prefill")  # 32 heads × 4096², d 128, float32


def test_ieee_tiles_past_ptxas_bounds_are_priced_as_spilling():
    """fp32 attention's one-pass kernel at 128 × 64 tiles in 8 warps spilled 7 KB a thread (ptxas, triton
    3.6, sm_90) and ran 300 ms against SDPA's 6: priced at 7.7 then. Schedules past the FMA bounds are
    priced as spilling; tiles within them are offered and win among IEEE schedules."""
    from dataclasses import replace

    from neptune_eq.extract.onchip import fma_dots_fit

    from neptune_eq.runtime import compile_ir

    program = _fp32_prefill()
    alts = compile_ir(program).alternatives
    one = [a for a in alts if len(a.plan.kernels) == 1]
    a = next(a for a in one if a.structure.startswith("1 kernel, rolling over j (max_j, sum_j, sum_j2)"))
    k, base = a.plan.kernels[0], a.schedules[0]

    def sched(i, j, warps, precision="ieee"):
        return replace(base, tiles={**base.tiles, "i": i, "j": j}, num_warps=warps, input_precision=precision)

    assert not fma_dots_fit(k, sched(128, 64, 8), program, a.plan)  # (ptxas: 7136 bytes of stack)
    assert not fma_dots_fit(k, sched(64, 32, 4), program, a.plan)  # (2080)
    assert not fma_dots_fit(k, sched(16, 64, 4), program, a.plan)  # (344: a computed operand over 64 keys)
    assert fma_dots_fit(k, sched(64, 32, 8), program, a.plan)  # (106 registers)
    assert fma_dots_fit(k, sched(128, 16, 8), program, a.plan)  # (170 registers)
    assert fma_dots_fit(k, sched(128, 64, 8, "tf32x3"), program, a.plan)  # (tensor cores: not these bounds)
    assert "TF32×3 products" in " ".join(a.kind for a in alts)
    # (measured, H100: 128 × 64 tiles in TF32×3 5.50 ms, SDPA 6.00; IEEE at FMA tiles 64 × 32 22.2)
    assert alts[0].schedules[0].input_precision == "tf32x3", alts[0].kind
    ieee = compile_ir(program, Options(float32_products=("ieee",))).alternatives
    assert all(s.input_precision == "ieee" for a in ieee for s in a.schedules)
    # (IEEE alone, the one-kernel plan runs at FMA tiles; since session 67 a plan running both products
    # as the vendor's SGEMM, 1/l written into P, may rank first: the fused FMA dot measured 22.2 ms)
    fused = [a for a in ieee if len(a.plan.kernels) == 1]
    assert "FMA tiles" in fused[0].kind
    assert all(fma_dots_fit(k, s, program, a.plan) for a in fused[:3] for k, s in zip(a.plan.kernels, a.schedules))


def test_tf32x3_attention_matches_float64():
    """A TF32×3 schedule is lowered with its precision and computes attention (checked on fresh inputs)."""
    import math

    from neptune_eq import dsl as ne
    from neptune_eq.library import attention
    from neptune_eq.runtime import compile_ir

    P = ne.program("fp32_attention")
    b, h, i, j, d, e = P.axes(b=1, h=2, i=48, j=80, d=32, e=32)
    q, k, v = P.input("q", b, h, i, d), P.input("k", b, h, j, d), P.input("v", b, h, j, e)
    P.output("o", attention(q, k, v, key_axis=j, dim_axis=d, scale=1 / math.sqrt(32)), (b, h, i, e))
    prog = compile_ir(P.build())
    alt = next(a for a in prog.alternatives if any(s.input_precision == "tf32x3" for s in a.schedules))
    pinned = prog.pin(alt.id)
    assert 'input_precision="tf32x3"' in pinned.source
    g = torch.Generator().manual_seed(7)
    xs = {n: torch.randn(1, 2, 48 if n == "q" else 80, 32, generator=g) for n in "qkv"}
    ref = torch.softmax(xs["q"].double() @ xs["k"].double().transpose(-1, -2) / math.sqrt(32), -1) @ xs["v"].double()
    out = pinned.run(xs)["o"].double()
    assert float((out - ref).norm() / ref.norm()) < 1e-5


def test_tuning_an_ieee_kernel_tries_tiles_within_ptxas_bounds():
    """The tuner's streamed candidates (128 × 64 rows × keys and up) all spill with IEEE products: it
    tries the FMA-sized tiles instead."""
    from neptune_eq.extract.onchip import fma_dots_fit

    from neptune_eq.runtime import compile_ir
    from neptune_eq.tune import _candidates

    program = _fp32_prefill()
    alts = compile_ir(program, Options(float32_products=("ieee",))).alternatives
    a = next(a for a in alts if len(a.plan.kernels) == 1)
    k, base = a.plan.kernels[0], a.schedules[0]
    cands = _candidates(k, program, a.plan, base)
    assert len(cands) > 4 and all(fma_dots_fit(k, c, program, a.plan) for c in cands)
    assert {c.num_stages for c in cands} >= {2, 3}


def test_float32_products_rejects_what_is_no_precision():
    import pytest

    from neptune_eq.ir import NeptuneError

    for bad in ((), ("fp16",), "ieee", ("ieee", "tf32x4")):
        with pytest.raises(NeptuneError, match="float32_products"):
            Options(float32_products=bad)
    assert Options(float32_products=["tf32x3", "ieee", "tf32x3"]).float32_products == ("tf32x3", "ieee")


def test_a_split_trainings_two_parts_of_a_gradient_are_summed_in_float32():
    """Linear attention of `.float()` features: the key gradient has a part through the kv state (the
    operand maps' backward) and a part through the normaliser (the core's backward), which largely
    cancel. torch sums them in float32 and rounds once; they had come back rounded to fp16 apart and
    been summed in fp16: the key gradient's error was 4.3e-3 against torch's 2.9e-4 (H100, fp16, L 4096),
    3.7× eager's in the interpreter at L 300. Still 4.5e-3 at L 4096 (interpreter) after that: ∂kv, a
    float32 value, was multiplied with v rounded to fp16 beside v's fp16 load, and the operand
    Σ_i z·φ(q)·∂out written once in fp16; both are float32 now (contract.held_wide), and every gradient
    is within 1.25× eager's own error against float64 (1.0× here; 2.5× had been the bound)."""
    def linear_attention(q, k, v):
        fq, fk = F.elu(q.float()) + 1.0, F.elu(k.float()) + 1.0
        kv = torch.einsum("bhld,bhle->bhde", fk, v.float())
        z = 1.0 / (torch.einsum("bhld,bhd->bhl", fq, fk.sum(2)) + 1e-6)
        return (torch.einsum("bhld,bhde->bhle", fq, kv) * z[..., None]).to(q.dtype)

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(2, 3, 300, 16, generator=g).half() for _ in range(3)]
    gout = torch.randn(2, 3, 300, 16, generator=g).half()
    prog = neptune_eq.compile(linear_attention, *xs)

    def grads(fn, dtype):
        ins = [x.to(dtype).clone().requires_grad_() for x in xs]
        fn(*ins).backward(gout.to(dtype))
        return [x.grad.double() for x in ins]

    ref, eager = grads(linear_attention, torch.float64), grads(linear_attention, torch.half)
    ours = grads(prog, torch.half)
    for r, e, o in zip(ref, eager, ours):
        scale = float(r.abs().max())
        assert float((o - r).abs().max()) <= 1.25 * float((e - r).abs().max()) + 1e-6 * scale
