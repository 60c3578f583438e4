"""The fusion search: rolling update and horizontal fusion of reductions over one axis.

These fusions rewrite the *structure* of a program (which reductions share a pass over an axis),
so they need a substitution (a producer's final value → its running value) and a view of whole
reduction groups. They are therefore a Python search over the e-graph: they read the representative
program extracted after the algebra phase, add fused `Loop` terms and correction quotients to the
same e-graph, and, once a later algebra phase has run, union each reduction's e-class with its
component of every loop whose corrections were found.

rolling_update     consumer t = ⊕ⱼ g(r, cⱼ) and producer r = ⊗ⱼ eⱼ in one pass:
                   r' = r ⊗ eⱼ;  t' = t ⊗' h(r, r') ⊕ g(r', cⱼ)
                   h is found, not written: the quotient g(R', c) ⊘ g(R, c) (⊘ inverse of ⊗')
                   is put into the e-graph with fresh symbols R = old:r, R' = cur:r (ir.StateRef); after
                   saturation its e-class must hold a term free of the loop axis. That term is h.
horizontal_fusion  independent reductions over the same axis share one pass.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from egglog import EGraph, union

from neptune_eq import ir
from neptune_eq.egg_write import write
from neptune_eq.masks import conjunction, keeps_an_element_of_every_row, split_mask
from neptune_eq.ops import MONOIDS, OPS
from neptune_eq.saturate import Budget, Saturator
from neptune_eq.terms import Comp, Comps, Encoder, Loop, Term, get

from .affine import (
    AFFINE_BUDGET,
    AffineResult,
    AffineSearcher,
    additive_uses,
    relative_uses,
    to_old,
)
from .affine import searcher as affine_searcher
from .affine_check import check_affine, describe_affine, span_test
from .correction import CORRECTION_BUDGET, CorrectionSearcher
from .correction import searcher as correction_searcher
from .extrapolate import centred, extrapolate, mean_shifts, mean_symbols, opaque_symbols, shifts_back
from .reset import selection_reset
from .types import Application, Binding, CompCandidate, CorrectionResult, LoopCandidate, count_name, direct_bindings

MAX_GROUP_SIZE = 8
MAX_GROUPS_PER_AXIS = 48  # fused groups tried per axis, nearest members first (each may need a search)
AFFINE_TOTAL_SECONDS = 4.0  # all affine searches of one compile (each fails only after its budget)


@dataclass
class FusionSearch:
    """Proposes loop groups from the representative program, finds their corrections, validates them."""

    egraph: EGraph
    encoder: Encoder
    bindings: list[Binding]
    by_node: dict[ir.Node, Binding]
    rules: list = field(default_factory=list)  # algebra rules for correction searches
    candidates: list[LoopCandidate] = field(default_factory=list)
    corrections: dict[ir.Node, CorrectionResult] = field(default_factory=dict)  # by quotient core pair
    skipped: list[str] = field(default_factory=list)  # axes whose further groups the time budget cut
    capped: list[str] = field(default_factory=list)  # axes with more groups than MAX_GROUPS_PER_AXIS
    corrections_affine: dict[tuple, AffineResult] = field(default_factory=dict)  # by core and basis
    affine_seconds: float = 0.0
    _searcher: CorrectionSearcher | None = None
    _affine: AffineSearcher | None = None
    _pending: list[LoopCandidate] = field(default_factory=list)  # groups awaiting affine searches
    _saturator: Saturator | None = None

    @property
    def by_name(self) -> dict[str, Binding]:
        return {b.name: b for b in self.bindings}

    def direct(self, b: Binding) -> set[str]:
        return direct_bindings(b.node.body, self.by_node)

    def _closure(self) -> dict[str, set[str]]:
        """All bindings each binding depends on, transitively."""
        deps = {b.name: self.direct(b) for b in self.bindings}
        changed = True
        while changed:
            changed = False
            for ds in deps.values():
                extra = set().union(*(deps[d] for d in ds)) - ds if ds else set()
                if extra:
                    ds |= extra
                    changed = True
        return deps

    def run(self, saturator: Saturator | None = None, max_groups: int = MAX_GROUPS_PER_AXIS) -> None:
        """rolling_update + horizontal_fusion: acyclic groups of reductions over one axis.

        Every reduction alone comes first: it needs no correction, so the unfused plan always exists.
        Then fused groups, smallest and nearest (in producer order) first, at most `max_groups` per
        axis, while the saturator's time budget lasts; correction searches share that budget."""
        self._saturator = saturator
        closure = self._closure()
        by_axis: dict[str, list[Binding]] = {}
        for b in self.bindings:
            by_axis.setdefault(b.axis, []).append(b)
        for axis, members in by_axis.items():
            for b in members:
                self.candidates.append(self._build(axis, [b]))
        for axis, members in by_axis.items():
            tried = 0
            for group in _nearest_groups(members, min(len(members), MAX_GROUP_SIZE)):
                if not self._acyclic(group, closure):
                    continue
                if tried >= max_groups:
                    self.capped.append(axis)
                    break
                if saturator is not None and saturator.remaining() <= 0:
                    self.skipped.append(axis)
                    break
                tried += 1
                self.candidates.append(self._build(axis, list(group)))
        # affine searches cost seconds each and share one budget: the largest groups first, since a
        # group that carries every accumulator a repair borrows is the one-pass plan (its sub-groups'
        # repairs, found first, would spend the budget on plans it makes slower)
        for cand in sorted(self._pending, key=lambda c: -len(c.comps)):
            self._finish(cand)
        self._pending.clear()
        self.encoder.flush()

    def _search_budget(self) -> Budget:
        """A correction search's budget: CORRECTION_BUDGET within what the compile's budget allows."""
        sat = self._saturator
        if sat is None:
            return CORRECTION_BUDGET
        b = sat.budget
        return Budget(max_nodes=min(CORRECTION_BUDGET.max_nodes, 5 * b.max_nodes),
                      max_seconds=max(0.0, min(CORRECTION_BUDGET.max_seconds, sat.remaining())),
                      max_iterations=min(CORRECTION_BUDGET.max_iterations, b.max_iterations),
                      match_limit=min(CORRECTION_BUDGET.match_limit, b.match_limit))

    def _acyclic(self, group, closure) -> bool:
        names = {b.name for b in group}
        for b in group:
            for d in closure[b.name] - names:
                if closure[d] & names:  # an outside producer needs a member's final value
                    return False
        return True

    def _build(self, axis: str, group: list[Binding]) -> LoopCandidate:
        names = {b.name for b in group}
        comps = []
        for b in group:  # (the bodies first, then the corrections: a reset reads its producer's body)
            used = self.direct(b)
            prods = tuple(g.name for g in group if g.name in used)
            mapping = {}
            for u in used:
                ub = self.by_name[u]
                kind = ir.RefKind.CURRENT if u in names else (ir.RefKind.FINAL if ub.axis == axis
                                                              else ir.RefKind.INLINE)
                mapping[ub.node] = ub.ref(kind)
            body = ir.substitute(b.node.body, mapping)
            preds, core = split_mask(body, b.op, lambda p: keeps_an_element_of_every_row(
                p, axis, self.encoder.extents, self.encoder.dynamic))
            preds, core = _running_tests_in_core(preds, core, b.op)
            comp = CompCandidate(b, body, prods, conjunction(preds) or ir.Const(1.0), core)
            comp.mask_term = self.encoder.encode(comp.mask)
            comp.core_term = self.encoder.encode(core)
            comps.append(comp)
        by_comp = {c.binding.name: c for c in comps}
        for comp in comps:
            if comp.producers:
                self._correct(axis, comp, by_comp)
        cand = LoopCandidate(axis, comps)
        if any(self._needs_affine(c) for c in comps):
            self._pending.append(cand)  # after every group's multiplicative searches (run)
        else:
            self._finish(cand)
        return cand

    def _correct(self, axis: str, comp: CompCandidate, by_comp: dict[str, CompCandidate]) -> None:
        """comp's correction: h from the quotient's e-class (the quotient is taken on the unmasked core:
        masked elements contribute the identity), else a selection's reset (fusion/reset.py)."""
        b, core, prods = comp.binding, comp.core, comp.producers
        old = ir.substitute(core, {self.by_name[p].ref(ir.RefKind.CURRENT): self.by_name[p].ref(ir.RefKind.OLD)
                                   for p in prods})
        key = ir.Call("and", (core, old))
        if key not in self.corrections:
            if self._searcher is None:
                self._searcher = correction_searcher(self.encoder.axis_order, self.encoder.extents,
                                                     self.rules, self.encoder.dynamic)
            self._searcher.budget = self._search_budget()
            found = self._searcher.correction_for(core, old, b.op, axis)
            if not found.found:
                n = self.encoder.extents[axis]
                extent = ir.Length(axis) if axis in self.encoder.dynamic else ir.Const(float(n))
                reset = selection_reset(core, b.op, axis, comp.mask, {
                    p: (by_comp[p].binding.op, by_comp[p].core, by_comp[p].mask, bool(by_comp[p].producers))
                    for p in prods}, extent)
                found = reset if reset is not None else found
            self.corrections[key] = found
        comp.correction = self.corrections[key]
        comp.quotient_term = self.encoder.encode(comp.correction.quotient)

    @staticmethod
    def _needs_affine(c: CompCandidate) -> bool:
        return bool(c.producers) and c.chosen is None and c.binding.op == "sum"

    def _finish(self, cand: LoopCandidate) -> None:
        """The affine repairs of `cand`'s components, then its Loop term; valid ones join the e-graph."""
        for comp in cand.comps:
            if self._needs_affine(comp):
                self._affine_repair(cand.axis, comp, cand.comps)
        cs = Comps()
        for c in cand.comps:
            corr = c.quotient_term if c.quotient_term is not None else Term.sym("no_correction")
            cs = cs.add(Comp(c.binding.name, c.binding.op, c.mask_term, c.core_term, corr))
        cand.term = Loop(cand.axis, cs)
        write(self.egraph, cand.term)
        self._validate(cand)

    def _affine_repair(self, axis: str, comp: CompCandidate, comps: list[CompCandidate]) -> None:
        """t′ = Σₖ hₖ·tₖ (+ h₀·n) over the sums of the group that share comp's mask (fusion/affine.py);
        running sums the body reads additively are read as running means (fusion/extrapolate.py)."""
        names = [c.binding.name for c in comps]
        sums = {c.binding.name for c in comps if c.binding.op == "sum"}
        extent = self.encoder.extents[axis]
        if extent > 2**24:  # the element count is carried in float32
            comp.affine = AffineResult(reason=f"{axis} is longer than float32 counts exactly (2^24)")
            return
        core, running, zero, symbols = comp.core, set(names), {}, {}
        additive = additive_uses(comp.core, sums)
        if additive and axis in self.encoder.dynamic:
            comp.affine = AffineResult(reason=f"a running sum is used additively and {axis}'s length is only known at "
                                              "the call: no running mean divides by a known count")
            return
        if additive:
            whole = {c.binding.name for c in comps if _unmasked(c)}
            if not _unmasked(comp) or not additive <= whole:
                comp.affine = AffineResult(reason=f"a running sum ({', '.join(sorted(additive))}) is used additively "
                                                  "in a masked body: no running mean stands for it (its repair would "
                                                  "cancel large terms in floating point)")
                return
            count, free = count_name(comp.binding), comp.binding.free
            core = extrapolate(comp.core, additive, extent, ir.StateRef(ir.RefKind.CURRENT, count, free))
            if not relative_uses(core, sums, frozenset({count})):
                comp.affine = AffineResult(reason="a running sum is used additively in the body (its repair would "
                                                  "cancel large terms in floating point)")
                return
            symbols = mean_symbols(additive, free, count)
            running |= {count} | {f"mean_{s}" for s in additive}
            by_name = {c.binding.name: c for c in comps}
            zero = {f"centred_{s}": centred(to_old(by_name[s].core, running), s, free) for s in sorted(additive)}
        # the search sees each running mean as one symbol, the current one as the old one plus a shift
        own = ir.substitute(core, symbols)
        carried = ir.substitute(own, mean_shifts(additive, comp.binding.free))
        basis = {c.binding.name: to_old(own if c is comp else c.core, running)  # (a sum read as a mean
                 for c in comps if c.binding.op == "sum" and c.mask == comp.mask  # is read through its
                 and c.binding.name not in additive}  # centred body instead)
        basis.update(zero)
        opaque = opaque_symbols([carried, *basis.values()], axis, comp.binding.free)  # (coefficients)
        if opaque:
            carried, basis = ir.substitute(carried, opaque), {k: ir.substitute(b, opaque) for k, b in basis.items()}
            running |= {m.name for m in opaque.values() if m.kind in ir.RUNNING}
        key = (carried, tuple(basis.items()))
        if key not in self.corrections_affine:
            if self.affine_seconds >= AFFINE_TOTAL_SECONDS:
                comp.affine = AffineResult(reason=f"the affine searches' {AFFINE_TOTAL_SECONDS:g} s were spent")
                return
            misfit = span_test(carried, basis, axis)
            if misfit is not None:  # no repair exists: spend no e-graph budget on it
                comp.affine = self.corrections_affine[key] = AffineResult(reason=f"no affine repair exists: {misfit}")
                return
            if self._affine is None:
                self._affine = affine_searcher(self.encoder.axis_order, self.encoder.extents, self.rules,
                                               self.encoder.dynamic)
            sat = self._saturator  # (set every time: a kept searcher holds its last compile's budget)
            self._affine.budget = AFFINE_BUDGET if sat is None else replace(  # within what the compile has left
                AFFINE_BUDGET, max_seconds=max(0.0, min(AFFINE_BUDGET.max_seconds, sat.remaining())))
            res = self._affine.search(carried, basis, running, axis, zero=frozenset(zero))
            self.affine_seconds += res.seconds
            bad = check_affine(carried, basis, res) if res.found else None
            if bad is None and res.found and (additive or opaque):
                shifts, means = shifts_back(additive, comp.binding.free), {v: k for k, v in symbols.items()}
                reveal = {v: k for k, v in opaque.items()}
                back = lambda h: ir.substitute(ir.substitute(ir.substitute(h, reveal), shifts), means)  # noqa: E731
                res = replace(res, terms={k: back(h) for k, h in res.terms.items() if k not in zero},
                              constant=None if res.constant is None else back(res.constant),
                              core=core if additive else None, means=tuple(sorted(additive)))  # (S itself is
                # no basis body: the repair cannot read it additively, only through the centred body, whose
                # term is dropped)
            self.corrections_affine[key] = AffineResult(reason=bad) if bad is not None else res
        comp.affine = self.corrections_affine[key]
        if comp.chosen_affine is not None and comp.affine.core is not None:  # the body reads the running mean
            comp.core = comp.affine.core
            comp.core_term = self.encoder.encode(comp.core)

    def _validate(self, cand: LoopCandidate) -> None:
        """A group is valid when every rolling component has a correction; then it joins the e-graph."""
        reasons = []
        for c in cand.comps:
            if c.producers and c.chosen is None and c.chosen_affine is None:
                why = c.correction.reason + (f"; no affine repair: {c.affine.reason}" if c.affine is not None else "")
                reasons.append(f"no correction for {c.binding.name} = {c.binding.op}_{cand.axis}({ir.show(c.core)}) "
                               f"over running {', '.join(c.producers)}: {why}")
        cand.valid = not reasons
        cand.reason = "; ".join(reasons)
        if not cand.valid:
            return
        self._record(cand)
        for c in cand.comps:
            if c.chosen is not None:  # the quotient's e-class holds the correction
                write(self.egraph, union(c.quotient_term).with_(self.encoder.encode(c.chosen.correction)))
            write(self.egraph, union(get(cand.term, c.binding.name)).with_(self.encoder.encode(c.binding.node)))
        self.encoder.flush()

    def _record(self, cand: LoopCandidate) -> None:
        rolling = [c for c in cand.comps if c.producers]
        for c in rolling:
            a = c.chosen_affine
            if a is not None:
                cand.applications.append(Application("affine_update", describe_affine(c.binding.name, a, c.count_name)))
                continue
            r = c.chosen
            if r.kind == "reset":
                cand.applications.append(Application(
                    "selection_reset",
                    f"{c.binding.name} = {c.binding.op}_{cand.axis}(...) carried with running "
                    f"{', '.join(c.producers)}: t {OPS[r.dist].infix} {ir.show(r.correction)} (derived: {r.reason})"))
                continue
            cand.applications.append(Application(
                "rolling_update",
                f"{c.binding.name} = {c.binding.op}_{cand.axis}(...) carried with running "
                f"{', '.join(c.producers)}: correction h = {ir.show(r.correction)} applied as t {OPS[r.dist].infix} h "
                f"(found in the e-class of {ir.show(r.quotient)} after {r.iterations} iterations)",
            ))
        roots = [c for c in cand.comps if not c.producers]
        if len(cand.comps) > 1 and (len(roots) > 1 or not rolling):
            cand.applications.append(Application(
                "horizontal_fusion",
                f"{', '.join(c.binding.name for c in roots)} share one pass over {cand.axis}",
            ))

    @property
    def valid(self) -> list[LoopCandidate]:
        return [c for c in self.candidates if c.valid]

    @property
    def rejected(self) -> list[LoopCandidate]:
        return [c for c in self.candidates if not c.valid]


def _unmasked(c: CompCandidate) -> bool:
    """Every element along the loop axis is a term of the reduction (its mask is true)."""
    return isinstance(c.mask, ir.Const) and c.mask.value != 0.0


def _nearest_groups(members: list, largest: int):
    """Groups of 2..largest members, smallest first, then by the span they cover in `members`
    (producers before consumers): neighbours in a chain, which are the ones that can share a pass,
    come before far-apart ones. Lazy: a chain of twenty reductions has 10^5 groups of up to 8."""
    n = len(members)
    for size in range(2, largest + 1):
        for span in range(size - 1, n):
            for lo in range(n - span):
                hi = lo + span
                for mid in itertools.combinations(range(lo + 1, hi), size - 2):
                    yield (members[lo], *(members[k] for k in mid), members[hi])


def _running_tests_in_core(preds: list[ir.Node], core: ir.Node, monoid: str) -> tuple[list[ir.Node], ir.Node]:
    """A mask reads data and indices only: a predicate testing a running value (`x == cur:max`, the
    count of a row's maxima) changes its verdict on elements already summed when the value moves, so
    it belongs to the core, whose quotient the correction must repair: where(p, core, identity). Split
    off as a mask, the quotient was 1/1 and the rolled count summed every element that had equalled
    some running max (26 maxima a row where there is one: silently wrong until session 55)."""
    running = [p for p in preds if any(isinstance(m, ir.StateRef) and m.running for m in ir.walk(p))]
    if not running:
        return preds, core
    kept = [p for p in preds if p not in running]
    return kept, ir.Call("where", (conjunction(running), core, ir.Const(MONOIDS[monoid].identity)))
