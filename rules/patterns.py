"""Read egglog expressions (rule sides and conditions) back into a small neutral tree.

The fuzzer evaluates these trees, the explorer prints them; both therefore see exactly the rules
egglog runs, including rules users write with the egglog API over our sorts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neptune_eq.ops import OPS
from neptune_eq.terms import op_of_callable

_F64_METHODS = {"__add__": "f_add", "__sub__": "f_sub", "__mul__": "f_mul", "__truediv__": "f_div",
                "__neg__": "f_neg", "__radd__": "f_add", "__rmul__": "f_mul", "__rsub__": "f_sub",
                "__rtruediv__": "f_div"}


class PatternError(ValueError):
    pass


@dataclass(frozen=True)
class PNode:
    kind: str  # "op" | "var" | "lit"
    name: str = ""  # op name or variable name
    args: tuple[PNode, ...] = ()
    value: object = None  # literal value
    sort: str = ""  # variable sort: Term, f64, String, i64

    def vars(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.kind == "var":
            out[self.name] = self.sort
        for a in self.args:
            out.update(a.vars())
        return out

    def ops(self) -> set[str]:
        out = {self.name} if self.kind == "op" else set()
        for a in self.args:
            out |= a.ops()
        return out


def pattern_of(expr) -> PNode:
    """PNode of an egglog runtime expression or declaration."""
    typed = getattr(expr, "__egg_typed_expr__", None)
    if typed is not None:
        return _convert(typed.expr, typed.tp.ident.name)
    return _convert(expr, "")


def _convert(d, sort: str) -> PNode:
    kind = type(d).__name__
    if kind == "TypedExprDecl":
        return _convert(d.expr, d.tp.ident.name)
    if kind == "UnboundVarDecl":
        return PNode("var", d.name, sort=sort)
    if kind == "LitDecl":
        return PNode("lit", value=d.value, sort=sort)
    if kind == "CallDecl":
        ref = d.callable
        args = tuple(_convert(a.expr, a.tp.ident.name) for a in d.args)
        if type(ref).__name__ == "MethodRef" and ref.ident.name == "f64" and ref.method_name in _F64_METHODS:
            return PNode("op", _F64_METHODS[ref.method_name], args)
        if type(ref).__name__ == "MethodRef" and ref.ident.name in ("i64", "f64"):
            return PNode("op", f"{ref.ident.name}.{ref.method_name}", args)
        if type(ref).__name__ == "ClassMethodRef" and ref.ident.name in ("i64", "f64"):
            return PNode("op", f"{ref.ident.name}.{ref.method_name}", args)
        if type(ref).__name__ == "InitRef" and ref.ident.name in ("f64", "i64", "String"):
            return args[0] if args else PNode("lit", value=None)
        op = op_of_callable(ref)
        if op is None:
            raise PatternError(f"rules may only use neptune_eq term constructors; found {ref}")
        return PNode("op", op, args)
    raise PatternError(f"unsupported pattern element {kind}")


def _lit(v) -> str:
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        short = f"{v:g}"  # 2, 0.5, 1e-06 ...; but 6 significant digits would print 1.0000001 as 1
        return short if float(short) == v else repr(v)  # repr: the shortest text that reads back exactly
    if isinstance(v, str):
        return repr(v)
    return str(v)


_INFIX = {op.name: op.infix for op in OPS.values() if op.infix and op.arity == 2}
_INFIX.update({"f_add": "+", "f_sub": "-", "f_mul": "*", "f_div": "/"})


def pretty(p: PNode) -> str:
    if p.kind == "var":
        return p.name
    if p.kind == "lit":
        return _lit(p.value)
    if p.name == "const":
        return pretty(p.args[0])
    if p.name in _INFIX:
        return f"({pretty(p.args[0])} {_INFIX[p.name]} {pretty(p.args[1])})"
    if p.name in ("neg", "f_neg"):
        return f"-{pretty(p.args[0])}"
    if p.name == "red":
        op, ax, body = p.args
        return f"{pretty(op).strip(chr(39))}_{pretty(ax)}({pretty(body)})"
    if p.name in ("index", "load", "sym", "length"):
        return f"{p.name}({pretty(p.args[0])})"
    return f"{p.name}({', '.join(pretty(a) for a in p.args)})"
