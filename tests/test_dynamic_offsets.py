"""Dynamic lengths through axes a constant shorter than a length (`x[:, 1:] - x[:, :-1]`,
`logits[:, :-1]` against `labels[:, 1:]`: frontend/offsets.py), checked against eager float64 at
lengths other than the example's: cases found by a hunt for wrong answers (CPU interpreter)."""

from __future__ import annotations

import torch

import neptune_eq


def _close(out, ref, tol=1e-10):
    assert out.shape == ref.shape
    assert (out.double() - ref.double()).abs().max().item() < tol


def test_a_mean_over_a_padded_axis_divides_by_its_own_length():
    """(x[:, 1:] - x[:, :-1]).mean(1): the sum over j (extent L - 1) is padded to L and masked, but
    the mean's divisor len(j) was left as it was, and became L: every length, the example's too, was
    off by (L - 1) / L. std's n - 1 likewise. len(j) of a padded axis is len(i) - 1."""
    for fn in (lambda x: (x[:, 1:] - x[:, :-1]).mean(1), lambda x: (x[:, 1:] - x[:, :-1]).std(1)):
        prog = neptune_eq.compile(fn, torch.randn(2, 9, 3, dtype=torch.float64), dynamic=True)
        assert prog.family.lengths.offsets
        for n in (9, 3, 17):
            x = torch.randn(2, n, 3, dtype=torch.float64)
            _close(prog(x), fn(x))
