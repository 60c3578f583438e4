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
    with pytest.raises(NeptuneError, match="torch.func transform"):
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
