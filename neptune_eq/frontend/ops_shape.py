"""Views and copies: they change which axis variable sits in which dimension, never the value, so
their IR expression is their input's."""

from __future__ import annotations

import torch

from .. import ir
from .operands import norm_dim
from .source import CaptureError

aten = torch.ops.aten


class ViewOp:
    """Base: pass 2 returns the input expression unchanged."""

    def build(self, tx, c):
        return c.args[0].expr


class Identity(ViewOp):
    def infer(self, tx, c):
        return c.args[0].dims


class Reshape(ViewOp):
    def infer(self, tx, c):
        x = c.args[0]
        return tx.axes.reshape(x.dims, x.shape, tuple(c.out.shape))


class Expand(ViewOp):
    def infer(self, tx, c):
        x = c.args[0]
        out = tuple(c.out.shape)
        offset = len(out) - x.ndim
        dims = []
        for j, n in enumerate(out):
            k = j - offset
            if n == 1:
                dims.append(None)
            elif k >= 0 and x.shape[k] == n:
                dims.append(x.dims[k])
            else:  # a broadcast dimension: the value does not vary along it
                dims.append(tx.axes.new(n))
        return dims


class Permute(ViewOp):
    def infer(self, tx, c):
        x = c.args[0]
        perm = [norm_dim(d, x.ndim) for d in c.arg(1, "dims")]
        return [x.dims[d] for d in perm]


class Transpose(ViewOp):
    def infer(self, tx, c):
        x = c.args[0]
        dims = list(x.dims)
        if x.ndim < 2:
            return dims
        a, b = norm_dim(c.arg(1, "dim0", 0), x.ndim), norm_dim(c.arg(2, "dim1", 1), x.ndim)
        dims[a], dims[b] = dims[b], dims[a]
        return dims


class Unsqueeze(ViewOp):
    def infer(self, tx, c):
        x = c.args[0]
        d = norm_dim(c.arg(1, "dim"), x.ndim + 1)
        return [*x.dims[:d], None, *x.dims[d:]]


class Squeeze(ViewOp):
    def infer(self, tx, c):
        x = c.args[0]
        ds = c.arg(1, "dim", None)
        if ds is None:
            drop = {k for k, n in enumerate(x.shape) if n == 1}
        else:
            ds = [ds] if isinstance(ds, int) else ds
            drop = {norm_dim(d, x.ndim) for d in ds if x.shape[norm_dim(d, x.ndim)] == 1}
        return [v for k, v in enumerate(x.dims) if k not in drop]


class Detach(Identity):
    """x.detach(): x's value, marked stopgrad where it is computed from a floating input (no gradient
    flows through it; neptune_eq/stopgrad.py)."""

    def build(self, tx, c):
        x = c.args[0]
        if x.info.dtype.is_floating_point and any(isinstance(n, ir.Load) for n in ir.walk(x.expr)):
            return ir.Call("stopgrad", (x.expr,))
        return x.expr


class Repeat(Expand):
    """x.repeat(r): where every repeated dimension has size 1 (or is new) the same values as an expand
    (multi-query attention's one kv head repeated over the query heads); tiling a longer dimension n
    r times is an expand to [r, n] (the copies: an axis the value does not vary along) viewed as
    [r·n] (F.instance_norm's per-channel weights repeated for each sample)."""

    def infer(self, tx, c):
        x, reps = c.args[0], list(c.arg(1, "repeats"))
        offset = len(reps) - x.ndim
        tiled = [j for j, r in enumerate(reps) if r != 1 and j >= offset and x.shape[j - offset] != 1]
        if not tiled:
            return super().infer(tx, c)
        dims, shape = [], []
        for j, r in enumerate(reps):
            n = x.shape[j - offset] if j >= offset else 1
            if j in tiled:
                dims += [tx.axes.new(r), x.dims[j - offset]]
                shape += [r, n]
            else:
                dims.append(x.dims[j - offset] if j >= offset and n == r * n else
                            (None if r * n == 1 else tx.axes.new(r * n)))
                shape.append(r * n)
        return tx.axes.reshape(dims, tuple(shape), tuple(c.out.shape))


class AsStrided(Reshape):
    """as_strided over a contiguous input with the contiguous strides of a size of as many elements:
    a reshape (torch's CPU decomposition of group_norm writes its [N, C] weights view so). Any other
    stride pattern reads memory the value's axes do not describe: refused."""

    def infer(self, tx, c):
        inp = c.node.args[0].meta.get("val")
        size, stride = list(c.arg(1, "size")), list(c.arg(2, "stride"))
        offset = c.arg(3, "storage_offset", None)
        want, step = [], 1
        for n in reversed(size):
            want.append(step)
            step *= n
        ok = (isinstance(inp, torch.Tensor) and inp.is_contiguous() and inp.numel() == step
              and all(s == w or n == 1 for s, w, n in zip(stride, want[::-1], size))
              and offset in (None, inp.storage_offset()))
        if not ok:
            raise CaptureError(f"unsupported operation {c.op_name} (size {size}, stride {stride}: not a "
                               "reshape of a contiguous tensor)")
        node = c.node.args[0]  # (an argument viewed so must come contiguous on every call: as_strided
        while node.op == "call_function" and node.target in _VIEWS:  # reads its storage)
            node = node.args[0]
        if node.op == "placeholder":
            tx.storage_reads.add(tx.inputs[tx._placeholder_index(node)].name)
        return super().infer(tx, c)


_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default,
          aten.detach.default, aten.clone.default, aten.contiguous.default)


class Unsupported:
    def __init__(self, why: str):
        self.why = why

    def infer(self, tx, c):
        raise CaptureError(f"unsupported operation {c.op_name} ({self.why})")

    build = infer


HANDLERS = {
    aten.view.default: Reshape(),
    aten._unsafe_view.default: Reshape(),
    aten.reshape.default: Reshape(),
    aten.expand.default: Expand(),
    aten.permute.default: Permute(),
    aten.transpose.int: Transpose(),
    aten.t.default: Transpose(),
    aten.unsqueeze.default: Unsqueeze(),
    aten.squeeze.default: Squeeze(),
    aten.squeeze.dim: Squeeze(),
    aten.squeeze.dims: Squeeze(),
    aten.clone.default: Identity(),
    aten.alias.default: Identity(),
    aten.detach.default: Detach(),
    aten.lift_fresh_copy.default: Identity(),
    aten.contiguous.default: Identity(),
    aten.repeat.default: Repeat(),
    aten.as_strided.default: AsStrided(),
}
