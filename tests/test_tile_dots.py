"""Sums of products inside a kernel become tensor-core dots (lower/contract.py try_dot): a factor over the
contracted axis alone scales the operand that is computed already, so a loaded 16-bit operand stays one
(not an IEEE fp32 dot); a sum whose other axis comes only from a zero-branch condition (a one-hot
scatter, `Σ_i [t_i = j]·h[i, d]`) is a dot with a 0/1 matrix, not an [i, j, d] block of selections.
Checked on the CUDA source (no GPU needed) and run in the interpreter against float64 at sizes that
are not tile multiples."""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq import dsl as ne
from neptune_eq.reference import evaluate
from neptune_eq.runtime import compile_ir


def _three_d_blocks(src: str) -> list[str]:
    """Reductions over a third block axis (an [a, b, c] tile summed in registers)."""
    return re.findall(r"tl\.sum\([^\n]*axis=2\)", src)


def _dots(src: str) -> list[str]:
    return re.findall(r"tl\.dot\([^\n]*", src)


def _close(prog, inputs, tol):
    want = evaluate(prog.program, {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})
    got = prog.run(inputs)
    for name, w in want.items():
        err = ((got[name].double() - w).norm() / w.norm()).item()
        assert err < tol, (name, err)


def _scatter(I, J, D, dtype="bfloat16"):
    """o[j, d] = Σ_i e^{x[i, j]}·h[i, d] + Σ_i [t_i = j]·c_i·h[i, d]: the shape of cross-entropy's weight
    gradient (the softmax's part, then the target's, the gradient of a gather W[t_i])."""
    P = ne.program("scatter")
    i, j, d = P.axes(i=I, j=J, d=D)
    h = P.input("h", i, d, dtype=dtype)
    x = P.input("x", i, j)
    c = P.input("c", i)
    t = P.input("t", i, dtype="int64")
    P.output("o", ne.sum(ne.exp(x) * h, i) + ne.sum(ne.where(t == j.index, c * h, 0.0), i))
    return P.build()


def test_a_one_hot_scatter_is_a_dot_with_a_zero_one_matrix():
    prog = compile_ir(_scatter(300, 160, 144))
    src = prog.source
    assert not _three_d_blocks(src), src
    dots = _dots(src)
    assert dots and all(".to(tl.bfloat16)" in d for d in dots), dots  # c·[t = j] in h's dtype: tensor cores
    assert 'input_precision="ieee"' not in src


def test_a_one_hot_scatter_matches_float64_in_the_interpreter():
    g = torch.Generator().manual_seed(0)
    I, J, D = 70, 37, 40  # not tile multiples; every row of o hit by several i, some by none
    prog = compile_ir(_scatter(I, J, D, dtype="float32"))
    t = torch.randint(0, J - 5, (I,), generator=g)
    inputs = {"h": torch.randn(I, D, generator=g), "x": torch.randn(I, J, generator=g),
              "c": torch.randn(I, generator=g), "t": t}
    _close(prog, inputs, 1e-5)
    for alt in range(min(4, len(prog.alternatives))):  # every schedule kind of the top plans, too
        _close(prog.pin(alt), inputs, 1e-5)


def _scaled_product(I, M, N, dtype):
    """o[m, n] = Σ_i h[i, m]·exp(x[i, n])/l[i]: a loaded operand, a computed one and a factor over i."""
    P = ne.program("scaled")
    i, m, n = P.axes(i=I, m=M, n=N)
    h = P.input("h", i, m, dtype=dtype)
    x = P.input("x", i, n)
    l_ = P.input("l", i)
    P.output("o", ne.sum(h * ne.exp(x) / l_, i))
    return P.build()


def test_a_factor_over_the_contracted_axis_keeps_the_loaded_operand_native():
    src = compile_ir(_scaled_product(512, 256, 256, "bfloat16")).source
    dots = _dots(src)
    assert dots and 'input_precision="ieee"' not in src, dots
    assert all(".to(tl.bfloat16)" in d for d in dots), dots  # the computed side is cast, h is read as is


def test_a_factor_over_the_contracted_axis_matches_float64_in_the_interpreter():
    g = torch.Generator().manual_seed(1)
    I, M, N = 45, 33, 20
    prog = compile_ir(_scaled_product(I, M, N, "bfloat16"))
    inputs = {"h": torch.randn(I, M, generator=g).bfloat16(), "x": torch.randn(I, N, generator=g),
              "l": torch.rand(I, generator=g) + 0.5}
    _close(prog, inputs, 1.6e-2)  # the bf16 level: the computed operand is rounded to bf16 for the dot


def test_a_computed_operand_is_not_multiplied_by_the_zeros_of_a_one_hot():
    """Σ_i [t_i = j]·e^{x[i, d]} with e^x = inf at one (i, d): a select gives inf in row t_i alone; a
    dot of the computed operand with a 0/1 matrix would give inf·0 = NaN in every row. Such a sum
    stays a select (exact), whatever the schedule."""
    P = ne.program("onehot_exp")
    i, j, d = P.axes(i=40, j=32, d=48)
    x = P.input("x", i, d)
    y = P.input("y", i, j)
    h = P.input("h", i, d)
    t = P.input("t", i, dtype="int64")
    P.output("o", ne.sum(ne.exp(y) * h, i) + ne.sum(ne.where(t == j.index, ne.exp(x), 0.0), i))
    prog = compile_ir(P.build())
    g = torch.Generator().manual_seed(2)
    inputs = {"x": torch.randn(40, 48, generator=g), "y": torch.randn(40, 32, generator=g),
              "h": torch.randn(40, 48, generator=g), "t": torch.randint(0, 32, (40,), generator=g)}
    inputs["x"][3, 5] = float("inf")
    want = evaluate(prog.program, {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})["o"]
    for alt in range(min(4, len(prog.alternatives))):
        got = prog.pin(alt).run(inputs)["o"].double()
        assert torch.equal(torch.isfinite(got), torch.isfinite(want)) and not got.isnan().any(), alt
        fin = torch.isfinite(want)
        assert torch.allclose(got[fin], want[fin], rtol=1e-4, atol=1e-4), alt


def _swin(q, k, v, logit_scale):
    attn = F.normalize(q.float(), dim=-1) @ F.normalize(k.float(), dim=-1).transpose(-2, -1)
    attn = torch.softmax(attn * torch.clamp(logit_scale, max=math.log(100.0)).exp(), -1)
    return attn.to(v.dtype) @ v


def test_a_float32_matmul_of_16_bit_data_is_not_rounded_to_16_bits():
    """Swin-v2's cosine logits: F.normalize(q.float()) @ F.normalize(k.float())ᵀ is a float32 matmul of
    bf16 data; fed to the dot rounded to bf16, the logits (scaled by up to 100) were 5x and the q, k
    gradients 10x further from float64 than eager's (sweep 4)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 49, 16, generator=g).bfloat16() for _ in range(3))
    ls = torch.full((2, 1, 1), math.log(10.0))
    ls[0] = 5.0
    xs64 = [t.double().requires_grad_() for t in (q, k, v, ls)]
    o64 = _swin(*xs64)
    cot = torch.randn(o64.shape, generator=g, dtype=torch.float64)
    o64.backward(cot)
    prog = neptune_eq.compile(_swin, q, k, v, ls)

    def err(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    assert err(prog(q, k, v, ls), o64) < 2 * err(_swin(q, k, v, ls), o64)
    errs = {}
    for name, fn in (("ours", prog), ("eager", _swin)):
        xs = [t.clone().requires_grad_() for t in (q, k, v, ls)]
        fn(*xs).backward(cot.bfloat16())
        errs[name] = [err(x.grad, x64.grad) for x, x64 in zip(xs[:2], xs64[:2])]
    assert all(a < 4 * b for a, b in zip(errs["ours"], errs["eager"])), errs


def _cosine_retrieval(q, keys):
    return (F.normalize(q, dim=-1) @ F.normalize(keys, dim=-1).T * 20).softmax(-1)


def test_normalised_fp16_operands_divided_by_final_norms_reach_the_tensor_cores():
    """F.normalize(q) @ F.normalize(keys)ᵀ in fp16 (retrieval scores): each operand is an fp16 tensor to
    torch. A plan that computes both norms first (plan buffers, row factors) rounds the operands to fp16
    for the tensor cores; a plan dividing by q's running norm (an affine repair over the contraction)
    keeps an fp32 IEEE dot: q / ‖q‖ over the tiles so far is larger than torch's q / ‖q‖ and could
    overflow 16 bits where neither does. The cost model prices that dot on the FMA pipe and chooses a
    plan with final norms (it had priced it at the tensor cores' rate and chosen it: 213.6 ms against
    torch.compile's 0.29 on the H100, session 64). Then the chosen plan's product against float64."""
    big = (torch.randn(512, 256).half(), torch.randn(2048, 256).half())
    prog = neptune_eq.compile(_cosine_retrieval, *big).program
    assert not any("ieee" in d for d in _dots(prog.source)), prog.alternative.structure
    # (a float32 dot at either precision it may take: IEEE, or TF32×3 on the tensor cores)
    seen: dict[bool, int] = {}
    for i, alt in enumerate(prog.alternatives):
        running = any(c.affine for k in alt.plan.kernels for p in k.passes() for c in p.comps)
        if seen.get(running, 0) >= 12:
            continue
        dots = _dots(prog.pin(i).source)
        assert dots and all(("input_precision" in d) == running for d in dots), (alt.structure, dots)
        seen[running] = seen.get(running, 0) + 1
    assert set(seen) == {True, False}, seen
    g = torch.Generator().manual_seed(0)
    q, keys = torch.randn(37, 45, generator=g).half(), torch.randn(70, 45, generator=g).half()
    got = neptune_eq.compile(_cosine_retrieval, q, keys)(q, keys)
    want = _cosine_retrieval(q.double(), keys.double())
    assert ((got.double() - want).norm() / want.norm()).item() < 2e-3
