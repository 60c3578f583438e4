"""A scalar loss's gradients computed beside it (neptune_eq.grad_joint): the joint program against
float64, the joint training's upstream scaling in eager calls, and where it is no alternative (several
outputs, a non-scalar one, a plan whose scratch passes the limit and cannot be chunked)."""

import sys
from pathlib import Path

import torch

import neptune_eq
from neptune_eq import autograd_joint, ir
from neptune_eq.autograd import training_report
from neptune_eq.autograd_joint import scratch_over
from neptune_eq.frontend import capture
from neptune_eq.grad_joint import joint_program, why_no_joint
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir
from neptune_eq.training import _derive

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from beyond.programs import linear_ce


def _lce_inputs(T=37, H=20, V=90, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, W = torch.randn(T, H, generator=g).bfloat16(), torch.randn(V, H, generator=g).bfloat16()
    t = torch.randint(0, V, (T,), generator=g)
    t[3] = -100  # an ignored token
    return h, W, t


def _reference(h, W, t, upstream=1.0):
    hd, Wd = h.double().requires_grad_(), W.double().requires_grad_()
    loss = linear_ce(hd, Wd, t)
    (loss * upstream).backward()
    return loss.detach(), hd.grad, Wd.grad


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def test_the_joint_program_of_linear_cross_entropy_matches_float64():
    h, W, t = _lce_inputs()
    prog = capture(linear_ce, h, W, t).program
    joint = joint_program(prog, _derive(prog, ["h", "W"]).recompute)
    assert joint.output == "out0" and set(joint.grads) == {"h", "W"}
    assert [o.name for o in joint.program.outputs] == ["out0", joint.grads["h"], joint.grads["W"]]
    assert not any(isinstance(n, ir.Load) and n.tensor.startswith("grad_out")
                   for o in joint.program.outputs for n in ir.walk(o.expr))  # (the upstream is the constant 1)
    got = compile_ir(joint.program, Options()).run({"h": h, "W": W, "target": t})
    loss, gh, gW = _reference(h, W, t)
    assert _rel(got["out0"], loss) < 1e-5
    assert _rel(got[joint.grads["h"]], gh) < 1e-2 and _rel(got[joint.grads["W"]], gW) < 1e-2


def test_a_joint_training_scales_its_gradients_by_the_upstream(monkeypatch, tmp_path):
    """Forced to rank first (its scaling priced at -1 s), the joint training returns the loss, and its
    backward the gradients at upstream 1 times the upstream: once per backward (a retained graph's
    second backward adds the same again), none for the integer targets."""
    monkeypatch.setattr(autograd_joint, "scaling_s", lambda joint, run: -1.0)
    h, W, t = _lce_inputs(seed=1)
    prog = neptune_eq.compile(linear_ce, h, W, t, cache_dir=tmp_path)
    hl, Wl = h.clone().requires_grad_(), W.clone().requires_grad_()
    loss = prog(hl, Wl, t)
    assert loss.requires_grad
    (loss * 3.0).backward(retain_graph=True)
    assert "backward: chose joint" in training_report(prog._first().op.qualname)
    want, gh, gW = _reference(h, W, t, 3.0)
    assert _rel(loss.detach(), want) < 1e-5
    assert _rel(hl.grad, gh) < 1e-2 and _rel(Wl.grad, gW) < 1e-2 and hl.grad.dtype == torch.bfloat16
    first = hl.grad.clone()
    (loss * 3.0).backward()
    assert torch.equal(hl.grad.float(), (first.float() * 2).bfloat16().float())
    # W alone requiring grad: a training of its own, joint too
    Wl2 = W.clone().requires_grad_()
    prog(h, Wl2, t).backward()
    assert _rel(Wl2.grad, _reference(h, W, t)[2]) < 1e-2


def test_only_a_single_scalar_output_has_a_joint_training():
    x = torch.randn(6, 10)
    rows = capture(lambda x: torch.logsumexp(x, -1), x).program
    assert "not a scalar" in why_no_joint(rows) and _derive(rows, ["x"]).joint is None
    two = capture(lambda x: (x.exp().sum(), x.square().mean()), x).program
    assert "2 outputs" in why_no_joint(two) and _derive(two, ["x"]).joint is None
    one = capture(lambda x: torch.logsumexp(x, -1).mean(), x).program
    assert why_no_joint(one) is None and _derive(one, ["x"]).joint is not None


def test_a_joint_plan_whose_scratch_cannot_be_chunked_is_not_offered():
    """Linear cross-entropy at 8192 tokens × 4096 → 32768: the joint program's plan writes the float32
    logits whole (2.1 GiB, the limit 1 GiB) and no axis of it can be cut (its log-sum-exp spans the
    vocabulary, its mean's count the tokens), where the two-program backward runs in chunks: not
    ranked (compile only)."""
    h, W = torch.empty(8192, 4096, dtype=torch.bfloat16), torch.empty(32768, 4096, dtype=torch.bfloat16)
    t = _derive(capture(linear_ce, h, W, torch.zeros(8192, dtype=torch.long)).program, ["h", "W"])
    run = compile_ir(t.joint.program, Options())
    why = scratch_over(run)
    assert run.chunking is None and why is not None and "2.13 GiB" in why and "1.00 GiB" in why, why
    small = compile_ir(_derive(capture(linear_ce, *_lce_inputs()[:2], _lce_inputs()[2]).program,
                               ["h", "W"]).joint.program, Options())
    assert scratch_over(small) is None


def test_a_joint_training_under_torch_compile_matches_float64(monkeypatch, tmp_path):
    """The joint training op traced by torch.compile: its fake kernel returns the gradients beside the
    loss, AOTAutograd traces the backward's scaling; the gradients match float64."""
    monkeypatch.setattr(autograd_joint, "scaling_s", lambda joint, run: -1.0)
    h, W, t = _lce_inputs(seed=2)
    prog = neptune_eq.compile(linear_ce, h, W, t, cache_dir=tmp_path)
    f = torch.compile(lambda h, W, t: prog(h, W, t) * 2.5)
    hl, Wl = h.clone().requires_grad_(), W.clone().requires_grad_()
    loss = f(hl, Wl, t)
    loss.backward()
    assert "backward: chose joint" in training_report(prog._first().op.qualname)
    want, gh, gW = _reference(h, W, t, 2.5)
    assert _rel(loss.detach() / 2.5, want) < 1e-5
    assert _rel(hl.grad, gh) < 1e-2 and _rel(Wl.grad, gW) < 1e-2
