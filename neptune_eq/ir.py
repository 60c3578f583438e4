"""The reduction IR: index notation with named axes.

A program has named axes with extents, named input tensors indexed by axes, and outputs that are
expressions built from elementwise calls (ops.OPS) and reductions (ops.MONOIDS) over named axes.
Nodes are immutable, hash-consed by value, and carry their free axes.
"""

from __future__ import annotations

import enum
import math
import weakref
from collections.abc import Iterator
from typing import ClassVar


class NeptuneError(ValueError):
    """Base class of the errors neptune_eq reports to users."""


class NeptuneWarning(UserWarning):
    """Base class of the warnings neptune_eq gives (caching turned off, a rule accepted as a refinement)."""


class ProgramError(NeptuneError):
    """The program is malformed (unknown axis, shape mismatch, bad reduction, ...)."""


class _HashConsed(type):
    """Nodes are hash-consed: building a node equal to a live one returns that one. Equal subterms
    are then the same object, so comparing two nodes costs what comparing their children's
    identities does (without it, comparing two separately built chains of ten softmaxes walks the
    DAG as a tree: exponential in its depth). The table holds nodes weakly: it is a cache of values,
    not state anything depends on."""

    _table: ClassVar[weakref.WeakValueDictionary] = weakref.WeakValueDictionary()

    def __call__(cls, *args, **kwargs):
        node = super().__call__(*args, **kwargs)
        key = (cls, node._key())
        found = _HashConsed._table.get(key)
        if found is None:
            _HashConsed._table[key] = found = node
        return found


class Node(metaclass=_HashConsed):
    __slots__ = ("__weakref__", "_axes", "_hash", "_loads", "_reduced", "_refs", "_walk")

    def _key(self) -> tuple:  # pragma: no cover - abstract
        raise NotImplementedError

    def children(self) -> tuple[Node, ...]:
        return ()

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            h = hash((type(self).__name__, *self._key()))
            object.__setattr__(self, "_hash", h)
            return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return type(self) is type(other) and hash(self) == hash(other) and self._key() == other._key()

    def __setattr__(self, name, value):
        raise AttributeError("IR nodes are immutable")

    def __reduce__(self):
        return (type(self), self._args())

    def _args(self) -> tuple:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def axes(self) -> frozenset[str]:
        """The free axes: the indices this value varies over."""
        try:
            return self._axes
        except AttributeError:
            ax = self._free_axes()
            object.__setattr__(self, "_axes", ax)
            return ax

    def _free_axes(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for c in self.children():
            out |= c.axes
        return out

    @property
    def refs(self) -> tuple[StateRef, ...]:
        """The distinct StateRefs of this DAG in walk() order (cached per node, as `axes` is: the plan
        enumeration asks it of the same expressions tens of thousands of times)."""
        try:
            return self._refs
        except AttributeError:
            _summarise(self)
            return self._refs

    @property
    def loads(self) -> tuple[Load, ...]:
        """The distinct Loads of this DAG in walk() order (cached per node)."""
        try:
            return self._loads
        except AttributeError:
            _summarise(self)
            return self._loads

    @property
    def reduced_axes(self) -> frozenset[str]:
        """The axes of the reductions in this DAG (cached per node)."""
        try:
            return self._reduced
        except AttributeError:
            _summarise(self)
            return self._reduced

    def __repr__(self) -> str:
        return show(self)


def _summarise(node: Node) -> None:
    """Fill `_refs`, `_loads` and `_reduced` of node and of every node under it not filled yet, children
    before parents (iterative: programs may be deep)."""
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:
        n, ready = stack.pop()
        if hasattr(n, "_refs"):
            continue
        kids = n.children()
        if not ready:
            stack.append((n, True))
            stack.extend((c, False) for c in reversed(kids) if not hasattr(c, "_refs"))
            continue
        refs: dict[Node, None] = {}
        loads: dict[Node, None] = {}
        for c in kids:
            refs.update(dict.fromkeys(c._refs))
            loads.update(dict.fromkeys(c._loads))
        reduced = frozenset().union(*(c._reduced for c in kids))
        if isinstance(n, StateRef):
            refs[n] = None
        elif isinstance(n, Load):
            loads[n] = None
        elif isinstance(n, Reduce):
            reduced |= {n.axis}
        object.__setattr__(n, "_refs", tuple(refs))
        object.__setattr__(n, "_loads", tuple(loads))
        object.__setattr__(n, "_reduced", reduced)


def _init(obj: Node, **fields) -> None:
    for k, v in fields.items():
        object.__setattr__(obj, k, v)


class Const(Node):
    __slots__ = ("value",)

    def __init__(self, value: float):
        _init(self, value=float(value))

    def _args(self):
        return (self.value,)

    def _key(self):
        # NaN compares equal to itself here; -0.0 and 0.0 are two constants (x / -0.0 is -inf), which
        # Program.validate refuses to hand to the e-graph (egglog's f64 holds one zero)
        v = self.value
        return ("nan",) if math.isnan(v) else (v, math.copysign(1.0, v))


class InternalAxis(enum.Enum):
    """An axis the compiler adds and no program declares. It is not a string, so it never equals an
    axis of the program (which may well be called "chunk"); it prints as its value."""

    CHUNK = "chunk"  # the chunk of split-K's partial states: the first axis of their buffers

    def __str__(self) -> str:
        return self.value


CHUNK = InternalAxis.CHUNK
Axis = str | InternalAxis  # an axis of a program (its name) or one the compiler added


class Index(Node):
    """The integer value of an axis index (for masks like j <= i)."""

    __slots__ = ("axis",)

    def __init__(self, axis: Axis):
        _init(self, axis=axis)

    def _args(self):
        return (self.axis,)

    def _key(self):
        return (self.axis,)

    def _free_axes(self):
        return frozenset((self.axis,))


class Length(Node):
    """The length of an axis as a number (a mean's divisor, a count of equal terms): the axis's extent
    where the program is compiled for one length, the kernel's length argument where the axis is
    dynamic. It varies over no axis (its value is the same at every index point)."""

    __slots__ = ("axis",)

    def __init__(self, axis: str):
        _init(self, axis=axis)

    def _args(self):
        return (self.axis,)

    def _key(self):
        return (self.axis,)


class Load(Node):
    """An element of an input tensor; each index entry is an integer-valued node (gather if not an Index)."""

    __slots__ = ("index", "tensor")

    def __init__(self, tensor: str, index: tuple[Node, ...]):
        _init(self, tensor=tensor, index=tuple(index))

    def _args(self):
        return (self.tensor, self.index)

    def _key(self):
        return (self.tensor, self.index)

    def children(self):
        return self.index


class Call(Node):
    """An elementwise operator from ops.OPS applied to its arguments."""

    __slots__ = ("args", "op")

    def __init__(self, op: str, args: tuple[Node, ...]):
        _init(self, op=op, args=tuple(args))

    def _args(self):
        return (self.op, self.args)

    def _key(self):
        return (self.op, self.args)

    def children(self):
        return self.args


class Reduce(Node):
    __slots__ = ("axis", "body", "op")

    def __init__(self, op: str, axis: str, body: Node):
        _init(self, op=op, axis=axis, body=body)

    def _args(self):
        return (self.op, self.axis, self.body)

    def _key(self):
        return (self.op, self.axis, self.body)

    def children(self):
        return (self.body,)

    def _free_axes(self):
        return self.body.axes - {self.axis}


class RefKind(enum.Enum):
    """Which value of a reduction a StateRef stands for; the value is its prefix in printed IR."""

    FINAL = "fin"  # its final value (computed by an earlier pass or kernel)
    INLINE = "val"  # its value computed per element where it is used (a contraction over a small axis)
    CURRENT = "cur"  # its running value in the pass that carries it, after the current tile
    OLD = "old"  # its running value before the current tile


RUNNING = frozenset((RefKind.CURRENT, RefKind.OLD))  # the values a loop's carried state takes


class StateRef(Node):
    """A reduction's value referred to by its name, varying over `axes`: its final or inline value
    in kernel plans, its running value (current / old) in a loop's update and in correction quotients."""

    __slots__ = ("kind", "name", "ref_axes")

    def __init__(self, kind: RefKind, name: str, axes: frozenset[str] | tuple[str, ...] = ()):
        if not isinstance(kind, RefKind):
            raise TypeError(f"StateRef kind must be a RefKind, not {kind!r}")
        _init(self, kind=kind, name=name, ref_axes=frozenset(axes))

    def _args(self):
        return (self.kind, self.name, tuple(sorted(self.ref_axes)))

    def _key(self):
        return self._args()

    def _free_axes(self):
        return self.ref_axes

    @property
    def running(self) -> bool:
        return self.kind in RUNNING

    @property
    def key(self) -> str:
        """The reference as one string (`cur:x`): its printed form and its symbol in the e-graph."""
        return f"{self.kind.value}:{self.name}"


# ---------------------------------------------------------------- traversal helpers


def walk(node: Node) -> Iterator[Node]:
    """Every distinct node of the DAG, children before parents. The order is cached on the node (plan
    enumeration and pricing walk the same kernel expressions hundreds of thousands of times)."""
    try:
        return iter(node._walk)
    except AttributeError:
        order = tuple(_walk(node))
        object.__setattr__(node, "_walk", order)
        return iter(order)


def _walk(node: Node) -> Iterator[Node]:
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            yield n
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        for c in reversed(n.children()):
            if id(c) not in seen:
                stack.append((c, False))


def rebuild(node: Node, fn, memo: dict | None = None) -> Node:
    """Bottom-up rewrite: fn(original, node_with_rebuilt_children) -> replacement."""
    memo = {} if memo is None else memo

    def go(n: Node) -> Node:
        key = id(n)
        if key in memo:
            return memo[key][1]
        if isinstance(n, Call):
            new = Call(n.op, tuple(go(a) for a in n.args))
        elif isinstance(n, Reduce):
            new = Reduce(n.op, n.axis, go(n.body))
        elif isinstance(n, Load):
            new = Load(n.tensor, tuple(go(a) for a in n.index))
        else:
            new = n
        out = fn(n, new)
        memo[key] = (n, out)
        return out

    return go(node)


def substitute(node: Node, mapping: dict[Node, Node]) -> Node:
    """Replace every occurrence of the keys (by value) with their values."""
    return rebuild(node, lambda old, new: mapping.get(old, mapping.get(new, new)))


def count_nodes(node: Node) -> int:
    return sum(1 for _ in walk(node))


def reads_state(node: Node) -> bool:
    """Does `node` read a reduction's value (a loop state, final or inline)?"""
    return any(isinstance(n, StateRef) for n in walk(node))


def reductions(node: Node) -> list[Reduce]:
    """Distinct reductions in `node`, producers before consumers."""
    return [n for n in walk(node) if isinstance(n, Reduce)]


def grouped_index(e: Node) -> tuple[str, int] | None:
    """(a, G) when index entry `e` is the axis a itself (G = 1) or a // G for a positive integer G
    (the kv head of grouped-query attention: G consecutive rows of a read one slice)."""
    if isinstance(e, Index):
        return e.axis, 1
    if isinstance(e, Call) and e.op == "floordiv" and isinstance(e.args[0], Index) and isinstance(e.args[1], Const):
        g = e.args[1].value
        if math.isfinite(g) and g.is_integer() and 0 < g < 2**31:
            return e.args[0].axis, int(g)
    return None


from .irtext import show, show_shared  # noqa: E402, F401  (printing needs the node classes above)
from .program import DTYPE_BYTES, DTYPES, FLOAT_DTYPES, Output, Program, TensorSpec  # noqa: E402, F401
