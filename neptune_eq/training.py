"""The training of a program: the backwards derived for a set of inputs that require grad, before
one is chosen (neptune_eq.autograd ranks them and runs the chosen one).

    recompute   the forward saves its inputs; the backward recomputes every reduction it reads
    saved       the forward also writes its row statistics (a softmax's max and sum) and the backward
                reads those and the outputs (neptune_eq.grad_saved: D = rowsum(dO∘O) for attention)
    joint       a scalar loss: the forward computes the gradients at upstream 1 beside it, one program;
                the backward scales them (neptune_eq.grad_joint)

A program whose dot operand is computed through a gather or a row norm is split at it (the core and a
map writing the operands: neptune_eq.grad_prologue); one with grouped-query heads is derived over
(kv head, member) axes (neptune_eq.regroup).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from . import ir
from .grad import Backward, NoBackward, backward_program
from .grad_joint import Joint, joint_program
from .grad_prologue import Prologue, split_prologue
from .lower.launch import length_source
from .masks import large_constants
from .regroup import Regroup, regroup


@dataclass
class _Training:
    """The backward alternatives of one forward program and, once ranked, the one chosen."""

    program: ir.Program
    recompute: Backward | None
    saved: Backward | None
    why: str = ""  # why neither could be derived
    chosen: Backward | None = None
    report: list[str] = field(default_factory=list)
    compile_fn: Callable[[ir.Program], object] | None = None
    outs: list[tuple] = field(default_factory=list)  # (output name, shape, dtype) in op order
    # a program split at its gathered dot operands (neptune_eq.grad_prologue): `program` is the core,
    # which reads them as inputs; the maps program writes them and its backward carries their gradients on
    prologue: tuple[Prologue, Backward] | None = None
    regroup: Regroup | None = None  # the programs are over a grouped axis split in two (neptune_eq.regroup)
    no_gradient: set[str] = field(default_factory=set)  # outputs whose cotangent the chosen backward never reads
    # a scalar loss's gradients beside it, in one program (neptune_eq.grad_joint): a third alternative
    joint: Joint | None = None
    mode: str | None = None  # the chosen one's: "recompute", "saved" or "joint"

    def split(self, name: str, x: torch.Tensor | None) -> torch.Tensor | None:
        """Tensor `name` (an input or output of the user's program) as the programs read it."""
        return x if self.regroup is None or x is None else self.regroup.split(name, x)

    def merged(self, name: str, y: torch.Tensor | None) -> torch.Tensor | None:
        """Tensor `name` as a program wrote it, shaped as the user's program has it."""
        return y if self.regroup is None or y is None else self.regroup.merge(name, y)

    @property
    def forward(self) -> ir.Program:  # the training forward: the outputs, then the statistics
        return self.saved.saved.forward if self.saved is not None else self.program

    @property
    def stats(self) -> list[str]:
        return list(self.saved.saved.stats) if self.saved is not None else []


def _derive(program: ir.Program, wrt: list[str]) -> _Training:
    """The training of `program` for the inputs `wrt`: over its grouped axis split in two where it has
    one (neptune_eq.regroup) and that trains, else as it is (_derive_at)."""
    got = regroup(program)
    if got is not None:
        t = _derive_at(got[0], wrt)
        if t.recompute is not None or t.saved is not None:
            t.regroup, t.joint = got[1], None  # (a joint program over the regrouped views: not derived)
            return t
    return _derive_at(program, wrt)


def _derive_at(program: ir.Program, wrt: list[str]) -> _Training:
    """The training of `program` for the inputs `wrt`: split at its gathered dot operands where it has
    such (neptune_eq.grad_prologue) and both halves have a backward, else whole."""
    try:
        pro = split_prologue(program, wrt)
    except ir.ProgramError:  # (a split that does not validate: the program trains whole)
        pro = None
    if pro is not None:
        try:
            maps = backward_program(pro.maps, [n for n in wrt if n in pro.maps.inputs])
        except NoBackward:
            maps = None
        if maps is not None:
            t = _derive_whole(pro.core, [n for n in wrt if n in pro.core.inputs] + list(pro.operands))
            if t.recompute is not None or t.saved is not None:
                t.prologue, t.joint = (pro, maps), None  # (its operands' gradients need the core's cotangents)
                return t
    return _derive_whole(program, wrt)


def _derive_whole(program: ir.Program, wrt: list[str]) -> _Training:
    found: dict[str, Backward | None] = {}
    errors = []
    for mode in ("recompute", "saved"):
        try:
            found[mode] = backward_program(program, wrt, saved=mode == "saved")
        except Exception as e:  # a forward runs whatever the derivation hits; a call needing gradients refuses
            found[mode] = None
            errors.append(str(e) if isinstance(e, NoBackward) else
                          f"{program.name}: the backward could not be derived ({e!r})")
    saved = found["saved"]
    if saved is not None and not (saved.saved.stats or saved.saved.outputs):
        saved = None  # it reads nothing the forward saves: the same program as recompute
    if saved is not None and saved.saved.stats and _large_fill(program):
        # a row statistic m + log l saved in fp32 loses log l beside a fill of magnitude K (the ulp of
        # 1e9 is 64): a row whose every score is masked to K has weights e^{K − lse} = 1, not 1/n
        # (attention's dV off by 1.6 on such a row). The recompute backward shifts by the max alone.
        saved = None
    try:
        joint = joint_program(program, found["recompute"]) if found["recompute"] is not None else None
    except ir.ProgramError:  # (a joint program that does not validate: the two-program trainings remain)
        joint = None
    return _Training(program, found["recompute"], saved, errors[0] if errors else "", joint=joint)


_FILL = 1e3  # the fp32 ulp of a constant this large is 6e-5, of 1e4 already 1e-3



def _large_fill(program: ir.Program) -> bool:
    """Does a finite constant of magnitude `_FILL` or more appear in the program (a mask's fill:
    `masked_fill(~m, -1e9)`, BERT's −10000, finfo.min)?"""
    return any(large_constants(o.expr, _FILL) for o in program.outputs)


def lengths_of(program: ir.Program, named: dict[str, torch.Tensor]) -> dict[str, int]:
    """The lengths of `program`'s dynamic axes in a call, read off the tensors `named` (input name →
    tensor) that have them ({} for a program compiled for one length)."""
    out = {}
    for a in program.dynamic:
        got = next(((n, s.axes.index(a)) for n, s in program.inputs.items()
                    if a in s.axes and n in named and named[n].dim() == len(s.axes)), None)
        if got is None:  # (an axis no input is declared over, read along one's dimension: x[b, j] of x[b, i])
            with contextlib.suppress(ir.NeptuneError):
                src = length_source(program, a)
                got = src if src[0] in named and named[src[0]].dim() == len(program.inputs[src[0]].axes) else None
        if got is not None:
            out[a] = named[got[0]].shape[got[1]]
    return out


def shape_at(program: ir.Program, axes, at: dict[str, int]) -> tuple[int, ...]:
    """The shape over `axes` of a call with dynamic axes at lengths `at` (each dynamic one must be there:
    a compile's bound in its place would reshape a tensor of the call's lengths wrongly)."""
    missing = [a for a in axes if a in program.dynamic and a not in at]
    if missing:
        raise ir.NeptuneError(f"{program.name}: the length of dynamic axis '{missing[0]}' is read by none of the "
                              "tensors at hand (a training call cannot shape its gradients)")
    return tuple(at.get(a, program.axes[a]) for a in axes)
