"""Calls of a compiled function that torch.compile traces (session 51's hunt): every call is served
or refused by name, never answered by another signature's op. Interpreter, tiny shapes."""

import pytest
import torch

import neptune_eq


def softmax(x):
    return torch.softmax(x, -1)


def tempered(x, t):
    return torch.softmax(x / t, -1)


def test_the_backward_ops_are_registered_with_the_training_op(tmp_path):
    """The backward op was registered when AOTAutograd traced the backward. A warm inductor cache (any
    process after the first) replays a compiled backward without tracing it, calling its op by name:
    torch.compile training failed there (AttributeError: no attribute '..._saved_backward'). The
    training op now registers every backward op its graphs may name with it."""
    prog = neptune_eq.compile(lambda x: torch.softmax(x, -1).pow(2).sum(-1), torch.randn(4, 8), cache_dir=tmp_path)
    train = prog.library_ops()["training"].name()  # registers the training op; no backward has run
    lib, name = train.split("::")
    base = name.removesuffix("_train")
    assert all(hasattr(getattr(torch.ops, lib), f"{base}_{mode}_backward") for mode in ("saved", "recompute"))
