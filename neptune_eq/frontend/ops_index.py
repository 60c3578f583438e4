"""Indexing: select, slice, diagonal, advanced indexing (x[i, target[i]], slopes[h]), gather,
index_select, embedding. An indexed dimension's axis is substituted by the index expression in the indexed
value's IR, so `x[arange(n)[:, None] - 1]`-style index arithmetic stays affine and `x[t]` with an
integer tensor t becomes a gather Load. Index tensors are range-checked on every call where their
range cannot be proved (Translator.check_index); x[t] counts negative t from the end, as eager does."""

from __future__ import annotations

import torch

from .. import ir
from .exprs import add, arg_extreme_axis, call, const, mul
from .operands import norm_dim
from .source import CaptureError

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
    mapping, selections = {}, []
    for v, e in pairs:
        if v is None:
            continue
        name = tx.res.name(v)
        if isinstance(e, ir.Index) and tx.res.extents[e.axis] != tx.res.extents[name]:
            e = ir.Call("add", (e, ir.Const(0.0)))
        if arg_extreme_axis(e) is not None:
            # x read at an argmax (logits.gather(-1, logits.argmax(-1, keepdim=True))): Σ_d [d = argmax]·x[d],
            # the kernels computing the index in a pass before the read; its gradient the one-hot, as torch's.
            # (Summed over its own axis, which the read removes from the result: a fresh copy of it would have
            # no length of an argument's, and kept a dynamic compile's length static. A later use of the axis
            # beside the result is shadowed apart by ir.Program.unshadowed.)
            selections.append((name, e))
            continue
        mapping[name] = e
    out = tx.substitute(expr, mapping) if mapping else expr
    for j, e in selections:
        out = ir.Reduce("sum", j, tx.where(ir.Call("eq", (ir.Index(j), e)), out, const(0.0)))
    return out


class Select:
    def infer(self, tx, c):
        x = c.args[0]
        d = norm_dim(c.arg(1, "dim"), x.ndim)
        tx.axes.mark_indexed(x.dims[d], by_tensor=False)
        return [v for k, v in enumerate(x.dims) if k != d]

    def build(self, tx, c):
        x = c.args[0]
        d = norm_dim(c.arg(1, "dim"), x.ndim)
        return _substitute_axes(tx, x.expr, [(x.dims[d], _from_end(tx, x, d, c.arg(2, "index")))])


def _from_end(tx, x, d: int, i: int) -> ir.Node:
    """Position `i` of dimension d of x, counted from its end where negative: `len(axis) + i` in a
    dynamic function's capture (x[:, -1], the last token, at every length), else a number."""
    if i >= 0:
        return const(i)
    if tx.symbolic_lengths and x.dims[d] is not None:
        return add(tx.count([x.dims[d]]), const(i))
    return const(i + x.shape[d])


class Slice:
    def _range(self, c):
        x = c.args[0]
        d = norm_dim(c.arg(1, "dim", 0), x.ndim)
        n = x.shape[d]
        start = c.arg(2, "start")
        start = 0 if start is None else (max(start + n, 0) if start < 0 else min(start, n))  # (as torch clamps)
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
        given = c.arg(2, "start")
        first = _from_end(tx, x, d, given) if given is not None and -x.shape[d] <= given < 0 else const(start)
        return _substitute_axes(tx, x.expr, [(x.dims[d], add(mul(tx.index(new), const(step)), first))])


class Split:
    """x.split(n, d) / x.split([n0, n1, …], d) / x.chunk(k, d) / x.unbind(d): each piece is a slice
    of d (x.chunk(2, -1) is SwiGLU's gate and value), or with `unbind` a select of one index."""

    def __init__(self, unbind: bool = False):
        self.unbind = unbind

    def _pieces(self, c):
        x = c.args[0]
        d = norm_dim(c.arg(1, "dim", 0) if self.unbind else c.arg(2, "dim", 0), x.ndim)
        starts = [0]
        for part in c.out[:-1]:
            starts.append(starts[-1] + (1 if self.unbind else part.shape[d]))
        return x, d, starts

    def infer(self, tx, c):
        x, d, _ = self._pieces(c)
        if len(c.out) > 1:
            tx.axes.mark_indexed(x.dims[d], by_tensor=False)
        result = []
        for part in c.out:
            dims = list(x.dims)
            if self.unbind:
                del dims[d]
            elif len(c.out) > 1:
                dims[d] = tx.axes.new(part.shape[d]) if part.shape[d] > 1 else None
            result.append(dims)
        return result

    def build(self, tx, c):
        x, d, starts = self._pieces(c)
        if len(c.out) == 1 and not self.unbind:
            return [x.expr]
        pieces = []
        for k, start in enumerate(starts):
            if self.unbind:
                at = const(start)
            else:
                new = tx.infos[c.node][k].dims[d]
                at = add(tx.index(new), const(start)) if new is not None else const(start)
            pieces.append(_substitute_axes(tx, x.expr, [(x.dims[d], at)]))
        return pieces


class Cat:
    """torch.cat(xs, d) / torch.stack(xs, d): a new axis along d whose index k reads piece p at
    k − offsetₚ where offsetₚ ≤ k < offsetₚ + nₚ, selected by comparisons of k (masks). Each piece's
    index is clamped into its own range, so the pieces not selected read in bounds too."""

    def __init__(self, stack: bool = False):
        self.stack = stack

    def _parts(self, c):
        xs = [x for x in c.args[0] if x.shape != (0,)]  # (torch.cat skips 1-D empties)
        d = norm_dim(c.arg(1, "dim", 0), c.out.ndim)
        return xs, d

    def infer(self, tx, c):
        xs, d = self._parts(c)
        rank = c.out.ndim
        placed = []
        for x in xs:
            slots = [k for k in range(rank) if k != d] if self.stack else [k if k != d else None for k in range(rank)]
            if not self.stack and x.dims[d] is not None:
                tx.axes.mark_indexed(x.dims[d], by_tensor=False)
            placed.append((x, slots))
        dims = tx.combine(c, rank, placed)
        n = c.out.shape[d]
        dims[d] = tx.axes.new(n) if n > 1 else None
        return dims

    def build(self, tx, c):
        xs, d = self._parts(c)
        new = tx.dims(c)[d]
        k = tx.index(new) if new is not None else const(0)
        pieces, offset = [], 0
        for x in xs:
            n = 1 if self.stack else x.shape[d]
            at = add(k, const(-offset))
            if offset > 0:
                at = call("max2", at, const(0))
            if offset + n < c.out.shape[d]:
                at = call("min2", at, const(n - 1))
            var = None if self.stack else x.dims[d]
            pieces.append((offset + n, _substitute_axes(tx, x.expr, [(var, at)]) if var is not None else x.expr))
            offset += n
        out = pieces[-1][1]
        for end, expr in reversed(pieces[:-1]):
            out = tx.where(call("lt", k, const(end)), expr, out)
        return out


class ConstantPad:
    """F.pad(x, (l, r, …), value=v) (constant mode): along each padded dimension a new axis k of extent
    l + n + r reads x at k − l where l ≤ k < l + n, and v elsewhere; the read is clamped into [0, n)
    (the positions not selected read in bounds too). n is `len(axis)` in a dynamic capture, so the
    program is the same at every length (Hugging Face's loss pads the labels by one ignore_index and
    shifts them: `F.pad(labels, (0, 1), value=-100)[..., 1:]`). A negative amount crops."""

    def _pads(self, c):
        x = c.args[0]
        amounts = list(c.arg(1, "pad"))
        value = c.arg(2, "value", None)
        return x, {x.ndim - 1 - k: (amounts[2 * k], amounts[2 * k + 1]) for k in range(len(amounts) // 2)
                   if (amounts[2 * k], amounts[2 * k + 1]) != (0, 0)}, 0.0 if value is None else float(value)

    def infer(self, tx, c):
        x, pads, _ = self._pads(c)
        dims = list(x.dims)
        for d in pads:
            tx.axes.mark_indexed(dims[d], by_tensor=False)
            n = c.out.shape[d]
            dims[d] = tx.axes.new(n) if n > 1 else None
        return dims

    def build(self, tx, c):
        x, pads, value = self._pads(c)
        inside, pairs = [], []
        for d, (lo, hi) in pads.items():
            new = tx.dims(c)[d]
            k = tx.index(new) if new is not None else const(0)
            n = tx.count([x.dims[d]]) if x.dims[d] is not None else const(1)
            at = add(k, const(-lo))
            if lo > 0:
                inside.append(call("ge", k, const(lo)))
                at = call("max2", at, const(0))
            if hi > 0:
                inside.append(call("lt", k, add(n, const(lo))))
                at = call("min2", at, call("sub", n, const(1)))
            pairs.append((x.dims[d], at))
        out = _substitute_axes(tx, x.expr, pairs)
        if not inside:
            return out
        cond = inside[0]
        for more in inside[1:]:
            cond = call("and", cond, more)
        return tx.where(cond, out, const(value))


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
        pairs = [(x.dims[p], tx.check_index(c, "indexing x[t]", t.expr, x.shape[p], wraps=True, along=x.dims[p]))
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
        pairs = [(x.dims[d], tx.check_index(c, "gather", idx.expr, x.shape[d], along=x.dims[d]))]
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
        index = tx.check_index(c, "embedding" if self.embedding else "index_select", idx.expr, x.shape[d],
                               along=x.dims[d])
        out = _substitute_axes(tx, x.expr, [(x.dims[d], index)])
        if self.embedding:
            pad, by_freq = c.arg(2, "padding_idx", -1), c.arg(3, "scale_grad_by_freq", False)
            if by_freq:
                raise CaptureError("unsupported operation embedding(scale_grad_by_freq=True) (its gradient is "
                                   "divided by each index's count in the batch)")
            if pad is not None and pad >= 0:  # the padding row takes no gradient: its reads are detached
                hit = ir.Call("eq", (idx.expr, ir.Const(pad)))
                out = ir.Call("where", (hit, ir.Call("stopgrad", (out,)), out))
        return out


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
    aten.split.Tensor: Split(),
    aten.split_with_sizes.default: Split(),
    aten.unbind.int: Split(unbind=True),
    aten.cat.default: Cat(),
    aten.constant_pad_nd.default: ConstantPad(),
    aten.stack.default: Cat(stack=True),
    aten.index.Tensor: Index(),
    aten.gather.default: Gather(),
    aten.index_select.default: IndexSelect(),
    aten.embedding.default: IndexSelect(embedding=True),
    aten.diagonal.default: Diagonal(),
    aten.diagonal_copy.default: Diagonal(),
}
