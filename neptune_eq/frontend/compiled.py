"""A compiled capture, called like the function it was traced from.

Every call, on every path (the checked one and the CUDA fast path that launches bound kernels):

    1. the guards of fn's environment (guards.py): a changed global/closure value re-captures and
       compiles again (`recompile`), or raises StaleCapture where no compiler was given; closure
       tensors written in place have their device copies refreshed
    2. the index range checks (checks.py)
    3. the kernels
    4. the new values of arguments fn writes in place are copied into them; fn's return structure
       is rebuilt
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..ir import NeptuneError
from ..lower.replay import MAX_ELEMENTS, STAGED_ELEMENTS, Replayer, layout_of, shapes_of
from .checks import run_checks
from .guards import same_value

# like torch.compile's recompile limit: past it a function keeps working, but says why it is slow
RECAPTURE_WARNING = 8


@dataclass
class CompiledFunction:
    """A compiled capture: call it with fn's arguments; outputs come back in fn's dtypes and
    structure. `recompile(program)` compiles a re-capture (None: a changed environment raises)."""

    captured: object  # frontend.capture.Captured
    compiled: object  # neptune_eq.runtime.CompiledProgram
    recompile: Callable | None = None
    recaptures: int = 0  # how often fn's environment changed and it was captured again
    # the kernels store straight into outputs of fn's dtypes (no conversion pass afterwards)
    _out_dtypes: dict[str, torch.dtype] = field(init=False, repr=False)
    # layout key of the arguments (see _layout) → (launcher, BoundCall or None): the fast path
    _bound: dict = field(init=False, repr=False, default_factory=dict)
    _order: list[str] = field(init=False, repr=False)  # program inputs in argument order
    # the index checks' device work, replayed per layout from a CUDA graph (lower/replay.py)
    _checks: Replayer = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._out_dtypes = {o.name: dt for o, dt in zip(self.captured.program.outputs, self.captured.output_dtypes)}
        self._order = [b.input for b in self.captured.args if b.input is not None]
        self._bound = {}
        self._checks = check_replayer(self.captured.index_checks)

    def _run_checks(self, inputs: dict[str, torch.Tensor]) -> None:
        replay_checks(self._checks, self.captured.index_checks, inputs)

    # (never traced: torch.compile takes Captured.call_with; when its guard on a value fn reads fails,
    # the frame it resumes may reach this call, which captures again and launches: it runs as is)
    @torch.compiler.disable
    def __call__(self, *args):
        self.follow_environment(args)
        cap = self.captured
        if cap.needs_grad(args):  # (neptune_eq.compile's calls take the custom op then, which has a backward)
            from ..runtime import grad_needed, refuse_grad

            refuse_grad(cap.program, grad_needed(cap.inputs(*args, cached=False)))
        checked = None
        if cap.index_checks or cap.mutations:
            checked = cap.inputs(*args)
            self._run_checks(checked)
            cap.check_aliases(args)
        # (a program run in chunks goes through run(): its launches differ per chunk)
        layout = call_layout(cap, args) if self.compiled.chunking is None else None
        fresh = False
        if layout is not None:
            key, ptrs = layout
            launcher = self.compiled.launcher("cuda")  # replaced when the schedules change
            hit = self._bound.get(key)
            if hit is not None and hit[0] is launcher:
                if hit[1] is not None:
                    return cap.finish(args, hit[1](ptrs, cap.output_shapes,
                                                   input_args(cap, args) if hit[1].library else None))
            else:
                fresh = True
        inputs = checked if checked is not None else cap.inputs(*args)
        results = self.compiled.run(inputs, self._out_dtypes)
        outs = [results[o.name] for o in cap.program.outputs]
        outs = [r if r.shape == shape else r.reshape(shape) for r, shape in zip(outs, cap.output_shapes)]
        if fresh:
            # checked and launched once for this layout: later calls go straight to the kernels
            # (unless an input had to be copied to reach the program's shape)
            self._bound[key] = (launcher, bind_after(launcher, inputs, self._order, ptrs, self._out_dtypes))
        return cap.finish(args, outs)

    def follow_environment(self, args) -> None:
        from .capture import StaleCapture

        try:
            self.captured.follow_environment()
        except StaleCapture as e:
            if self.recompile is None:
                raise
            self._recapture(args, str(e))

    @torch.compiler.disable
    def _recapture(self, args, reason: str) -> None:
        """Capture and compile again for fn's changed environment, outside dynamo's frame conversion: a
        call dynamo gave up on inside a torch.compile'd step (a training call after a module's
        attribute changed, model.eval()) had its capture's frames converted one by one and stopped in
        a functorch internal assert."""
        self.captured = self.captured.again(*args)
        self.compiled = self.recompile(self.captured.program)
        self.__post_init__()
        self.recaptures += 1
        if self.recaptures == RECAPTURE_WARNING:
            warnings.warn(f"neptune_eq: {self.captured.program.name} was captured again {self.recaptures} "
                          f"times because values it reads keep changing (last: {reason}); pass such values "
                          "as tensor arguments", stacklevel=4)


def call_layout(captured, args) -> tuple[tuple, list[int]] | None:
    """(key, input addresses) of a call on CUDA tensors: the key holds everything the checks and
    the kernels' specialisation depend on (shape, dtype, device, strides, 16-byte alignment of
    each tensor, the baked-in values); None for anything else (the checked path reports it)."""
    if len(args) != len(captured.args):
        return None
    key, ptrs = [], []
    for b, a in zip(captured.args, args):
        if not b.is_tensor:
            if isinstance(a, torch.Tensor) or not same_value(a, b.static):
                return None
            continue
        if not isinstance(a, torch.Tensor) or not a.is_cuda:
            return None
        p = a.data_ptr()
        key.append((a.shape, a.dtype, a.device, a.stride(), p % 16 == 0))
        if b.input is not None:
            ptrs.append(p)
    return tuple(key), ptrs


def input_args(captured, args) -> list[torch.Tensor]:
    """The arguments holding the program's inputs, in call_layout's order of their addresses."""
    return [a for b, a in zip(captured.args, args) if b.is_tensor and b.input is not None]


def check_replayer(checks) -> Replayer:
    """The Replayer of index checks `checks` (replay_checks runs them through it)."""
    return Replayer(lambda inputs, at=None: run_checks(checks, inputs, at))


def replay_checks(replayer: Replayer, checks, inputs: dict[str, torch.Tensor], at: dict | None = None) -> None:
    """Index checks `checks` (`replayer`'s) on a call's `inputs` (`at`: a dynamic call's lengths): on
    CUDA their device work replays from a CUDA graph per layout of the tensors they read, staged
    (copied into the graph's buffers) where those are small, as a batch's labels are; else eagerly.
    A dynamic function's training step had evaluated its labels' check eagerly on every call: 0.55 ms
    of host time beside a static compile's (the causal-LM loss, H200)."""
    read = {n: inputs[n] for n in sorted({n for c in checks for n in c.reads()})}
    box = tuple(sorted((at or {}).items()))
    if read and all(t.is_cuda for t in read.values()) and all(c.elements(inputs, at) <= MAX_ELEMENTS for c in checks):
        if sum(t.numel() for t in read.values()) <= STAGED_ELEMENTS:  # (fresh index tensors every call)
            replayer.staged((box, shapes_of(read)), read, at)
        else:
            replayer((box, layout_of(list(read.values()))), inputs, at)
    else:
        run_checks(checks, inputs, at)


def bind_after(launcher, inputs: dict, order: list[str], ptrs: list[int], out_dtypes: dict):
    """The launcher's BoundCall for a call just run checked on `inputs`, or None where an input is
    not the argument itself at its own address (a copy made to reach the program's shape)."""
    views = all(inputs[name].data_ptr() == p for name, p in zip(order, ptrs))
    return launcher.bind(inputs, order, out_dtypes) if views else None


class ZeroSizeError(NeptuneError):
    """What eager PyTorch raised evaluating a function on arguments with a zero-size dimension."""


class ZeroSizeIndexError(ZeroSizeError, IndexError):
    pass


class ZeroSizeRuntimeError(ZeroSizeError, RuntimeError):
    pass


@dataclass
class EagerFunction:
    """fn run by PyTorch itself, for argument shapes with a zero-size dimension: there is no work
    to fuse, and torch's answer (empty results; sum over an empty axis is 0) is the answer. What
    torch raises (amax over an empty axis) comes back as a ZeroSizeError that is also an
    IndexError / RuntimeError where torch's was."""

    fn: Callable

    def __call__(self, args):
        try:
            return self.fn(*args)
        except NeptuneError:
            raise
        except Exception as e:
            kind = (ZeroSizeIndexError if isinstance(e, IndexError) else
                    ZeroSizeRuntimeError if isinstance(e, RuntimeError) else ZeroSizeError)
            raise kind(f"the function raised on arguments with a zero-size dimension: {type(e).__name__}: {e}") from e
