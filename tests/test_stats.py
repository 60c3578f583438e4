"""Compiled.stats(): a user can see what a call cost — captures, compiles, cache hits, calls (issue 14
asks for it so that "nothing recompiled" can be checked; today a new length is a new signature)."""

from __future__ import annotations

import torch

import neptune_eq


def test_stats_count_captures_compiles_and_calls(tmp_path):
    def softmax(x):
        return torch.softmax(x, -1)

    x = torch.randn(4, 33)
    prog = neptune_eq.compile(softmax, x, cache_dir=tmp_path)
    assert prog.stats() == {"captures": 1, "compiles": 1, "cache_hits": 0, "calls": 0, "signatures": 1}
    prog(x)
    prog(torch.randn(4, 33))
    assert prog.stats()["calls"] == 2 and prog.stats()["captures"] == 1  # same signature: nothing new
    prog(torch.randn(4, 40))  # a new length is captured and compiled again
    assert prog.stats() == {"captures": 2, "compiles": 2, "cache_hits": 0, "calls": 3, "signatures": 2}
    again = neptune_eq.compile(softmax, torch.randn(4, 40), cache_dir=tmp_path)
    assert again.stats()["compiles"] == 0 and again.stats()["cache_hits"] == 1


def test_a_changed_environment_counts_as_a_capture(tmp_path):
    scale = [2.0]

    def scaled(x):
        return torch.softmax(x * scale[0], -1)

    x = torch.randn(3, 8)
    prog = neptune_eq.compile(scaled, x, cache_dir=tmp_path)
    prog(x)
    scale[0] = 3.0  # read from the environment: the next call captures again
    out = prog(x)
    assert torch.allclose(out, torch.softmax(x * 3.0, -1), atol=1e-6)
    assert prog.stats()["captures"] == 2 and prog.stats()["calls"] == 2
