"""bench/handwritten.py: the issue's hand-written FlashAttention baseline (timed beside ours on the
GPU) must compute attention; checked here through Triton's interpreter against float64."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from handwritten import handwritten


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors need the interpreter, off on a GPU machine")
@pytest.mark.parametrize("causal", [False, True])
def test_handwritten_baseline_matches_float64(causal):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 128, 32, generator=g).half() for _ in range(3))
    out = handwritten(q, k, v, causal, 32, 16, 4, 2)
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(32)
    if causal:
        s = s.masked_fill(torch.ones(128, 128, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ v.double()
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-3
