"""How compiled functions are called inside training code (session 55's hunt): torch.func transforms,
tensors made under inference mode, autocast, keyword arguments. Each either works as eager does, or
raises a NeptuneError naming the cause (interpreter, tiny shapes, float64 references)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq import NeptuneError


def lse(x, w):
    return torch.logsumexp(x * w, -1)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_a_torch_func_transform_is_refused_naming_it(transform):
    x, w = torch.randn(4, 16), torch.randn(16)
    prog = neptune_eq.compile(lse, x, w)
    with pytest.raises(NeptuneError, match=r"torch\.func transform"):
        if transform == "grad":
            torch.func.grad(lambda x: prog(x, w).sum())(x)
        else:
            torch.vmap(lambda x: prog(x, w))(torch.randn(3, 4, 16))


def test_a_teacher_made_under_inference_mode_trains_the_student():
    """Distillation with teacher logits from torch.inference_mode(): torch refuses to save an inference
    tensor for backward, which the training op did with its inputs (a RuntimeError)."""
    def kd(s, t):
        return F.kl_div(F.log_softmax(s / 2, -1), F.softmax(t / 2, -1), reduction="batchmean") * 4
    s = torch.randn(8, 40)
    with torch.inference_mode():
        teacher = torch.randn(8, 40) * 2
    prog = neptune_eq.compile(kd, s, teacher.clone())
    ours, ref = s.clone().requires_grad_(), s.double().requires_grad_()
    prog(ours, teacher).backward()
    kd(ref, teacher.double()).backward()
    assert torch.allclose(ours.grad.double(), ref.grad, atol=1e-6)


def test_the_autocast_state_is_part_of_a_calls_signature():
    """A capture records autocast's casts: compiled outside bf16 autocast and called inside it, the call
    ran in float32 (eager: bf16); compiled inside and called outside, it ran in bf16, silently 3e4 times
    further from float64 than eager. Each state is now a signature of its own, also for dynamic lengths."""
    def g(x, w):
        return torch.log_softmax(x @ w, -1)
    x, w = torch.randn(8, 32), torch.randn(32, 40) / 6
    ref = g(x.double(), w.double())
    for dynamic in (None, True):
        prog = neptune_eq.compile(g, x, w, dynamic=dynamic)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inside, eager = prog(x, w), g(x, w)
        outside = prog(x, w)
        assert inside.dtype == eager.dtype == torch.bfloat16
        assert (inside.double() - ref).abs().max() < 0.05
        assert outside.dtype == torch.float32 and (outside.double() - ref).abs().max() < 1e-5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prog = neptune_eq.compile(g, x, w)
    out = prog(x, w)
    assert out.dtype == torch.float32 and (out.double() - ref).abs().max() < 1e-5


def test_a_number_tensor_written_without_its_version_is_seen():
    """A 0-d temperature is baked into the program and guarded by its version counter, which
    `tau.data.fill_()` and a write through numpy's view of its memory leave alone: the next call kept the
    old value (error 0.6). A CPU number's value is compared too."""
    import numpy as np

    x = torch.randn(4, 16)
    tau = torch.tensor(1.0)
    prog = neptune_eq.compile(lambda x: torch.softmax(x / tau, -1), x)
    prog(x)
    tau.data.fill_(0.25)
    assert torch.allclose(prog(x).double(), torch.softmax(x.double() / 0.25, -1), atol=1e-6)
    arr = np.array(2.0, dtype=np.float32)
    s = torch.from_numpy(arr)
    prog = neptune_eq.compile(lambda x: torch.softmax(x * s, -1), x)
    prog(x)
    arr[...] = 5.0
    assert torch.allclose(prog(x).double(), torch.softmax(x.double() * 5.0, -1), atol=1e-6)


class _Schedule:
    def __init__(self):
        self.step = 0

    def temp(self):
        return 2.0 / (1 + self.step)

    @property
    def T(self):
        return 2.0 / (1 + self.step)


SCHEDULE = _Schedule()


@pytest.mark.parametrize("read", ["method", "property"])
def test_a_schedule_read_through_a_method_or_property_is_guarded(read):
    """x / sched.temp() and x / sched.T read sched.step inside the method: the attributes fn's code
    names were guarded, not those its methods read, and an advanced schedule kept its first value."""
    def f(x):
        return torch.softmax(x / (SCHEDULE.temp() if read == "method" else SCHEDULE.T), -1)
    x = torch.randn(4, 8)
    SCHEDULE.step = 0
    prog = neptune_eq.compile(f, x)
    prog(x)
    SCHEDULE.step = 5
    assert torch.allclose(prog(x).double(), torch.softmax(x.double() / (2.0 / 6), -1), atol=1e-6)
