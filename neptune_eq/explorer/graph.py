"""A readable picture of the e-graph: graphviz dot text built from extract/view.py's EGraphView.

Each e-class is a cluster (labelled with its id and the axes it varies over) holding its e-nodes;
an edge goes from an e-node to each child e-class. The plan's e-classes are shaded and the e-nodes
its terms were extracted from are drawn bold in colour: the loop, the `get` of each reduction from
it, and the nodes of every component's mask, body and correction as they occur in the e-graph.

By default the picture is the chosen plan's neighbourhood (`neighbourhood_classes`): the plan's
e-classes, the outputs, and the e-classes one edge away from them (the children and the users of
the e-nodes drawn), up to `max_classes`; e-classes that are only a constant (0, 1, log2 e, ...) are
left out unless the plan uses them — every sub-term uses them, and drawn once each they pull edges
across the whole picture. `whole=True` draws every e-class (constants included). Within a cluster
the e-nodes are stacked (at most `max_nodes`, plan nodes first, the rest summed up as "+k more")
and the title is broken over lines, so that the width grows with the plan's depth, not with the
number of alternatives an e-class holds.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections import deque
from dataclasses import dataclass, field

from .. import ir
from ..extract.view import EGraphView, ENode, class_of
from ..ir import NeptuneError
from ..ops import OPS
from ..pipeline import Alternative, Compilation
from ..terms import LEAVES
from .derivation import comp_plans, loop_candidate

_SYMBOL = {name: op.infix for name, op in OPS.items() if op.infix}


@dataclass
class Highlight:
    classes: set[int] = field(default_factory=set)
    nodes: set[tuple[int, int]] = field(default_factory=set)  # (class, index of the e-node in the class)
    order: list[int] = field(default_factory=list)  # plan classes, most important first

    def add_class(self, cid: int) -> None:
        if cid not in self.classes:
            self.classes.add(cid)
            self.order.append(cid)


def _children(n: ENode) -> list[int]:
    if n.op == "red":
        return [n.args[2]]
    if n.op in LEAVES:
        return []
    if n.op == "split":
        return [n.args[0]]
    return [a for a in n.args if isinstance(a, int) and not isinstance(a, bool)]


def _realize(view: EGraphView, cid: int, node: ir.Node, hl: Highlight, memo: dict) -> bool:
    """Mark the e-nodes through which `node` occurs in e-class `cid` (True if it does)."""
    key = (cid, id(node))
    if key in memo:
        return memo[key]
    memo[key] = False
    for k, en in enumerate(view.nodes(cid)):
        kids: list[ir.Node] | None = None
        if isinstance(node, ir.Const) and en.op == "const":
            kids = [] if en.args and en.args[0] == node.value else None
        elif isinstance(node, ir.Load) and en.op == "load":
            kids = [] if en.args[0] == ir.show(node) else None
        elif isinstance(node, ir.StateRef) and en.op == "sym":
            kids = [] if en.args[0] == node.key else None
        elif isinstance(node, ir.Index | ir.Length) and en.op == ("index" if isinstance(node, ir.Index) else "length"):
            kids = [] if en.args[0] == node.axis else None
        elif isinstance(node, ir.Reduce) and en.op == "red":
            kids = [node.body] if en.args[0] == node.op and en.args[1] == node.axis else None
        elif isinstance(node, ir.Call) and en.op == node.op and len(_children(en)) == len(node.args):
            kids = list(node.args)
        if kids is None:
            continue
        if all(_realize(view, ch, kid, hl, memo) for ch, kid in zip(_children(en), kids)):
            hl.nodes.add((cid, k))
            hl.add_class(cid)
            memo[key] = True
            return True
    return False


def plan_highlight(c: Compilation, alt: Alternative) -> Highlight:
    """The e-classes and e-nodes that alternative `alt` was extracted from."""
    view = c.view
    hl = Highlight()
    memo: dict = {}
    cid = lambda t: class_of(c.egraph, view, t)  # noqa: E731
    for name in c.roots:
        hl.add_class(cid(c.roots[name]))
    plans = comp_plans(alt.plan)
    for axis, names, split in alt.plan.groups:
        lp = loop_candidate(c, axis, tuple(names))
        if lp is None:
            continue
        loop_cls = cid(lp.term)
        _mark_loop(view, loop_cls, hl)
        source = loop_cls
        if split > 1:
            for c2, ns in view.classes.items():
                for k, n in enumerate(ns):
                    if n.op == "split" and n.args[0] == loop_cls and n.args[1] == split:
                        hl.add_class(c2)
                        hl.nodes.add((c2, k))
                        source = c2
        for comp in lp.comps:
            bcls = cid(c.encoder.encode(comp.binding.node))
            hl.add_class(bcls)
            hl.nodes |= {(bcls, k) for k, n in enumerate(view.nodes(bcls))
                         if n.op == "get" and n.args[0] == source and n.args[1] == comp.binding.name}
            cp = plans.get(comp.binding.name)
            pairs = [(comp.core_term, cp.core if cp else None), (comp.mask_term, cp.mask if cp else None),
                     (comp.quotient_term, cp.corr if cp else None)]
            for term, node in pairs:
                if term is None:
                    continue
                tc = cid(term)
                hl.add_class(tc)
                if node is not None:
                    _realize(view, tc, node, hl, memo)
    for name, term in alt.plan.inline.items():
        b = next((b for b in c.bindings if b.name == name), None)
        if b is not None:
            bcls = cid(c.encoder.encode(b.node))
            hl.add_class(bcls)
            _realize(view, bcls, term, hl, memo)
    return hl


def _mark_loop(view: EGraphView, loop_cls: int, hl: Highlight) -> None:
    """The loop node and its state: the chain of comps and each comp (their children are marked by terms)."""
    stack, seen = [loop_cls], set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for k, n in enumerate(view.nodes(cls)):
            if n.op in ("loop", "comps", "comps_add", "comp"):
                hl.add_class(cls)
                hl.nodes.add((cls, k))
                if n.op != "comp":
                    stack += _children(n)


def _label(n: ENode) -> str:
    a = n.args
    if n.op == "const":
        return f"{a[0]:g}" if isinstance(a[0], float) else str(a[0])
    if n.op in ("load", "sym"):
        return str(a[0])
    if n.op in ("index", "length"):
        return f"{n.op} {a[0]}"
    if n.op == "red":
        return f"{a[0]}_{a[1]}"
    if n.op == "get":
        return f"get {a[1]}"
    if n.op == "split":
        return f"split {a[1]}"
    if n.op == "loop":
        return f"loop over {a[0]}"
    if n.op == "comp":
        return f"comp {a[0]} ({a[1]})"
    if n.op == "comps_add":
        return "comps +"
    return _SYMBOL.get(n.op, n.op)


def _axes(c: Compilation, view: EGraphView, cid: int) -> str:
    bits = view.deps.get(cid)
    if bits is None:
        return ""
    axes = [a for k, a in enumerate(c.encoder.axis_order) if bits >> k & 1]
    return " · over " + ",".join(axes) if axes else " · constant"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def constant_classes(view: EGraphView) -> set[int]:
    """E-classes that are only a constant: holding a `const` e-node, or axis-free with every e-node
    built from constants (e.g. 0.5 * 1.4427 not folded)."""
    const = {cid for cid, ns in view.classes.items() if any(n.op == "const" for n in ns)}
    changed = True
    while changed:
        changed = False
        for cid, ns in view.classes.items():
            if cid in const or view.deps.get(cid) != 0 or view.sort.get(cid) != "Term":
                continue
            if any(n.op not in ("load", "sym", "index", "length", "red") and _children(n) and
                   all(ch in const for ch in _children(n)) for n in ns):
                const.add(cid)
                changed = True
    return const


def _drawn(view: EGraphView, hl: Highlight, cid: int, max_nodes: int) -> list[tuple[int, ENode]]:
    """The e-nodes drawn for class `cid`: plan nodes first, at most max_nodes."""
    nodes = list(enumerate(view.nodes(cid)))
    nodes.sort(key=lambda kn: (cid, kn[0]) not in hl.nodes)
    return nodes[:max_nodes]


def neighbourhood_classes(view: EGraphView, hl: Highlight, roots: list[int], max_classes: int,
                          max_nodes: int) -> list[int]:
    """The plan's e-classes and the outputs, then the classes one edge from them (children of their
    drawn e-nodes, then classes whose drawn e-nodes use them), constants only where the plan has them."""
    consts = constant_classes(view) - hl.classes
    chosen = list(dict.fromkeys([*hl.order, *roots]))
    core = set(chosen)
    for cid in list(chosen):
        chosen += [ch for _, n in _drawn(view, hl, cid, max_nodes) for ch in _children(n)]
    chosen += [cid for cid in sorted(view.classes) if cid not in core and
               any(ch in core for _, n in _drawn(view, hl, cid, max_nodes) for ch in _children(n))]
    return [c for c in dict.fromkeys(chosen) if c not in consts][:max_classes]


def select_classes(view: EGraphView, hl: Highlight, roots: list[int], max_classes: int | None) -> list[int]:
    """Plan classes first, then breadth-first from the roots, then any unreachable rest, up to max_classes."""
    limit = len(view.classes) if max_classes is None else max_classes
    chosen: list[int] = []
    seen: set[int] = set()
    for c in [*hl.order, *roots]:
        if c not in seen and len(chosen) < limit:
            seen.add(c)
            chosen.append(c)
    queue = deque(chosen)
    while queue and len(chosen) < limit:
        for n in view.nodes(queue.popleft()):
            for ch in _children(n):
                if ch not in seen and len(chosen) < limit:
                    seen.add(ch)
                    chosen.append(ch)
                    queue.append(ch)
    chosen += [c for c in sorted(view.classes) if c not in seen][: limit - len(chosen)]
    return chosen


def egraph_dot(c: Compilation, alt: Alternative, *, whole: bool = False, max_classes: int | None = None,
               max_nodes: int = 4) -> str:
    """Graphviz dot text of the final e-graph with alternative `alt` highlighted: the plan's
    neighbourhood (at most max_classes e-classes, default 60), or with whole=True every e-class
    (max_classes: no limit unless given). See the module docstring."""
    view = c.view
    if view is None:
        raise NeptuneError("the compilation has no final e-graph view (plans were not extracted)")
    hl = plan_highlight(c, alt)
    roots = [class_of(c.egraph, view, t) for t in c.roots.values()]
    if whole:
        shown = select_classes(view, hl, roots, max_classes)
    else:
        shown = neighbourhood_classes(view, hl, roots, 60 if max_classes is None else max_classes, max_nodes)
    visible = set(shown)
    anchor: dict[int, str] = {}
    scope = "the whole e-graph" if whole else "the plan's neighbourhood"
    title = (f"e-graph of {c.program.name}: {scope}, {len(shown)} of {len(view.classes)} e-classes shown, "
             f"{view.n_nodes} e-nodes in all\nhighlighted: alternative #{alt.id}\n{alt.structure}")
    lines = ["digraph egraph {", "  compound=true; rankdir=TB; newrank=true;",
             '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=10, height=0.25];',
             '  edge [arrowsize=0.5, color="#777777"];',
             f"  label={_q(title)};", "  labelloc=t; fontname=Helvetica; fontsize=11;"]
    edges: list[tuple[str, int, bool]] = []
    for cid in shown:
        nodes = _drawn(view, hl, cid, max_nodes)
        total = len(view.nodes(cid))
        in_plan = cid in hl.classes
        style = 'style="filled,rounded"; fillcolor="#fff4cc"; color="#d4a017"' if in_plan else \
            'style="rounded"; color="#bbbbbb"'
        root = " (output)" if cid in roots else ""
        lines.append(f"  subgraph cluster_{cid} {{ {style}; fontsize=8; "
                     f"label={_q(f'e{cid}{_axes(c, view, cid)}{root}')};")
        ids = []
        for k, n in nodes:
            nid = f"n{cid}_{k}"
            ids.append(nid)
            anchor.setdefault(cid, nid)
            attrs = 'color="#b8860b", penwidth=2, fontcolor="#7a4f00", style="rounded,bold"' \
                if (cid, k) in hl.nodes else ""
            lines.append(f"    {nid} [label={_q(_label(n))}{', ' + attrs if attrs else ''}];")
            for ch in _children(n):
                if ch in visible:
                    edges.append((nid, ch, (cid, k) in hl.nodes and ch in hl.classes))
        if total > len(nodes):
            lines.append(f'    m{cid} [label="+{total - len(nodes)} more", shape=plaintext, fontsize=8];')
            ids.append(f"m{cid}")
            anchor.setdefault(cid, f"m{cid}")
        if not total:
            lines.append(f'    m{cid} [label="(no e-nodes)", shape=plaintext, fontsize=8];')
            anchor.setdefault(cid, f"m{cid}")
        # the e-nodes of a class one under the other, not side by side: the picture grows down, not wide
        lines += [f"    {a} -> {b} [style=invis];" for a, b in itertools.pairwise(ids)]
        lines.append("  }")
    for src, ch, hot in edges:
        color = ', color="#b8860b", penwidth=1.5' if hot else ""
        head = "" if src.startswith(f"n{ch}_") else f"lhead=cluster_{ch}"  # a node using its own e-class
        lines.append(f"  {src} -> {anchor[ch]} [{', '.join(x for x in (head, color.lstrip(', ')) if x)}];")
    lines.append("}")
    return "\n".join(lines)


def have_dot() -> bool:
    """Whether graphviz `dot` is on PATH (svg_of_dot needs it; egraph_dot does not)."""
    return shutil.which("dot") is not None


def svg_of_dot(dot: str, timeout: float = 60.0) -> str:
    """Run graphviz `dot -Tsvg` (a clear error if it is not installed)."""
    exe = shutil.which("dot")
    if exe is None:
        raise NeptuneError("graphviz `dot` is not on PATH (install graphviz, e.g. `apt-get install graphviz`); "
                           "the dot text itself is available from egraph_dot()")
    try:
        r = subprocess.run([exe, "-Tsvg"], input=dot, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise NeptuneError(f"graphviz `dot` took longer than {timeout:g}s; draw fewer classes (max_classes=...)") \
            from None
    if r.returncode != 0:
        raise NeptuneError(f"graphviz `dot` failed: {r.stderr.strip()[:500]}")
    return r.stdout


def inline_svg(svg: str) -> str:
    """The <svg> element alone (no XML prolog / DOCTYPE), for embedding in HTML."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


__all__ = ["Highlight", "constant_classes", "egraph_dot", "have_dot", "inline_svg", "neighbourhood_classes",
           "plan_highlight", "svg_of_dot"]
