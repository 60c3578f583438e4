"""A product with work fused beside it, split so the product alone is a library GEMM's kernel
(extract/gemm_split.py): an epilogue reading the sum (a gather term, a scalar factor hoisted out of
the sum), and a smaller sum sharing the product's pass. Every split alternative runs in the
interpreter on sizes that are no tile multiples, against float64; the cost model's choice for linear
cross-entropy's loss and gradients at an H100 size (compile only)."""

import inspect
import sys
from pathlib import Path

import torch

from neptune_eq.frontend import capture
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


def _split_ids(prog) -> list[int]:
    return [a.id for a in prog.alternatives if any(d.startswith("gemm_split") for d in a.plan.derivation)]


def _check(fn, xs, want, tol):
    prog = capture(fn, *xs).compile()
    comp = prog.compiled
    ids = _split_ids(comp)
    kinds = {comp.alternatives[i].kind for i in ids}
    assert any("library" in k for k in kinds) and any("library" not in k for k in kinds), kinds
    names = [o.name for o in comp.program.outputs]
    inputs = dict(zip(inspect.signature(fn).parameters, xs))
    for i in ids:
        got = comp.pin(i).run(inputs)
        for name, w in zip(names, want):
            err = float((got[name].double() - w).norm() / w.norm())
            assert err < tol, (comp.alternatives[i].structure, comp.alternatives[i].kind, name, err)
    return comp, ids


def test_an_epilogue_with_a_gather_and_a_hoisted_factor_runs_after_the_product():
    """dh = (p @ W)·s + c·W[t]: the sum Σ_e p·W alone (s leaves it), the rest in a map kernel."""
    g = torch.Generator().manual_seed(0)
    m, v, n = 70, 150, 40
    p, W = torch.randn(m, v, generator=g).bfloat16(), torch.randn(v, n, generator=g).bfloat16()
    t, c, s = torch.randint(0, v, (m,), generator=g), torch.randn(m, generator=g), torch.rand((), generator=g) + 0.5

    def dh(p, W, t, c, s):
        return (p @ W) * s + c[:, None] * W[t]

    want = (p.double() @ W.double()).bfloat16().double() * s.double() + c.double()[:, None] * W.double()[t]
    comp, ids = _check(dh, (p, W, t, c, s), [want], 2e-2)
    plan = comp.alternatives[ids[0]].plan
    assert [k.name for k in plan.kernels] == ["k0", "k0_epilogue"] and "gemm_sum_e" in plan.buffers


def test_a_smaller_sum_sharing_the_products_pass_gets_a_kernel_of_its_own():
    """dw = pᵀ @ h beside Σ_i c·h[:, 0] (one pass over i): the product a kernel alone, storing dw itself."""
    g = torch.Generator().manual_seed(1)
    m, v, n = 70, 150, 40
    p, h, c = torch.randn(m, v, generator=g).bfloat16(), torch.randn(m, n, generator=g).bfloat16(), torch.randn(m)

    def dw(p, h, c):
        return p.t() @ h, (c * h[:, 0].float()).sum()

    want = [(p.double().t() @ h.double()), (c.double() * h.double()[:, 0]).sum()]
    comp, ids = _check(dw, (p, h, c), want, 1e-2)
    plan = comp.alternatives[ids[0]].plan
    assert [k.name for k in plan.kernels] == ["k0", "k0_sums"] and not any(b.startswith("gemm_") for b in plan.buffers)


def test_linear_cross_entropys_loss_and_gradients_run_as_three_library_gemms_at_h100_size():
    """The joint loss-and-gradients program at 8192 tokens × 4096 → 128256 (compile only): the logits,
    dH and dW each a library GEMM — the gather of the target's logit, dH's one-hot term and the
    loss's sum split off them (before: 56.1 ms predicted, dH rolled into the log-sum-exp pass and
    dW generated beside the loss's sum)."""
    from beyond.programs import linear_ce
    from probe_joint_scalar import joint_program

    T, H, V = 8192, 4096, 128256
    h, W = torch.empty(T, H, dtype=torch.bfloat16), torch.empty(V, H, dtype=torch.bfloat16)
    t = torch.zeros(T, dtype=torch.long)
    comp = compile_ir(joint_program(capture(linear_ce, h, W, t).program), Options())
    best = comp.alternatives[0]
    assert best.kind.count("library GEMM") == 3, best.structure
    assert best.cost.time < 45e-3, best.cost.time
