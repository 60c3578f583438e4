"""A small index-notation language for reduction programs.

    P = program("softmax")
    i, j = P.axes(i=64, j=1000)
    x = P.input("x", i, j)
    m = max(x, j)                       # reductions name the axis they remove
    e = exp(x - m)                      # broadcasting is by axis name
    P.output("y", e / sum(e, j))
    prog = P.build()

Masks compare affine index expressions: `where(j.index <= i.index, s, -inf)`.
"""

from __future__ import annotations

import builtins
import math

from . import ir
from .ir import ProgramError

inf = math.inf


class Axis:
    __slots__ = ("builder", "extent", "name")

    def __init__(self, builder: ProgramBuilder, name: str, extent: int):
        self.builder, self.name, self.extent = builder, name, extent

    @property
    def index(self) -> Expr:
        """The integer index along this axis, as an expression (for masks)."""
        return Expr(self.builder, ir.Index(self.name))

    def __repr__(self) -> str:
        return f"Axis({self.name}={self.extent})"


Scalar = int | float


class Expr:
    """A value indexed by named axes; arithmetic broadcasts by axis name."""

    __slots__ = ("builder", "node")
    __array_priority__ = 1000

    def __init__(self, builder: ProgramBuilder, node: ir.Node):
        self.builder, self.node = builder, node

    @property
    def axes(self) -> tuple[str, ...]:
        order = list(self.builder._axes)
        return tuple(sorted(self.node.axes, key=order.index))

    def _bin(self, op: str, other, swap: bool = False) -> Expr:
        o = _lift(other, self.builder)
        a, b = (o, self) if swap else (self, o)
        return Expr(self.builder, ir.Call(op, (a.node, b.node)))

    def __add__(self, o):
        return self._bin("add", o)

    def __radd__(self, o):
        return self._bin("add", o, True)

    def __sub__(self, o):
        return self._bin("sub", o)

    def __rsub__(self, o):
        return self._bin("sub", o, True)

    def __mul__(self, o):
        return self._bin("mul", o)

    def __rmul__(self, o):
        return self._bin("mul", o, True)

    def __truediv__(self, o):
        return self._bin("div", o)

    def __rtruediv__(self, o):
        return self._bin("div", o, True)

    def __floordiv__(self, o):
        return self._bin("floordiv", o)

    def __mod__(self, o):
        return self._bin("mod", o)

    def __neg__(self):
        return Expr(self.builder, ir.Call("neg", (self.node,)))

    def __pow__(self, p):
        if p == 2:
            return self * self
        raise ProgramError(f"only x**2 is supported, got x**{p!r}")

    def __lt__(self, o):
        return self._bin("lt", o)

    def __le__(self, o):
        return self._bin("le", o)

    def __gt__(self, o):
        return self._bin("gt", o)

    def __ge__(self, o):
        return self._bin("ge", o)

    def __eq__(self, o):  # elementwise, like torch and numpy (a Python bool here would build a wrong program)
        return self._bin("eq", o)

    def __ne__(self, o):
        return self._bin("ne", o)

    __hash__ = object.__hash__  # identity: an Expr stays usable as a dict key

    def __and__(self, o):
        return self._bin("and", o)

    def __or__(self, o):
        return self._bin("or", o)

    def __invert__(self):
        return Expr(self.builder, ir.Call("not", (self.node,)))

    def __bool__(self):
        raise ProgramError("an expression has no truth value; use where(cond, a, b) for data-dependent choices")

    def __repr__(self) -> str:
        return f"Expr[{', '.join(self.axes)}]({ir.show(self.node)})"


def _lift(x, builder: ProgramBuilder | None) -> Expr:
    if isinstance(x, Expr):
        if builder is not None and x.builder is not builder:
            raise ProgramError(
                f"expression from program '{x.builder.name}' used in program '{builder.name}'"
            )
        return x
    if isinstance(x, Axis):
        return x.index
    if isinstance(x, bool | int | float):
        return Expr(builder, ir.Const(float(x)))
    raise ProgramError(f"cannot use {type(x).__name__} {x!r} in a program expression")


def _builder_of(*xs) -> ProgramBuilder:
    for x in xs:
        if isinstance(x, Expr | Axis):
            return x.builder
    raise ProgramError("an operation needs at least one program expression among its arguments")


def _call(op: str, *args) -> Expr:
    b = _builder_of(*args)
    return Expr(b, ir.Call(op, tuple(_lift(a, b).node for a in args)))


def exp(x) -> Expr:
    return _call("exp", x)


def exp2(x) -> Expr:
    return _call("exp2", x)


def log(x) -> Expr:
    return _call("log", x)


def log1p(x) -> Expr:
    return _call("log1p", x)


def expm1(x) -> Expr:
    return _call("expm1", x)


def erf(x) -> Expr:
    return _call("erf", x)


def tanh(x) -> Expr:
    return _call("tanh", x)


def sin(x) -> Expr:
    return _call("sin", x)


def cos(x) -> Expr:
    return _call("cos", x)


def sqrt(x) -> Expr:
    return _call("sqrt", x)


def rsqrt(x) -> Expr:
    return _call("rsqrt", x)


def abs(x) -> Expr:
    return _call("abs", x)


def maximum(a, b) -> Expr:
    return _call("max2", a, b)


def minimum(a, b) -> Expr:
    return _call("min2", a, b)


def where(cond, a, b) -> Expr:
    return _call("where", cond, a, b)


def eq(a, b) -> Expr:
    return _call("eq", a, b)


def ne(a, b) -> Expr:
    return _call("ne", a, b)


def _reduce(op: str, x: Expr, axis) -> Expr:
    if not isinstance(x, Expr):
        raise ProgramError(f"{op}() needs a program expression, got {type(x).__name__}")
    name = x.builder._axis_name(axis)
    if name not in x.node.axes:
        have = ", ".join(x.axes) or "none"
        raise ProgramError(
            f"{op} over axis '{name}' but the body does not depend on '{name}' (its axes: {have})"
        )
    return Expr(x.builder, ir.Reduce(op, name, x.node))


def sum(x: Expr, axis) -> Expr:
    return _reduce("sum", x, axis)


def max(x: Expr, axis) -> Expr:
    return _reduce("max", x, axis)


def min(x: Expr, axis) -> Expr:
    return _reduce("min", x, axis)


def mean(x: Expr, axis) -> Expr:
    name = x.builder._axis_name(axis)
    return sum(x, axis) / float(x.builder._axes[name])


class ProgramBuilder:
    """Collects axes, inputs and outputs; `build()` returns a validated ir.Program."""

    def __init__(self, name: str):
        self.name = name
        self._axes: dict[str, int] = {}
        self._inputs: dict[str, ir.TensorSpec] = {}
        self._outputs: list[ir.Output] = []

    def axis(self, name: str, extent: int) -> Axis:
        if name in self._axes:
            raise ProgramError(f"axis '{name}' declared twice in program '{self.name}'")
        if not isinstance(extent, int) or isinstance(extent, bool) or extent < 1:
            raise ProgramError(f"axis '{name}' needs an int extent >= 1, got {extent!r}")
        self._axes[name] = extent
        return Axis(self, name, extent)

    def axes(self, **extents: int) -> tuple[Axis, ...]:
        return tuple(self.axis(n, e) for n, e in extents.items())

    def _axis_name(self, axis) -> str:
        if isinstance(axis, Axis):
            if axis.builder is not self:
                raise ProgramError(f"axis '{axis.name}' belongs to program '{axis.builder.name}', not '{self.name}'")
            return axis.name
        if isinstance(axis, str):
            if axis not in self._axes:
                known = ", ".join(self._axes) or "none"
                raise ProgramError(f"unknown axis '{axis}' in program '{self.name}' (declared: {known})")
            return axis
        raise ProgramError(f"expected an axis, got {type(axis).__name__} {axis!r}")

    def input(self, name: str, *axes, dtype: str = "float32") -> Expr:
        """Declare an input tensor indexed by `axes` (Axis objects or names) and return its element."""
        if name in self._inputs:
            raise ProgramError(f"input '{name}' declared twice in program '{self.name}'")
        if len(axes) == 1 and isinstance(axes[0], tuple | list):
            axes = tuple(axes[0])
        names = tuple(self._axis_name(a) for a in axes)
        if dtype not in ir.DTYPES:
            raise ProgramError(f"input '{name}' has unknown dtype {dtype!r} (known: {ir.DTYPES})")
        self._inputs[name] = ir.TensorSpec(name, names, dtype)
        return Expr(self, ir.Load(name, tuple(ir.Index(a) for a in names)))

    def gather(self, name: str, *index) -> Expr:
        """Element of input `name` at computed indices, e.g. gather("x", i, target) for x[i, target[i]]."""
        spec = self._inputs.get(name)
        if spec is None:
            raise ProgramError(f"gather from unknown input '{name}'")
        if len(index) != len(spec.axes):
            raise ProgramError(f"gather from '{name}' needs {len(spec.axes)} indices, got {len(index)}")
        nodes = tuple(_lift(i, self).node for i in index)
        return Expr(self, ir.Load(name, nodes))

    def output(self, name: str, expr: Expr, axes=None, dtype: str | None = None) -> None:
        expr = _lift(expr, self)
        names = expr.axes if axes is None else tuple(self._axis_name(a) for a in axes)
        self._outputs.append(ir.Output(name, names, expr.node, dtype))

    def build(self) -> ir.Program:
        return ir.Program(self.name, dict(self._axes), dict(self._inputs), list(self._outputs)).validate().unshadowed()


def program(name: str) -> ProgramBuilder:
    return ProgramBuilder(name)


__all__ = [
    "Axis", "Expr", "ProgramBuilder", "abs", "cos", "eq", "erf", "exp", "exp2", "expm1", "inf", "log", "log1p", "max",
    "maximum", "mean", "min", "minimum", "ne", "program", "rsqrt", "sin", "sqrt", "sum", "tanh", "where",
]
_ = builtins  # the module shadows sum/max/min/abs on purpose
