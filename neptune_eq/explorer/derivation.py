"""Derivations: how the e-graph produced a plan, read from what the compile recorded.

Nothing here is a fixed story. Each step comes from data the pipeline kept:

    algebra            the algebra phase's report: iterations, e-graph size, how it stopped, and the
                       per-rule match counts egglog returned (user rules marked with their origin)
    represent          the reductions of the cheapest program after the algebra phase (the bindings)
    rolling_update     the fusion application recorded on the LoopCandidate: the quotient that was
                       saturated, the correction h found in its e-class, the search's size and the
                       rules that matched in it; on request the minimal rule set that still derives h
                       (fusion/correction.py minimal_rules re-runs the search, so it is computed lazily)
    horizontal_fusion  the recorded application (independent reductions sharing a pass)
    split_k            the chunk count the plan uses and the split_k phase's matches
    inline/materialise the plan's inline terms and the buffers its kernels exchange through HBM
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .. import ir
from ..fusion.correction import minimal_rules
from ..fusion.types import CompCandidate, CorrectionResult, LoopCandidate
from ..ops import OPS
from ..pipeline import Alternative, Compilation
from ..plan import Combine, CompPlan, KernelPlan, Pass, Plan
from ..rules.base import Rule
from ..saturate import PhaseReport

Progress = Callable[[str], None] | None


@dataclass
class Step:
    """One step of a derivation: the rule or decision (`rule`), a one-line summary and details."""

    rule: str
    text: str
    details: list[str] = field(default_factory=list)

    def lines(self, number: int) -> list[str]:
        return [f"{number}. {self.rule}: {self.text}", *(f"     {d}" for d in self.details)]


@dataclass
class Derivation:
    alternative: int
    steps: list[Step]

    def rules(self) -> list[str]:
        """The rules and decisions in order (e.g. ['algebra', 'rolling_update', 'split_k'])."""
        return [s.rule for s in self.steps]

    def __str__(self) -> str:
        out: list[str] = []
        for k, s in enumerate(self.steps, 1):
            out += s.lines(k)
        return "\n".join(out)


class MinimalRules:
    """Cache of minimal rule sets per correction (each costs one correction search per matched rule)."""

    def __init__(self, c: Compilation, progress: Progress = None):
        self.c, self.progress = c, progress
        self._cache: dict[int, list[Rule]] = {}

    def __call__(self, result: CorrectionResult, axis: str, what: str) -> list[Rule]:
        key = id(result)
        if key not in self._cache:
            rules = self.c.fusion.rules if self.c.fusion else []
            tried = sum(1 for r in rules if result.matches.get(r.name))
            if self.progress is not None:
                self.progress(f"  deriving the minimal rules for the correction of {what}: re-running the search "
                              f"without each of the {tried} rules that matched ...")
            self._cache[key] = minimal_rules(result, axis, self.c.encoder.axis_order, self.c.encoder.extents, rules)
        return self._cache[key]


def user_rule_names(c: Compilation) -> dict[str, Rule]:
    return {r.name: r for r in c.options.rules}


def phase_report(c: Compilation, name: str) -> PhaseReport | None:
    """The saturator's report of phase `name` ("algebra", "split_k", ...), None if it did not run."""
    return next((r for r in c.saturator.reports if r.name == name), None)


def _counts(matches, known: dict[str, Rule], user: dict[str, Rule], limit: int | None = None) -> list[str]:
    fired = sorted(((n, k) for n, k in matches.items() if n in known), key=lambda nk: (-nk[1], nk[0]))
    text = [f"{n} ×{k}" + (f" [user rule, {user[n].origin}]" if n in user else "") for n, k in fired]
    if limit is not None and len(text) > limit:
        text = [*text[:limit], f"... {len(text) - limit} more"]
    return text


def _wrap(items: list[str], prefix: str, width: int = 100) -> list[str]:
    out, cur = [], prefix
    for it in items:
        piece = it if cur == prefix else ", " + it
        if len(cur) + len(piece) > width and cur != prefix:
            out.append(cur + ",")
            cur = " " * len(prefix) + it
        else:
            cur += piece
    out.append(cur)
    return out


def algebra_step(c: Compilation) -> Step:
    rep = phase_report(c, "algebra")
    if rep is None:
        return Step("algebra", "no algebra phase ran")
    known = {r.name: r for r in c.fusion.rules} if c.fusion else {}
    user = user_rule_names(c)
    fired = _counts(rep.matches, known, user)
    details = _wrap(fired, "rules that fired (matches): ") if fired else ["no algebra rule matched"]
    silent = [n for n in user if not rep.matches.get(n)]
    if silent:
        details.append(f"user rules that never matched here: {', '.join(silent)}")
    if "budget" in rep.stop:
        details.append(f"STOPPED BY THE {rep.stop.upper()}: later rewrites are missing; the rules matching most "
                       "are the likely cause")
    return Step("algebra", f"{rep.iterations} iterations to {rep.nodes} e-nodes ({rep.stop}); {len(fired)} rules fired",
                details)


def represent_step(c: Compilation) -> Step:
    names = {b.node: b.name for b in c.bindings}
    lines = [f"{b.name} = {b.op}_{b.axis}({ir.show(b.node.body, names)})" for b in c.bindings]
    return Step("represent", f"the cheapest program after the algebra phase has {len(c.bindings)} reduction(s)",
                lines)


def loop_candidate(c: Compilation, axis: str, names: tuple[str, ...]) -> LoopCandidate | None:
    """The validated loop candidate a plan group (axis, names) was built from."""
    if c.fusion is None:
        return None
    return next((lp for lp in c.fusion.candidates if lp.valid and lp.axis == axis and lp.names == names), None)


def comp_plans(plan: Plan) -> dict[str, CompPlan]:
    """The plan's carried reductions by name."""
    return {cp.name: cp for k in plan.kernels for ph in k.phases if isinstance(ph, Pass) for cp in ph.comps}


def rolling_step(c: Compilation, lp: LoopCandidate, comp: CompCandidate, alt: Alternative,
                 minimal: MinimalRules | None) -> Step:
    r = comp.chosen
    b = comp.binding
    known = {x.name: x for x in c.fusion.rules} if c.fusion else {}
    user = user_rule_names(c)
    prods = ", ".join(comp.producers)
    if r.kind == "reset":  # (derived from an invariant, not found in a quotient's e-class: fusion/reset.py)
        return Step("selection_reset", f"{b.name} joins the pass over {lp.axis} that computes {prods}", [
            f"consumer {b.name} = {b.op}_{lp.axis}(g) with g = {ir.show(comp.core)} selects the elements attaining "
            f"the running {prods}",
            f"invariant: every element already in {b.name} is on the near side of old:{prods} (the extreme is "
            f"over the same values), so {r.reason}",
            f"repair: {b.name} {OPS[r.dist].infix}= {ir.show(r.correction)} — kept where the max did not move, "
            "restarted where it did"])
    details = [
        f"consumer {b.name} = {b.op}_{lp.axis}(g) with g = {ir.show(comp.core)}, producer(s) {prods} still running",
        f"quotient saturated in a fresh e-graph: {ir.show(r.quotient)}   (old: = value before the tile, cur: = after)",
        f"correction found: h = {ir.show(r.correction)}   (the quotient's e-class no longer varies along "
        f"{lp.axis} after {r.iterations} iterations, {r.nodes} e-nodes, {r.seconds:.2f}s)",
    ]
    details += _wrap(_counts(r.matches, known, user, limit=12), "rules that matched in that search: ")
    if minimal is not None:
        ms = minimal(r, lp.axis, b.name)
        tags = [f"{m.name} [user rule, {m.origin}]" if m.name in user else m.name for m in ms]
        details.append("minimal rules that still derive h: " + (", ".join(tags) or "(none: the quotient was "
                                                                     "already free of the axis)"))
        details += [f"    {m.name}: {m.math}" for m in ms]
    cp = comp_plans(alt.plan).get(b.name)
    if cp is not None and cp.corr is not None:
        details.append(f"the plan repairs {b.name} {OPS[cp.dist].infix}= {ir.show(cp.corr)} whenever {prods} moves "
                       "(the cheapest term of h's e-class in the final e-graph)")
    return Step("rolling_update", f"{b.name} joins the pass over {lp.axis} that computes {prods}", details)


def fusion_steps(c: Compilation, alt: Alternative, minimal: MinimalRules | None) -> list[Step]:
    steps: list[Step] = []
    sk = phase_report(c, "split_k")
    for axis, names, split in alt.plan.groups:
        lp = loop_candidate(c, axis, tuple(names))
        if lp is None:
            steps.append(Step("pass", f"{', '.join(names)} over {axis} (no recorded loop candidate)"))
            continue
        rolled = [comp for comp in lp.comps if comp.producers and comp.chosen is not None]
        for comp in rolled:
            steps.append(rolling_step(c, lp, comp, alt, minimal))
        for app in lp.applications:
            if app.rule == "horizontal_fusion":
                steps.append(Step("horizontal_fusion", app.detail))
        if not lp.applications:
            steps.append(Step("pass", f"{', '.join(names)} computed alone in a pass over {axis} (no fusion rule)"))
        if split > 1:
            matched = f"; the split_k phase matched {sum(sk.matches.values())} times" if sk else ""
            steps.append(Step("split_k", f"the pass over {axis} ({', '.join(names)}) runs as {split} chunks in "
                                         f"parallel, combined with the same corrections{matched}"))
    return steps


def _reads(k: KernelPlan, tensor: str) -> bool:
    exprs: list[ir.Node] = []
    for ph in k.phases:
        if isinstance(ph, Pass):
            for cp in ph.comps:
                exprs += [e for e in (cp.core, cp.mask, cp.corr) if e is not None]
            exprs += [st.expr for st in ph.stores]
        elif isinstance(ph, Combine) and any(f"part_{cp.name}" == tensor for cp in ph.source.comps):
            return True
    exprs += [st.expr for st in k.epilogue]
    return any(isinstance(n, ir.Load) and n.tensor == tensor for e in exprs for n in ir.walk(e))


def _writes(k: KernelPlan, tensor: str) -> bool:
    stores = [st for ph in k.phases if isinstance(ph, Pass) for st in ph.stores] + list(k.epilogue)
    return any(st.target == tensor for st in stores)


def placement_steps(alt: Alternative) -> list[Step]:
    plan = alt.plan
    steps = [Step("inline", f"{name} = {ir.show(term)} is computed per tile where it is used (not materialised)")
             for name, term in sorted(plan.inline.items())]
    for name, buf in plan.buffers.items():
        writers = [k.name for k in plan.kernels if _writes(k, name)]
        readers = [k.name for k in plan.kernels if _reads(k, name)]
        what = "partial states of split-K chunks" if name.startswith("part_") else "an intermediate"
        steps.append(Step("materialise", f"{name}[{', '.join(map(str, buf.axes))}] ({what}) written by "
                                         f"{', '.join(writers) or '?'}, read by {', '.join(readers) or '?'} "
                                         "through HBM"))
    n = len(plan.kernels)
    policy = ("consecutive passes with compatible grids share a kernel" if plan.fused_kernels
              else "one kernel per pass, intermediates through HBM")
    steps.append(Step("kernels", f"{n} kernel{'s' if n != 1 else ''} ({policy}): "
                                 + "; ".join(f"{k.name} over ({', '.join(k.grid)})" for k in plan.kernels)))
    return steps


def derive(c: Compilation, alt: Alternative, minimal: MinimalRules | None = None) -> Derivation:
    """The derivation of alternative `alt`: algebra, representation, fusion, split-K, placement."""
    steps = [algebra_step(c), represent_step(c), *fusion_steps(c, alt, minimal), *placement_steps(alt)]
    return Derivation(alt.id, steps)


def not_offered(c: Compilation) -> list[str]:
    """Fusions the rules could not justify (their correction search found nothing), with the reason."""
    return c.rejected_notes


def budget_warnings(c: Compilation) -> list[str]:
    """Every phase or correction search that a budget cut short, with the rules that matched most."""
    out = []
    known = {r.name: r for r in c.fusion.rules} if c.fusion else {}
    user = user_rule_names(c)
    for rep in c.saturator.reports:
        if "budget" in rep.stop:
            top = _counts(rep.matches, known, user, limit=4)
            b = c.options.budget
            limit = f"{b.max_nodes} e-nodes" if rep.stop.startswith("node") else f"{b.max_seconds:g}s"
            mine = [n for n in user if rep.matches.get(n)]
            blame = f"; user rules that matched: {', '.join(mine)}" if mine else ""
            out.append(f"saturation phase '{rep.name}' stopped by the {rep.stop} ({rep.nodes} e-nodes, limit {limit}); "
                       f"rules matching most: {', '.join(top) or 'none'}{blame}")
    if c.fusion is not None:
        for res in c.fusion.corrections.values():
            if not res.found and "budget" in res.reason:
                out.append(f"a correction search stopped by its budget: {res.reason[:200]}")
    return out


__all__ = ["Derivation", "MinimalRules", "Step", "budget_warnings", "derive", "not_offered"]
