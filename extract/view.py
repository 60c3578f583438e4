"""A read-only Python view of an egglog e-graph: e-classes, their e-nodes and the analysis values.

Built from egglog's frozen dump, so extraction can use costs that egglog's tree extractor cannot
express (work weighted by iteration space, axis-free terms for corrections, shared loops).

The view is numbered canonically: its class ids and the order of each class's nodes follow from the
e-graph's structure alone, not from egglog's ids or the order of its function tables. Those differ
between processes for the same input (egglog-python turns shared subterms into let bindings in the
order it pops them from a Python set, which moves its function declarations, rows and ids), and every
tie an extraction breaks by position (two spellings of equal cost: e^x against 2^(x·log₂e)) would
then be broken differently in each process: the same program got plans whose predictions differed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from egglog import EGraph

from neptune_eq import ir
from neptune_eq.terms import op_of_callable

from .canonical import canonical_order

_PRIMS = {"String": "value_to_string", "i64": "value_to_i64", "f64": "value_to_f64", "bool": "value_to_bool"}


class ENode(NamedTuple):  # (a tuple: views are built often, and a frozen dataclass is slow to make)
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
    # (class, node) pairs encoded from IR (the program as written, a representative, a quotient): among
    # spellings of equal cost extraction keeps these, so a plan reads a·b where the program wrote a·b
    written: set[tuple[int, ENode]] = field(default_factory=set)

    def nodes(self, cid: int) -> list[ENode]:
        return self.classes.get(cid, [])

    def class_of_value(self, value) -> int:
        return self._ids[value]

    def free_of(self, cid: int, axis_bit: int) -> bool:
        return (self.deps.get(cid, -1) & axis_bit) == 0


def merged_constants(view: EGraphView, rel: float = 1e-6, visible: float = 1e-6) -> list[float] | None:
    """The constants of the first e-class equating two numbers that differ by more than `rel` of the
    larger, one of them at least `visible` in magnitude (0 and 1; −7e19 and 3e19), else None. Real
    algebra over float constants merges spellings that differ by rounding (6.249890 against its
    neighbour, a product folded in two orders), and a class of numbers all within 1e−6 of 0 holds the
    program's 0, which the extractor takes (extract/terms._plainness: a drifted 8.97e−15 had stood for
    the 0 of an index, max(e − 4, 8.97e−15) ≤ i); anything more takes an unsound chain of refinements
    (phases.saturated)."""
    for nodes in view.classes.values():
        values = sorted({float(n.args[0]) + 0.0 for n in nodes if n.op == "const" and n.args
                         and n.args[0] == n.args[0]})
        if len(values) > 1:
            lo, hi = values[0], values[-1]
            big = max(abs(lo), abs(hi))
            if big >= visible and hi - lo > rel * big:
                return values
    return None


def _sort_name(s: str) -> str:
    return s.rsplit(".", 1)[-1]


def build_view(egraph: EGraph, written: dict | None = None, *, canonical: bool = True) -> EGraphView:
    """The view of `egraph`; `written` (an Encoder's memo, IR node → Term) marks the nodes as written.
    canonical=False keeps egglog's numbering, which differs between processes: for questions whose answer
    does not depend on it (does a term exist?), where the numbering's cost is paid too often."""
    view = EGraphView()
    raw = egraph._egraph  # the bindings-level e-graph (pinned egglog version)
    state = egraph._state
    frozen = raw.freeze()

    def cid(v) -> int:
        got = view._ids.get(v)
        if got is None:
            got = view._ids[v] = len(view._ids)
        return got

    is_class: dict[str, tuple[bool, ...]] = {}  # per op: which arguments are classes (the others primitives)
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
        convs = [_PRIMS.get(s) for s in in_sorts]
        is_class[op] = tuple(conv is None for conv in convs)
        out_sort = _sort_name(fn.output_sort)
        for row in fn.rows:
            if row.subsumed:
                continue
            args = [getattr(raw, conv)(v) if conv else cid(v) for conv, v in zip(convs, row.inputs)]
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
    if canonical:
        view = _renumbered(view, is_class)
    if written:
        mark_written(egraph, view, written)
    return view


def _renumbered(raw: EGraphView, is_class: dict[str, tuple[bool, ...]]) -> EGraphView:
    """`raw` (numbered as egglog's tables met its classes) numbered as extract.canonical orders it."""
    facts = {c: (raw.deps.get(c, -1), c in raw.nonneg, c in raw.finite, c in raw.nonpos)
             for c in raw.classes}  # (bools as ints)
    order, ranked = canonical_order(raw.classes, is_class, facts, len(raw._ids))
    new = {c: i for i, c in enumerate(order)}
    for c in raw._ids.values():  # classes only seen as arguments: no nodes, no ties to break
        new.setdefault(c, len(new))
    view = EGraphView(deps={new[c]: d for c, d in raw.deps.items()}, nonneg={new[c] for c in raw.nonneg},
                      finite={new[c] for c in raw.finite}, nonpos={new[c] for c in raw.nonpos},
                      _ids={v: new[c] for v, c in raw._ids.items()}, n_nodes=raw.n_nodes)
    plain = {op for op, mask in is_class.items() if all(mask)}  # (ops over classes alone: most nodes)

    def renamed(op: str, args: tuple) -> tuple:
        return tuple(map(new.__getitem__, args)) if op in plain else tuple(
            new[a] if m else a for a, m in zip(args, is_class[op]))

    for c in order:
        ns = raw.classes[c]
        view.classes[new[c]] = [ENode(op, renamed(op, args), sort) for op, args, sort in (ns[k] for k in ranked[c])]
        view.sort[new[c]] = raw.sort[c]
    return view


def mark_written(egraph: EGraph, view: EGraphView, memo: dict) -> None:
    """Add to view.written the node of each IR call and reduction in `memo` (an Encoder's IR node → Term)."""
    classes: dict = {}

    def of(node) -> int:
        c = classes.get(node)
        if c is None:
            c = classes[node] = class_of(egraph, view, memo[node])
        return c

    for node in memo:
        if isinstance(node, ir.Call):
            op, prims = node.op, ()
        elif isinstance(node, ir.Reduce):
            op, prims = "red", (node.op, node.axis)
        else:
            continue
        try:
            c, args = of(node), prims + tuple(of(ch) for ch in node.children())
        except KeyError:  # (a term the view does not hold, e.g. encoded after it was built)
            continue
        n = next((n for n in view.nodes(c) if n.op == op and n.args == args), None)
        if n is not None:
            view.written.add((c, n))


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
