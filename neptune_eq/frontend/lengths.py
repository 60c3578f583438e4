"""The lengths a translation writes as values: a mean's divisor, the count of a sum over a broadcast
dimension, a number the function computed from its arguments' sizes. A number in a capture for one
length; `len(axis)` in a dynamic function's capture (symbolic_lengths), so that its program is the
same at every length of the axis (frontend/dynamic_axes.py) and the kernels read the length as their
argument."""

from __future__ import annotations

from torch import fx

from .. import ir
from .axes import Dim
from .exprs import call, const
from .symsizes import size_expression


class LengthValues:
    """Translator methods (frontend/translate.py: its fields symbolic_lengths, sizes, res, infos, graph,
    written_sizes)."""

    def length(self, axis: str) -> ir.Node:
        """The length of `axis` as a value: its extent, or `len(axis)` in a capture with symbolic
        lengths (a dynamic function's: the program is then the same at every length of the axis)."""
        return ir.Length(axis) if self.symbolic_lengths else const(self.res.extents[axis])

    def size_value(self, node: fx.Node, k: int) -> ir.Node | None:
        """Argument `k` of `node` written with len(axis) where the function computed it from its
        arguments' sizes (x.sum() / x.shape[0]; a dynamic capture), else None."""
        e = self.sizes.values.get((node, k)) if self.sizes is not None else None
        if e is None:
            return None
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]

        def length(symbol) -> ir.Node:
            p, d = self.sizes.sizes[symbol]
            info = self.infos.get(placeholders[p])
            if info is None:  # an argument fn reads only the size of: its dimensions stay specialised
                return const(self.sizes.example[symbol])
            v = info.dims[d]
            return const(1) if v is None else self.count([v])

        out = size_expression(e, length)
        if out is not None:
            self.written_sizes.add((node, k))
        return out

    def count(self, dims: list[Dim]) -> ir.Node:
        """The number of index points of `dims` (a mean's divisor): the product of their axes' lengths."""
        out = None
        for a in (a for v in dims for a in self.res.axes(v)):
            out = self.length(a) if out is None else call("mul", out, self.length(a))
        return const(1) if out is None else out

    def symbolic_extents(self, axes: set[str]) -> dict[str, frozenset]:
        """Each program axis's extents as the symbolic trace writes them (`x[:, :-1]`'s is s1 - 1), where
        the two traces are aligned: one per dimension of a value on it."""
        shapes = self.sizes.shapes if self.sizes is not None else {}
        out: dict[str, set] = {}
        for node, info in self.infos.items():
            shape = shapes.get(node)
            if not hasattr(info, "dims") or shape is None or len(shape) != len(info.dims):
                continue
            for v, e in zip(info.dims, shape):
                if v is not None and (a := self.res.names.get(self.res.root(v))) in axes:
                    out.setdefault(a, set()).add(e)
        return {a: frozenset(es) for a, es in out.items()}
