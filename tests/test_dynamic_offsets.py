"""Dynamic lengths through axes a constant shorter than a length (`x[:, 1:] - x[:, :-1]`,
`logits[:, :-1]` against `labels[:, 1:]`: frontend/offsets.py), checked against eager float64 at
lengths other than the example's: cases found by a hunt for wrong answers (CPU interpreter)."""

from __future__ import annotations

import pytest
import sympy
import torch

import neptune_eq
from neptune_eq.frontend.checks import IndexOutOfRange


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


def test_a_flattened_shifted_loss_is_proved_at_every_length_it_serves():
    """nll_loss(log_softmax(logits[:, :-1]).reshape(-1, V), labels[:, 1:].reshape(-1)): torch tests
    B*(L - 1) ≠ B, which holds at every L ≥ 3 the group serves; bounded side by side ([6, ∞) against
    [2, ∞)) it was not proved, and the sequence length stayed static (a compile per length). The
    sides' factored difference B*(L - 2) is bounded away from 0."""
    from neptune_eq.frontend.symsizes import proved

    b, n = sympy.symbols("b n", integer=True, positive=True)
    assert proved(sympy.Ne(b * (n - 1), b), [{b}, {n}], {}, [2, 3])
    assert not proved(sympy.Ne(b * (n - 1), b), [{b}, {n}], {}, [2, 2])

    def nll(logits, labels):
        lp = torch.log_softmax(logits[:, :-1], -1)
        return torch.nn.functional.nll_loss(lp.reshape(-1, lp.shape[-1]), labels[:, 1:].reshape(-1))

    prog = neptune_eq.compile(nll, torch.randn(2, 9, 5, dtype=torch.float64), torch.randint(0, 5, (2, 9)),
                              dynamic=True)
    assert len(prog.family.lengths.groups) == 2, prog.family.lengths.static
    for n in (3, 17):
        args = torch.randn(3, n, 5, dtype=torch.float64), torch.randint(0, 5, (3, n))
        _close(prog(*args), nll(*args))
    assert prog.stats()["signatures"] == 0


def test_a_label_the_shifted_program_never_reads_is_not_checked():
    """logits[:, 1:] gathered at labels[:, :-1]: eager never reads the last label, so one out of range
    there is no error. Padded, the gather's index labels[b, j] runs over every j < L, and its range
    check (and the kernel's gather) read the last label too: IndexOutOfRange where eager returns. A
    gathered index is 0 at the masked steps; a label the program reads is still checked."""
    def fn(logits, labels):
        return logits[:, 1:].log_softmax(-1).gather(-1, labels[:, :-1, None]).sum()

    prog = neptune_eq.compile(fn, torch.randn(2, 9, 5, dtype=torch.float64), torch.randint(0, 5, (2, 9)),
                              dynamic=True)
    assert prog.family.lengths.offsets
    for n in (9, 4, 17):
        x, labels = torch.randn(2, n, 5, dtype=torch.float64), torch.randint(0, 5, (2, n))
        labels[1, -1] = 99
        _close(prog(x, labels), fn(x, labels))
        labels[1, -2] = 99
        with pytest.raises(IndexOutOfRange, match="gather"):
            prog(x, labels)


def test_an_axis_read_only_shifted_is_renumbered_to_a_read_of_its_own():
    """x[:, 1:-1].sum(1) reads x only at j + 1: padded, no input was read at j itself, so the kernels
    could not know its length and the sequence stayed static (a compile per length; so did
    logsumexp(x[:, 1:]), x[:, 1:].var(1), a diff of a diff, (x[:, :-1] @ x[:, 1:].mT).softmax). j is
    renumbered from its least shift (j' = j + 1, over 1 ≤ j' < L - 1): one read is j' itself."""
    fns = (lambda x: x[:, 1:-1].sum(1),
           lambda x: (x[:, 2:] * torch.arange(x.shape[1] - 2)[None, :, None]).sum(1),
           lambda x: (lambda d: (d[:, 1:] - d[:, :-1]).abs().sum(1))(x[:, 1:] - x[:, :-1]))
    for fn in fns:
        prog = neptune_eq.compile(fn, torch.randn(2, 9, 3, dtype=torch.float64), dynamic=True)
        assert len(prog.family.lengths.groups) == 2, prog.family.lengths.static
        for n in (9, 4, 17):
            x = torch.randn(2, n, 3, dtype=torch.float64)
            _close(prog(x), fn(x))
        assert prog.stats()["signatures"] == 0


def test_the_gradient_of_a_padded_read_is_over_the_input_own_axis():
    """x[:, :-1].sum(1) with x requiring grad at a length other than the example's: the backward's
    gradient of x came out over the padded axis j (x[b, j, d]'s), which the backward reads no input
    at, so its kernels could not know its length ("dynamic axis 'j' is read by no input") and the
    call crashed. The gradient is written over x's own axes where it can be."""
    for fn in (lambda x: x[:, :-1].sum(1), lambda x: x[:, 1:-1].mean(1)):
        prog = neptune_eq.compile(fn, torch.randn(2, 9, 3, dtype=torch.float64), dynamic=True)
        for n in (9, 5, 17):
            x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
            y = x.detach().clone().requires_grad_()
            g = torch.randn(2, 3, dtype=torch.float64)
            (prog(x) * g).sum().backward()
            (fn(y) * g).sum().backward()
            _close(x.grad, y.grad)
        assert prog.stats()["signatures"] == 0


def test_attention_of_a_sequence_on_its_shifted_self_trains_in_one_graph():
    """(x[:, :-1] @ x[:, 1:].mT).softmax(-1): x is read along two tied dynamic axes, with a reduction
    over one of them. Summing the two loads' gradients renames the softmax's Σ apart, and the copy had
    no length at the call, so every length had trained through a compile of its own (and, traced, left
    the graph). The copy now takes the length of the axis it was renamed from (Program.same_length):
    one torch.compile'd graph trains at every length of the bucket."""
    def fn(x):
        return (x[:, :-1] @ x[:, 1:].transpose(1, 2)).softmax(-1).sum((1, 2))

    prog = neptune_eq.compile(fn, torch.randn(2, 9, 3, dtype=torch.float64), dynamic=True)
    run = torch.compile(lambda x: prog(x), dynamic=True, backend="eager")
    for n in (5, 7):
        x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        run(x).sum().backward()
        fn(y).sum().backward()
        _close(x.grad, y.grad)
    assert prog.family.no_training is None
    assert prog.stats()["signatures"] == 0


def test_a_traced_training_call_without_a_backward_for_every_length_leaves_the_graph(monkeypatch):
    """Where no backward is derived over the buckets, a traced call needing gradients is derived first
    (NoBackward had come out of dynamo's trace as an internal error) and runs outside the graph, as an
    eager call compiles its own length."""
    from helpers import refuse_dynamic_backwards

    refuse_dynamic_backwards(monkeypatch)

    def fn(x):
        return (x[:, :-1] * x[:, 1:]).sum(-1).softmax(-1).square().sum(1)  # (derived by no other test)

    prog = neptune_eq.compile(fn, torch.randn(2, 9, 3, dtype=torch.float64), dynamic=True)
    run = torch.compile(lambda x: prog(x), dynamic=True, backend="eager")
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    run(x).sum().backward()
    fn(y).sum().backward()
    _close(x.grad, y.grad)
    assert "no backward at every length" in prog.family.no_training
