"""A program with many reductions whose fused plan policies take the whole enumeration room with covers
that are all refused still gets the unfused plan (which always exists): the backward of a pre-norm
block's scores, every input requiring grad, had "no executable plan found" (21 sums over 5 axes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import assert_gradients_match


def test_a_pre_norm_scores_backward_with_every_input_requiring_grad():
    def scores(x, wq, wk, g):
        h = F.rms_norm(x, (x.shape[-1],), g)
        return torch.softmax((h @ wq) @ (h @ wk).transpose(-1, -2), -1)

    xs = [torch.randn(2, 7, 12), 0.3 * torch.randn(12, 12), 0.3 * torch.randn(12, 12), torch.randn(12)]
    assert_gradients_match(scores, xs, atol=1e-4)
