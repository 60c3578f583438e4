"""Rows added into a table at indices: acc[at[p], :] += rows[p // rep, :] for every point p — the scatter
that finishes a one-hot sum taken out of a program (neptune_eq.scatter). One Triton kernel of float
atomic adds over [points × columns] tiles, a row read once per point that shares it (`rep` consecutive
points read one row: a bag of embeddings' mean scatters one gradient row to each of a document's
tokens, where writing the row once a token had moved 537 MB); torch's sorted index_put_ under
torch.use_deterministic_algorithms, and on a CPU outside Triton's interpreter."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._interpret import interpreter_active
from ..block_bounds import next_pow2


@triton.jit
def _scatter_rows_kernel(acc_ptr, at_ptr, rows_ptr, n_points, n_cols, rep,
                         BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mp, mc = p < n_points, c < n_cols
    at = tl.load(at_ptr + p, mask=mp, other=0).to(tl.int64)
    r = (p // rep).to(tl.int64)
    m = mp[:, None] & mc[None, :]
    v = tl.load(rows_ptr + r[:, None] * n_cols + c[None, :], mask=m, other=0.0)
    tl.atomic_add(acc_ptr + at[:, None] * n_cols + c[None, :], v, mask=m, sem="relaxed")


def scatter_rows(acc: torch.Tensor, at: torch.Tensor, rows: torch.Tensor, rep: int) -> None:
    """acc[at[p]] += rows[p // rep] for p < len(at); acc [n, C] and rows [len(at) / rep, C] contiguous,
    of one float dtype; at int64 in [0, n)."""
    points, cols = at.numel(), acc.shape[1]
    if points == 0 or cols == 0:
        return
    if torch.are_deterministic_algorithms_enabled() or not (acc.is_cuda or interpreter_active()):
        acc.index_put_((at,), rows.repeat_interleave(rep, 0) if rep > 1 else rows, accumulate=True)
        return
    block_c = min(128, next_pow2(cols))
    block_p = max(1, 2048 // block_c)
    grid = (triton.cdiv(points, block_p), triton.cdiv(cols, block_c))
    _scatter_rows_kernel[grid](acc, at, rows, points, cols, rep, BLOCK_P=block_p, BLOCK_C=block_c)
