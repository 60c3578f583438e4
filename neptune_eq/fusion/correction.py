"""Correction synthesis: find h with g(R′, c) = g(R, c) ⊗' h(R, R′) by saturating the quotient.

For a consumer body g over the loop axis j with running producers R, the quotient
g(R′, c) ⊘ g(R, c) (⊘ the inverse of the operator ⊗' that distributes over the consumer's monoid)
goes into an e-graph with R = old:r and R′ = cur:r (ir.StateRef) as fresh symbols. The algebra
rules run one iteration at a time; as soon as the deps analysis shows the quotient's e-class no
longer varies along j, the cheapest j-free term of that e-class is the correction. If the budget runs out first,
no correction exists as far as these rules can tell, and the fusion is not offered.

Each search has its own small e-graph, so it is cheap, and the set of rules a correction needed can
be recomputed exactly (`minimal_rules`) for derivations.
"""

from __future__ import annotations

import time

import numpy as np
from egglog import EGraph, ruleset

from neptune_eq import ir
from neptune_eq.egg_write import write
from neptune_eq.extract.terms import TermExtractor
from neptune_eq.extract.view import build_view, class_of
from neptune_eq.masks import some_equal
from neptune_eq.ops import MONOIDS, OPS
from neptune_eq.rules import analysis
from neptune_eq.rules.base import Rule
from neptune_eq.rules.soundness import eval_ir_sampled
from neptune_eq.saturate import Budget, PhaseReport, Saturator, prime
from neptune_eq.terms import Encoder, deps, nonneg

from .found import Found, Searchers, searcher_key
from .types import Binding, CorrectionResult

CORRECTION_BUDGET = Budget(max_nodes=20_000, max_seconds=5.0, max_iterations=10)
_FOUND = Found()  # what searches found, by rules, axes, extents, budget less its seconds and query (found.py)
_KEPT = Searchers()  # searchers by rules, axes and extents, for the main thread (found.py)


class CorrectionSearcher:
    """One e-graph for all correction searches of a compile: the rules are registered once and
    every query runs between push() and pop(), so queries cannot see each other."""

    def __init__(self, axis_order, extents, rules: list[Rule], budget: Budget = CORRECTION_BUDGET,
                 dynamic: frozenset[str] = frozenset()):
        self.axis_order, self.extents, self.rules, self.budget = tuple(axis_order), dict(extents), rules, budget
        self.egraph = EGraph()
        self.base = Encoder(self.egraph, self.axis_order, self.extents, dynamic)  # axis facts, registered once
        self.schedule = ruleset(*[r.egglog() for r in rules], name=f"corr_rules_{len(rules)}") | analysis.ANALYSIS
        self.names = {r.egglog().decl: r.name for r in rules}
        prime(self.egraph, self.schedule, analysis.SEED)  # (each search, pushed, then runs them unmerged)
        self.key = searcher_key(self.axis_order, self.extents, rules, dynamic)

    def search(self, q: ir.Node, axis: str, need_nonneg: bool) -> tuple[ir.Node | None, PhaseReport]:
        """The cheapest term free of `axis` in the e-class of q, or None; and the phase's report."""
        b = self.budget
        key = (self.key, b.max_nodes, b.max_iterations, b.match_limit, q, axis, need_nonneg)

        def search():
            h, rep = self._search(q, axis, need_nonneg)
            return (h, rep), rep.seconds, rep.stop == "time budget"

        return _FOUND.answer(key, b.max_seconds, search, alive=tuple(self.rules))

    def _search(self, q: ir.Node, axis: str, need_nonneg: bool) -> tuple[ir.Node | None, PhaseReport]:
        eg = self.egraph
        eg.push()
        try:
            enc = self.base.fresh()
            t = enc.encode(q)
            enc.flush()
            write(eg, t)
            bit = 1 << self.axis_order.index(axis)
            sat = Saturator(eg, self.budget, rule_names=self.names)

            def done() -> bool:
                v = eg.lookup_function_value(deps(t))
                if v is None or int(v.value) & bit:
                    return False
                return not need_nonneg or eg.check_bool(nonneg(t))

            rep = sat.phase("correction", self.schedule, seed=analysis.SEED, stop_when=done)
            if not done():
                return None, rep
            view = build_view(eg, enc.encoded)
            tx = TermExtractor(view, self.axis_order, self.extents, enc.loads, enc.syms)
            allow = lambda c, n: view.free_of(c, bit) and n.op != "red"  # noqa: E731
            return tx.best_term(class_of(eg, view, t), allow=allow), rep
        finally:
            eg.pop()

    def correction_for(self, core: ir.Node, old_core: ir.Node, monoid: str, axis: str) -> CorrectionResult:
        """Search each (⊗', ⊘) the consumer's monoid allows, in order of preference."""
        t0 = time.perf_counter()
        reasons = []
        for dist, inverse, cond, ann in MONOIDS[monoid].dist:
            q = ir.Call(inverse, (core, old_core))
            h, rep = self.search(q, axis, cond == "nonneg")
            failure = None if h is None else repair_failure(core, old_core, h, dist)
            if h is not None and failure is None:
                return CorrectionResult(q, dist, inverse, cond, ann, h, rep.iterations, rep.nodes,
                                        time.perf_counter() - t0, matches=rep.matches)
            if failure is not None:
                reasons.append(f"the term {ir.show(h)} of the e-class of {ir.show(q)} does not repair the "
                               f"state where the quotient is undefined: {failure}")
                continue
            why = (f"no term free of {axis} in the e-class of {ir.show(q)} after {rep.iterations} iterations "
                   f"({rep.stop})")
            if cond == "nonneg":
                why += " or it is not provably ≥ 0 (needed for ⊗' = mul to distribute over max/min)"
            reasons.append(why)
        return CorrectionResult(ir.Call(MONOIDS[monoid].dist[0][1], (core, old_core)),
                                seconds=time.perf_counter() - t0, reason="; ".join(reasons))


def searcher(axis_order, extents, rules: list[Rule], dynamic: frozenset[str] = frozenset()) -> CorrectionSearcher:
    """A CorrectionSearcher for these rules, axes and extents: one the main thread kept from an earlier
    compile, else a new one (its budget is the caller's to set before each search)."""
    return _KEPT.get(searcher_key(axis_order, extents, rules, dynamic),
                     lambda: CorrectionSearcher(axis_order, extents, rules, dynamic=dynamic), tuple(rules))


def correction_for(core: ir.Node, old_core: ir.Node, monoid: str, axis: str, axis_order, extents,
                   rules: list[Rule], budget: Budget = CORRECTION_BUDGET) -> CorrectionResult:
    """One-off search (see CorrectionSearcher for many)."""
    return CorrectionSearcher(axis_order, extents, rules, budget).correction_for(core, old_core, monoid, axis)


def minimal_rules(result: CorrectionResult, axis: str, axis_order, extents, rules: list[Rule]) -> list[Rule]:
    """A small set of rules that still finds this correction (greedy removal; for derivations)."""
    if not result.found:
        return []
    keep = [r for r in rules if result.matches.get(r.name)]
    for r in list(keep):
        trial = [x for x in keep if x is not r]
        h, _ = CorrectionSearcher(axis_order, extents, trial).search(result.quotient, axis, result.cond == "nonneg")
        if h is not None:
            keep = trial
    return keep


def _meet_states(rng, env: dict[str, np.ndarray], states: list[str]) -> None:
    """Loaded values sit exactly at a running value at an eighth of the samples each: drawn apart they
    never meet, and a body testing `x == cur:max` would never show its other branch."""
    states = sorted(set(states))
    if not states:
        return
    for key, v in env.items():
        if key in states or v.ndim == 0:
            continue
        at = rng.random(v.shape) < 0.125
        pick = env[states[int(rng.integers(len(states)))]]
        env[key] = np.where(at, pick, v)


def repair_failure(core: ir.Node, old_core: ir.Node, h: ir.Node, dist: str, samples: int = 256,
                   seed: int = 0) -> str | None:
    """Does old ⊗' h give the body at the new running values wherever the body is a number? On random
    float64 values, loads including zeros. h comes from the e-class of the quotient core / old, which
    is undefined where the body is 0 for a reason the running values do not change: a cotangent
    factor g = 0 made g / (n′ · (g / n)) — in the class of (g/n′) / (g/n) — NaN, and the rolled
    state 0 · NaN, where any finite h keeps 0 (stack then amax: NaN gradients at rows of g = 0). Running
    values are 0 at a tenth of the samples: a sum's state starts there, and h = where(cur ≠ 0, cur, 0) /
    where(old ≠ 0, old, 0) had rolled NaN from the first tile (the gradient of a variance over a slice
    of a dynamic axis, session 55)."""
    rng = np.random.default_rng(seed)
    env: dict[str, np.ndarray] = {}
    for n in (*ir.walk(core), *ir.walk(old_core), *ir.walk(h)):
        key = ir.show(n)
        if key in env:
            continue
        if isinstance(n, ir.StateRef):  # (a sum's state starts at 0, its identity: h must be a number there)
            env[key] = np.where(rng.random(samples) < 0.1, 0.0, rng.normal(0, 3, samples))
        elif isinstance(n, ir.Load | ir.Index):
            env[key] = some_equal(rng, rng.normal(0, 3, samples))
    _meet_states(rng, env, [ir.show(n) for n in (*ir.walk(core), *ir.walk(old_core)) if isinstance(n, ir.StateRef)])
    new, old, hv = (np.broadcast_to(eval_ir_sampled(e, env), (samples,)) for e in (core, old_core, h))
    with np.errstate(all="ignore"):
        fixed = OPS[dist].numpy(old, hv)
    bad = ~np.isnan(new) & np.isfinite(old) & ~(np.isclose(fixed, new, rtol=1e-7, atol=1e-12) | (fixed == new))
    # where a running value is 0 (a sum's first state: the rolled state is then 0 too) h must be a number,
    # or 0 ⊗ h is NaN; a body infinite there (g / n at n = 0) never enters a state that is not already 0
    olds = [env[ir.show(n)] for n in ir.walk(old_core) if isinstance(n, ir.StateRef) and n.kind is ir.RefKind.OLD]
    at_zero = np.logical_or.reduce([np.broadcast_to(v == 0, (samples,)) for v in olds]) if olds else False
    bad |= at_zero & ~np.isfinite(hv) & np.isfinite(new)
    if bad.any():
        k = int(np.argmax(bad))
        return f"at a sample where the body is {new[k]!r} (before: {old[k]!r}), old {dist} h = {fixed[k]!r}"
    return None


def numeric_correction_check(body: ir.Node, corr: ir.Node, dist: str, producers: list[Binding],
                             samples: int = 256, seed: int = 0) -> str | None:
    """Check g(R′, c) == g(R, c) ⊗' h(R, R′) on random float64 values. Returns a failure message or None."""
    rng = np.random.default_rng(seed)
    env: dict[str, np.ndarray] = {}
    refs = {ir.show(n) for n in ir.walk(body) if isinstance(n, ir.StateRef)} | {
        ir.show(n) for n in ir.walk(corr) if isinstance(n, ir.StateRef)}
    for name in sorted(refs):
        env[name] = rng.normal(0, 3, samples)
    loads = {ir.show(n) for n in ir.walk(body) if isinstance(n, ir.Load | ir.Index)}
    for name in sorted(loads):  # (some equal: a mask comparing two loads must hold at some samples)
        env[name] = some_equal(rng, rng.normal(0, 3, samples))
    _meet_states(rng, env, sorted(refs))
    old_body = ir.substitute(body, {p.ref(ir.RefKind.CURRENT): p.ref(ir.RefKind.OLD) for p in producers})
    g_new = eval_ir_sampled(body, env)
    g_old = eval_ir_sampled(old_body, env)
    h = eval_ir_sampled(corr, env)
    fixed = OPS[dist].numpy(g_old, h)
    ok = np.isnan(g_new) | np.isclose(fixed, g_new, rtol=1e-7, atol=1e-12) | (fixed == g_new)
    if not ok.all():
        k = int(np.argmin(ok))
        return (f"correction fails at sample {k}: g(R′,c) = {g_new[k]!r} but g(R,c) {dist} h = {fixed[k]!r}")
    return None

