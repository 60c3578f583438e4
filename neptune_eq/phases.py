"""The saturation phases of a compile (neptune_eq.pipeline runs them in order):

    encode      IR → egglog terms (a new Compilation)
    algebra     the algebra rules under the node budget; an iteration that passed it is undone
    simplify    the merge-only rules to their fixpoint (what a budget cut left pending)
    saturated   algebra then simplify, again without the refinements by a value not known to be 0
                where the algebra equated two numbers; an e-graph that still does is refused
    stabilise   the STABILITY rules' max-shifted and centred spellings (represent follows, in pipeline)
"""

from __future__ import annotations

import math
import time

from egglog import EGraph, ruleset, union

from . import ir
from .compilation import Compilation, Options
from .device import from_torch
from .egg_write import write
from .extract.view import build_view, merged_constants
from .ir import NeptuneError
from .rules import analysis
from .rules.algebra import ALGEBRA, STABILITY, STABILITY_HELPERS, simplifies
from .rules.base import Rule
from .saturate import Budget, Saturator, egraph_size
from .terms import Encoder, held_forms


def _rulesets(options: Options, refine: bool = True, fold: bool = True):
    rules = [*ALGEBRA, *options.rules]
    if not refine:  # (without the refinements by a value not known to be 0: saturated)
        rules = [r for r in rules if not any(c.kind == "not_zero" for c in r.conds)]
    if not fold:  # (without the rules that fold constants in float64: saturated)
        rules = [r for r in rules if not r.rounds]
    return ruleset(*[r.egglog() for r in rules], name=f"algebra_{len(rules)}_{refine}_{fold}"), rules


def saturated(c: Compilation, options: Options) -> tuple[Compilation, list[Rule]]:
    """The algebra saturated, then simplified. A refinement guarded by not_zero(b) (a·b/b → a) fires
    while b is not yet known to be 0; where the algebra proves b = 0 later (Σⱼ (x − x)), 0/0 has been
    equated with each constant the rule met, and those constants merge: a 0/0 (NaN) compiled to
    −3.3e−4, and a Σⱼ (x − x) beside another output to 2.3e−13 (a hunt, session 56). Such an e-graph
    is saturated again without those refinements. Folding constants in float64 rounds: two orders of
    folds give two numbers for one real, and a difference of them (an ulp) times 1000⁶ was equated with
    the 0 another path proved (logaddexp(x / max(|x|, 1e-3), x), extended fuzz seed 42); an e-graph still
    equating numbers is saturated once more without those folds too, and one that then still does is
    refused."""
    merged = None
    for refine, fold in ((True, True), (False, True), (False, False)):
        algebra, rules = _rulesets(options, refine, fold)
        c.saturator.rule_names = {r.egglog().decl: r.name for r in rules}
        timed(c, "saturate", lambda: saturate_algebra(c, algebra))  # noqa: B023  (run now)
        # (an e-graph whose algebra already equated numbers is not simplified: merging under folded
        # constants that keep doubling ran 3 s an iteration without a new node, 18 s for a 0/0)
        first, merged = merged, merged_constants(build_view(c.egraph, canonical=False))
        if merged is None:
            timed(c, "saturate", lambda: simplify(c, rules))  # noqa: B023
            merged = merged_constants(build_view(c.egraph, canonical=False))
        if merged is None:
            if first is not None:
                c.refinements_dropped = (f"the algebra equated the numbers {', '.join(f'{v:g}' for v in first[:4])}: "
                                         "saturated again without the refinements by values not known to be 0"
                                         + ("" if fold else " and without folding constants"))
            return c, rules
        if fold:
            c = encode(c.program, options, c.saturator.progress, started=c.saturator.started)
    raise NeptuneError(f"program '{c.program.name}': the algebra equates the numbers "
                       f"{', '.join(f'{v:g}' for v in merged[:4])} (a value it proves 0 divides another, with no "
                       "constant folded): "
                       "not compiled, as no plan from it could be trusted")


def _simplify_ruleset(rules: list[Rule]):
    kept = [r for r in rules if simplifies(r)]
    return ruleset(*[r.egglog() for r in kept], name=f"simplify_{len(kept)}")


def saturate_algebra(c: Compilation, algebra) -> None:
    """Saturate the algebra. An iteration that took the e-graph past the node budget is undone (the
    e-graph is pushed before each iteration and popped back), so the budget holds exactly and the
    result does not depend on how far it overshot."""
    rep = c.saturator.phase("algebra", algebra, analysis=analysis.ANALYSIS, seed=analysis.SEED, undo_past_nodes=True)
    if rep.undone is not None:
        rep.stop = f"node budget (iteration {rep.undone[0]} undone: {rep.undone[1]} e-nodes)"


def stabilise(c: Compilation, rules: list[Rule]) -> None:
    """The cheapest program sums exponentials that may overflow (exp(x)/Σexp(x) written naively), or
    subtracts two sums ≥ 0 (E[x²] − E[x]²): saturate a few iterations more with the STABILITY rules, which
    add the max-shifted and centred spellings (the pipeline then extracts again: the extractor prices an
    exp of an exponent not known ≤ 0 as an overflow risk, such a difference as a cancellation risk). Its
    own node budget (what the algebra left plus max_nodes), so a program that filled the algebra's still
    gets the shift."""
    b = c.options.budget
    budget = Budget(max_nodes=egraph_size(c.egraph) + b.max_nodes, max_seconds=b.max_seconds, max_iterations=4,
                    match_limit=b.match_limit)
    sat = Saturator(c.egraph, budget, c.saturator.progress, c.saturator.rule_names, c.saturator.started)
    # the shifts, the cancellations they set up (e^M·a / e^M·b), and the merge-only rules: the whole
    # algebra again would re-expand every new sum (an ALiBi attention's compile grew past 10 GB)
    use = [*STABILITY, *(r for r in rules if simplifies(r) or r.name in STABILITY_HELPERS)]
    stabilise = ruleset(*[r.egglog() for r in use], name=f"stabilise_{len(use)}")
    sat.rule_names.update({r.egglog().decl: r.name for r in STABILITY})
    c.saturator.reports.append(sat.phase("stabilise", stabilise, analysis=analysis.ANALYSIS, seed=analysis.SEED))
    simplify(c, rules)


def simplify(c: Compilation, rules: list[Rule]) -> None:
    """Finish the merges that an algebra phase cut short left pending. A budget can stop saturation
    between deriving Σ_d (x − μ)·rstd = (Σ_d (x − μ))·rstd = 0·rstd and merging 0·rstd with 0: its
    e-class then holds both Σ_d y and Σ_d y / n (equal only because both are 0 over the reals) and
    the extractor may take the one that is not 0 in floating point. Rules that only merge (simplifies())
    add no terms of their own, so this phase runs outside the node and time budgets — for 4 iterations at
    least, then to its fixpoint unless the analysis grows the e-graph past a bound (below)."""
    budget = Budget(max_nodes=2**62, max_seconds=math.inf, max_iterations=32, match_limit=c.options.budget.match_limit)
    sat = Saturator(c.egraph, budget, c.saturator.progress, c.saturator.rule_names, c.saturator.started)
    t0, done = time.perf_counter(), [0]

    def enough() -> bool:
        # (merging can still grow the e-graph: a variance over a broadcast axis, x·4/4 beside −g/4·4,
        # reached 7476 nodes and 5 s an iteration, the next exhausting memory inside egglog; after 4
        # iterations the phase stops at a quarter of the compile's time budget or 1.5 times its node budget,
        # or where it equates two numbers, an e-graph `saturated` discards: folding constants that keep
        # doubling had run 0.5 s an iteration without a new node, to the time budget)
        done[0] += 1
        return done[0] >= 4 and (time.perf_counter() - t0 > c.options.budget.max_seconds / 4
                                 or egraph_size(c.egraph) > 1.5 * c.options.budget.max_nodes
                                 or merged_constants(build_view(c.egraph, canonical=False)) is not None)

    c.saturator.reports.append(sat.phase("simplify", _simplify_ruleset(rules), analysis=analysis.ANALYSIS,
                                         seed=analysis.SEED,
                                         stop_when=enough))


def timed(c: Compilation, key: str, fn) -> None:
    t0 = time.perf_counter()
    fn()
    c.timings[key] = c.timings.get(key, 0.0) + time.perf_counter() - t0


def encode(program: ir.Program, options: Options, progress, started: float | None = None) -> Compilation:
    t0 = time.perf_counter()
    eg = EGraph()
    enc = Encoder(eg, tuple(program.axes), dict(program.axes), program.dynamic)
    roots = {o.name: enc.encode(o.expr) for o in program.outputs}
    # an input that holds a computed value (a saved statistic) is that value: the analyses see what it
    # is (s − m ≤ 0 for a saved max m), the extractor never recomputes it (_extractor)
    held = {}
    for ld in list(enc.loads.values()):
        spec = program.inputs.get(ld.tensor)
        if spec is not None and spec.holds is not None and ld.index == tuple(ir.Index(a) for a in spec.axes):
            for value, spelled in held_forms(ld, spec.holds):
                held[enc.encode(spelled)] = enc.encode(value)
    enc.flush()
    write(eg, *roots.values(), *(union(a).with_(b) for a, b in held.items()))
    device = options.device or from_torch()
    sat = Saturator(eg, options.budget, progress, started=started if started is not None else t0)
    c = Compilation(program, options, device, eg, enc, roots, sat, held=list(held))
    c.timings["encode"] = time.perf_counter() - t0
    return c
