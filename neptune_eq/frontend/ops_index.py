"""Indexing: select, slice, diagonal, advanced indexing (x[i, target[i]], slopes[h]), gather,
index_select, embedding. An indexed dimension's axis is substituted by the index expression in the indexed
value's IR, so `x[arange(n)[:, None] - 1]`-style index arithmetic stays affine and `x[t]` with an
integer tensor t becomes a gather Load. Index tensors are range-checked on every call where their
range cannot be proved (Translator.check_index); x[t] counts negative t from the end, as eager does."""

from __future__ import annotations

import torch

from .. import ir
from .exprs import add, const, mul
from .source import CaptureError
from .translate import norm_dim

aten = torch.ops.aten


def _need_integer(op) -> None:
    if op.dtype == torch.bool:
        raise CaptureError("indexing with a boolean mask has a data-dependent shape; use torch.where instead")
    if op.dtype.is_floating_point:
        raise CaptureError("index tensors must be integer tensors")


def _substitute_axes(tx, expr, pairs):
    """expr with each (variable, index expression) substituted; variables of size-1 dims are skipped.
    An axis read at another, shorter axis (x[:3], a diagonal) is written `k + 0`: ir.Program
    takes a bare axis at a different extent for a shape mismatch, an expression for an index."""
    mapping = {}
    for v, e in pairs:
        if v is None:
            continue
        name = tx.res.name(v)
        if isinstance(e, ir.Index) and tx.res.extents[e.axis] != tx.res.extents[name]:
            e = ir.Call("add", (e, ir.Const(0.0)))
        mapping[name] = e
    return tx.substitute(expr, mapping) if mapping else expr


class Select:
    def infer(self, tx, c):
        x = c.args[0]
        d = norm_dim(c.arg(1, "dim"), x.ndim)
        tx.axes.mark_indexed(x.dims[d], by_tensor=False)
        return [v for k, v in enumerate(x.dims) if k != d]

    def build(self, tx, c):
        x = c.args[0]
        d = norm_dim(c.arg(1, "dim"), x.ndim)
        i = c.arg(2, "index")
        i = i + x.shape[d] if i < 0 else i
        return _substitute_axes(tx, x.expr, [(x.dims[d], const(i))])


class Slice:
    def _range(self, c):
        x = c.args[0]
        d = norm_dim(c.arg(1, "dim", 0), x.ndim)
        n = x.shape[d]
        start = c.arg(2, "start")
        start = 0 if start is None else (start + n if start < 0 else min(start, n))
        step = c.arg(4, "step", 1)
        return x, d, start, step

    def infer(self, tx, c):
        x, d, _, _ = self._range(c)
        length = c.out.shape[d]
        dims = list(x.dims)
        if length == x.shape[d]:
            return dims
        tx.axes.mark_indexed(dims[d], by_tensor=False)
        dims[d] = tx.axes.new(length) if length > 1 else None
        return dims

    def build(self, tx, c):
        x, d, start, step = self._range(c)
        if c.out.shape[d] == x.shape[d]:
            return x.expr
        new = tx.dims(c)[d]
        return _substitute_axes(tx, x.expr, [(x.dims[d], add(mul(tx.index(new), const(step)), const(start)))])


class Index:
    """x[idx0, idx1, ...] with integer index tensors (None = a whole dimension)."""

    def _layout(self, x, indices, rank_b):
        pos = [p for p, t in enumerate(indices) if t is not None]
        rest = [p for p in range(x.ndim) if p not in pos]
        adjacent = pos == list(range(pos[0], pos[-1] + 1))
        if adjacent:
            before = [p for p in rest if p < pos[0]]
            after = [p for p in rest if p > pos[-1]]
            order = [*(("x", p) for p in before), *(("b", k) for k in range(rank_b)), *(("x", p) for p in after)]
        else:
            order = [*(("b", k) for k in range(rank_b)), *(("x", p) for p in rest)]
        return pos, order

    def infer(self, tx, c):
        x, indices = c.args[0], list(c.args[1])
        tensors = [t for t in indices if t is not None]
        for t in tensors:
            _need_integer(t)
        rank_b = max(t.ndim for t in tensors)
        pos, order = self._layout(x, indices, rank_b)
        slot = {key: s for s, key in enumerate(order)}
        for p in pos:
            tx.axes.mark_indexed(x.dims[p])
        operands = [(x, [slot.get(("x", p)) for p in range(x.ndim)])]
        operands += [(t, [slot[("b", rank_b - t.ndim + k)] for k in range(t.ndim)]) for t in tensors]
        return tx.combine(c, len(order), operands)

    def build(self, tx, c):
        x, indices = c.args[0], list(c.args[1])
        # x[t] counts negative t from the end, as eager does; beyond [-n, n) it raises
        pairs = [(x.dims[p], tx.check_index(c, "indexing x[t]", t.expr, x.shape[p], wraps=True))
                 for p, t in enumerate(indices) if t is not None]
        return _substitute_axes(tx, x.expr, pairs)


class Gather:
    """gather(x, dim, index): out[..., j, ...] = x[..., index[..., j, ...], ...]."""

    def infer(self, tx, c):
        x, idx = c.args[0], c.args[2]
        _need_integer(idx)
        d = norm_dim(c.arg(1, "dim"), x.ndim)
        tx.axes.mark_indexed(x.dims[d])
        x_slots = []
        for k in range(x.ndim):
            if k == d:
                x_slots.append(None)
            elif idx.shape[k] == x.shape[k]:
                x_slots.append(k)
            elif idx.shape[k] == 1:  # only position 0 of x along k is read
                x_slots.append(None)
                tx.axes.mark_indexed(x.dims[k], by_tensor=False)
            else:
                raise CaptureError("gather with an index smaller than the input along another dimension")
        return tx.combine(c, x.ndim, [(x, x_slots), (idx, list(range(idx.ndim)))])

    def build(self, tx, c):
        x, idx = c.args[0], c.args[2]
        d = norm_dim(c.arg(1, "dim"), x.ndim)
        pairs = [(x.dims[d], tx.check_index(c, "gather", idx.expr, x.shape[d]))]
        pairs += [(x.dims[k], const(0)) for k in range(x.ndim) if k != d and idx.shape[k] == 1]
        return _substitute_axes(tx, x.expr, pairs)


class IndexSelect:
    """index_select(x, dim, idx) and embedding(weight, idx) (= index_select(weight, 0, idx) reshaped)."""

    def __init__(self, embedding: bool = False):
        self.embedding = embedding

    def _args(self, c):
        if self.embedding:
            return c.args[0], 0, c.args[1]
        x = c.args[0]
        return x, norm_dim(c.arg(1, "dim"), x.ndim), c.args[2]

    def infer(self, tx, c):
        x, d, idx = self._args(c)
        _need_integer(idx)
        tx.axes.mark_indexed(x.dims[d])
        if self.embedding:
            slots_x = [None, idx.ndim]
            slots_i = list(range(idx.ndim))
            n = idx.ndim + 1
        else:
            slots_x = [None if k == d else k for k in range(x.ndim)]
            slots_i = [d]
            n = x.ndim
        return tx.combine(c, n, [(x, slots_x), (idx, slots_i)])

    def build(self, tx, c):
        x, d, idx = self._args(c)
        index = tx.check_index(c, "embedding" if self.embedding else "index_select", idx.expr, x.shape[d])
        return _substitute_axes(tx, x.expr, [(x.dims[d], index)])


class Diagonal:
    """x.diagonal(offset, dim1, dim2): dims dim1 and dim2 give way to a last dim k of length L that
    reads x[.., k + max(0, -offset), .., k + max(0, offset), ..] (one axis indexes both dims)."""

    def _args(self, c):
        x = c.args[0]
        d1, d2 = norm_dim(c.arg(2, "dim1", 0), x.ndim), norm_dim(c.arg(3, "dim2", 1), x.ndim)
        return x, c.arg(1, "offset", 0), d1, d2

    def infer(self, tx, c):
        x, _, d1, d2 = self._args(c)
        for d in (d1, d2):
            tx.axes.mark_indexed(x.dims[d], by_tensor=False)
        n = c.out.shape[-1]
        return [v for k, v in enumerate(x.dims) if k not in (d1, d2)] + [tx.axes.new(n) if n > 1 else None]

    def build(self, tx, c):
        x, offset, d1, d2 = self._args(c)
        k = tx.index(tx.dims(c)[-1])
        pairs = [(x.dims[d1], add(k, const(max(0, -offset)))), (x.dims[d2], add(k, const(max(0, offset))))]
        return _substitute_axes(tx, x.expr, pairs)


HANDLERS = {
    aten.select.int: Select(),
    aten.slice.Tensor: Slice(),
    aten.index.Tensor: Index(),
    aten.gather.default: Gather(),
    aten.index_select.default: IndexSelect(),
    aten.embedding.default: IndexSelect(embedding=True),
    aten.diagonal.default: Diagonal(),
    aten.diagonal_copy.default: Diagonal(),
}
