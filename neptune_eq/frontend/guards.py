"""What a captured function read from its environment, and the checks that say whether it still holds.

Tracing runs fn once: every value it reads besides its arguments — a global `scale`, a closure's
`cap`, a default argument, a module's `eps` or its weights, a score_mod it calls — is baked into
the program (numbers become constants, tensors extra inputs). `scan(fn)` records those values as
guards, like torch.compile's (frontend/scan.py); `Guards.check()` runs before every call and reports the first one
that changed:

    a number, string, dtype, ...      the same value (floats by their bits: -0.0 is not 0.0, NaN is NaN)
    a tuple/list/dict of such         equality of a snapshot (lists and dicts may change in place)
    a tensor                          identity, its version counter (in-place writes), its storage
    a function, module, object        identity; then, one or two levels in, what *it* reads

What is scanned: fn's closure cells, the globals its code (and the code nested in it) names, its
default arguments; the same for the functions found there, two levels deep (FlexAttention's
score_mod and the values it captures, a callable object's __call__ and its fields); for an
nn.Module, every submodule's parameters, buffers, plain attributes and the attributes of plain
objects it holds; for a module, class or plain object found there, the attributes fn's code names
(`cfg.scale`, `Config.scale`, `cfg.inner.s`). Not guarded, and said: a container of more than 64
items or nested deeper than 3 is guarded by identity only (a NeptuneWarning at capture names it).
Not guarded: values reached other ways (through a function call's result, deeper than two levels).

A tensor whose values the program reads at run time (an extra input) and that was written in
place only needs its copies refreshed (`Changed.stale` is False); any other change means the
capture is stale and must be traced again.
"""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass, field

import torch

# values compared by equality: what a trace bakes into a program as a constant or a decision
_ATOMS = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format, enum.Enum)
_GUARDED = (torch.Tensor, *_ATOMS, tuple, list, dict)  # what a namespace entry is guarded for
_MAX_ITEMS = 64  # larger containers are guarded by identity only
_MISSING = object()  # a variable deleted, a key removed


# ---------------------------------------------------------------- where a value is read from


@dataclass(frozen=True, eq=False)
class Cell:
    """A closure variable."""

    cell: types.CellType
    name: str
    owner: str

    def read(self):
        try:
            return self.cell.cell_contents
        except ValueError:  # the variable was deleted
            return _MISSING

    def __str__(self) -> str:
        return f"closure variable '{self.name}' of {self.owner}"


@dataclass(frozen=True, eq=False)
class Entry:
    """A key of a namespace: a module's globals, an object's __dict__, a module's parameters."""

    mapping: dict
    key: str
    label: str

    def read(self):
        return self.mapping.get(self.key, _MISSING)

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True, eq=False)
class Attr:
    """An attribute read with getattr (a function's defaults, a partial's arguments)."""

    obj: object
    name: str
    label: str

    def read(self):
        return getattr(self.obj, self.name, _MISSING)

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True, eq=False)
class Held:
    """A value the capture holds itself (a tensor the trace lifted as a constant)."""

    value: object
    label: str

    def read(self):
        return self.value

    def __str__(self) -> str:
        return self.label


Source = Cell | Entry | Attr | Held


# ---------------------------------------------------------------- guards


def _atom_key(v):
    """What identifies a number: its bits for floats (0.0 and -0.0 differ, NaN equals NaN)."""
    if isinstance(v, float):
        return "nan" if v != v else v.hex()
    if isinstance(v, complex):
        return (_atom_key(v.real), _atom_key(v.imag))
    return v


def same_value(a, b) -> bool:
    """a and b are the same constant to a trace: the same object, or equal values of one type with
    floats compared by their bits (a scale changed from 0.0 to -0.0 changes x / scale; a NaN
    argument is the same NaN on the next call)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(_atom_key(a) == _atom_key(b))
    except Exception:  # a value whose == is not a bool (an array): not the same
        return False


@dataclass(eq=False)
class ValueGuard:
    """A number, string, ... compared by equality (of the same type: True is not 1)."""

    source: Source
    value: object

    def holds(self) -> bool:
        return same_value(self.source.read(), self.value)

    def describe(self) -> str:
        return f"{self.source} was {self.value!r}, now {self.source.read()!r}"


@dataclass(eq=False)
class SnapshotGuard:
    """A tuple, list or dict of numbers and tensors, compared by a snapshot of its contents (a tuple
    of atoms alone cannot change: the same object is enough)."""

    source: Source
    value: object
    snapshot: object
    keep: list = field(default_factory=list, repr=False)  # its tensors, so their ids stay unique

    def __post_init__(self) -> None:
        self._frozen = isinstance(self.value, tuple) and not self.keep and _immutable(self.snapshot)

    def holds(self) -> bool:
        v = self.source.read()
        if v is self.value and self._frozen:
            return True
        try:
            return _snapshot(v, []) == self.snapshot
        except _Opaque:
            return False

    def describe(self) -> str:
        return f"{self.source} changed (now {self.source.read()!r})"


@dataclass(eq=False)
class IdentityGuard:
    """A function, module or object: the same object (what it reads is guarded separately)."""

    source: Source
    value: object

    def holds(self) -> bool:
        return self.source.read() is self.value

    def describe(self) -> str:
        return f"{self.source} was rebound"


@dataclass(eq=False)
class TensorGuard:
    """A tensor: the same object (shape, dtype and device are then fixed) at the same version.
    `refresh`: the program reads its values at run time, so an in-place write needs only its
    copies refreshed; otherwise (a 0-d tensor baked in as a number, a tensor whose shape decided
    the trace) the capture is stale."""

    source: Source
    tensor: torch.Tensor
    version: int
    refresh: bool = False
    data_ptr: int = 0  # t.data = other keeps the object and its version but not its storage
    # a CPU number's value: `t.data.fill_(v)` and a write through numpy's view of its memory leave the
    # version counter as it was (a baked temperature had kept its old value, silently)
    value: object = None

    def __post_init__(self) -> None:
        self.data_ptr = self.tensor.data_ptr() if self.tensor.device.type != "meta" else 0
        if self.tensor.dim() == 0 and self.tensor.device.type == "cpu":
            self.value = self.tensor.item()

    def same_value(self, t: torch.Tensor) -> bool:
        if self.value is None:
            return True
        v = t.item()
        return v == self.value or (v != v and self.value != self.value)

    def describe(self) -> str:
        if self.source.read() is not self.tensor:
            return f"{self.source} was rebound to another tensor"
        if self.data_ptr and self.tensor.data_ptr() != self.data_ptr:
            return f"{self.source} was given other storage (t.data = ...)"
        return f"{self.source} was modified in place"


Guard = ValueGuard | SnapshotGuard | IdentityGuard


@dataclass(frozen=True)
class Changed:
    """The first guard that failed; `stale` unless only refreshable tensors were written in place."""

    guard: Guard | TensorGuard
    stale: bool

    def describe(self) -> str:
        return self.guard.describe()


@dataclass
class Guards:
    """The guards of one capture; check() is on every call's path (a few comparisons each)."""

    values: list[Guard] = field(default_factory=list)
    tensors: list[TensorGuard] = field(default_factory=list)

    def check(self) -> Changed | None:
        for g in self.values:
            if not g.holds():
                return Changed(g, stale=True)
        written = None
        tracing = torch.compiler.is_compiling()
        for g in self.tensors:
            t = g.source.read()
            if t is not g.tensor:
                return Changed(g, stale=True)
            if tracing and g.refresh:
                # a traced graph reads the tensor itself at every call (its version is a data-dependent
                # value dynamo cannot branch on), so a write in place needs nothing refreshed
                continue
            if t._version != g.version or not (tracing or g.refresh or g.same_value(t)):
                if not g.refresh:
                    return Changed(g, stale=True)
                written = g
            if g.data_ptr and t.data_ptr() != g.data_ptr:
                return Changed(g, stale=True)
        return None if written is None else Changed(written, stale=False)

    def accept(self) -> None:
        """The refreshable tensors' current versions are the ones the program now sees."""
        for g in self.tensors:
            g.version = g.tensor._version
            if g.value is not None:
                g.value = g.tensor.item()

    def __len__(self) -> int:
        return len(self.values) + len(self.tensors)


def _immutable(snapshot) -> bool:
    """A snapshot of tuples and atoms only."""
    if isinstance(snapshot, tuple) and len(snapshot) == 2 and isinstance(snapshot[0], type):
        kind, content = snapshot
        if kind is tuple:
            return all(_immutable(x) for x in content)
        return kind not in (list, dict, set)
    return False


class _Opaque(Exception):
    """A value a snapshot cannot hold (too large, deep, or not made of atoms and tensors)."""


def _snapshot(value, keep: list, depth: int = 0):
    """A comparable copy of a small container of atoms and tensors (tensors as id and version;
    `keep` collects them so their ids stay unique); raises _Opaque for anything else."""
    if isinstance(value, torch.Tensor):
        keep.append(value)
        return ("tensor", id(value), value._version)
    if isinstance(value, _ATOMS):
        return (type(value), _atom_key(value))
    if depth > 3 or not isinstance(value, tuple | list | dict | set | frozenset) or len(value) > _MAX_ITEMS:
        raise _Opaque
    if isinstance(value, dict):
        return (dict, tuple((_snapshot(k, keep, depth + 1), _snapshot(v, keep, depth + 1)) for k, v in value.items()))
    items = value if isinstance(value, tuple | list) else sorted(value, key=repr)
    return (type(value), tuple(_snapshot(v, keep, depth + 1) for v in items))
