"""RoPE inside attention at speed: the rotated key written once (extract/materialise.materialise_inline),
the rotated query cast to 16 bits once per program, rotate-half read as contiguous tiles under a range
mask (lower/memory._unit_shifts), and training split at the rotated operands (neptune_eq.grad_prologue).
Plans at H100 sizes are compiled, not run; what runs, runs in the interpreter against float64."""

from __future__ import annotations

import math
import re

import pytest
import torch

import neptune_eq
from neptune_eq import ir
from neptune_eq.device import H100
from neptune_eq.grad_prologue import split_prologue
from neptune_eq.pipeline import Options, compile_program
from neptune_eq.runtime import compile_ir
from neptune_eq.verify import rel_err


def _rot(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


def _attn(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v


def rope_k(q, k, v, cos, sin):
    return _attn(q, k * cos + _rot(k) * sin, v)


def rope_q(q, k, v, cos, sin):
    return _attn(q * cos + _rot(q) * sin, k, v)


def _inputs(L=24, d=16, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, L, d, generator=g, dtype=torch.float64) for _ in range(3))
    ang = torch.arange(L, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(d // 2) / (d // 2))[None]
    ang = torch.cat([ang, ang], -1)
    return [t.to(dtype) for t in (q, k, v, ang.cos(), ang.sin())]


def _run(comp, i, xs):
    """Alternative i of `comp` run on the five inputs, its output as the function returns it."""
    p = comp.program
    got = comp.pin(i).run({n: x.reshape(p.input_shape(n)) for n, x in zip(["q", "k", "v", "cos", "sin"], xs)})
    return next(iter(got.values()))


def _h100(fn, **extents):
    program = neptune_eq.compile(fn, *_inputs()).program.program
    return compile_program(program.with_extents(extents), Options(device=H100))


@pytest.fixture(scope="module")
def rope_k_prog():
    return neptune_eq.compile(rope_k, *_inputs())


def test_the_rotated_key_is_written_once_and_streamed_as_data(rope_k_prog):
    """Every query tile's program recomputed k·cos + rotate_half(k)·sin (3.1 ms against torch.compile's
    0.2 on the H100); the plan writing it once by a map pass is offered, runs exactly, and the H100
    model picks it at L 2048."""
    comp = rope_k_prog.program
    (i,) = [i for i, a in enumerate(comp.alternatives) if any(b.operand for b in a.plan.buffers.values())][:1]
    plan = comp.alternatives[i].plan
    (buf,) = [b for b in plan.buffers.values() if b.operand]
    assert buf.axes == ("h", "j", "d") and buf.dtype == "bfloat16"  # k's layout, the dtype the dot reads
    (term,) = plan.inline.values()
    assert {n.tensor for n in ir.walk(term) if isinstance(n, ir.Load)} == {"q", buf.name}
    xs = _inputs()
    want = rope_k(*(x.double() for x in xs))
    assert rel_err(_run(comp, i, xs).reshape(-1), want.reshape(-1))[0] < 1e-2
    best = _h100(rope_k, h=16, i=2048, j=2048, d=128, e=128).best
    assert any(b.operand for b in best.plan.buffers.values()), best.structure


def test_rotate_half_is_read_as_contiguous_tiles(rope_k_prog):
    """k[min(d, 7) + 8] read lane by lane (10× the plain kernel on the H100) is the unclamped tile
    k[d + 8] under the mask d + 8 < 16, and the clamped lanes read the edge k[15]."""
    comp = rope_k_prog.program
    i = next(i for i, a in enumerate(comp.alternatives) if not a.plan.buffers)
    src, _ = comp.pin(i).lowered("cuda")
    assert "tl.minimum(offs_d" not in src and "tl.maximum(offs_d" not in src
    assert "(offs_d + 8)" in src and "(offs_d + -8)" in src and re.search(r"\+ 15 \* k_s\d", src)
    xs = _inputs(seed=1)
    assert rel_err(_run(comp, i, xs).reshape(-1), rope_k(*(x.double() for x in xs)).reshape(-1))[0] < 1e-2


def test_the_rotated_query_is_cast_once_and_keeps_wide_key_steps():
    """The rotated query tile, built before the key loop, is converted to bf16 there (not every key
    step), and counts as one 16-bit tile of shared memory, not the three tiles it is computed from:
    128 keys a step, as plain attention (0.301 → 0.220 ms on the H100 with both)."""
    comp = _h100(rope_q, h=16, i=2048, j=2048, d=128, e=128)
    best = comp.best
    (sched,) = best.schedules
    assert sched.tiles["j"] == 128, sched.tiles
    from neptune_eq.runtime import CompiledProgram

    src, _ = CompiledProgram(comp).lowered("cuda")
    head = src[src.index("def nq_"):src.index("for start_j")]
    (cast,) = re.findall(r"(c\d+) = t\d+\.to\(tl\.bfloat16\)", head)
    assert src.count(f"tl.dot({cast}, ") == 3  # the scores' dot of each of the three key loops reads it


def test_training_splits_at_the_rotated_operands():
    """The backward runs on the rotated q and k as inputs (attention's own backward), then the
    rotation's adjoint carries their gradients to q and k: gradients of q, k, v and of cos, sin
    against float64 autograd."""
    xs = _inputs(L=11, d=8, dtype=torch.float64, seed=2)
    prog = neptune_eq.compile(lambda q, k, v, c, s: rope_q(q, k * c + _rot(k) * s, v, c, s),
                              *[x.float() for x in xs])
    split = split_prologue(prog.program.program, ["q", "k", "v"])
    assert split is not None and len(split.operands) == 2
    assert {o.name for o in split.maps.outputs} == set(split.core.inputs) - {"v"}
    for wants in ((True, True, True, False, False), (False, True, False, True, True)):
        ours = [x.clone().float().requires_grad_(w) for x, w in zip(xs, wants)]
        ref = [x.clone().requires_grad_(w) for x, w in zip(xs, wants)]
        out = prog(*ours)
        want = rope_q(ref[0], ref[1] * ref[3] + _rot(ref[1]) * ref[4], *ref[2:])
        cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        (out.double() * cot).sum().backward()
        (want * cot).sum().backward()
        for a, b in zip(ours, ref):
            if b.requires_grad:
                assert torch.allclose(a.grad.double(), b.grad, atol=1e-5), (a.grad.double() - b.grad).abs().max()
    assert "split at the computed dot operands" in prog.explain()


def test_plain_attention_is_not_split():
    """An elementwise operand (q·c) differentiates inline; softmax's P, an operand of P·V computed through
    reductions, is no smaller than the [i, j] matrix fusion avoids writing: neither is split."""
    program = neptune_eq.compile(lambda q, k, v, c, s: _attn(q * c, k, v), *_inputs()).program.program
    assert split_prologue(program, ["q", "k", "v"]) is None

    def unguarded(q, k, v):
        s = q @ k.transpose(-1, -2)
        p = torch.exp(s - s.amax(-1, keepdim=True))
        return (p / p.sum(-1, keepdim=True)) @ v

    program = neptune_eq.compile(unguarded, *_inputs()[:3]).program.program
    assert split_prologue(program, ["q", "k", "v"]) is None


def test_map_outputs_over_other_axes_get_kernels_of_their_own():
    """Two elementwise outputs over different axes (the rotated q over i, k over j) are two kernels of
    4096-element tiles, not one grid over both (2^34 programs at L 2048)."""
    p = ir.Program("maps", {"i": 2048, "j": 2048, "d": 128},
                   {"x": ir.TensorSpec("x", ("i", "d")), "y": ir.TensorSpec("y", ("j", "d"))},
                   [ir.Output("a", ("i", "d"), ir.Call("mul", (ir.Load("x", (ir.Index("i"), ir.Index("d"))),
                                                              ir.Const(2.0)))),
                    ir.Output("b", ("j", "d"), ir.Call("exp", (ir.Load("y", (ir.Index("j"), ir.Index("d"))),)))])
    best = compile_program(p, Options(device=H100)).best
    assert len(best.plan.kernels) == 2
    for s in best.schedules:
        assert math.prod(s.tiles.values()) == 4096 and s.tiles["d"] == 128, s.tiles
    small = compile_ir(p.with_extents({"i": 5, "j": 7, "d": 3}))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 3, generator=g), torch.randn(7, 3, generator=g)
    got = small.run({"x": x, "y": y})
    assert torch.allclose(got["a"], 2 * x) and torch.allclose(got["b"], y.exp())


def test_grouped_query_rope_trains():
    """k read at the kv head h // G is rotated once per kv head (a fresh axis of n_h / G), not per query
    head: its gradient then needs no sum over the group at a shifted position, which is not derived
    (the whole program raised NoBackward before)."""
    def rope_gqa(q, k, v, cos, sin):
        q, k = q * cos + _rot(q) * sin, k * cos + _rot(k) * sin
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(1, 4, 9, 8, generator=g, dtype=torch.float64)]
    xs += [torch.randn(1, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(2)]
    xs += _inputs(L=9, d=8, dtype=torch.float64)[3:]
    prog = neptune_eq.compile(rope_gqa, *[x.float() for x in xs])
    split = split_prologue(prog.program.program, ["q", "k", "v"])
    (kv,) = [n for n, f in split.operands.items()
             if any(isinstance(m, ir.Load) and m.tensor == "k" for m in ir.walk(f))]
    assert split.core.inputs[kv].axes[0] not in prog.program.program.axes  # stored per kv head
    # the inference forward's materialised key: its shifted tile read at the kv head h // G, uniform in the
    # loop, and the edge element with it (a CompilationError on the GPU when the edge load was hoisted)
    ys = [torch.randn(1, h, 20, 16, generator=g).to(torch.bfloat16) for h in (4, 2, 2)] + _inputs(L=20)[3:]
    comp = neptune_eq.compile(rope_gqa, *ys).program
    i = next(i for i, a in enumerate(comp.alternatives) if any(b.operand for b in a.plan.buffers.values()))
    want = rope_gqa(*(y.double() for y in ys)).reshape(-1)
    assert rel_err(_run(comp, i, ys).reshape(-1), want)[0] < 1e-2
    ours = [x.clone().float().requires_grad_(k < 3) for k, x in enumerate(xs)]
    ref = [x.clone().requires_grad_(k < 3) for k, x in enumerate(xs)]
    cot = torch.randn(1, 4, 9, 8, generator=g, dtype=torch.float64)
    (prog(*ours).double() * cot).sum().backward()
    (rope_gqa(*ref) * cot).sum().backward()
    for a, b in zip(ours[:3], ref[:3]):
        assert torch.allclose(a.grad.double(), b.grad, atol=1e-5), (a.grad.double() - b.grad).abs().max()


def qk_norm(q, k, v, wq, wk):
    q = q * torch.rsqrt((q * q).mean(-1, keepdim=True) + 1e-6) * wq
    k = k * torch.rsqrt((k * k).mean(-1, keepdim=True) + 1e-6) * wk
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def _qk_inputs(L=20, d=16, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, L, d, generator=g, dtype=torch.float64) for _ in range(3))
    wq, wk = (1 + 0.1 * torch.randn(d, generator=g, dtype=torch.float64) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v, wq, wk)]


def test_qk_norm_attention_is_one_kernel_on_the_tensor_cores():
    """The row statistics Σ_d q² and Σ_d k² inside the scores Σ_d q̂·k̂ (a sum over their own axis) are
    computed in the tile, with the scores, the head dimension held whole (before, the scores were a
    GEMM written to memory: 4.85 ms against torch.compile's 0.20 on the H100); the two normalised
    operands are rounded to bf16 for the dot, as torch holds them (not an fp32 IEEE dot)."""
    program = neptune_eq.compile(qk_norm, *_qk_inputs()).program.program
    comp = compile_program(program.with_extents({"h": 16, "i": 2048, "j": 2048, "d": 128, "e": 128}),
                           Options(device=H100))
    assert len(comp.best.plan.kernels) == 1 and len(comp.best.plan.inline) == 3, comp.best.structure
    from neptune_eq.runtime import CompiledProgram

    src, _ = CompiledProgram(comp).lowered("cuda")
    assert "tl.dot(" in src and 'input_precision="ieee"' not in src
    xs = _qk_inputs()
    prog = neptune_eq.compile(qk_norm, *xs)
    assert rel_err(prog(*xs), qk_norm(*(x.double() for x in xs)))[0] < 1e-2


def test_qk_norm_trains_split_at_the_normalised_operands():
    """The normalised q and k are the core's inputs (attention's backward), their RMSNorm's backward
    carries the gradients to q, k and the weights (73.5 → 1.17 ms fwd+bwd on the H100)."""
    xs = _qk_inputs(L=9, d=8, dtype=torch.float64)
    prog = neptune_eq.compile(qk_norm, *[x.float() for x in xs])
    split = split_prologue(prog.program.program, ["q", "k", "v", "wq", "wk"])
    assert split is not None and len(split.operands) == 2
    ours = [x.clone().float().requires_grad_() for x in xs]
    ref = [x.clone().requires_grad_() for x in xs]
    cot = torch.randn(1, 2, 9, 8, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    (prog(*ours).double() * cot).sum().backward()
    (qk_norm(*ref) * cot).sum().backward()
    for a, b in zip(ours, ref):
        assert torch.allclose(a.grad.double(), b.grad, atol=1e-5), (a.grad.double() - b.grad).abs().max()
    assert "split at the computed dot operands" in prog.explain()
