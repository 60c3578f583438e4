"""Which sum bodies are tile contractions (tl.dot), and their parts: one reading shared by the
lowering (lower/contract.py), the cost model (extract/cost.py) and the plan space (extract/plans.py),
so that what is priced as tensor-core work is what is emitted as a dot."""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Call, Const, Index, Load, Node

_ZERO = Const(0.0)
_ONE = Const(1.0)


@dataclass(frozen=True)
class Opened:
    """A sum body as a product: factors (a divisor b as the factor 1/b, which scales its operand),
    the conditions under which the body is not 0 (c of where(c, x, 0), ¬c of where(c, 0, x): each
    masks the operand it varies with), and the structural nodes (the products and wheres opened)."""

    factors: tuple[Node, ...]
    conditions: tuple[Node, ...]
    structure: tuple[Node, ...]


def opened(body: Node) -> Opened:
    """`body` opened into factors, conditions and structure (a body that is no product is one factor)."""
    factors, conditions, structure = [], [], []
    todo = _product(body, structure)
    while todo:
        n = todo.pop(0)
        if isinstance(n, Call) and n.op == "where" and _ZERO in n.args[1:]:
            c, x, y = n.args
            structure.append(n)
            conditions.append(Call("not", (c,)) if x == _ZERO else c)
            todo.extend(_product(y if x == _ZERO else x, structure))
        else:
            factors.append(n)
    return Opened(tuple(factors), tuple(conditions), tuple(structure))


def _product(n: Node, structure: list[Node]) -> list[Node]:
    """The factors of a product tree, in order (a divisor b as 1/b); its mul/div nodes go to `structure`."""
    if isinstance(n, Call) and n.op == "mul":
        structure.append(n)
        return _product(n.args[0], structure) + _product(n.args[1], structure)
    if isinstance(n, Call) and n.op == "div" and n.args[0] != _ONE:
        structure.append(n)
        return [*_product(n.args[0], structure), Call("div", (_ONE, n.args[1]))]
    return [n]


def is_product(node: Node) -> bool:
    """A product a·b or a quotient a/b, possibly under where(c, 0, ·) / where(c, ·, 0): the body of a
    sum that can become a tl.dot."""
    while isinstance(node, Call) and node.op == "where" and _ZERO in node.args[1:]:
        node = node.args[2] if node.args[1] == _ZERO else node.args[1]
    return isinstance(node, Call) and node.op in ("mul", "div")


@dataclass(frozen=True)
class GemmSides:
    """A condition-free product body over loop axis k split like a GEMM's: the factors of the
    [m, k] operand (left), of the [k, n] operand (right) and those over neither k (post: [m, n]
    factors, applied to the result)."""

    m: str
    n: str
    left: tuple[Node, ...]
    right: tuple[Node, ...]
    post: tuple[Node, ...]


def gemm_sides(body: Node, k: str, grid, extents: dict[str, int]) -> GemmSides | None:
    """`body`'s factors as the two operands of a tile GEMM over `k` into two of the `grid` axes of
    at least 16 (split as lower/contract.py's try_dot splits them: a factor over k and m goes left,
    over k and n right, over k alone left; a per-row factor scales its operand), or None."""
    parts = opened(body)
    if parts.conditions:
        return None
    axes = [a for a in grid if extents[a] >= 16 and a in body.axes]
    for m in axes:
        for n in axes:
            if m == n:
                continue
            left, right, post = [], [], []
            for f in parts.factors:
                fa = set(f.axes)
                if k in fa:
                    side = left if n not in fa else right if m not in fa else None
                elif m in fa and n not in fa:
                    side = left
                elif n in fa and m not in fa:
                    side = right
                else:
                    side = post
                if side is None:
                    break
                side.append(f)
            else:
                if any(k in f.axes and m in f.axes for f in left) and any(k in f.axes and n in f.axes for f in right):
                    return GemmSides(m, n, tuple(left), tuple(right), tuple(post))
    return None


def plain_input(f: Node, inputs) -> bool:
    """An element of an input tensor at plain indices: an operand the tensor cores read as loaded."""
    return isinstance(f, Load) and f.tensor in inputs and all(isinstance(i, Index) for i in f.index)
