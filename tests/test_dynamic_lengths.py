"""Dynamic lengths (issue 14) the kernels must be able to take, and outputs that must move with them:
cases found by a hunt for wrong answers and crashes on the dynamic path (session 53, CPU interpreter)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq.frontend.dynamic import NotDynamic


def _close(out, ref, tol=1e-12):
    assert out.shape == ref.shape
    assert (out.double() - ref).abs().max().item() < tol


def test_an_axis_no_input_reads_keeps_its_group_static():
    """`torch.ones(L, L).tril()` (or two aranges of L) gives an axis of the rows' example length that
    no input reads. The two had been made one dynamic group, and every call, even at the example's
    length, raised "dynamic axis 'e' is read by no input": the kernels cannot know its length. Such a
    group stays static (a compile per length, each correct)."""
    def ones_tril(x):
        L = x.shape[0]
        return x * torch.ones(L, L, dtype=x.dtype).tril().sum(1, keepdim=True)

    def arange_band(x):
        L = x.shape[0]
        band = torch.arange(L)[:, None] - torch.arange(L)[None] <= 40 - L
        return x * band.to(x.dtype).sum(1, keepdim=True)

    for fn in (ones_tril, arange_band):
        prog = neptune_eq.compile(fn, torch.randn(20, 4, dtype=torch.float64), dynamic=True)
        for n in (20, 3, 33):
            y = torch.randn(n, 4, dtype=torch.float64)
            _close(prog(y), fn(y))
        with pytest.raises(NotDynamic, match="read by no input"):
            neptune_eq.compile(fn, torch.randn(20, 4, dtype=torch.float64), dynamic={0: [0]})


def test_an_output_flattening_a_length_keeps_only_that_axis_static():
    """x.reshape(-1) of x [L, 4] has 4L values: with dynamic=True the whole compile had been refused
    (NotDynamic from the output check, after every axis was resolved). That axis now stays static
    and the others stay dynamic; named, it is refused saying why."""
    def f(x, y):
        return x.reshape(-1) * 2, y.sum(0)

    x = torch.randn(20, 4, dtype=torch.float64)
    prog = neptune_eq.compile(f, x, torch.randn(20, 3, dtype=torch.float64), dynamic=True)
    assert len(prog.family.lengths.groups) == 1  # y's rows
    for n in (2, 17, 33):
        y = torch.randn(n, 3, dtype=torch.float64)
        for got, want in zip(prog(x, y), f(x, y)):
            _close(got, want)
    assert prog.stats()["signatures"] == 0
    with pytest.raises(NotDynamic, match="output's shape depends on it"):
        neptune_eq.compile(lambda x: x.reshape(-1) * 2, x, dynamic={0: [0]})


def test_an_index_reading_a_length_is_checked_at_capture():
    """x[(arange(L) + 1) % L] (a roll written as a gather): with symbolic lengths the index reads
    len(axis), which the capture's range check evaluated without that axis (KeyError: the dynamic
    compile crashed; the static one worked). The gather keeps its axis static, each length correct."""
    def rolled(x):
        return x[(torch.arange(x.shape[0]) + 1) % x.shape[0]]

    prog = neptune_eq.compile(rolled, torch.randn(20, 4, dtype=torch.float64), dynamic=True)
    for n in (20, 2, 17):
        y = torch.randn(n, 4, dtype=torch.float64)
        _close(prog(y), rolled(y))


def test_the_probes_at_other_lengths_warn_nothing():
    """A dynamic compile captures the function again at lengths it picks, one input's batch moved and
    not another's (y's, which no output reads): F.l1_loss of the two then warned of "a target size that
    is different to the input size" twice, about sizes the user never passed (extended fuzz seed 13).
    What torch warns of there is not the user's to read; the example's own trace still warns as torch
    would."""
    import warnings

    def fn(x, y):
        t0 = F.l1_loss(x, y)  # noqa: F841  (unused, as the fuzzer wrote it: traced all the same)
        return F.normalize(x.mean((-2, -1), keepdim=True), dim=-1)

    x, y = torch.randn(2, 7, 4), torch.randn(2, 7, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = neptune_eq.compile(fn, x, y, dynamic=True)
    assert not [w for w in caught if "target size" in str(w.message)], [str(w.message) for w in caught]
    x, y = torch.randn(2, 10, 4), torch.randn(2, 10, 4)
    assert torch.allclose(prog(x, y), fn(x, y), atol=1e-5)
