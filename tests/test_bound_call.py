"""The launch fast path: a compiled function binds its kernels' launches to an argument layout on
the first call and later calls with that layout pass only addresses. BoundCall's argument
assembly is checked on the CPU with stand-in runners; the path itself needs CUDA (skipped here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from neptune_eq.frontend import CaptureError, capture
from neptune_eq.lower.bound import BoundCall
from neptune_eq.verify import rel_err

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import neptune_ops


def test_bound_call_fills_addresses_and_allocates_outputs():
    seen = []
    a = torch.zeros(3)

    def runner(*args):
        seen.append(args)

    # kernel 0 reads input 0 and writes output 0; kernel 1 reads input 1, a fixed buffer, output 0
    launches = [(runner, [None, 1, None, 1, 7, "c"], ((0, 0), (2, 2))),
                (runner, [None, 4, 999, 1, None, 1], ((0, 1), (4, 2)))]
    call = BoundCall(launches, [(torch.float16, torch.device("cpu"))], keep=[a])
    outs = call([111, 222], [(2, 3)])
    assert len(outs) == 1 and outs[0].shape == (2, 3) and outs[0].dtype == torch.float16
    o = outs[0].data_ptr()
    assert seen == [(111, 1, o, 1, 7, "c"), (222, 4, 999, 1, o, 1)]
    assert launches[0][1][0] is None  # the template is not modified


def test_bound_call_runs_a_library_gemm_on_views_of_the_calls_tensors():
    """A library GEMM takes tensors: the bound call views the call's own (an input passed as a
    flat buffer of the same address, the output it allocates) as laid out at binding; a fixed
    buffer stays the one bound. Given addresses alone, it refuses (internal error, named)."""
    from neptune_eq.ir import NeptuneError
    from neptune_eq.lower.library import LibraryGemm

    seen = []
    g = LibraryGemm("x", ("i", "d"), "w", ("d", "e"), "y", ("i", "e"), "d", "float32")
    w = torch.randn(5, 3)
    # x (slot 0) was bound as a 4 × 5 transposed view (strides 1, 4); y is output slot 1 (4 × 3, contiguous)
    views = (("x", 0, (4, 5), (1, 4), None), ("w", None, (5, 3), (3, 1), w), ("y", 1, (4, 3), (3, 1), None))
    call = BoundCall([(lambda *a: seen.append(a), [None], ((0, 1),)), (g, views, None)],
                     [(torch.float32, torch.device("cpu"))], keep=[w])
    assert call.library
    xt = torch.randn(5, 4)  # x's storage: x = xt.T
    flat = xt.reshape(-1)
    (y,) = call([flat.data_ptr()], [(12,)], [flat])
    assert seen == [(y.data_ptr(),)] and y.shape == (12,)
    torch.testing.assert_close(y.view(4, 3), xt.T @ w)
    with pytest.raises(NeptuneError, match="library GEMM"):
        call([flat.data_ptr()], [(12,)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU kernels need the interpreter, off on a GPU machine")
def test_cpu_calls_take_the_checked_path():
    q, k, v = neptune_ops.example_inputs("gqa_dc", 64, head_dim=16, heads=(4, 2))
    fn = capture(neptune_ops.gqa_dc, q, k, v).compile()
    fn(q, k, v)
    assert fn._bound == {}


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the launch fast path runs on CUDA")


@cuda
@pytest.mark.parametrize("op", ["gqa_dc", "causal_pf"])
def test_bound_calls_match_float64(op):
    """Decode GQA reshapes q to the program's shape (the bound call must address the same memory);
    fresh inputs of the same layout go through the bound launches and must still be right."""
    shape = dict(head_dim=64, heads=(8, 2) if op == "gqa_dc" else (4, 4), dtype=torch.float16, device="cuda")
    q, k, v = neptune_ops.example_inputs(op, 256, **shape)
    fn = capture(getattr(neptune_ops, op), q, k, v).compile()
    fn(q, k, v)
    (_, bound), = fn._bound.values()
    assert bound is not None
    for seed in (1, 2):
        q2, k2, v2 = neptune_ops.example_inputs(op, 256, seed=seed, **shape)
        out = fn(q2, k2, v2)
        assert len(fn._bound) == 1
        ref = fn.captured.reference(q2.double().cpu(), k2.double().cpu(), v2.double().cpu())
        assert rel_err(out.double().cpu(), ref)[0] < 2e-3
        # back-to-back calls (a dependent kernel launched while its producer drains) agree bit for bit
        again = [fn(q2, k2, v2) for _ in range(50)]
        assert all(torch.equal(a, out) for a in again)


@cuda
def test_new_layouts_bind_again_and_wrong_shapes_still_fail():
    shape = dict(head_dim=64, heads=(8, 2), dtype=torch.float16, device="cuda")
    q, k, v = neptune_ops.example_inputs("gqa_dc", 256, **shape)
    fn = capture(neptune_ops.gqa_dc, q, k, v).compile()
    fn(q, k, v)
    # the same values with k stored transposed: other strides, another binding, the same result
    kt = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    torch.testing.assert_close(fn(q, kt, v), fn(q, k, v))
    torch.testing.assert_close(fn(q, kt, v), fn(q, k, v))
    assert len(fn._bound) == 2
    with pytest.raises(CaptureError, match="shape"):
        fn(q, k[:, :, :128], v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the launch fast path runs on CUDA")
def test_training_steps_after_the_first_take_bound_launches_and_match_float64():
    """The training op's forward and its backward bind their launches per input layout too (a step
    had spent 300 + 800 µs of host time in the checked path, more than its kernels); each step, on
    fresh values at one layout, matches float64 autograd."""
    import neptune_eq
    from neptune_eq import autograd

    def layer(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    g = torch.Generator(device="cuda").manual_seed(0)
    x0, w0 = torch.randn(64, 256, device="cuda", generator=g), torch.randn(256, device="cuda", generator=g)
    prog = neptune_eq.compile(layer, x0, w0)
    before = len(autograd._BOUND)
    for step in range(3):
        x = torch.randn(64, 256, device="cuda", generator=g).requires_grad_()
        w = torch.randn(256, device="cuda", generator=g).requires_grad_()
        gy = torch.randn(64, 256, device="cuda", generator=g)
        prog(x, w).backward(gy)
        x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        layer(x64, w64).backward(gy.double())
        assert rel_err(x.grad, x64.grad)[0] < 1e-5 and rel_err(w.grad, w64.grad)[0] < 1e-5, step
    assert len(autograd._BOUND) >= before + 2  # the forward's layout and the backward's


@cuda
def test_a_library_gemm_plan_binds_and_matches_float64():
    """A plan whose product runs as the vendor's GEMM binds its launches too (it had kept the checked
    path); later calls on fresh values go through the bound call and match float64."""
    import neptune_eq
    from neptune_eq.frontend.compiled import CompiledFunction

    def f(x, w):
        return torch.relu(x) @ w

    g = torch.Generator(device="cuda").manual_seed(0)
    x0 = torch.randn(512, 384, device="cuda", generator=g, dtype=torch.float16)
    w0 = torch.randn(384, 256, device="cuda", generator=g, dtype=torch.float16)
    base = neptune_eq.compile(f, x0, w0)
    lib = next(a for a in base.alternatives if "library" in a.kind)
    fn = CompiledFunction(base.captured, base.program.pin(lib.id))
    for _ in range(4):
        x = torch.randn(512, 384, device="cuda", generator=g, dtype=torch.float16)
        w = torch.randn(384, 256, device="cuda", generator=g, dtype=torch.float16)
        assert rel_err(fn(x, w).double(), f(x.double(), w.double()))[0] < 2e-3
    assert [b.library for _, b in fn._bound.values()] == [True]


@cuda
def test_training_with_library_gemms_binds_and_matches_float64():
    """RMSNorm → matmul at 4096: its forward and backward GEMMs run as library GEMMs, bound after the
    first step (host 937 µs a step in the checked path against eager's 410, H100, session 69)."""
    import torch.nn.functional as F

    import neptune_eq
    from neptune_eq import autograd

    def f(x, w, W):
        return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6) @ W

    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = ((4096, 4096), (4096,), (4096, 4096))
    prog = neptune_eq.compile(f, *(torch.randn(s, device="cuda", generator=g, dtype=torch.bfloat16) for s in shapes))
    before = set(autograd._BOUND)
    for step in range(3):
        xs = [torch.randn(s, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_() for s in shapes]
        gy = torch.randn(4096, 4096, device="cuda", generator=g, dtype=torch.bfloat16)
        prog(*xs).backward(gy)
        ref = [x.detach().double().requires_grad_() for x in xs]
        f(*ref).backward(gy.double())
        for x, r in zip(xs, ref):
            assert rel_err(x.grad, r.grad)[0] < 2e-2, step
    bound = [autograd._BOUND[k][1] for k in set(autograd._BOUND) - before]
    assert any(b.library for b in bound), bound


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU kernels need the interpreter, off on a GPU machine")
def test_a_library_gemm_plan_binds_its_views_and_matches_float64(monkeypatch):
    """Launcher.bind on a plan that is one library GEMM (the CPU standing in for CUDA: the GEMM runs
    through torch either way): the bound call reads fresh inputs at the bound layout — x passed
    transposed in memory — through views laid out as at binding, and matches float64."""
    import neptune_eq
    from neptune_eq.lower.launch import Launcher

    monkeypatch.setattr(Launcher, "_binds_on", staticmethod(lambda device: True))
    g = torch.Generator().manual_seed(7)
    xt, w = torch.randn(48, 40, generator=g).bfloat16(), torch.randn(48, 24, generator=g).bfloat16()
    base = neptune_eq.compile(lambda x, w: x @ w, xt.T, w)
    lib = next(a for a in base.alternatives if a.kind == "library GEMM (torch.matmul)")
    prog = base.program.pin(lib.id)
    launcher = prog.launcher("interpreter")
    order = list(prog.program.inputs)
    inputs = {"x": xt.T, "w": w} if order[0] != "w" else {"w": w, "x": xt.T}
    assert set(inputs) == set(order), order
    launcher(inputs)
    bound = launcher.bind(inputs, order)
    assert bound is not None and bound.library
    for _ in range(2):
        xt2, w2 = torch.randn(48, 40, generator=g).bfloat16(), torch.randn(48, 24, generator=g).bfloat16()
        fresh = {"x": xt2.T, "w": w2}
        (out,) = bound([fresh[n].data_ptr() for n in order], [(40, 24)], [fresh[n] for n in order])
        assert rel_err(out.double(), xt2.T.double() @ w2.double())[0] < 1e-2
