"""Reductions (sum, mean, amax, var, norm, logsumexp), softmax family, contractions (mm, bmm, ...),
and the negative log-likelihood behind F.cross_entropy.

softmax, log_softmax and logsumexp are the composites of neptune_eq.library: a softmax row whose
entries are all -inf gives 0 (torch's eager softmax gives NaN there; SDPA and FlexAttention give
0). A contraction is emitted as written, Σ_k a·b: moving a softmax's normalisation after the sum
(`Σ_j (p/l)·v = (Σ_j p·v)/l`) is found by saturation, not by the capture.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from .. import ir, library
from .exprs import call, const, is_const, power
from .operands import Unavailable, norm_dim
from .source import CaptureError

aten = torch.ops.aten


def _positions(x, dims) -> list[int]:
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return list(range(x.ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({norm_dim(d, x.ndim) for d in dims})


class Reduction:
    """A reduction over the dimensions given by argument `dim_arg` (all when absent)."""

    def __init__(self, kind: str, dim_arg: int | None = 1, keepdim_arg: int | None = 2, *, outputs: int = 1):
        self.kind, self.dim_arg, self.keepdim_arg, self.outputs = kind, dim_arg, keepdim_arg, outputs

    def _where(self, c):
        x = c.args[0]
        dims = None if self.dim_arg is None else c.arg(self.dim_arg, "dim")
        keep = False if self.keepdim_arg is None else bool(c.arg(self.keepdim_arg, "keepdim", False))
        return x, _positions(x, dims), keep

    def infer(self, tx, c):
        x, pos, keep = self._where(c)
        tx.axes.prefer.update(x.dims[p] for p in pos if x.dims[p] is not None)
        if keep:
            dims = [None if k in pos else v for k, v in enumerate(x.dims)]
        else:
            dims = [v for k, v in enumerate(x.dims) if k not in pos]
        if self.outputs == 1:
            return dims
        if self.kind in ("var_mean", "std_mean", "max_dim", "min_dim"):
            return dims, dims
        return dims, Unavailable(f"the second output of {c.op_name}")

    def build(self, tx, c):
        x, pos, _ = self._where(c)
        vs = [x.dims[p] for p in pos]
        n = math.prod(x.shape[p] for p in pos)
        e = x.expr
        kind = self.kind
        if kind in ("sum", "max", "min"):
            out = tx.reduce(kind, e, vs)
        elif kind == "nansum":  # NaN counts 0 (and passes no gradient: torch's)
            out = tx.reduce("sum", call("where", call("ne", e, e), const(0), e), vs)
        elif kind == "count_nonzero":  # an integer count (NaN is nonzero: torch's)
            out = tx.reduce("sum", call("where", call("ne", e, const(0)), const(1), const(0)), vs)
        elif kind == "mean":
            out = call("div", tx.reduce("sum", e, vs), tx.count(vs))
        elif kind in ("var", "std", "var_mean", "std_mean"):
            if not x.dtype.is_floating_point:  # (the fake trace gives an integer result; eager raises)
                raise CaptureError(f"{c.op_name} of a {x.dtype} tensor is not supported by torch (std and var "
                                   "take floating tensors); convert to float first")
            corr = c.kwargs.get("correction", 1)
            corr = 1 if corr is None else corr
            count = tx.count(vs)
            mean = call("div", tx.reduce("sum", e, vs), count)
            d = call("sub", e, mean)
            # torch divides by max(0, n − correction): with no degree of freedom S/0, NaN where S = 0 (a
            # single element), ∞ where S > 0, written S·∞ (a division by the constant 0 folds away). A
            # symbolic count n − c is positive at every length a dynamic axis serves (≥ 2) where c ≤ 1;
            # a larger correction keeps the number (and the axis static)
            ss = tx.reduce("sum", call("mul", d, d), vs)
            if n > corr:
                dof = call("sub", count, const(corr)) if corr <= 1 and not is_const(count) else const(n - corr)
                var = call("div", ss, dof) if corr else call("div", ss, count)
            else:
                var = call("mul", ss, const(math.inf))
            out = _root(var) if kind in ("std", "std_mean") else var
            if kind in ("var_mean", "std_mean"):
                return out, mean
        elif kind == "norm":
            out = _norm(tx, c, e, vs)
        elif kind == "logsumexp":  # over several dims, one at a time: log Σ_a Σ_b eˣ = lse_a(lse_b(x))
            out = e  # (over a dimension of size 1, which is no axis: log eˣ = x, ±inf and NaN included)
            for v in reversed(vs):
                if v is None:
                    continue
                a = tx.single_axis(v, "logsumexp")
                if a in out.axes:
                    out = library.logsumexp(tx.dsl(out), a).node
                else:  # n equal terms (a matmul by a constant weight): log(n·eˣ) = x + log n, ±inf and NaN too
                    n_a = tx.length(a)
                    out = call("add", out, call("log", n_a) if not is_const(n_a) else const(math.log(n_a.value)))
        elif kind in ("argmax", "argmin"):
            out = _arg_extreme(tx, kind.removeprefix("arg"), x, pos)
        else:  # max.dim / min.dim: values and indices
            op = kind.removesuffix("_dim")
            return tx.reduce(op, e, vs), _arg_extreme(tx, op, x, pos)
        return out


def _arg_extreme(tx, op: str, x, pos: list[int]) -> ir.Node:
    """The index of the first element attaining the max (min) over dimensions `pos` of x (row-major over
    them, as torch flattens), a NaN counting as the extreme, as torch's:

        argmax_j x[j] = min_j where(x[j] == max_k x[k]  or  x[j] != x[j], j, n)

    The max and the comparison must see the same values: where x holds a reduction (a matmul's
    logits), every plan writes it once (extract/exact_tests.py), as a recomputed sum may round
    otherwise in another kernel and equal no max."""
    e = x.expr
    vs = [x.dims[p] for p in pos]
    flat = None
    for v in vs:
        if v is None:
            continue
        i = tx.index(v)
        flat = i if flat is None else call("add", call("mul", flat, tx.count([v])), i)
    if flat is None:  # (over dimensions of size 1 only)
        return const(0)
    extreme = tx.reduce(op, e, vs)
    hit = call("or", call("eq", e, extreme), call("ne", e, e))
    return tx.reduce("min", call("where", hit, flat, tx.count(vs)), vs)


def _root(s):
    """√s with torch's gradient of a norm or a standard deviation: 0 where s = 0 (a zero row, a
    constant row), where the chain rule through √ would give ∞·0 = NaN."""
    return call("where", call("eq", s, const(0.0)), const(0.0), call("sqrt", s))


def _norm(tx, c, e, vs):
    p = c.arg(1, "ord", 2)
    if p == 2:
        return _root(tx.reduce("sum", call("mul", e, e), vs))
    if p == 1:
        return tx.reduce("sum", call("abs", e), vs)
    if p == math.inf:
        return tx.reduce("max", call("abs", e), vs)
    if p == -math.inf:
        return tx.reduce("min", call("abs", e), vs)
    if p == 0:  # the count of nonzero elements
        return tx.reduce("sum", call("where", call("ne", e, const(0.0)), const(1.0), const(0.0)), vs)
    # (Σ|x|ᵖ)^(1/p); 0 with a zero gradient on a zero row (torch's), where the root's derivative is ∞.
    # An integer p up to 8 multiplies (libdevice's pow per element made F.normalize(p=3) 2.6x slower)
    a = call("abs", e)
    term = power(a, int(p)) if float(p).is_integer() and 2 <= p <= 8 else call("pow", a, const(float(p)))
    s = tx.reduce("sum", term, vs)
    return call("where", call("eq", s, const(0.0)), const(0.0), call("pow", s, const(1.0 / p)))


def _one_axis(tx, vs, what: str) -> str:
    if len(vs) != 1 or vs[0] is None:
        raise CaptureError(f"{what} over {len(vs)} dimensions (or a dimension of size 1) is not supported")
    return tx.single_axis(vs[0], what)


class Softmax:
    def __init__(self, log: bool):
        self.log = log

    def _dim(self, c):
        x = c.args[0]
        return x, norm_dim(c.arg(1, "dim"), x.ndim)

    def infer(self, tx, c):
        x, d = self._dim(c)
        if x.dims[d] is not None:
            tx.axes.prefer.add(x.dims[d])
        return x.dims

    def build(self, tx, c):
        x, d = self._dim(c)
        name = "log_softmax" if self.log else "softmax"
        if not c.out.dtype.is_floating_point:  # (the fake trace gives an integer result; eager raises)
            raise CaptureError(f"{name} of a {c.out.dtype} tensor is not implemented by torch; convert to float first")
        if x.dims[d] is None and x.shape[d] == 1:  # (a row of one: attention over a single key)
            return self._one(x.expr)
        axis = _one_axis(tx, [x.dims[d]], name)
        if axis not in x.expr.axes:
            raise CaptureError(f"{name} along a dimension its input does not vary along")
        fn = library.log_softmax if self.log else library.softmax
        return fn(tx.dsl(x.expr), axis).node

    def _one(self, e):
        """library.softmax / log_softmax of a row of one element, their reductions the element itself:
        1 (log: 0), 0 for a masked −inf (log: NaN, as torch's), NaN for +inf or NaN."""
        m = call("where", call("eq", call("abs", e), const(math.inf)), const(0.0), e)  # safe_max
        p = call("exp", call("sub", e, m))
        if self.log:
            return call("sub", e, call("add", m, call("log", p)))
        return call("where", call("eq", p, const(0.0)), const(0.0), call("div", p, p))


# ---------------------------------------------------------------- contractions


def contract(tx, a: ir.Node, b: ir.Node, k) -> ir.Node:
    """Σ_k a·b as written: where a normalisation is applied is the e-graph's choice (rules/algebra.py)."""
    axes = tx.res.axes(k)
    if not axes:
        return call("mul", a, b)
    return tx.reduce("sum", call("mul", a, b), [k])


def _held(tx, operand) -> ir.Node:
    """A matmul operand's expression, marked float32 (`round_f32`, exact in the kernels' float32) where
    torch holds it in float32 though it is computed from 16-bit loads: Swin-v2's
    F.normalize(q.float()) @ F.normalize(k.float())ᵀ is a float32 matmul, which the lowering had fed to
    the tensor cores rounded to the loads' bf16 (lower/contract.py `_data_dtype`; the logits, scaled by
    up to 100, then lost the gradient's precision: 4e-2 against eager's 4e-3)."""
    expr = operand.expr
    if operand.dtype != torch.float32 or isinstance(expr, ir.Load):
        return expr
    dtypes = tx.input_dtypes
    narrow = {torch.float16, torch.bfloat16}
    if any(isinstance(n, ir.Load) and dtypes.get(n.tensor) in narrow for n in ir.walk(expr)):
        return call("round_f32", expr)
    return expr


class Contraction:
    """mm, bmm, mv, dot, addmm and baddbmm: operand dimensions go to slots, the contracted slot is
    summed; addmm/baddbmm add beta·bias (broadcast against the result)."""

    # per kind: slots of a's dims, slots of b's dims, result slots, contracted slot
    LAYOUTS: ClassVar[dict[str, tuple]] = {
        "mm": ([0, 2], [2, 1], [0, 1], 2),
        "bmm": ([0, 1, 3], [0, 3, 2], [0, 1, 2], 3),
        "mv": ([0, 1], [1], [0], 1),
        "dot": ([0], [0], [], 0),
    }

    def __init__(self, kind: str, first: int = 0):
        self.kind, self.first = kind, first

    def infer(self, tx, c):
        a_slots, b_slots, res, k = self.LAYOUTS[self.kind]
        a, b = c.args[self.first], c.args[self.first + 1]
        operands = [(a, a_slots), (b, b_slots)]
        if self.first:  # addmm/baddbmm: the bias broadcasts against the result
            bias = c.args[0]
            operands.append((bias, res[len(res) - bias.ndim:]))
        slots = tx.combine(c, 1 + max(a_slots + b_slots), operands)
        if slots[k] is not None:
            tx.axes.prefer.add(slots[k])
        tx.keep_apart(slots)  # (the summed class stays apart from every axis of the result, later too)
        return [slots[s] for s in res]

    def build(self, tx, c):
        a_slots, _, _, k = self.LAYOUTS[self.kind]
        a, b = c.args[self.first], c.args[self.first + 1]
        out = contract(tx, _held(tx, a), _held(tx, b), a.dims[a_slots.index(k)])
        if self.first:
            beta, alpha = c.kwargs.get("beta", 1), c.kwargs.get("alpha", 1)
            bias = c.args[0].expr if beta == 1 else call("mul", c.args[0].expr, const(beta))
            out = call("add", bias, out if alpha == 1 else call("mul", out, const(alpha)))
        return out


class NllLoss:
    """nll_loss_forward(logp, target, weight=None, reduction, ignore_index): the loss of row n is
    -w[target[n]]·logp[n, target[n]] (w = 1 without class weights), 0 where target[n] ==
    ignore_index; reduction 'none' (0) keeps the rows, 'sum' (2) adds them, 'mean' (1) divides the
    sum by the weight of the rows not ignored (their number without weights; 0/0 = nan when every
    row is, as in eager). A target outside [0, C) other than ignore_index is checked on every call
    (checks.py)."""

    REDUCTIONS: ClassVar[dict[int, str]] = {0: "none", 1: "mean", 2: "sum"}

    def infer(self, tx, c):
        x, t, w = c.args[0], c.args[1], c.arg(2, "weight")
        reduction = c.arg(3, "reduction")
        if reduction not in self.REDUCTIONS:
            raise CaptureError(f"cross entropy / nll_loss with reduction code {reduction!r} is not supported")
        tx.axes.mark_indexed(x.dims[-1])
        rows = [0] if x.ndim == 2 else []
        weights = [(w, [1])] if w is not None else []  # the class axis of the weights is the logits'
        slots = tx.combine(c, 2, [(x, [*rows, 1]), (t, [0] * t.ndim), *weights])
        if reduction != 0 and slots[0] is not None:
            tx.axes.prefer.add(slots[0])
        loss = [slots[0]] if x.ndim == 2 and reduction == 0 else []
        return loss, Unavailable("the total weight of nll_loss")

    def build(self, tx, c):
        x, t = c.args[0], c.args[1]
        if t.dtype.is_floating_point:
            raise CaptureError("class-probability targets are not supported; pass integer class indices")
        cls = x.dims[-1]
        ignore = c.arg(4, "ignore_index", -100)
        n = x.shape[-1]
        index = tx.check_index(c, "cross_entropy / nll_loss target", t.expr, n, ignore=ignore, along=cls)
        # rows whose target is ignore_index read class 0 or n - 1 instead (their loss is 0): every
        # read stays inside the row (valid targets are checked)
        if ignore < 0:
            index = call("max2", index, const(0))
        elif ignore >= n:
            index = call("min2", index, const(n - 1))
        def at_target(e):
            return e if cls is None else tx.substitute(e, {tx.res.name(cls): index})

        w = c.arg(2, "weight")
        weight = None if w is None else at_target(w.expr)
        picked = at_target(x.expr)
        ignored = call("eq", t.expr, const(ignore))
        loss = call("where", ignored, const(0), call("neg", picked if weight is None else call("mul", weight, picked)))
        reduction = self.REDUCTIONS[c.arg(3, "reduction")]
        if reduction == "none":
            return loss, None
        rows = [x.dims[0]] if x.ndim == 2 else []
        total = tx.reduce("sum", loss, rows)
        if reduction == "sum":
            return total, None
        count = tx.reduce("sum", call("where", ignored, const(0), const(1) if weight is None else weight), rows)
        return call("div", total, count), None


CONTRACTIONS = (aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default, aten.addmm.default,
                aten.baddbmm.default)
HANDLERS = {
    aten.sum.dim_IntList: Reduction("sum"),
    aten.sum.default: Reduction("sum", None, None),
    aten.nansum.default: Reduction("nansum"),  # (torch.nanmean: nansum over the count of non-NaN)
    aten.count_nonzero.dim_IntList: Reduction("count_nonzero", 1, None),
    aten.count_nonzero.default: Reduction("count_nonzero", 1, None),
    aten.mean.dim: Reduction("mean"),
    aten.mean.default: Reduction("mean", None, None),
    aten.amax.default: Reduction("max"),
    aten.amin.default: Reduction("min"),
    aten.max.default: Reduction("max", None, None),
    aten.min.default: Reduction("min", None, None),
    aten.max.dim: Reduction("max_dim", outputs=2),
    aten.min.dim: Reduction("min_dim", outputs=2),
    aten.argmax.default: Reduction("argmax"),
    aten.argmin.default: Reduction("argmin"),
    aten.var.correction: Reduction("var"),
    aten.std.correction: Reduction("std"),
    aten.var_mean.correction: Reduction("var_mean", outputs=2),
    aten.std_mean.correction: Reduction("std_mean", outputs=2),
    aten.linalg_vector_norm.default: Reduction("norm", 2, 3),
    aten.logsumexp.default: Reduction("logsumexp"),
    aten._softmax.default: Softmax(log=False),
    aten._safe_softmax.default: Softmax(log=False),
    aten._log_softmax.default: Softmax(log=True),
    aten.mm.default: Contraction("mm"),
    aten.bmm.default: Contraction("bmm"),
    aten.mv.default: Contraction("mv"),
    aten.dot.default: Contraction("dot"),
    aten.addmm.default: Contraction("mm", first=1),
    aten.baddbmm.default: Contraction("bmm", first=1),
    aten.nll_loss_forward.default: NllLoss(),
}
