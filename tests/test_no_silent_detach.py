"""Issue 13, item 3: a call that needs gradients is refused at the forward call, naming the inputs,
never answered with a result cut from the autograd graph (no backward is derived yet)."""

from __future__ import annotations

import pytest
import torch

import neptune_eq
from neptune_eq.runtime import NoBackward


def softmax_mm(x, w):
    return torch.softmax(x, -1) @ w


def test_an_input_that_requires_grad_is_refused_by_name():
    x, w = torch.randn(4, 64), torch.randn(64, 8)
    prog = neptune_eq.compile(softmax_mm, x, w)
    with pytest.raises(NoBackward, match=r"softmax_mm: input 'x' requires grad.*no backward"):
        prog(x.requires_grad_(), w)
    with torch.no_grad():
        got = prog(x, w)
    with torch.inference_mode():
        prog(x, w)
    assert not got.requires_grad
    assert torch.allclose(prog(x.detach(), w), softmax_mm(x.detach(), w), atol=1e-5)


def test_a_parameter_read_from_the_environment_is_named():
    bias = torch.nn.Parameter(torch.randn(64))

    def biased_softmax(x):
        return torch.softmax(x + bias, -1)

    x = torch.randn(4, 64)
    prog = neptune_eq.compile(biased_softmax, x)
    with pytest.raises(NoBackward, match="requires grad") as err:
        prog(x)
    assert "'x'" not in str(err.value)  # only the parameter needs a gradient
    with torch.no_grad():
        assert torch.allclose(prog(x), biased_softmax(x), atol=1e-6)


def test_attention_refuses_a_query_that_requires_grad():
    q, k, v = (torch.randn(1, 2, 32, 16) for _ in range(3))
    neptune_eq.attention(q, k, v)  # compiled once
    with pytest.raises(NoBackward, match="'q' requires grad"):
        neptune_eq.attention(q.requires_grad_(), k, v)


def test_torch_compile_refuses_at_the_forward_call():
    x, w = torch.randn(4, 64), torch.randn(64, 8)
    prog = neptune_eq.compile(softmax_mm, x, w)
    prog(x, w)
    model = torch.compile(lambda x, w: prog(x, w) * 2, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="derives no backward yet"):
        model(x.clone().requires_grad_(), w)
    torch._dynamo.reset()
    assert torch.allclose(model(x, w), 2 * softmax_mm(x, w), atol=1e-5)
