"""A readable picture of the e-graph: graphviz dot text built from extract/view.py's EGraphView.

Each e-class is a cluster (labelled with its id and the axes it varies over) holding its e-nodes;
an edge goes from an e-node to each child e-class. The e-graph of a real program has hundreds of
classes, so the picture keeps the classes nearest the outputs and the chosen plan's classes first
(`max_classes`), and at most `max_nodes` e-nodes per class (plan nodes first; the rest summed up as
"+k more"). The plan's e-classes are shaded and the e-nodes its terms were extracted from are drawn
bold in colour: the loop, the `get` of each reduction from it, and the nodes of every component's
mask, body and correction as they occur in the e-graph.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import deque
from dataclasses import dataclass, field

from .. import ir
from ..extract.view import EGraphView, ENode, class_of
from ..ir import NeptuneError
from ..ops import OPS
from ..pipeline import Alternative, Compilation
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
    if n.op in ("const", "load", "index", "sym"):
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
        elif isinstance(node, ir.Sym) and en.op == "sym":
            kids = [] if en.args[0] == node.name else None
        elif isinstance(node, ir.Index) and en.op == "index":
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
    if n.op == "index":
        return f"index {a[0]}"
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


def select_classes(view: EGraphView, hl: Highlight, roots: list[int], max_classes: int) -> list[int]:
    """Plan classes first, then breadth-first from the roots, up to max_classes."""
    chosen: list[int] = []
    seen: set[int] = set()
    for c in [*hl.order, *roots]:
        if c not in seen and len(chosen) < max_classes:
            seen.add(c)
            chosen.append(c)
    queue = deque(chosen)
    while queue and len(chosen) < max_classes:
        for n in view.nodes(queue.popleft()):
            for ch in _children(n):
                if ch not in seen and len(chosen) < max_classes:
                    seen.add(ch)
                    chosen.append(ch)
                    queue.append(ch)
    return chosen


def egraph_dot(c: Compilation, alt: Alternative, *, max_classes: int = 60, max_nodes: int = 4) -> str:
    """Graphviz dot text of (part of) the final e-graph with alternative `alt` highlighted."""
    view = c.view
    if view is None:
        raise NeptuneError("the compilation has no final e-graph view (plans were not extracted)")
    hl = plan_highlight(c, alt)
    roots = [class_of(c.egraph, view, t) for t in c.roots.values()]
    shown = select_classes(view, hl, roots, max_classes)
    visible = set(shown)
    anchor: dict[int, str] = {}
    title = (f"e-graph of {c.program.name}: {len(shown)} of {len(view.classes)} e-classes shown, "
             f"{view.n_nodes} e-nodes in all; highlighted: alternative #{alt.id} ({alt.structure})")
    lines = ["digraph egraph {", "  compound=true; rankdir=TB; newrank=true;",
             '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=10, height=0.25];',
             '  edge [arrowsize=0.5, color="#777777"];',
             f"  label={_q(title)};", "  labelloc=t; fontname=Helvetica; fontsize=11;"]
    edges: list[tuple[str, int, bool]] = []
    for cid in shown:
        nodes = list(enumerate(view.nodes(cid)))
        nodes.sort(key=lambda kn: (cid, kn[0]) not in hl.nodes)
        in_plan = cid in hl.classes
        style = 'style="filled,rounded"; fillcolor="#fff4cc"; color="#d4a017"' if in_plan else \
            'style="rounded"; color="#bbbbbb"'
        root = " (output)" if cid in roots else ""
        lines.append(f"  subgraph cluster_{cid} {{ {style}; fontsize=8; "
                     f"label={_q(f'e{cid}{_axes(c, view, cid)}{root}')};")
        for k, n in nodes[:max_nodes]:
            nid = f"n{cid}_{k}"
            anchor.setdefault(cid, nid)
            attrs = 'color="#b8860b", penwidth=2, fontcolor="#7a4f00", style="rounded,bold"' \
                if (cid, k) in hl.nodes else ""
            lines.append(f"    {nid} [label={_q(_label(n))}{', ' + attrs if attrs else ''}];")
            for ch in _children(n):
                if ch in visible:
                    edges.append((nid, ch, (cid, k) in hl.nodes and ch in hl.classes))
        if len(nodes) > max_nodes:
            lines.append(f'    m{cid} [label="+{len(nodes) - max_nodes} more", shape=plaintext, fontsize=8];')
            anchor.setdefault(cid, f"m{cid}")
        if not nodes:
            lines.append(f'    m{cid} [label="(no e-nodes)", shape=plaintext, fontsize=8];')
            anchor.setdefault(cid, f"m{cid}")
        lines.append("  }")
    for src, ch, hot in edges:
        color = ', color="#b8860b", penwidth=1.5' if hot else ""
        head = "" if src.startswith(f"n{ch}_") else f"lhead=cluster_{ch}"  # a node using its own e-class
        lines.append(f"  {src} -> {anchor[ch]} [{', '.join(x for x in (head, color.lstrip(', ')) if x)}];")
    lines.append("}")
    return "\n".join(lines)


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


__all__ = ["Highlight", "egraph_dot", "inline_svg", "plan_highlight", "svg_of_dot"]
