"""Printing IR: readable infix text, with a long subterm used more than once named once (`%1 = ...`)
so that the text of a program is polynomial in the size of its DAG (it is also the compile cache's key)."""

from __future__ import annotations

import math

from .ir import Call, Const, Index, Length, Load, Node, Reduce, StateRef, walk
from .ops import OPS

_PREC = {"or": 1, "and": 2, "lt": 3, "le": 3, "gt": 3, "ge": 3, "eq": 3, "ne": 3, "add": 4, "sub": 4,
         "mul": 5, "div": 5, "floordiv": 5, "mod": 5}


def show(node: Node, names: dict[Node, str] | None = None) -> str:
    """Readable infix form, e.g. `sum_j(exp(s[i,j] - m) * v[j,e])`. A long subterm used more than
    once is printed once, named (`... where %1 = ...`): the text stays polynomial in the DAG's size."""
    lets, (text,) = show_shared([node], names)
    return text if not lets else f"{text} where " + "; ".join(f"{k} = {v}" for k, v in lets)


SHARE_CHARS = 80  # a subterm used more than once is named once its text is at least this long


def show_shared(roots: list[Node], names: dict[Node, str] | None = None, *, exact: bool = False
                ) -> tuple[list[tuple[str, str]], list[str]]:
    """(named shared subterms in definition order, the text of each root). Linear in the DAG size
    (times SHARE_CHARS): a program with a chain of ten softmaxes prints in milliseconds. `exact`
    writes every constant so that it reads back bit for bit (float.hex): text that identifies."""
    names = dict(names or {})
    uses: dict[int, int] = {}
    order: list[Node] = []
    seen: set[int] = set()
    for r in roots:
        for n in walk(r):
            if id(n) not in seen:
                seen.add(id(n))
                order.append(n)
                for c in n.children():
                    uses[id(c)] = uses.get(id(c), 0) + 1
    for r in roots:
        uses[id(r)] = uses.get(id(r), 0) + 1
    texts: dict[int, tuple[str, float]] = {}
    lets: list[tuple[str, str]] = []

    def wrap(c: Node, prec: float) -> str:
        s, p = texts[id(c)]
        return f"({s})" if p < prec else s

    for n in order:
        if n in names:
            texts[id(n)] = (names[n], 100)
            continue
        s, p = _text(n, wrap, exact)
        if uses.get(id(n), 0) > 1 and isinstance(n, Call | Reduce) and len(s) >= SHARE_CHARS:
            name = f"%{len(lets) + 1}"
            lets.append((name, s))
            s, p = name, 100
        texts[id(n)] = (s, p)
    return lets, [texts[id(r)][0] for r in roots]


def _fmt_const(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.9g}"


def _text(n: Node, wrap, exact: bool = False) -> tuple[str, float]:
    """The text of n from its children's (wrap(child, precedence) parenthesises where needed) and
    the precedence it binds with (100: an atom)."""
    if isinstance(n, Const):
        s = n.value.hex() if exact else _fmt_const(n.value)
        return s, (4 if s.startswith("-") else 100)
    if isinstance(n, Index):
        return str(n.axis), 100
    if isinstance(n, Length):
        return f"len({n.axis})", 100
    if isinstance(n, StateRef):
        return n.key, 100
    if isinstance(n, Load):
        return f"{n.tensor}[{', '.join(wrap(a, 0) for a in n.index)}]", 100
    if isinstance(n, Reduce):
        return f"{n.op}_{n.axis}({wrap(n.body, 0)})", 100
    assert isinstance(n, Call)
    op = OPS[n.op]
    if op.infix is not None and op.arity == 2:
        p = _PREC.get(n.op, 6)
        return f"{wrap(n.args[0], p)} {op.infix} {wrap(n.args[1], p + 1)}", p
    if n.op == "neg":
        return f"-{wrap(n.args[0], 7)}", 100
    if n.op == "not":
        return f"~{wrap(n.args[0], 7)}", 100
    return f"{n.op}({', '.join(wrap(a, 0) for a in n.args)})", 100
