"""The data of a translation (frontend/translate.py) that its operator handlers (ops_*.py) share: a
traced value's dimensions, an operation's call and operands, the declared inputs and the result."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import fx

from .. import ir
from .axes import Dim
from .checks import IndexCheck


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def norm_dim(d: int, ndim: int) -> int:
    """A dimension argument with negative values counted from the end."""
    return d + ndim if d < 0 else d


@dataclass
class Info:
    """What pass 1 knows about a tensor value."""

    dims: tuple[Dim, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Operand:
    """A tensor argument of an operation: its dimensions and, in pass 2, its expression."""

    pos: int
    info: Info
    expr: ir.Node | None = None

    @property
    def dims(self) -> tuple[Dim, ...]:
        return self.info.dims

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.info.dtype

    @property
    def ndim(self) -> int:
        return len(self.info.shape)


@dataclass
class Unavailable:
    """A part of a multi-output operation that cannot be translated (e.g. the indices of max)."""

    what: str


@dataclass
class OpCall:
    node: fx.Node
    args: tuple
    kwargs: dict

    def arg(self, i: int, name: str, default=None):
        if i < len(self.args):
            return self.args[i]
        return self.kwargs.get(name, default)

    @property
    def out(self):
        """The traced (fake) result: a tensor or a tuple."""
        return self.node.meta["val"]

    @property
    def op_name(self) -> str:
        return op_name(self.node.target)


def op_name(target) -> str:
    packet = getattr(target, "overloadpacket", None)
    return str(packet) if packet is not None else getattr(target, "__name__", str(target))


@dataclass
class InputDecl:
    """A placeholder that becomes a program input."""

    name: str
    dtype: torch.dtype


@dataclass
class Translation:
    program: ir.Program
    output_shapes: list[tuple[int, ...]]
    output_dtypes: list[torch.dtype]
    checks: tuple[IndexCheck, ...] = ()  # index ranges to check on every call (checks.py)
    extents: dict = field(default_factory=dict)  # program axis → its extents in the symbolic trace (sympy)
