"""A read-only Python view of an egglog e-graph: e-classes, their e-nodes and the analysis values.

Built from egglog's frozen dump, so extraction can use costs that egglog's tree extractor cannot
express (work weighted by iteration space, axis-free terms for corrections, shared loops).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from egglog import EGraph

from neptune_eq.terms import op_of_callable

_PRIMS = {"String": "value_to_string", "i64": "value_to_i64", "f64": "value_to_f64", "bool": "value_to_bool"}


@dataclass(frozen=True)
class ENode:
    op: str
    args: tuple  # e-class ids (int) for term-like arguments, python values for primitives
    sort: str


@dataclass
class EGraphView:
    classes: dict[int, list[ENode]] = field(default_factory=dict)
    sort: dict[int, str] = field(default_factory=dict)
    deps: dict[int, int] = field(default_factory=dict)
    nonneg: set[int] = field(default_factory=set)
    finite: set[int] = field(default_factory=set)
    nonpos: set[int] = field(default_factory=set)  # ≤ 0: an exponent that cannot overflow
    _ids: dict = field(default_factory=dict)
    n_nodes: int = 0

    def nodes(self, cid: int) -> list[ENode]:
        return self.classes.get(cid, [])

    def class_of_value(self, value) -> int:
        return self._ids[value]

    def free_of(self, cid: int, axis_bit: int) -> bool:
        return (self.deps.get(cid, -1) & axis_bit) == 0


def _sort_name(s: str) -> str:
    return s.rsplit(".", 1)[-1]


def build_view(egraph: EGraph) -> EGraphView:
    view = EGraphView()
    raw = egraph._egraph  # the bindings-level e-graph (pinned egglog version)
    state = egraph._state
    frozen = raw.freeze()

    def cid(v) -> int:
        got = view._ids.get(v)
        if got is None:
            got = view._ids[v] = len(view._ids)
        return got

    for name, fn in frozen.functions.items():
        if fn.is_let_binding:
            continue
        refs = state.egg_fn_to_callable_refs.get(name)
        if not refs:
            continue
        op = op_of_callable(next(iter(refs)))
        if op is None:
            continue
        in_sorts = [_sort_name(s) for s in fn.input_sorts]
        out_sort = _sort_name(fn.output_sort)
        for row in fn.rows:
            if row.subsumed:
                continue
            args = []
            for s, v in zip(in_sorts, row.inputs):
                conv = _PRIMS.get(s)
                args.append(getattr(raw, conv)(v) if conv else cid(v))
            if op == "deps":
                view.deps[args[0]] = raw.value_to_i64(row.output)
            elif op == "nonneg":
                view.nonneg.add(args[0])
            elif op == "finite":
                view.finite.add(args[0])
            elif op == "nonpos":
                view.nonpos.add(args[0])
            elif out_sort in _PRIMS or out_sort == "Unit":
                continue
            else:
                c = cid(row.output)
                view.classes.setdefault(c, []).append(ENode(op, tuple(args), out_sort))
                view.sort[c] = out_sort
                view.n_nodes += 1
    return view


def class_of(egraph: EGraph, view: EGraphView, expr) -> int:
    """The e-class id (in `view`) of a registered expression."""
    value = egraph._state.typed_expr_to_value(expr.__egg_typed_expr__)
    return view.class_of_value(value)


def positive_multiples(view: EGraphView, classes: frozenset[int]) -> frozenset[int]:
    """`classes` and, transitively, every class holding c·x, x·c or x/c of one of them with c a finite
    constant > 0. A held statistic m = maxⱼ(s/√d) also stands for maxⱼ(s·log₂e/√d) = m·√d·log₂e
    (rules.algebra's max_scale relates the two): neither may be recomputed."""
    positive = {cid for cid, ns in view.classes.items()
                if any(n.op == "const" and isinstance(n.args[0], float) and 0.0 < n.args[0] < float("inf")
                       for n in ns)}
    out = set(classes)
    grown = True
    while grown:
        grown = False
        for cid, ns in view.classes.items():
            if cid not in out and any(n.op in ("mul", "div") and _scales(n, out, positive) for n in ns):
                out.add(cid)
                grown = True
    return frozenset(out)


def _scales(n: ENode, of: set[int], positive: set[int]) -> bool:
    a, b = n.args
    return (a in of and b in positive) or (n.op == "mul" and b in of and a in positive)
