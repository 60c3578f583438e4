"""Issue 10 for the PyTorch frontend: never a silent wrong answer. Each test feeds the adversarial
input as the issue writes it and compares with eager PyTorch in float64, or expects a clear
NeptuneError naming the cause: changed globals and closures, arguments written in place, dict
outputs, out-of-range targets and indices, zero-size axes, meta tensors, diagonal, and
cross_entropy's reductions."""

from __future__ import annotations

import collections
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from helpers import Annealed
from test_frontend import check_capture, randn, rel_err

import neptune_eq
from neptune_eq.frontend import CaptureError, capture
from neptune_eq.frontend.capture import StaleCapture, ZeroSizeCapture
from neptune_eq.frontend.checks import IndexOutOfRange
from neptune_eq.frontend.compiled import ZeroSizeError
from neptune_eq.ir import NeptuneError, NeptuneWarning

THIS = sys.modules[__name__]
F64 = torch.float64


def close(got, want, tol: float = 1e-5) -> None:
    assert rel_err(got, want) < tol


def run_of(prog):
    """The CompiledFunction behind a neptune_eq.compile result's (only) signature."""
    (variant,) = prog.variants.values()
    return variant.run


# ---------------------------------------------------------------- guards: values fn reads from its environment

SCALE = 0.5
BIAS = torch.tensor([1.0, -2.0, 0.5, 3.0])


def scaled(x):
    return (x * SCALE + BIAS).softmax(-1)


def test_global_float_changed_after_compile_gives_the_new_result(tmp_path, monkeypatch):
    x = torch.randn(3, 4)
    prog = neptune_eq.compile(scaled, x, cache_dir=tmp_path)
    close(prog(x), scaled(x.double()))
    monkeypatch.setattr(THIS, "SCALE", 2.0)
    close(prog(x), scaled(x.double()))  # the new scale, not the one baked in at capture
    close(prog(x), scaled(x.double()))
    assert run_of(prog).recaptures == 1  # captured again once, then the guards hold


def test_rebound_global_tensor_gives_the_new_result(tmp_path, monkeypatch):
    x = torch.randn(3, 4)
    prog = neptune_eq.compile(scaled, x, cache_dir=tmp_path)
    prog(x)
    monkeypatch.setattr(THIS, "BIAS", torch.tensor([0.0, 4.0, -1.0, 2.0]))
    close(prog(x), scaled(x.double()))


def test_closure_tensor_written_in_place_is_seen(tmp_path):
    w = torch.randn(4)

    def fn(x):
        return (x * w).softmax(-1)

    x = torch.randn(3, 4)
    prog = neptune_eq.compile(fn, x, cache_dir=tmp_path)
    prog(x)
    w.mul_(3.0)  # same tensor, new values
    close(prog(x), fn(x.double()))
    assert run_of(prog).recaptures == 0  # its values are a program input: nothing to trace again


def test_zero_dim_closure_tensor_written_in_place_recaptures(tmp_path):
    t = torch.tensor(2.0)  # a 0-d tensor is baked into the program as a number

    def fn(x):
        return (x * t).softmax(-1)

    x = torch.randn(3, 4)
    prog = neptune_eq.compile(fn, x, cache_dir=tmp_path)
    prog(x)
    t.fill_(-5.0)
    close(prog(x), fn(x.double()))
    assert run_of(prog).recaptures == 1


def test_score_mod_captured_cap_changed(tmp_path):
    cap = 20.0

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    def eager(q, k, v):
        s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        return torch.softmax(cap * torch.tanh(s / cap), -1) @ v

    q, k, v = (torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(s)) for s in range(3))
    close(neptune_eq.attention(q, k, v, score_mod=softcap, cache_dir=tmp_path), eager(*(a.double() for a in (q, k, v))))
    cap = 0.5  # the same score_mod object: neptune_eq.attention's cache must not reuse the old program
    close(neptune_eq.attention(q, k, v, score_mod=softcap, cache_dir=tmp_path), eager(*(a.double() for a in (q, k, v))))


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act = torch.tanh

    def helper(self, x):
        return x * SCALE  # a global read one method down

    def forward(self, x):
        return self.act(self.helper(x))


def test_guards_cover_module_methods_and_attributes(monkeypatch):
    m, x = Scaled(), randn(3, 4)
    c = capture(m, x)
    monkeypatch.setattr(THIS, "SCALE", 3.0)
    with pytest.raises(StaleCapture, match=r"global 'SCALE' of Scaled\.helper"):
        c.reference(x)
    c = capture(m, x)
    m.act = torch.sigmoid
    with pytest.raises(StaleCapture, match="attribute 'act' of Scaled was rebound"):
        c.reference(x)
    m.layer = torch.nn.Identity()
    close(capture(m, x).reference(x), m(x))


def test_guards_cover_defaults_module_attributes_and_config_objects():
    x = randn(3, 4)

    def with_default(x, s=2.0):
        return x * s

    c = capture(with_default, x)
    with_default.__defaults__ = (3.0,)
    with pytest.raises(StaleCapture, match="default arguments"):
        c.reference(x)

    norm = torch.nn.LayerNorm(4).double()
    c = capture(norm, x)
    norm.eps = 0.5
    with pytest.raises(StaleCapture, match="'eps'"):
        c.reference(x)
    assert capture(norm, x).reference(x).sub(norm(x)).abs().max() < 1e-12

    cfg = types.SimpleNamespace(scale=0.5)

    def configured(x):
        return x * cfg.scale

    c = capture(configured, x)
    cfg.scale = 4.0
    with pytest.raises(StaleCapture, match="'scale'"):
        c.reference(x)


# ---------------------------------------------------------------- arguments written in place


def add_into(x, y):
    x.add_(y)  # the write the issue says was dropped
    return (x * 2).sum(-1)


def test_argument_written_in_place_is_written(tmp_path):
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    prog = neptune_eq.compile(add_into, x.clone(), y, cache_dir=tmp_path)
    mine, theirs = x.clone(), x.clone().double()
    close(prog(mine, y), add_into(theirs, y.double()))
    close(mine, theirs)  # the argument holds the new value, as after eager
    with pytest.raises(CaptureError, match="'x' is written in place and shares memory with argument 'y'"):
        prog(mine, mine)


def test_function_that_only_writes_returns_none(tmp_path):
    def scale_(x):
        x.mul_(2)

    x = torch.randn(3, 4)
    prog = neptune_eq.compile(scale_, x.clone(), cache_dir=tmp_path)
    mine = x.clone()
    assert prog(mine) is None
    close(mine, x * 2)


def test_written_argument_passed_twice_is_refused():
    x = randn(3, 4)
    with pytest.raises(CaptureError, match="'x' is written in place and also passed"):
        capture(add_into, x, x)


def test_writing_into_a_global_tensor_is_refused():
    def fn(x):
        BIAS.add_(x)
        return x

    with pytest.raises(CaptureError, match=r"writing in place into a tensor .* at test_frontend_safety\.py:\d+"):
        capture(fn, torch.randn(4))


# ---------------------------------------------------------------- return structures

Stats = collections.namedtuple("Stats", "total rows")


def structured(x):
    return {"probs": x.softmax(-1), "stats": Stats(x.sum(-1), x.shape[0]), "none": None}


def test_dict_namedtuple_and_constant_leaves_come_back(tmp_path):
    x = torch.randn(3, 4)
    got = neptune_eq.compile(structured, x, cache_dir=tmp_path)(x)
    want = structured(x.double())
    assert isinstance(got, dict) and list(got) == ["probs", "stats", "none"]
    assert type(got["stats"]) is Stats and got["stats"].rows == 3 and got["none"] is None
    close(got["probs"], want["probs"])
    close(got["stats"].total, want["stats"].total)


# ---------------------------------------------------------------- out-of-range targets and indices


def test_cross_entropy_target_out_of_range_raises(tmp_path):
    x = torch.randn(4, 7)
    prog = neptune_eq.compile(lambda x, t: F.cross_entropy(x, t, reduction="none"), x, torch.tensor([3, 0, 6, 2]),
                              cache_dir=tmp_path)
    t = torch.tensor([3, 0, 6, -100])
    close(prog(x, t), F.cross_entropy(x.double(), t, reduction="none"))
    for bad, value in ((torch.tensor([3, 7, 6, 2]), 7), (torch.tensor([3, 0, -1, 2]), -1)):
        with pytest.raises(IndexOutOfRange, match=rf"cross_entropy.*index {value} is out of range: valid indices "
                                                  rf"are \[0, 7\) or ignore_index -100 at test_frontend_safety\.py"):
            prog(x, bad)
        with pytest.raises(IndexError):  # what eager raises
            F.cross_entropy(x, bad)


def test_a_call_needing_gradients_checks_its_indices_too(tmp_path):
    """A training call runs the compiled function's checks (on CUDA replayed from a CUDA graph, not
    evaluated eagerly per call): an out-of-range target still raises, naming the op and the value."""
    x = torch.randn(4, 7)
    prog = neptune_eq.compile(lambda x, t: F.cross_entropy(x, t), x, torch.tensor([3, 0, 6, 2]), cache_dir=tmp_path)
    w = x.clone().requires_grad_()
    prog(w, torch.tensor([3, 0, 6, -100])).backward()
    assert w.grad is not None
    with pytest.raises(IndexOutOfRange, match=r"cross_entropy.*index 9 is out of range"):
        prog(x.clone().requires_grad_(), torch.tensor([3, 9, 6, 2]))


def test_gather_index_out_of_range_raises(tmp_path):
    def fn(x, t):
        return x.gather(-1, t)

    x = torch.randn(3, 5)
    prog = neptune_eq.compile(fn, x, torch.zeros(3, 1, dtype=torch.long), cache_dir=tmp_path)
    t = torch.tensor([[4], [0], [2]])
    close(prog(x, t), fn(x.double(), t))
    with pytest.raises(IndexOutOfRange, match=r"gather: index 5 is out of range: valid indices are \[0, 5\)"):
        prog(x, torch.tensor([[4], [5], [2]]))


def test_advanced_indexing_wraps_negative_indices_and_raises_beyond(tmp_path):
    def fn(x, t):
        return x[torch.arange(x.shape[0]), t]

    x = torch.randn(4, 7)
    prog = neptune_eq.compile(fn, x, torch.tensor([0, 1, 2, 3]), cache_dir=tmp_path)
    t = torch.tensor([1, -1, 3, -7])  # eager counts negative indices from the end
    close(prog(x, t), fn(x.double(), t))
    with pytest.raises(IndexOutOfRange, match=r"index -8 is out of range: valid indices are \[-7, 7\)"):
        prog(x, torch.tensor([1, -8, 3, 0]))


def test_index_select_and_embedding_out_of_range_raise():
    w = randn(5, 3)
    c = capture(lambda w, t: F.embedding(t, w), w, torch.tensor([0, 4]))
    with pytest.raises(IndexOutOfRange, match="embedding: index 5"):
        c.reference(w, torch.tensor([0, 5]))
    c = capture(lambda w, t: w.index_select(0, t), w, torch.tensor([0, 4]))
    with pytest.raises(IndexOutOfRange, match="index_select: index -1"):
        c.reference(w, torch.tensor([-1, 2]))


def test_index_of_axes_alone_is_checked_once_and_wraps():
    x = randn(6, 3)
    check_capture(lambda x: x[torch.arange(6) - 1], x)  # x[-1] first, as eager
    with pytest.raises(CaptureError, match=r"index 6 is out of range: valid indices are \[-6, 6\)"):
        capture(lambda x: x[torch.arange(6) + 1], x)


# ---------------------------------------------------------------- zero-size axes


def test_zero_size_axes_return_what_torch_returns(tmp_path):
    prog = neptune_eq.compile(lambda x: x.sum(-1), torch.randn(3, 0), cache_dir=tmp_path)
    assert torch.equal(prog(torch.randn(3, 0)), torch.zeros(3))  # a sum over nothing is 0
    assert prog(torch.randn(0, 4)).shape == (0,)
    softmax = neptune_eq.compile(lambda x: x.softmax(-1), torch.randn(2, 4), cache_dir=tmp_path)
    assert softmax(torch.randn(0, 4)).shape == (0, 4)  # a zero-size call after a compiled one
    amax = neptune_eq.compile(lambda x: x.amax(-1), torch.randn(2, 0), cache_dir=tmp_path)
    with pytest.raises(ZeroSizeError, match="amax") as info:
        amax(torch.randn(2, 0))
    assert isinstance(info.value, IndexError)  # the kind eager raises
    with pytest.raises(ZeroSizeCapture, match="argument 'x' has shape \\(3, 0\\)"):
        capture(lambda x: x.sum(-1), torch.randn(3, 0))


def test_attention_with_no_keys_gives_zero_and_no_queries_empty(tmp_path):
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 0, 8)
    assert torch.equal(neptune_eq.attention(q, k, k, cache_dir=tmp_path), torch.zeros(1, 2, 3, 8))
    q = torch.randn(1, 2, 0, 8)
    assert neptune_eq.attention(q, torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), cache_dir=tmp_path).shape == (
        1, 2, 0, 8)


# ---------------------------------------------------------------- devices


def test_meta_tensors_are_refused_before_the_interpreter(tmp_path):
    x = torch.randn(3, 4)
    with pytest.raises(NeptuneError, match="argument 'x' is on device 'meta'"):
        neptune_eq.compile(lambda x: x.softmax(-1), x.to("meta"), cache_dir=tmp_path)
    prog = neptune_eq.compile(lambda x, y: (x + y).softmax(-1), x, x + 1, cache_dir=tmp_path)
    with pytest.raises(NeptuneError, match="argument 'y' is on device 'meta'"):
        prog(x, x.to("meta"))
    with pytest.raises(NeptuneError, match="input 'x' is on device 'meta'"):
        prog.program.run({"x": x.to("meta"), "y": x.to("meta")})
    w = torch.randn(4, device="meta")
    with pytest.raises(CaptureError, match=r"cpu and meta.* at test_frontend_safety\.py:\d+"):
        capture(lambda x: x * w, x)


# ---------------------------------------------------------------- diagonal


def test_diagonal_with_offsets_and_dims():
    x, y = randn(4, 6), randn(2, 5, 3, seed=1)

    def fn(x, y):
        return (x.diagonal(), x.diagonal(2), x.diagonal(-1), torch.diagonal(x, 1, 1, 0),
                y.diagonal(0, 1, 2), y.diagonal(offset=-2, dim1=-1, dim2=1), x.diagonal(-3) + 1)

    c = check_capture(fn, x, y)
    assert "diagonal" not in str(c.program)


def test_diagonal_and_prefix_slice_end_to_end(tmp_path):
    def fn(y):  # both read an axis at a shorter one (was a ProgramError "shape mismatch")
        return y.diagonal(1, 1, 2).softmax(-1), y[:, :3] * 2

    y = torch.randn(2, 5, 4)
    for got, want in zip(neptune_eq.compile(fn, y, cache_dir=tmp_path)(y), fn(y.double())):
        close(got, want)


# ---------------------------------------------------------------- cross_entropy and nll_loss reductions


@pytest.mark.parametrize("kwargs", [{}, {"reduction": "sum"}, {"reduction": "mean"}, {"label_smoothing": 0.1},
                                    {"ignore_index": 2}, {"label_smoothing": 0.2, "reduction": "sum"}])
def test_cross_entropy_reductions(kwargs):
    x, t = randn(5, 7), torch.tensor([3, -100, 6, 2, 0] if "ignore_index" not in kwargs else [3, 2, 6, 2, 0])
    check_capture(lambda x, t: F.cross_entropy(x, t, **kwargs), x, t)


def test_nll_loss_reductions_and_edge_cases():
    x, t = randn(5, 7).log_softmax(-1), torch.tensor([3, -100, 6, 2, 0])
    for reduction in ("mean", "sum", "none"):
        check_capture(lambda x, t, r=reduction: F.nll_loss(x, t, reduction=r), x, t)
    everything_ignored = torch.full((5,), -100)
    c = capture(lambda x, t: F.cross_entropy(x, t), x, everything_ignored)
    assert torch.isnan(c.reference(x, everything_ignored))  # 0 / 0, as eager
    check_capture(lambda x, t: F.cross_entropy(x, t), randn(7), torch.tensor(4))  # one row, no batch


@pytest.mark.parametrize("kwargs", [{}, {"reduction": "sum"}, {"reduction": "none"}, {"label_smoothing": 0.2},
                                    {"ignore_index": 2}])
def test_cross_entropy_with_class_weights(kwargs):
    """loss_n = -w[t_n]·logp[n, t_n]; 'mean' divides by the weight of the rows kept (torch's rule)."""
    x, t = randn(5, 7), torch.tensor([3, -100, 6, 2, 0] if "ignore_index" not in kwargs else [3, 2, 6, 2, 0])
    w, held = torch.rand(7, dtype=F64) + 0.5, torch.linspace(0.5, 2, 7, dtype=F64)  # an argument; a closure
    check_capture(lambda x, t, w: F.cross_entropy(x, t, weight=w, **kwargs), x, t, w)
    check_capture(lambda x, t: F.cross_entropy(x, t, weight=held, **kwargs), x, t)


def test_cross_entropy_over_extra_dims():
    """(N, C, d1[, d2]) logits: torch's nll_loss2d, traced as its math, weights and ignore_index included."""
    w = torch.rand(5, dtype=F64) + 0.5
    for shape in ((2, 5, 3), (2, 5, 3, 4)):
        x, t = randn(*shape), torch.randint(0, 5, (shape[0], *shape[2:]), generator=torch.Generator().manual_seed(0))
        t.view(-1)[1] = -100
        for kwargs in ({}, {"weight": w}, {"weight": w, "reduction": "sum"}, {"reduction": "none"}):
            check_capture(lambda x, t, kw=kwargs: F.cross_entropy(x, t, **kw), x, t)


def test_cross_entropy_mean_end_to_end(tmp_path):
    x, t = torch.randn(6, 9), torch.tensor([3, -100, 8, 2, 0, 5])
    prog = neptune_eq.compile(lambda x, t: F.cross_entropy(x, t), x, t, cache_dir=tmp_path)
    close(prog(x, t), F.cross_entropy(x.double(), t))


# ---------------------------------------------------------------- CUDA: the bound-launch fast path does the same

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the launch fast path runs on CUDA")


@cuda
def test_cuda_fast_path_follows_guards_checks_and_writes(tmp_path, monkeypatch):
    w = torch.randn(16, device="cuda")  # a closure tensor: written in place below

    def fn(x, t):
        x.mul_(SCALE)
        return F.cross_entropy(x * w, t, reduction="none")

    x, t = torch.randn(8, 16, device="cuda"), torch.randint(0, 16, (8,), device="cuda")
    prog = neptune_eq.compile(fn, x.clone(), t, cache_dir=tmp_path)

    def agree():
        mine, theirs = x.clone(), x.clone()  # eager in float32 on the GPU is the reference here
        close(prog(mine, t), fn(theirs, t))
        close(mine, theirs)

    for _ in range(3):  # the later calls take the bound launches
        agree()
    assert any(bound is not None for _, bound in run_of(prog)._bound.values())
    w.mul_(3.0)
    agree()
    monkeypatch.setattr(THIS, "SCALE", 3.0)
    agree()
    assert run_of(prog).recaptures == 1


@cuda
def test_mixed_devices_are_refused(tmp_path):
    x = torch.randn(3, 4, device="cuda")
    prog = neptune_eq.compile(lambda x, y: (x + y).softmax(-1), x, x, cache_dir=tmp_path)
    with pytest.raises(NeptuneError, match="argument 'y' is on device 'cpu' but argument 'x' is on 'cuda:0'"):
        prog(x, x.cpu())


@cuda
def test_out_of_range_target_on_cuda_stops_with_a_device_assert(tmp_path):
    code = f"""
import torch, torch.nn.functional as F, neptune_eq
x, t = torch.randn(4, 7, device="cuda"), torch.tensor([3, 0, 6, 2], device="cuda")
prog = neptune_eq.compile(lambda x, t: F.cross_entropy(x, t, reduction="none"), x, t, cache_dir={str(tmp_path)!r})
prog(x, t)
torch.cuda.synchronize()
print("valid ok", flush=True)
prog(x, torch.tensor([3, 0, 7, 2], device="cuda"))
torch.cuda.synchronize()
print("no assert")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "valid ok" in run.stdout and "no assert" not in run.stdout
    assert "device-side assert" in run.stderr



@pytest.mark.parametrize("dynamic", [False, True])
def test_a_function_no_file_holds_is_never_located_in_neptune_eqs_own_code(dynamic):
    """A function defined by exec (python -c, a notebook) has no line to name: an index error says the
    op and the value alone. It had named the next frame out, neptune_eq's own (`at api.py:207: captured
    = capture(...)`)."""
    scope = {}
    exec("import torch.nn.functional as F\ndef f(x, t):\n    return F.cross_entropy(x, t)\n", scope)
    x, t = torch.randn(9, 7), torch.randint(0, 7, (9,))
    prog = neptune_eq.compile(scope["f"], x, t, dynamic=dynamic)
    with pytest.raises(IndexOutOfRange, match=r"cross_entropy.*index 7 is out of range") as err:
        prog(x, torch.where(torch.arange(9) == 4, 7, t))
    assert ".py" not in str(err.value), str(err.value)

@cuda
@pytest.mark.parametrize("fresh", [False, True])
def test_a_replayed_range_check_still_stops_on_a_bad_target_written_in_place(tmp_path, fresh):
    """The index checks' device work is replayed from a CUDA graph after a layout's second call
    (lower/replay.py), on its own copy of the targets: a bad value written into the same tensor, or
    passed in a fresh one, is still caught."""
    bad = ('prog(x, torch.tensor([3, 0, 7, 2], device="cuda"))' if fresh else
           't.copy_(torch.tensor([3, 0, 7, 2]))\nprog(x, t)')
    code = f"""
import torch, torch.nn.functional as F, neptune_eq
x, t = torch.randn(4, 7, device="cuda"), torch.tensor([3, 0, 6, 2], device="cuda")
prog = neptune_eq.compile(lambda x, t: F.cross_entropy(x, t, reduction="none"), x, t, cache_dir={str(tmp_path)!r})
for _ in range(4):
    prog(x, t)
torch.cuda.synchronize()
(variant,) = prog.variants.values()
assert variant.run._checks.recorded == 1, variant.run._checks.recorded
for _ in range(3):  # fresh targets each call (a training loop's batches): the same graph, on its own copy
    prog(x, torch.tensor([3, 0, 6, 2], device="cuda"))
torch.cuda.synchronize()
assert variant.run._checks.recorded == 1, variant.run._checks.recorded
print("valid ok", flush=True)
{bad}
torch.cuda.synchronize()
print("no assert")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "valid ok" in run.stdout and "no assert" not in run.stdout, run.stderr[-2000:]
    assert "device-side assert" in run.stderr


@cuda
def test_a_dynamic_functions_training_replays_its_label_check_and_still_stops_on_a_bad_label(tmp_path):
    """A dynamic function's calls replay their index checks from a CUDA graph per layout too (its
    training step had evaluated the causal-LM loss's label check eagerly each call: 0.55 ms of host,
    H200, session 54): fresh labels every step replay the same graph, and a bad label is still caught."""
    code = f"""
import torch, torch.nn.functional as F, neptune_eq
def loss(logits, labels):
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
x = torch.randn(2, 9, 7, device="cuda")
prog = neptune_eq.compile(loss, x, torch.randint(0, 7, (2, 9), device="cuda"), dynamic=True,
                          cache_dir={str(tmp_path)!r})
x = torch.randn(2, 12, 7, device="cuda", requires_grad=True)
for _ in range(5):
    prog(x, torch.randint(0, 7, (2, 12), device="cuda")).backward()
torch.cuda.synchronize()
assert prog.family._checks.recorded == 1, prog.family._checks.recorded
print("valid ok", flush=True)
bad = torch.randint(0, 7, (2, 12), device="cuda")
bad[1, 5] = 7
prog(x, bad).backward()
torch.cuda.synchronize()
print("no assert")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "valid ok" in run.stdout and "no assert" not in run.stdout, run.stderr[-2000:]
    assert "device-side assert" in run.stderr


# ---------------------------------------------------------------- guards the review found missing


class Softcap:
    def __init__(self, cap):
        self.cap = cap

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.cap * torch.tanh(score / self.cap)


class Config:
    scale = 2.0

    def __init__(self):
        self.inner = types.SimpleNamespace(s=3.0)


CFG = Config()
ZERO = 0.0


def test_callable_object_class_attribute_and_nested_attribute(tmp_path):
    q, k, v = (torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(s)) for s in range(3))
    sm = Softcap(20.0)

    def eager(q, k, v):
        s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        return torch.softmax(sm.cap * torch.tanh(s / sm.cap), -1) @ v

    close(neptune_eq.attention(q, k, v, score_mod=sm, cache_dir=tmp_path), eager(*(a.double() for a in (q, k, v))))
    sm.cap = 0.5  # a field of a callable object
    close(neptune_eq.attention(q, k, v, score_mod=sm, cache_dir=tmp_path), eager(*(a.double() for a in (q, k, v))))

    def fn(x):
        return (x * Config.scale * CFG.inner.s).softmax(-1)

    x = torch.randn(3, 4)
    prog = neptune_eq.compile(fn, x, cache_dir=tmp_path)
    close(prog(x), fn(x.double()))
    Config.scale = 5.0  # a class attribute
    close(prog(x), fn(x.double()))
    CFG.inner.s = 0.25  # an attribute of an attribute
    close(prog(x), fn(x.double()))
    Config.scale = 2.0



def test_a_scale_changed_to_negative_zero_is_not_the_old_zero(tmp_path, monkeypatch):
    def signed(x):
        return torch.sigmoid(x / ZERO)

    x = torch.randn(3, 4)
    prog = neptune_eq.compile(signed, x, cache_dir=tmp_path)
    assert torch.equal(prog(x), signed(x))
    monkeypatch.setattr(THIS, "ZERO", -0.0)  # 0.0 == -0.0, but x / -0.0 flips every sign
    with pytest.raises(NeptuneError, match=r"-0\.0"):  # re-captured, and -0.0 is refused, never stale
        prog(x)


def test_tensor_given_other_storage_is_seen(tmp_path):
    w = torch.randn(4)

    def fn(x):
        return (x * w).softmax(-1)

    x = torch.randn(3, 4)
    prog = neptune_eq.compile(fn, x, cache_dir=tmp_path)
    close(prog(x), fn(x.double()))
    w.data = torch.randn(4)  # the same object and version, other storage
    close(prog(x), fn(x.double()))


def test_nan_static_argument_and_tensors_inside_a_static_argument(tmp_path):
    x = torch.randn(3, 4)

    def fn(x, c):
        return (x + c).softmax(-1) if c == c else x.softmax(-1)

    prog = neptune_eq.compile(fn, x, float("nan"), cache_dir=tmp_path)
    assert torch.allclose(prog(x, float("nan")), fn(x, float("nan")))  # the same NaN on the next call
    with pytest.raises(CaptureError, match="holding tensors"):
        neptune_eq.compile(lambda x, ws: (x * ws[0]).softmax(-1), x, [torch.randn(4)], cache_dir=tmp_path)


BIG = {f"k{i}": float(i) for i in range(100)}


def test_large_container_is_said_to_be_guarded_by_identity_only(tmp_path):
    with pytest.warns(NeptuneWarning, match="guarded by identity only"):
        neptune_eq.compile(lambda x: (x * BIG["k3"]).softmax(-1), torch.randn(3, 4), cache_dir=tmp_path)


def softmax_of(t):
    """A global whose name is also an attribute the function below reads (`torch.softmax_of` does not
    exist; `x.softmax_of` is never called): it must not be scanned as a global of that function."""
    return BIG


def test_an_attribute_named_like_a_global_is_no_global_read(tmp_path):
    """`F.pad` in a module that also has a function `pad` made the environment scan read that function's
    globals (a 100-entry dict: a spurious 'guarded by identity only' warning): attribute names are not
    global reads. Only LOAD_GLOBAL names are scanned."""
    import warnings

    class Holder:
        softmax_of = staticmethod(lambda x: x.softmax(-1))

    h = Holder()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeptuneWarning)
        prog = neptune_eq.compile(lambda x: h.softmax_of(x * 2), torch.randn(3, 4), cache_dir=tmp_path)
    x = torch.randn(3, 4)
    assert torch.allclose(prog(x), (x * 2).softmax(-1))
    assert softmax_of(x) is BIG


def test_a_module_methods_attributes_are_guarded_eagerly_and_under_torch_compile():
    """neptune_eq.compile(self.core) reading self.tau: an annealed temperature changed between calls
    was not seen (a module method's owner was not scanned) — the old value, silently, also under
    torch.compile (no dynamo guard on a value only the captured program reads)."""
    x = torch.randn(3, 8)
    m = Annealed()
    m.f(x)
    m.tau = 1.0
    close(m.f(x), m.core(x))
    m2 = Annealed()
    cm = torch.compile(m2, backend="aot_eager")
    with torch.no_grad():
        close(cm(x), m2.core(x))
        m2.tau = 0.4
        close(cm(x), m2.core(x))
