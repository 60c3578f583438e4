"""A causal language model's loss at every length (issue 14): `logits[:, :-1]` against `labels[:, 1:]`
sums over an axis one shorter than the sequence, padded to it (frontend/offsets.py), so one compile
serves every length ≥ 3 — eager, with gradients, under torch.compile; the index checks are run over
each call's positions."""

from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq.frontend import offsets as padding
from neptune_eq.frontend.capture import capture
from neptune_eq.frontend.checks import IndexOutOfRange
from neptune_eq.frontend.symsizes import SizeTrace, restricting
from neptune_eq.reference import evaluate

V = 11


def causal_lm_loss(logits, labels):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def _batch(b: int, n: int, *, grad: bool = False):
    x = torch.randn(b, n, V, dtype=torch.float64, requires_grad=grad)
    y = torch.randint(0, V, (b, n))
    y[0, -1] = -100  # (an ignored position)
    return x, y


@pytest.fixture(scope="module")
def lm_loss():
    torch.manual_seed(0)
    return neptune_eq.compile(causal_lm_loss, *_batch(2, 9), dynamic=True)


def test_the_shifted_axis_is_padded_to_the_sequence_and_moves_with_it(lm_loss):
    lengths = lm_loss.family.lengths
    seq = next(g for g in lengths.groups if len(g) > 1)
    (offset,) = lengths.offsets
    assert offset.axis in seq and offset.source in seq and offset.by == 1
    assert lengths.least[lengths.groups.index(seq)] == 3  # (at 2 the slice has length 1: another program)
    text = lm_loss.family.captured.program.text()
    assert f"{offset.axis} < len({offset.source}) - 1" in text  # the mask of the padded step
    assert f"min2({offset.axis} + 1, len(" in text  # the shifted read, clamped


def test_one_compile_serves_every_length_of_a_bucket(lm_loss):
    for b, n in ((2, 9), (3, 5), (2, 16), (4, 3)):
        x, y = _batch(b, n)
        torch.testing.assert_close(lm_loss(x, y), causal_lm_loss(x, y), rtol=1e-9, atol=1e-12)
    stats = lm_loss.stats()
    assert stats["compiles"] + stats["cache_hits"] == 1 and stats["signatures"] == 0
    x, y = _batch(2, 2)  # (the slice has length 1 there: a compile of its own)
    torch.testing.assert_close(lm_loss(x, y), causal_lm_loss(x, y), rtol=1e-9, atol=1e-12)
    assert lm_loss.stats()["signatures"] == 1


def test_gradients_at_new_lengths(lm_loss):
    for b, n in ((3, 7), (2, 12)):
        x, y = _batch(b, n, grad=True)
        lm_loss(x, y).backward()
        want = x.detach().clone().requires_grad_()
        causal_lm_loss(want, y).backward()
        torch.testing.assert_close(x.grad, want.grad, rtol=1e-9, atol=1e-12)


def test_labels_are_checked_where_the_loss_reads_them(lm_loss):
    """At a new length the check reads positions 1..L-1 of the labels (eager reads those and raises
    there), not the capture's 1..8, and not position 0, which the loss never reads."""
    x, y = _batch(2, 13)
    y[1, 0] = 99
    torch.testing.assert_close(lm_loss(x, y), causal_lm_loss(x, y), rtol=1e-9, atol=1e-12)
    y[1, 0], y[1, 12] = 3, 99
    with pytest.raises(IndexOutOfRange, match="index 99"):
        lm_loss(x, y)


def test_padding_keeps_the_program_at_its_extents():
    x, y = _batch(2, 9)
    c = capture(causal_lm_loss, x, y, merge=False, symbolic_lengths=True)
    (seq,) = {a for a, n in c.program.axes.items() if n == 8}
    symbol_axes = {s: c.program.inputs[name].axes[d] for (pos, d), s in c.size_of.items()
                   for name in [("logits", "labels")[pos]]}
    offsets = padding.shorter(c, symbol_axes, set(c.program.axes))
    assert [o.axis for o in offsets] == [seq] and offsets[0].by == 1
    padded = padding.pad(c, offsets).program
    assert padded.axes[seq] == 9
    inputs = {"logits": x, "labels": y}
    torch.testing.assert_close(evaluate(padded, inputs)["out0"], evaluate(c.program, inputs)["out0"])
    assert padding.pad(c, ()) is c
    assert padding.shorter(c, symbol_axes, set()) == ()  # (only axes shorter than a candidate)
    assert offsets[0] == padding.Offset(seq, offsets[0].source, 1) and padded.axes[offsets[0].source] == 9


def test_a_test_of_two_arguments_lengths_on_one_axis_is_proved_moving_them_together():
    """cross_entropy's `B·L == B'·L'` (logits' rows against the labels') holds wherever the two batch
    sizes are one dynamic group's length: proved with them as one, not as two free sizes."""
    b0, b1, n0, n1 = sympy.symbols("s0 s1 s2 s3", integer=True, positive=True)
    test = sympy.Eq(b0 * n0, b1 * n1)
    trace = SizeTrace({}, {b0: (0, 0), b1: (1, 0), n0: (0, 1), n1: (1, 1)}, (test,), dict.fromkeys((b0, b1, n0, n1), 9))
    assert restricting(trace, n0, moving=[], together={n1}) is None  # (both batches held at 9)
    assert restricting(trace, n0, moving=[{b0}, {b1}], together={n1}) is not None
    assert restricting(trace, n0, moving=[{b0, b1}], together={n1}) is None


def test_the_least_length_bounds_what_is_proved():
    n = sympy.Symbol("s0", integer=True, positive=True)
    trace = SizeTrace({}, {n: (0, 1)}, (sympy.Ne(n - 1, 1),), {n: 9})
    assert restricting(trace, n, moving=[]) == "Ne(n - 1, 1)"
    assert restricting(trace, n, moving=[], least={n: 3}) is None


def test_labels_last_dimension_is_a_candidate():
    """With dynamic=True an integer matrix's last dimension is its tokens' (labels [B, L]), not a model
    dimension: the flattened loss keeps both batch and sequence dynamic."""
    def flat_loss(logits, labels):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    prog = neptune_eq.compile(flat_loss, *_batch(2, 9), dynamic=True)
    assert len(prog.family.lengths.groups) == 2
    for b, n in ((3, 5), (2, 14)):
        x, y = _batch(b, n)
        torch.testing.assert_close(prog(x, y), flat_loss(x, y), rtol=1e-9, atol=1e-12)
    assert prog.stats()["signatures"] == 0


def hf_causal_lm_loss(logits, labels, ignore_index=-100):
    """transformers' ForCausalLMLoss: the labels padded by one ignore_index, then shifted."""
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=ignore_index)
    shift_labels = labels[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), shift_labels.view(-1), ignore_index=ignore_index)


def test_hugging_face_loss_pads_its_labels_and_serves_every_length():
    """F.pad (constant_pad_nd, refused before) reads x at k − l inside the pad and the value outside,
    with the pad's bound written len(axis): the loss keeps one program at every length, 2 included."""
    torch.manual_seed(1)
    prog = neptune_eq.compile(hf_causal_lm_loss, *_batch(2, 9), dynamic=True)
    assert len(prog.family.lengths.groups) == 2 and not prog.family.lengths.offsets
    for b, n in ((3, 5), (2, 2), (2, 14)):
        x, y = _batch(b, n, grad=True)
        prog(x, y).backward()
        want = x.detach().clone().requires_grad_()
        hf_causal_lm_loss(want, y).backward()  # (in float32: the loss casts the logits)
        torch.testing.assert_close(x.grad, want.grad, rtol=1e-5, atol=1e-7)
    assert prog.stats()["signatures"] == 0


def test_constant_pad_values_and_gradients():
    def padded(x):
        return (F.pad(x, (2, 3), value=1.5).sum(-1) * F.pad(x, (-1, 2)).exp().sum(-1),
                F.pad(x, (1, 1, 2, 0), value=0.25).softmax(-1))

    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    prog = neptune_eq.compile(padded, x.detach())
    got = prog(x)
    (got[0].sum() + got[1][:, 0].sum()).backward()
    want_x = x.detach().clone().requires_grad_()
    want = padded(want_x)
    (want[0].sum() + want[1][:, 0].sum()).backward()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(x.grad, want_x.grad, rtol=1e-9, atol=1e-12)


def token_logps(logits, ids):
    """The log-probability of each next token (GRPO, DPO): [B, L - 1], over the shifted axis."""
    return logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def test_an_output_over_the_shifted_axis_is_cut_to_its_length():
    """The output's axis is padded like a reduced one (its padded step written 0) and each call returns
    it cut to L - 1, contiguous as eager's; its gradient reaches only the positions eager's does."""
    torch.manual_seed(2)
    prog = neptune_eq.compile(token_logps, *_batch(2, 9), dynamic=True)
    lengths = prog.family.lengths
    assert len(lengths.groups) == 2 and (0, 1, 1, 1) in lengths.outputs  # (dimension 1: group 1's length - 1)
    for b, n in ((3, 5), (2, 3), (2, 15)):
        x, y = _batch(b, n, grad=True)
        y[y < 0] = 0
        got = prog(x, y)
        want_x = x.detach().clone().requires_grad_()
        want = token_logps(want_x, y)
        assert got.shape == (b, n - 1) and got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        weights = torch.arange(got.numel(), dtype=got.dtype).reshape(got.shape)
        (got * weights).sum().backward()
        (want * weights).sum().backward()
        torch.testing.assert_close(x.grad, want_x.grad, rtol=1e-9, atol=1e-12)
    assert prog.stats()["signatures"] == 0


def test_the_last_token_is_read_at_every_length():
    """`h[:, -1]` (a reward model's or classifier's last-token pooling) reads position len(axis) - 1 in
    a dynamic capture: the sequence stays dynamic, values and gradients right at every length. A
    slice `x[:, -4:]` (its length min(4, L): a test not proved for L ≥ 2) is dynamic from the length
    its tests hold from (session 54); a shorter call compiles its own."""
    def last_token(h, w):
        return (h[:, -1] @ w).softmax(-1)

    torch.manual_seed(3)
    w = torch.randn(8, 5, dtype=torch.float64)
    prog = neptune_eq.compile(last_token, torch.randn(2, 9, 8, dtype=torch.float64), w, dynamic=True)
    assert len(prog.family.lengths.groups) == 2
    for b, n in ((3, 5), (2, 2), (2, 14)):
        h = torch.randn(b, n, 8, dtype=torch.float64, requires_grad=True)
        got = prog(h, w)
        want_h = h.detach().clone().requires_grad_()
        want = last_token(want_h, w)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        got[:, 0].sum().backward()
        want[:, 0].sum().backward()
        torch.testing.assert_close(h.grad, want_h.grad, rtol=1e-9, atol=1e-12)
    assert prog.stats()["signatures"] == 0
    def tail_mean(x):
        return x[:, -4:].mean(1)

    tail = neptune_eq.compile(tail_mean, torch.randn(2, 9, 3, dtype=torch.float64), dynamic=True)
    lengths = tail.family.lengths
    assert lengths.groups == (("b",), ("i",)) and 4 <= lengths.least[1] <= 9, lengths
    for n in (2, 3, 4, 5, 11, 30):
        x = torch.randn(2, n, 3, dtype=torch.float64)
        before = tail.stats()["signatures"]
        torch.testing.assert_close(tail(x), tail_mean(x), rtol=1e-12, atol=1e-12)
        assert (tail.stats()["signatures"] > before) == (n < lengths.least[1]), (n, tail.stats())


def test_a_length_tested_against_a_threshold_is_dynamic_above_it():
    """`if x.shape[1] > 20:` at an example of 37: every test of the length holds from 21 on, so the
    sequence is dynamic for lengths ≥ 21 (the branch the example took) and a call at 20 or less compiles
    its own (the other branch), right at each; `< 50` holds from no length on and stays static."""
    def branch(h):
        return h.sum(1) * 2 if h.shape[1] > 20 else h.sum(1)

    prog = neptune_eq.compile(branch, torch.randn(3, 37, 4, dtype=torch.float64), dynamic=True)
    assert prog.family.lengths.least == (2, 21), prog.family.lengths
    for n in (21, 60, 20, 5, 33):
        h = torch.randn(3, n, 4, dtype=torch.float64)
        torch.testing.assert_close(prog(h), branch(h), rtol=1e-12, atol=1e-12)
    assert prog.stats()["signatures"] == 2  # (20 and 5)

    def below(h):
        return h.sum(1) * 2 if h.shape[1] < 50 else h.sum(1)

    static = neptune_eq.compile(below, torch.randn(3, 37, 4, dtype=torch.float64), dynamic=True)
    assert static.family.lengths.groups == (("b",),)
    assert any("n < 50" in why for _, why in static.family.lengths.static)


def test_a_gather_by_computed_indices_is_checked_at_each_calls_rows():
    """`x.gather(1, idx + 1)`'s check has a program of its own (the indices are computed): evaluated at
    the capture's extents it had kept the rows static; over each call's box they move, and an index out
    of range at a new length is refused."""
    def shifted_gather(x, idx):
        return x.gather(1, idx + 1).sum(1)

    torch.manual_seed(4)
    prog = neptune_eq.compile(shifted_gather, torch.randn(6, 9, dtype=torch.float64), torch.randint(0, 7, (6, 3)),
                              dynamic=True)
    assert len(prog.family.lengths.groups) == 2
    x, idx = torch.randn(11, 9, dtype=torch.float64), torch.randint(0, 7, (11, 3))
    torch.testing.assert_close(prog(x, idx), shifted_gather(x, idx), rtol=1e-12, atol=1e-12)
    idx[10, 1] = 8  # (row 10: past the capture's 6 rows)
    with pytest.raises(IndexOutOfRange, match="index 9"):
        prog(x, idx)
    assert prog.stats()["signatures"] == 0


def test_a_variance_over_a_slice_of_a_dynamic_axis_trains_without_nan():
    """x[:, -4:].var(1) and friends under dynamic=True had all-NaN gradients at every length: the
    backward rolled Σ_j where(s ≠ 0, s / 4, 0) with the running s by h = where(s′ ≠ 0, …) / where(s ≠ 0, …),
    0/0 at s's first value 0, and the correction check had never drawn a running value of 0."""
    fns = [lambda x: x[:, -4:].var(1), lambda x: x[:, 2:6].std(1)]
    for f in fns:
        prog = neptune_eq.compile(f, torch.randn(2, 20, 8), dynamic=True)
        for n in (20, 33):
            x = torch.randn(2, n, 8, requires_grad=True)
            prog(x).sum().backward()
            xr = x.detach().double().requires_grad_()
            f(xr).sum().backward()
            assert torch.allclose(x.grad.double(), xr.grad, atol=1e-5), n
