"""Elementwise arithmetic, comparisons, selection, casts and constant tensors (arange, ones, ...)."""

from __future__ import annotations

import math

import torch

from .. import ir
from ..ops import COMPARISONS
from .exprs import add, call, const, is_const, mul, power
from .operands import Operand
from .source import CaptureError

aten = torch.ops.aten


def _value(a) -> ir.Node:
    """An argument as an expression: a tensor operand's, or a Python number as a constant."""
    if isinstance(a, Operand):
        return a.expr
    if isinstance(a, bool | int | float):
        return const(a)
    raise CaptureError(f"cannot use {type(a).__name__} {a!r} as a value")


class Pointwise:
    """The first `arity` arguments broadcast together; `fn(translator, call, *exprs)` builds the result
    (Python numbers among the arguments become constants)."""

    def __init__(self, arity: int, fn, *, bool_only: bool = False, data: tuple[int, ...] | None = None):
        self.arity, self.fn, self.bool_only = arity, fn, bool_only
        self.data = tuple(range(arity)) if data is None else data  # operands that are values (not conditions)

    def infer(self, tx, c):
        ops = [a for a in c.args[: self.arity] if isinstance(a, Operand)]
        if self.bool_only and any(op.dtype != torch.bool for op in ops):
            raise CaptureError(f"{c.op_name} on integer tensors is not supported (only on masks)")
        return tx.broadcast(c, ops, len(c.out.shape))

    def build(self, tx, c):
        # (a number the function computed from its arguments' sizes is their len(axis) expression)
        args = [e if (e := tx.size_value(c.node, k)) is not None else _value(a)
                for k, a in enumerate(c.args[: self.arity])]
        if c.out.dtype.is_floating_point:  # torch promotes integer operands: the arithmetic is float
            args = [call("float", e) if k in self.data and isinstance(a, Operand) and not a.dtype.is_floating_point
                    else e for k, (a, e) in enumerate(zip(c.args, args))]
        return self.fn(tx, c, *args)


def unary(op: str) -> Pointwise:
    return Pointwise(1, lambda tx, c, x: call(op, x))


def binary(op: str) -> Pointwise:
    return Pointwise(2, lambda tx, c, a, b: call(op, a, b))


def _alpha(c, b: ir.Node) -> ir.Node:
    alpha = c.kwargs.get("alpha", 1)
    return b if alpha == 1 else mul(b, const(alpha))


def _add(tx, c, a, b):
    if c.out.dtype == torch.bool:  # torch adds masks as a logical or (True + True is True, not 2)
        return call("or", a, b) if c.kwargs.get("alpha", 1) else a
    return call("add", a, _alpha(c, b))


def _sub(tx, c, a, b):
    return call("sub", a, _alpha(c, b))


def _rsub(tx, c, a, b):
    return call("sub", b, _alpha(c, a))


def _div_mode(tx, c, a, b):
    mode = c.kwargs.get("rounding_mode")
    if mode is None:
        return call("div", a, b)
    if mode == "floor":
        return call("floordiv", a, b)
    if mode == "trunc" and c.out.dtype.is_floating_point:
        return call("trunc", call("div", a, b))
    raise CaptureError(f"division with rounding_mode={mode!r} of integers is not supported; use floor division (//)")


def _round_decimals(tx, c, x):
    """torch.round(x, decimals=d) as torch computes it: rint(x·10^d) / 10^d, or rint(x / 10^−d) · 10^−d."""
    d = c.kwargs.get("decimals", c.args[1] if len(c.args) > 1 else 0)
    if not c.out.dtype.is_floating_point:
        raise CaptureError("torch.round(decimals=) of an integer tensor is not supported")
    if d >= 0:
        return call("div", call("rint", call("mul", x, const(10.0 ** d))), const(10.0 ** d))
    return call("mul", call("rint", call("div", x, const(10.0 ** -d))), const(10.0 ** -d))


def integral(op: str) -> Pointwise:
    """floor / ceil / trunc / round: of floats the op, of integers the value itself (as torch's)."""
    return Pointwise(1, lambda tx, c, x: call(op, x) if c.out.dtype.is_floating_point else x)


def _pow(tx, c, x, p):
    if not is_const(p):
        return _pow_op(c, x, p)
    e = p.value
    if e == 1:
        return x
    if e == 0.5:
        return call("sqrt", x)
    if e == -0.5:
        return call("rsqrt", x)
    if e == -1:
        if not c.out.dtype.is_floating_point:  # (torch raises: integers to negative integer powers)
            raise CaptureError(f"{c.op_name} of integers to a negative integer power is not allowed (torch "
                               "raises); convert to float first")
        return call("div", const(1), x)
    if e == int(e) and 2 <= e <= 4:
        return power(x, int(e))
    return _pow_op(c, x, p)


def _pow_op(c, x, p):
    """xᵖ as the op table's pow (torch's special values), for a floating result: an integer power of
    integers would be computed in floats (and torch refuses a negative exponent there)."""
    if not c.out.dtype.is_floating_point:
        raise CaptureError(f"{c.op_name} of integers with a result of {c.out.dtype} is not supported (exponents "
                           "2, 3, 4 are); convert to float first")
    return call("pow", x, p)


def _pow_scalar(tx, c, base, x):
    b = base.value
    if b == 2:
        return call("exp2", x)
    if b > 0:
        return call("exp", mul(x, const(math.log(b))))
    return _pow_op(c, base, x)


def _hardtanh(tx, c, x):
    lo, hi = c.arg(1, "min_val", -1.0), c.arg(2, "max_val", 1.0)
    return call("where", call("le", x, const(lo)), const(lo), call("where", call("ge", x, const(hi)), const(hi), x))


def _clamp(tx, c, x):
    lo, hi = c.arg(1, "min"), c.arg(2, "max")
    if isinstance(lo, Operand) or isinstance(hi, Operand):
        raise CaptureError("clamp with tensor bounds is not supported; use torch.maximum/minimum")
    return _clamped(c, x, None if lo is None else const(lo), None if hi is None else const(hi))


def _clamped(c, x, lo, hi):
    """clamp(x, lo, hi) of floats as selects: x at a bound keeps its gradient (torch's clamp;
    torch.maximum and torch.minimum, max2/min2 here, share a tie's), NaN stays NaN, lo > hi gives hi.
    Of integers (a relative position clamped into a table) max2/min2, the form index analysis reads."""
    if not c.args[0].info.dtype.is_floating_point:
        x = x if lo is None else call("max2", x, lo)
        return x if hi is None else call("min2", x, hi)
    if lo is not None:
        x = call("where", call("lt", x, lo), lo, x)
    if hi is not None:
        x = call("where", call("gt", x, hi), hi, x)
    return x


def _hardsigmoid(tx, c, x):  # (torch's backward: 1/6 strictly inside (−3, 3), 0 at ±3)
    inner = add(mul(x, const(1 / 6)), const(0.5))
    return call("where", call("le", x, const(-3)), const(0), call("where", call("ge", x, const(3)), const(1), inner))


def _hardswish(tx, c, x):  # (torch's backward: x/3 + 1/2 on (−3, 3), 0 at −3, 1 at 3; at −∞ 0, torch's NaN)
    inner = mul(x, mul(add(x, const(3)), const(1 / 6)))
    return call("where", call("le", x, const(-3)), const(0), call("where", call("ge", x, const(3)), x, inner))


def _logit(tx, c, x):
    """log(z / (1 − z)), z = x clamped into [eps, 1 − eps] where eps is given (torch's logit; its gradient is
    0 outside that range and passes at its ends, the clamp's)."""
    eps = c.arg(1, "eps")
    if isinstance(eps, Operand):
        raise CaptureError("torch.logit with a tensor eps is not supported; pass a number")
    z = x if eps is None else _clamped(c, x, const(eps), const(1.0 - eps))
    return call("log", call("div", z, call("sub", const(1), z)))


def _float_only(fn):
    """An op torch implements for floating tensors only: of an integer tensor its fake-tensor trace
    gives an integer result where eager raises, so it is refused rather than computed and truncated."""
    def build(tx, c, *args):
        if not c.out.dtype.is_floating_point:
            raise CaptureError(f"{c.op_name} of a {c.out.dtype} tensor is not implemented by torch; convert to "
                               "float first")
        return fn(tx, c, *args)
    return build


def _where(tx, c, cond, a, b):
    return tx.where(cond, a, b)


def _not(tx, c, x):
    return tx.logical_not(x)


class InPlace:
    """An in-place update left by a decomposition (rms_norm's x.add_(eps)): its out-of-place
    version, when nothing else reads the updated tensor."""

    def __init__(self, handler):
        self.handler = handler

    def infer(self, tx, c):
        target = c.node.args[0]
        if target.op != "call_function" or set(target.users) != {c.node}:
            raise CaptureError(f"in-place {c.op_name} on a tensor that is also used elsewhere is not supported")
        return self.handler.infer(tx, c)

    def build(self, tx, c):
        return self.handler.build(tx, c)


class MaskedFill:
    def infer(self, tx, c):
        x, mask = c.args[0], c.args[1]
        return tx.broadcast(c, [x, mask], x.ndim)

    def build(self, tx, c):
        return tx.where(c.args[1].expr, _value(c.args[2]), c.args[0].expr)


class Cast:
    """dtype conversions: numbers stay numbers; bool→number is where(b, 1, 0), number→bool is x != 0."""

    def infer(self, tx, c):
        return c.args[0].dims

    def build(self, tx, c):
        x = c.args[0]
        src, dst = x.dtype, c.out.dtype
        if src == dst:
            return x.expr
        if src == torch.bool:
            as_int = call("where", x.expr, const(1), const(0))
            return call("float", as_int) if dst.is_floating_point else as_int
        if dst == torch.bool:
            return call("ne", x.expr, const(0))
        if dst.is_floating_point and not src.is_floating_point:
            return call("float", x.expr)  # from here on float arithmetic, as in torch
        if dst.is_floating_point or not src.is_floating_point:
            return x.expr
        raise CaptureError(f"casting {src} to {dst} (truncation) is not supported")


class Constant:
    """A tensor filled with one value (ones, zeros, full, scalar_tensor, *_like)."""

    def __init__(self, value_arg: int | None, value: float | None = None, name: str = "fill_value"):
        self.value_arg, self.value, self.name = value_arg, value, name

    def infer(self, tx, c):
        return tx.axes.dims_for(tuple(c.out.shape))

    def build(self, tx, c):
        v = self.value if self.value_arg is None else c.arg(self.value_arg, self.name)
        if isinstance(v, Operand):
            raise CaptureError("filling with a tensor value is not supported")
        return const(v)


class Uninitialised:
    """empty / empty_like: no values, so only an op that overwrites every element may read it (the
    fill of F.binary_cross_entropy_with_logits' composite); any other reader is refused."""

    OVERWRITES = (torch.ops.aten.fill.Scalar, torch.ops.aten.fill_.Scalar)

    def infer(self, tx, c):
        return tx.axes.dims_for(tuple(c.out.shape))

    def build(self, tx, c):
        readers = [u for u in c.node.users if u.target not in self.OVERWRITES]
        if readers:
            raise CaptureError(f"the values of an uninitialised tensor ({c.op_name}) are read by "
                               f"{readers[0].target}; torch leaves them undefined")
        return const(0.0)  # (never read: every user overwrites it)


class Arange:
    def __init__(self, form: str):
        self.form = form

    def _range(self, c):
        if self.form == "end":
            return 0, 1
        start = c.arg(0, "start")
        return start, (c.arg(2, "step", 1) if self.form == "step" else 1)

    def infer(self, tx, c):
        return tx.axes.dims_for(tuple(c.out.shape))

    def build(self, tx, c):
        start, step = self._range(c)
        return add(mul(tx.index(tx.dims(c)[0]), const(step)), const(start))


class Eye:
    """eye(n[, m]): 1 where the row index equals the column's (SigLIP's ±1 labels, 2·eye − 1)."""

    def infer(self, tx, c):
        return tx.axes.dims_for(tuple(c.out.shape))

    def build(self, tx, c):
        row, col = (tx.index(d) for d in tx.dims(c))
        pred = call("eq", row, col)
        return pred if c.out.dtype == torch.bool else call("where", pred, const(1), const(0))


class Triangle:
    """tril/triu: keep elements with col - row <= k (tril) or >= k (triu), zero elsewhere."""

    def __init__(self, lower: bool):
        self.lower = lower

    def infer(self, tx, c):
        return c.args[0].dims

    def build(self, tx, c):
        x = c.args[0]
        k = c.arg(1, "diagonal", 0)
        row, col = tx.index(x.dims[-2]), tx.index(x.dims[-1])
        pred = call("le" if self.lower else "ge", col, add(row, const(k)))
        if is_const(x.expr, 1.0) and x.dtype == torch.bool:
            return pred
        return call("where", pred, x.expr, const(0))


def _sigmoid(tx, c, x):
    return call("div", const(1), call("add", const(1), call("exp", call("neg", x))))


HANDLERS = {
    aten.add.Tensor: Pointwise(2, _add),
    aten.add.Scalar: Pointwise(2, _add),
    aten.sub.Tensor: Pointwise(2, _sub),
    aten.sub.Scalar: Pointwise(2, _sub),
    aten.rsub.Tensor: Pointwise(2, _rsub),
    aten.rsub.Scalar: Pointwise(2, _rsub),
    aten.mul.Tensor: binary("mul"),
    aten.mul.Scalar: binary("mul"),
    aten.div.Tensor: binary("div"),
    aten.div.Scalar: binary("div"),
    aten.div.Tensor_mode: Pointwise(2, _div_mode),
    aten.div.Scalar_mode: Pointwise(2, _div_mode),
    aten.floor_divide.default: binary("floordiv"),
    aten.floor_divide.Scalar: binary("floordiv"),
    aten.remainder.Tensor: binary("mod"),
    aten.remainder.Scalar: binary("mod"),
    aten.neg.default: unary("neg"),
    aten.exp.default: unary("exp"),
    aten.exp2.default: unary("exp2"),
    aten.log.default: unary("log"),
    aten.log2.default: unary("log2"),
    aten.log1p.default: unary("log1p"),
    aten.expm1.default: unary("expm1"),
    aten.erf.default: unary("erf"),
    aten.tanh.default: unary("tanh"),
    aten.sin.default: unary("sin"),
    aten.cos.default: unary("cos"),
    aten.sqrt.default: unary("sqrt"),
    aten.rsqrt.default: unary("rsqrt"),
    aten.abs.default: unary("abs"),
    aten.reciprocal.default: Pointwise(1, lambda tx, c, x: call("div", const(1), x)),
    aten.square.default: Pointwise(1, lambda tx, c, x: call("mul", x, x)),
    aten.sigmoid.default: Pointwise(1, _sigmoid),
    # sign: 1, -1, and 0 at ±0 and NaN (torch's)
    aten.sign.default: Pointwise(1, lambda tx, c, x: call("where", call("gt", x, const(0)), const(1), call(
        "where", call("lt", x, const(0)), const(-1), const(0)))),
    aten.isnan.default: Pointwise(1, lambda tx, c, x: call("ne", x, x)),  # (xlogy's decomposition reads it)
    aten.floor.default: integral("floor"),
    aten.ceil.default: integral("ceil"),
    aten.trunc.default: integral("trunc"),
    aten.round.default: integral("rint"),
    aten.round.decimals: Pointwise(1, _round_decimals),
    aten.frac.default: Pointwise(1, lambda tx, c, x: call("sub", x, call("trunc", x))),
    aten.isinf.default: Pointwise(1, lambda tx, c, x: call("eq", call("abs", x), const(math.inf))),
    aten.isposinf.default: Pointwise(1, lambda tx, c, x: call("eq", x, const(math.inf))),
    aten.isneginf.default: Pointwise(1, lambda tx, c, x: call("eq", x, const(-math.inf))),
    aten.logit.default: Pointwise(1, _float_only(_logit)),
    aten.log10.default: Pointwise(1, lambda tx, c, x: call("mul", call("log", x), const(1 / math.log(10)))),
    # (relu and hardtanh as selects: torch's gradient is 0 at their kinks, where clamp passes it)
    aten.relu.default: Pointwise(1, lambda tx, c, x: call("where", call("le", x, const(0)), const(0), x)),
    aten.hardtanh.default: Pointwise(1, _hardtanh),
    aten.pow.Tensor_Scalar: Pointwise(2, _pow),
    aten.pow.Scalar: Pointwise(2, _pow_scalar),
    aten.maximum.default: binary("max2"),
    aten.minimum.default: binary("min2"),
    aten.clamp.default: Pointwise(1, _clamp),
    aten.clamp_min.default: Pointwise(2, lambda tx, c, x, lo: _clamped(c, x, lo, None)),
    aten.clamp_max.default: Pointwise(2, lambda tx, c, x, hi: _clamped(c, x, None, hi)),
    aten.hardsigmoid.default: Pointwise(1, _float_only(_hardsigmoid)),
    aten.hardswish.default: Pointwise(1, _float_only(_hardswish)),
    aten.where.self: Pointwise(3, _where, data=(1, 2)),
    aten.where.ScalarSelf: Pointwise(3, _where, data=(1, 2)),
    aten.where.ScalarOther: Pointwise(3, _where, data=(1, 2)),
    aten.where.Scalar: Pointwise(3, _where, data=(1, 2)),
    aten.masked_fill.Scalar: MaskedFill(),
    aten.masked_fill.Tensor: MaskedFill(),
    aten.logical_and.default: binary("and"),
    aten.logical_or.default: binary("or"),
    aten.logical_not.default: Pointwise(1, _not),
    aten.bitwise_and.Tensor: Pointwise(2, lambda tx, c, a, b: call("and", a, b), bool_only=True),
    aten.bitwise_or.Tensor: Pointwise(2, lambda tx, c, a, b: call("or", a, b), bool_only=True),
    aten.bitwise_xor.Tensor: Pointwise(2, lambda tx, c, a, b: call("ne", a, b), bool_only=True),
    aten.bitwise_not.default: Pointwise(1, _not, bool_only=True),
    aten._to_copy.default: Cast(),
    aten.eye.default: Eye(),
    aten.eye.m: Eye(),
    aten.arange.default: Arange("end"),
    aten.arange.start: Arange("start"),
    aten.arange.start_step: Arange("step"),
    aten.ones.default: Constant(None, 1.0),
    aten.zeros.default: Constant(None, 0.0),
    aten.ones_like.default: Constant(None, 1.0),
    aten.zeros_like.default: Constant(None, 0.0),
    aten.new_ones.default: Constant(None, 1.0),
    aten.new_zeros.default: Constant(None, 0.0),
    aten.full.default: Constant(1),
    aten.full_like.default: Constant(1),
    aten.new_full.default: Constant(2),
    aten.scalar_tensor.default: Constant(0, name="s"),
    aten.fill.Scalar: Constant(1, name="value"),
    aten.empty_like.default: Uninitialised(),
    aten.empty.memory_format: Uninitialised(),
    aten.tril.default: Triangle(lower=True),
    aten.triu.default: Triangle(lower=False),
    aten.add_.Tensor: InPlace(Pointwise(2, _add)),
    aten.add_.Scalar: InPlace(Pointwise(2, _add)),
    aten.mul_.Tensor: InPlace(binary("mul")),
    aten.mul_.Scalar: InPlace(binary("mul")),
    aten.masked_fill_.Scalar: InPlace(MaskedFill()),  # cross_entropy's label smoothing
    aten.fill_.Scalar: InPlace(Constant(1, name="value")),  # F.cosine_embedding_loss: empty_like().fill_(1)
    aten.sub_.Tensor: InPlace(Pointwise(2, _sub)),  # … .sub_(cos)
    aten.pow.Tensor_Tensor: Pointwise(2, _pow),
    **{getattr(getattr(aten, op), overload): binary(op)
       for op in COMPARISONS for overload in ("Tensor", "Scalar")},
}
