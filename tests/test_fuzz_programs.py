"""A few random programs of scripts/fuzz_programs.py compiled and checked against float64 (the hunt
itself runs many seeds: `python scripts/fuzz_programs.py --seeds 0:200 --grad`), and the check
catching a wrong answer, so that a passing seed means something."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import torch
import torch.nn.functional as F
from fuzz_programs import check, random_program

import neptune_eq


def test_random_programs_match_float64():
    # 100: a batched cat, matmul and norm; 110: a matmul, a cat, a slice and two outputs
    for seed in (100, 110):
        out = check(random_program(seed))
        assert out.verdict == "ok", (seed, out, random_program(seed).source)


def test_a_random_program_trains_like_float64():
    # 111: a cross-entropy of y @ y.mT (its one-hot gradient had been refused) beside a normalised w @ w.mT
    out = check(random_program(111), grad=True)
    assert out.verdict == "ok", (out, random_program(111).source)


def test_a_max_attained_by_masked_zeros_trains_without_nan():
    """1017: the max over a row of where(d ≤ j, w, 0), beside a log-softmax. On a row of negative w the
    max is a masked 0, which passes w no gradient; the count of the elements attaining the max,
    Σ_d [where(d ≤ j, w, 0) == max], had split d ≤ j off as a mask — its masked branch, 0 == max, looked
    never true, the running max never being sampled at the constant it is compared with — so it counted
    0 and the gradient was 0/0 = NaN (masks.py _sample_env, session 61)."""
    out = check(random_program(1017), grad=True)
    assert out.verdict == "ok", (out, random_program(1017).source)


def test_a_self_product_beside_its_factor_matches_torch():
    """t1 @ t1.mT + t1: the add unified the product's column axis with t1's column axis, the class the
    product sums over, so the captured sum bound its own output axis (t1[k, k] where t1[j, k] is meant);
    the summed class is now kept apart from the result's axes (translate.keep_apart). Fuzzer seed 1057
    (a layer norm, two such products, a std) too."""
    w = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))

    def fn(w):
        t1 = w @ w.mT
        return t1 @ t1.mT + t1

    got = neptune_eq.compile(fn, w)(w)
    assert torch.allclose(got, fn(w), atol=1e-4), (got, fn(w))
    out = check(random_program(1057), grad=True)
    assert out.verdict == "ok", (out, random_program(1057).source)


def test_an_index_clamped_at_zero_keeps_its_zero():
    """Fuzzer seed 3009, minimal: the second half of a concatenation reads t3[i, max(e − 4, 0)]. Folding
    constants in doubles in two orders (products by log₂e, differences) merged 0 with 8.97e-15 in one
    e-class, and the extractor took 8.97e-15 for the index's 0: max(e − 4, 8.97e-15) ≤ i was false at
    e = 4, i = 0, so that element came out as the mask's −1e4 (the extractor now takes a class's
    plainest constant: extract/terms._plainness)."""
    def fn(y):
        keep = torch.arange(y.shape[-1])[None, :] >= torch.arange(y.shape[-2])[:, None]
        t1 = torch.softmax(torch.where(keep, y, 0.0), -1)
        t3 = torch.where(torch.arange(t1.shape[-1])[None, :] <= torch.arange(t1.shape[-2])[:, None], t1, -1e4)
        return torch.cat([t3, t3], -1)

    y = torch.randn(7, 4, generator=torch.Generator().manual_seed(0))
    got = neptune_eq.compile(fn, y)(y)
    torch.testing.assert_close(got.double(), fn(y.double()), rtol=1e-5, atol=1e-5)
    out = check(random_program(3009))
    assert out.verdict == "ok", (out, random_program(3009).source)


def test_a_row_value_over_a_copied_axis_runs_in_a_folded_pass():
    """Fuzzer seeds 3330 and 3336, minimal: a layer norm's rows read twice, its statistics over d2 (a copy
    of d kept apart), beside a logsumexp down the columns. The plan folding the norm's rows into the pass
    over i held d whole for the row values but dropped d2's tile: the kernel named BLOCK_d2 and never
    declared it (a NameError at the launch; space._whole_rows keeps it now)."""
    def fn(w):
        t2 = F.layer_norm(torch.log1p(w.abs()), (w.shape[-1],))
        return torch.logsumexp(t2, -2), t2

    w = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    for got, want in zip(neptune_eq.compile(fn, w)(w), fn(w.double())):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    for seed in (3330, 3336):
        out = check(random_program(seed))
        assert out.verdict == "ok", (seed, out, random_program(seed).source)


def test_the_check_reports_a_wrong_result_and_a_wrong_gradient(monkeypatch):
    real = neptune_eq.compile

    def wrapped(change):
        def compile(fn, *xs, **kw):
            prog = real(fn, *xs, **kw)

            def call(*ys):
                out = prog(*ys)
                return tuple(map(change, out)) if isinstance(out, tuple) else change(out)
            return call
        return compile

    monkeypatch.setattr(neptune_eq, "compile", wrapped(lambda o: o + 1e-2))
    assert check(random_program(110)).verdict == "WRONG"
    monkeypatch.setattr(neptune_eq, "compile", wrapped(lambda o: o + (o - o.detach())))  # a gradient twice torch's
    got = check(random_program(110), grad=True)
    assert got.verdict == "WRONG" and "gradient" in got.detail, got


def test_the_cached_summaries_of_ir_nodes_are_what_a_walk_finds():
    """refs, loads and reduced_axes (cached per node for the plan enumeration) against ir.walk, on the
    captured random programs and on a plan's state references."""
    from neptune_eq import ir
    from neptune_eq.frontend import capture

    exprs = []
    for seed in range(100, 112):
        p = random_program(seed)
        exprs += [o.expr for o in capture(p.function(), *p.inputs(seed)).program.outputs]
    ref = ir.StateRef(ir.RefKind.INLINE, "s", ("i",))
    exprs.append(ir.Call("add", (ref, ir.Reduce("sum", "j", ir.Call("mul", (ref, ir.Load("x", (ir.Index("j"),))))))))
    for e in exprs:
        nodes = list(ir.walk(e))
        assert e.refs == tuple(n for n in nodes if isinstance(n, ir.StateRef))
        assert e.loads == tuple(n for n in nodes if isinstance(n, ir.Load))
        assert e.reduced_axes == {n.axis for n in nodes if isinstance(n, ir.Reduce)}
    assert exprs[-1].refs == (ref,) and exprs[-1].reduced_axes == {"j"}


def test_a_matrix_beside_its_transpose_in_a_cat_keeps_both_axes():
    """cat([t.mT, t], -1): the first piece puts t's columns in the rows' slot, the second t's rows, and t's
    columns are the second piece's cut (read at k − n). Unified with the rows there, they made the
    second piece t's diagonal — Σ_d w[k−n, d]·w[k−n, d] for t = w @ wᵀ, silently (fuzzer seeds 1170 and
    1180); a dimension left out of the slots is now renamed apart like the others (frontend/axes.py)."""
    from neptune_eq.frontend import capture
    from neptune_eq.reference import evaluate

    w = torch.randn(5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for fn in (lambda w: torch.cat([(w @ w.mT).mT, 2 * (w @ w.mT)], -1),
               lambda w: torch.cat([w @ w.mT, (w @ w.mT).mT + 1], -1),
               lambda w: torch.cat([(w @ w.mT).mT, torch.relu(w @ w.mT @ w @ w.mT)], 0)):
        c = capture(fn, w)
        got = evaluate(c.program, {"w": w})[c.program.outputs[0].name]
        torch.testing.assert_close(got, fn(w))
    for seed in (1170, 1180):
        out = check(random_program(seed), grad=True)
        assert out.verdict == "ok", (seed, out, random_program(seed).source)


def test_a_squared_product_of_repeated_factors_evaluates_in_float64():
    """Fuzzer seed 1651: ‖layer_norm(min_i softmax(w))‖. The float64 evaluator (reference.evaluate) sums
    Σ_d ((x − μ)·r)² as one einsum of its factors; the repeated factors are one memoised value twice, and
    merging them by identity dropped both copies, so the sum read Σ_d (x − μ)·r = 0. The invariance test
    that runs on that evaluator then found the output blind to the min (an output of 0 both ways), and
    the training returned a detached result where torch's gradient is ~1e-3."""
    from neptune_eq.frontend import capture
    from neptune_eq.reference import evaluate

    def fn(w):
        return F.layer_norm(w.amin(0, keepdim=True), (3,)).norm(dim=-1)

    w = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = evaluate(capture(fn, w.float()).program, {"w": w})
    assert torch.allclose(got["out0"].reshape(-1), fn(w).reshape(-1), rtol=1e-12)
    out = check(random_program(1651), grad=True)
    assert out.verdict == "ok", (out, random_program(1651).source)


def test_a_repaired_state_kept_transposed_stays_transposed():
    """Extended fuzz seed 20: the gradient of (w @ wᵀ).amin(-1). Its backward's rolling pass counts the
    ties of each row's min and sums Σ_e2 hit·g/count·w[e2, d] into a [d, e] gradient, the state laid out
    [e, d] for the tensor cores (lower/passes._computed_on_the_right); the repair (× old count / new) was
    aligned canonically to [d, e], the dot accumulated into it, and the state then held its transpose —
    with 16 × 16 tiles no shape error told, and the gradient was off by ~1 of ~3 (6 of its 196
    alternatives). The first eight alternatives whose plan rolls a pass are checked against float64."""
    from neptune_eq.frontend import capture
    from neptune_eq.grad import backward_program
    from neptune_eq.runtime import compile_ir

    def fn(w):
        return (w @ w.mT).amin(-1, keepdim=True)

    w = torch.randn(4, 3, generator=torch.Generator().manual_seed(3))
    back = compile_ir(backward_program(capture(fn, w).program).program)
    rolling = [k for k, a in enumerate(back.alternatives) if "rolling" in a.plan.structure()]
    assert len(rolling) >= 4
    for k in rolling[:8]:
        report = back.pin(k).verify(sets=("normal",))
        assert "FAIL" not in str(report), (k, back.alternatives[k].plan.structure(), report)
    a = w.clone().requires_grad_()
    b = w.double().requires_grad_()
    neptune_eq.compile(fn, w)(a).sum().backward()
    fn(b).sum().backward()
    assert torch.allclose(a.grad.double(), b.grad, atol=1e-5)
    out = check(random_program(20, extended=True), grad=True)
    assert out.verdict == "ok", (out, random_program(20, extended=True).source)


def test_a_program_amplifying_rounding_is_noisy_not_wrong():
    """Extended level-2 seed 28: F.normalize of a standardised tensor's mean — 0 over the reals, ~1e-8
    from float32's rounding — is ±1 from noise; torch in float32 misses float64 as far as the kernels do.
    The fuzzer calls it noisy rather than wrong."""
    out = check(random_program(28, extended=2))
    assert out.verdict == "noisy", out


def test_a_read_at_an_argmax_in_a_random_program_trains():
    """Extended level-2 seed 31: y read at its argmax over the rows, then a product with w (refused as a
    gather at an index computed by a reduction before session 77)."""
    out = check(random_program(31, extended=2), grad=True)
    assert out.verdict == "ok", (out, random_program(31, extended=2).source)


def test_a_sum_over_a_pass_axis_hoisted_before_the_pass_runs_its_own_loop():
    """Fuzz --big seed 34: the backward of a layer norm over a cat of a row-normalised matrix with itself
    (37 × 40 → 74). Its third kernel passes over j, and a value computed before that pass (hoisted: it does
    not vary along the pass) sums over j too; the lowering took the pass's tile of j for it, whose offsets
    are defined only inside the pass's loop — `offs_j` read before assignment (a crash in the interpreter,
    a compile error on the GPU). Such a sum now runs as a loop of its own before the pass."""
    def fn(x, y):
        t1 = torch.cat([y, x], -1).mT
        t2 = t1 / t1.abs().sum(-2, keepdim=True).clamp_min(1e-3)
        return F.layer_norm(torch.cat([t2, t1], -1), (74,))

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(37, 20, generator=g), torch.randn(37, 20, generator=g)
    a, b = x.clone().requires_grad_(), y.clone().requires_grad_()
    a64, b64 = x.double().requires_grad_(), y.double().requires_grad_()
    gout = torch.randn(40, 74, generator=g, dtype=torch.float64)
    neptune_eq.compile(fn, x, y)(a, b).backward(gout.float())
    fn(a64, b64).backward(gout)
    assert torch.allclose(a.grad.double(), a64.grad, atol=1e-4)
    assert torch.allclose(b.grad.double(), b64.grad, atol=1e-4)


def test_a_running_max_of_normalised_values_starts_at_its_identity():
    """Fuzz --big seed 73: log1p(|max_d normalize(w)|) at 20 × 9. The plan rolls the norm and the max of
    w/‖w‖ together, repairing the max by ‖old‖/‖cur‖; on the first tile ‖old‖ = 0, and the running max's
    identity −∞ times 0 made every row NaN (every alternative rolling them: 3 of 6 first). A max or min
    still at its identity now stays there whatever the repair."""
    def fn(w):
        return torch.log1p(F.normalize(w, dim=-1).max(-1).values.abs())

    w = torch.randn(20, 9, generator=torch.Generator().manual_seed(0))
    prog = neptune_eq.compile(fn, w)
    for k, alt in enumerate(prog.program.alternatives[:8]):
        got = prog.program.pin(k).run({"w": w})["out0"]
        assert torch.allclose(got, fn(w), atol=1e-6), (k, alt.plan.structure(), got)


def test_a_clamped_min_keeps_its_gradient_where_some_rows_pass_the_clamp():
    """Fuzz --big seed 60: min_d(w).clamp(min=-0.5)² normalised over the rows. The test of whether the
    outputs see a shift of the min drew N(0, 1) twice; over 9 values every row's min was below −0.5 in
    both draws, the clamp hid the shift, and the min's adjoint was dropped — a detached output. The draws
    now vary in scale and offset, so the clamp is passed in some."""
    def fn(w):
        t = w.min(-1).values.clamp(min=-0.5) ** 2
        return t / t.abs().sum(-1, keepdim=True).clamp_min(1e-3)

    w = torch.randn(20, 9, generator=torch.Generator().manual_seed(0)) * 0.3
    a, b = w.clone().requires_grad_(), w.double().requires_grad_()
    got = neptune_eq.compile(fn, w)(a)
    assert got.requires_grad
    g = torch.randn(20, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got.backward(g.float())
    fn(b).backward(g)
    assert b.grad.abs().max() > 0
    assert torch.allclose(a.grad.double(), b.grad, atol=1e-5)
