"""A compile a time budget cut short depends on how loaded the host was: it serves its process but is
not written to the disk cache, where a later compile on an idle host would read the cut plans back
(session 56: kl_rows lost its split-K phase to the 20 s budget on a busy 2-core host)."""

from __future__ import annotations

import torch

import neptune_eq
from neptune_eq.saturate import Budget


def _entries(d) -> list:
    return sorted(p.name for p in (d / "programs").glob("*.json")) if (d / "programs").exists() else []


def causal(q, k, v):
    s = q @ k.transpose(-1, -2)
    keep = torch.arange(s.shape[-1])[None, :] <= torch.arange(s.shape[-2])[:, None]
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def test_a_compile_cut_by_the_time_budget_stays_out_of_the_disk_cache(tmp_path):
    q, k, v = (torch.randn(1, 24, 8) for _ in range(3))
    cut = neptune_eq.compile(causal, q, k, v, cache_dir=tmp_path / "cut", budget=Budget(max_seconds=1e-3))
    assert torch.allclose(cut(q, k, v), causal(q, k, v), atol=1e-5)
    assert any("time budget" in n or "max_seconds" in n for n in cut.program.compilation.budget_notes)
    assert _entries(tmp_path / "cut") == []
    whole = neptune_eq.compile(causal, q, k, v, cache_dir=tmp_path / "whole")
    whole(q, k, v)
    assert len(_entries(tmp_path / "whole")) == 1
