"""Which sum bodies are tile contractions (tl.dot), and their parts: one reading shared by the
lowering (lower/contract.py), the cost model (extract/cost.py) and the plan space (extract/plans.py),
so that what is priced as tensor-core work is what is emitted as a dot."""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Call, Const, Index, Load, Node
from .masks import conjuncts

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
    """`body` opened into factors, conditions and structure (a body that is no product is one factor;
    a sum or difference of products that share a factor is that factor times the sum of the rest)."""
    shared = _common_factor(body)
    if shared is not None:
        return shared
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


def _common_factor(body: Node) -> Opened | None:
    """x·f ± y·f (each term a product under its own conditions) opened as (x ± y)·f: the factors both
    terms share, and one computed factor holding the rest of each, its conditions as zero-branch
    selections. Two gradient contributions to one weight, Σᵢ pᵢⱼ·hᵢ + Σᵢ [tᵢ = j]·cᵢ·hᵢ, become one
    dot of (p + [t = j]·c) with h. Where h holds inf and both terms are selected out the sum was 0 and
    the dot meets 0·inf: the loaded operand is taken as finite, as for any masked dot (README)."""
    if not (isinstance(body, Call) and body.op in ("add", "sub")):
        return None
    x, y = (opened(t) for t in body.args)
    if len(x.factors) < 2 or len(y.factors) < 2:
        return None
    rest_y = list(y.factors)
    common = []
    for f in x.factors:
        if f in rest_y and not isinstance(f, Const):
            rest_y.remove(f)
            common.append(f)
    if not common:
        return None
    rest_x = list(x.factors)
    for f in common:
        rest_x.remove(f)

    rest = Call(body.op, (product_of(rest_x, x.conditions), product_of(rest_y, y.conditions)))
    return Opened((rest, *common), (), (body, *x.structure, *y.structure))


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
    return (isinstance(node, Call) and node.op in ("mul", "div")) or _common_factor(node) is not None


@dataclass(frozen=True)
class GemmSides:
    """A product body over loop axis k split like a GEMM's: the factors of the [m, k] operand (left),
    of the [k, n] operand (right) and those over neither k (post: [m, n] factors, applied to the
    result); with conditions, those each side's values are selected under (a condition over k and
    m masks the left operand, over k and n the right, over neither k the result)."""

    m: str
    n: str
    left: tuple[Node, ...]
    right: tuple[Node, ...]
    post: tuple[Node, ...]
    left_conds: tuple[Node, ...] = ()
    right_conds: tuple[Node, ...] = ()
    post_conds: tuple[Node, ...] = ()


def gemm_sides(body: Node, k: str, grid, extents: dict[str, int], conditions: bool = False) -> GemmSides | None:
    """`body`'s factors as the two operands of a tile GEMM over `k` into two of the `grid` axes of
    at least 16 (split as lower/contract.py's try_dot splits them: a factor over k and m goes left,
    over k and n right; a per-row factor scales its operand; a factor over k alone goes to an operand
    that is computed anyway, so a loaded one stays as it is), or None. A body under conditions is
    None unless `conditions`, then each condition goes with the side whose axes it is over."""
    parts = opened(body)
    if parts.conditions and not conditions:
        return None
    axes = [a for a in grid if extents[a] >= 16 and a in body.axes]
    for m in axes:
        for n in axes:
            if m == n:
                continue
            sides = _split(parts, k, m, n)
            if sides is not None:
                return sides
    return None


def _side(f: Node, k: str, m: str, n: str) -> int | None:
    """0 (left), 1 (right), 2 (post) or None (over both m and n and k) for a factor or condition."""
    fa = set(f.axes)
    if k in fa:
        return 0 if n not in fa else 1 if m not in fa else None
    return 0 if m in fa and n not in fa else 1 if n in fa and m not in fa else 2


def _split(parts: Opened, k: str, m: str, n: str) -> GemmSides | None:
    facs: list[list[Node]] = [[], [], []]
    conds: list[list[Node]] = [[], [], []]
    k_only: tuple[list[Node], list[Node]] = ([], [])  # factors, conditions over k alone
    for into, kept, nodes in ((facs, k_only[0], parts.factors), (conds, k_only[1], parts.conditions)):
        for f in nodes:
            at = _side(f, k, m, n)
            if at is None:
                return None
            (kept if set(f.axes) & {k, m, n} == {k} else into[at]).append(f)
    if not (any(k in f.axes and m in f.axes for f in facs[0] + conds[0])
            and any(k in f.axes and n in f.axes for f in facs[1] + conds[1])):
        return None

    def loaded(i: int) -> bool:  # an operand read as it is: one load at plain indices, unselected
        return len(facs[i]) == 1 and not conds[i] and isinstance(facs[i][0], Load) \
            and all(isinstance(x, Index) for x in facs[i][0].index)

    to = 1 if loaded(0) and not loaded(1) else 0
    facs[to][:0], conds[to][:0] = k_only
    return GemmSides(m, n, tuple(facs[0]), tuple(facs[1]), tuple(facs[2]),
                     tuple(conds[0]), tuple(conds[1]), tuple(conds[2]))


def product_of(factors, conditions=()) -> Node:
    """Π factors (1 if none), selected under every condition (0 elsewhere): a body gemm_sides splits
    back into the same sides."""
    out = factors[0] if factors else _ONE
    for f in factors[1:]:
        out = Call("mul", (out, f))
    for c in conditions:
        out = Call("where", (c, out, _ZERO))
    return out


def masked_body(core: Node, mask: Node | None) -> Node:
    """A comp's body with its mask's conjuncts as zero-branch selections (Σ over the mask of x is
    Σ of where(mask, x, 0)), so that `opened` sees them as conditions."""
    for c in conjuncts(mask) if mask is not None else ():
        core = Call("where", (c, core, _ZERO))
    return core


def plain_input(f: Node, inputs) -> bool:
    """An element of an input tensor at plain indices: an operand the tensor cores read as loaded."""
    return isinstance(f, Load) and f.tensor in inputs and all(isinstance(i, Index) for i in f.index)
