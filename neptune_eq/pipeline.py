"""The compiler pipeline, one named phase per line (each result is kept on the Compilation).

    encode      IR → egglog terms
    algebra     algebra rules to saturation (under the budget), analyses to their fixpoint each iteration
    simplify    the merge-only rules to their fixpoint (what a budget cut left pending)
    represent   the cheapest program; its reductions become the bindings fusion works on
    stabilise   only if it sums exponentials that may overflow: the STABILITY rules add the max-shifted
                spellings, the extractor (pricing such an exp as a risk) takes one, represent again
    fuse        fusion rules propose loops; corrections are searched by saturating quotients
    split_k     split-K rule offers chunked versions of every validated loop
    plans       exact covers of the bindings by loops → kernel plans
    rank        analytic cost model on the device spec → ranked alternatives
    lower       the chosen plan → Triton source (per target, on demand)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from egglog import EGraph, i64, ruleset, union

from . import ir
from .budget_notes import budget_notes
from .device import DeviceSpec, from_torch
from .extract.cost import Cost, kernel_cost, priced_at
from .extract.exact_tests import compared_with_extreme, materialising
from .extract.numerics import cancellation_risks, stability_notes, summed_overflow_risks
from .extract.plans import PlanSpace, PlanTerms, enumerate_plans
from .extract.terms import TermExtractor
from .extract.view import EGraphView, build_view, class_of, merged_constants, positive_multiples
from .fusion.search import FusionSearch
from .fusion.types import Binding
from .ir import NeptuneError
from .lower.names import check_names
from .masks import conjunction, conjuncts
from .plan import Plan
from .rules import analysis, splitk
from .rules.algebra import ALGEBRA, STABILITY, STABILITY_HELPERS, simplifies
from .rules.base import Rule
from .saturate import Budget, BudgetError, Progress, Saturator, egraph_size, stderr_progress
from .schedule import KernelSchedule, plan_schedules
from .space import plan_variants
from .stopgrad import without_stopgrad
from .terms import Encoder, Term, held_forms, split_factor


@dataclass(frozen=True)
class Options:
    """What a compile may do. Nothing here changes what is computed, only how it is searched and run."""

    device: DeviceSpec | None = None  # None: the current GPU, else the H100 spec
    budget: Budget = field(default_factory=Budget)
    split_factors: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    min_chunk: int = 512  # a split-K chunk covers at least this many elements
    inline_max: int = 256  # contractions over axes up to this extent are computed per tile
    max_plans: int = 200
    rules: tuple[Rule, ...] = ()  # extra (user) algebra rules, already checked for soundness
    strict_rules: bool = False  # reject user rules that only refine (docs/RULES.md) instead of warning
    progress: Progress | bool = None
    cache_dir: Path | None = None
    # bytes of intermediate buffers a plan may use before run() cuts it into chunks of one axis
    # (neptune_eq/chunked.py); None: the largest input or output of the program, at least 1 GiB
    scratch_limit: int | None = None

    def __post_init__(self) -> None:
        """Wrong types are named here, not met as AttributeErrors deep inside a compile."""
        if isinstance(self.budget, dict):  # budget={"max_seconds": 2.0}
            unknown = set(self.budget) - {f.name for f in fields(Budget)}
            if unknown:
                raise BudgetError(f"unknown budget field(s) {sorted(unknown)}; Budget has "
                                  f"{[f.name for f in fields(Budget)]}")
            object.__setattr__(self, "budget", Budget(**self.budget))
        if not isinstance(self.budget, Budget):
            raise BudgetError(f"budget must be a neptune_eq.Budget (e.g. Budget(max_seconds=2.0)), got "
                              f"{type(self.budget).__name__} {self.budget!r}")
        if self.device is not None and not isinstance(self.device, DeviceSpec):
            raise NeptuneError(f"device must be a neptune_eq.device.DeviceSpec or None, got {self.device!r}")
        if not isinstance(self.split_factors, tuple | list) or not all(
                isinstance(f, int) and not isinstance(f, bool) and f >= 2 for f in self.split_factors):
            raise NeptuneError(f"split_factors must be a tuple of ints >= 2, got {self.split_factors!r}")
        if self.scratch_limit is not None and (isinstance(self.scratch_limit, bool) or not isinstance(
                self.scratch_limit, int) or self.scratch_limit < 1):
            raise NeptuneError(f"scratch_limit must be None or an int >= 1 (bytes), got {self.scratch_limit!r}")
        for name in ("min_chunk", "inline_max", "max_plans"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise NeptuneError(f"{name} must be an int >= 1, got {v!r}")


@dataclass
class Alternative:
    id: int
    plan: Plan
    cost: Cost
    schedules: list[KernelSchedule]
    kind: str = "streamed"  # the schedule kind of each kernel (neptune_eq.space)

    @property
    def structure(self) -> str:
        return f"{self.plan.structure()} [{self.kind}]"

    @property
    def predicted_time(self) -> float:
        return self.cost.time

    def __str__(self) -> str:
        t = self.cost.terms()
        return (f"#{self.id}: {self.structure} — predicted {t['time_us']:.1f} µs, {t['hbm_MB']:.2f} MB HBM, "
                f"{t['tensor_GFLOP']:.3f} TC GFLOP, {t['sfu_Gop']:.3f} G special ops")


@dataclass
class Compilation:
    """Everything the pipeline produced, phase by phase (for the explorer, the CLI and tests)."""

    program: ir.Program
    options: Options
    device: DeviceSpec
    egraph: EGraph
    encoder: Encoder
    roots: dict[str, Term]
    saturator: Saturator
    representative: dict[str, ir.Node] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)
    fusion: FusionSearch | None = None
    view: EGraphView | None = None
    alternatives: list[Alternative] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    nodes: int = 0
    budget_notes: list[str] = field(default_factory=list)  # what a budget cut short (explain() shows it)
    numerics_notes: list[str] = field(default_factory=list)  # a stable spelling chosen over a cheaper one
    refinements_dropped: str | None = None  # why the algebra ran without some refinements (_saturated)
    overflow_risks: list[ir.Node] = field(default_factory=list)  # exps under a sum that may overflow
    cancel_risks: list[ir.Node] = field(default_factory=list)  # differences of two sums ≥ 0
    # what plan enumeration could not do: loops dropped (no extractable term), whether it stopped at
    # max_plans (kept as data: the plan space's closures hold the e-graph, which must not outlive the
    # compile's thread in a reference cycle — egglog's EGraph cannot be dropped on another thread)
    dropped_loops: list[str] = field(default_factory=list)
    plans_truncated: bool = False
    held: list[Term] = field(default_factory=list)  # loads of inputs that hold a computed value

    @property
    def best(self) -> Alternative:
        return self.alternatives[0]

    @property
    def numerics_risks(self) -> list[ir.Node]:
        """What the stabilise phase can repair in the representative program."""
        return [*self.overflow_risks, *self.cancel_risks]

    @property
    def rejected_notes(self) -> list[str]:
        """The fusions the rules could not justify, one line each (loop, axis, why)."""
        rejected = self.fusion.rejected if self.fusion else []
        return [f"{', '.join(lp.names)} over {lp.axis}: {lp.reason}" for lp in rejected if lp.reason]

    def axis_bits(self) -> dict[str, int]:
        return {a: 1 << k for k, a in enumerate(self.encoder.axis_order)}


def _rulesets(options: Options, refine: bool = True):
    rules = [*ALGEBRA, *options.rules]
    if not refine:  # (without the refinements by a value not known to be 0: _saturated)
        rules = [r for r in rules if not any(c.kind == "not_zero" for c in r.conds)]
    return ruleset(*[r.egglog() for r in rules], name=f"algebra_{len(rules)}_{refine}"), rules


def _saturated(c: Compilation, options: Options) -> tuple[Compilation, list[Rule]]:
    """The algebra saturated, then simplified. A refinement guarded by not_zero(b) (a·b/b → a) fires
    while b is not yet known to be 0; where the algebra proves b = 0 later (Σⱼ (x − x)), 0/0 has been
    equated with each constant the rule met, and those constants merge: a 0/0 (NaN) compiled to
    −3.3e−4, and a Σⱼ (x − x) beside another output to 2.3e−13 (a hunt, session 56). Such an e-graph
    is saturated again without those refinements; one that still equates two numbers is refused."""
    merged = None
    for refine in (True, False):
        algebra, rules = _rulesets(options, refine)
        c.saturator.rule_names = {r.egglog().decl: r.name for r in rules}
        _timed(c, "saturate", lambda: _algebra(c, algebra))  # noqa: B023  (run now)
        # (an e-graph whose algebra already equated numbers is not simplified: merging under folded
        # constants that keep doubling ran 3 s an iteration without a new node, 18 s for a 0/0)
        first, merged = merged, merged_constants(build_view(c.egraph, canonical=False))
        if merged is None:
            _timed(c, "saturate", lambda: _simplify(c, rules))  # noqa: B023
            merged = merged_constants(build_view(c.egraph, canonical=False))
        if merged is None:
            if first is not None:
                c.refinements_dropped = (f"the algebra proved 0 a value a refinement had divided by, equating "
                                         f"{', '.join(f'{v:g}' for v in first[:4])}: saturated again without "
                                         "the refinements by values not known to be 0")
            return c, rules
        if refine:
            c = _encode(c.program, options, c.saturator.progress, started=c.saturator.started)
    raise NeptuneError(f"program '{c.program.name}': the algebra equates the numbers "
                       f"{', '.join(f'{v:g}' for v in merged[:4])} (a value it proves 0 divides another): "
                       "not compiled, as no plan from it could be trusted")


def _simplify_ruleset(rules: list[Rule]):
    kept = [r for r in rules if simplifies(r)]
    return ruleset(*[r.egglog() for r in kept], name=f"simplify_{len(kept)}")


def compile_program(program: ir.Program, options: Options | None = None) -> Compilation:
    options = options or Options()
    if not isinstance(options, Options):
        raise NeptuneError(f"options must be a neptune_eq.pipeline.Options, got {type(options).__name__}")
    program = without_stopgrad(program.validate()).with_static_lengths()
    check_names(program)
    progress = stderr_progress if options.progress is True else (options.progress or None)
    c, rules = _saturated(_encode(program, options, progress), options)
    _timed(c, "extract", lambda: _represent(c))
    if c.numerics_risks:
        _timed(c, "saturate", lambda: _stabilise(c, rules))
    _timed(c, "fuse", lambda: _fuse(c, rules))
    _timed(c, "saturate", lambda: _split_k(c))
    _timed(c, "extract", lambda: _plans(c))
    c.nodes = egraph_size(c.egraph)
    c.budget_notes = budget_notes(c) + ([c.refinements_dropped] if c.refinements_dropped else [])
    if not c.alternatives:
        raise NeptuneError(f"no executable plan found for program '{program.name}'")
    return c


def _algebra(c: Compilation, algebra) -> None:
    """Saturate the algebra. An iteration that took the e-graph past the node budget is undone (the
    program is encoded again and the iterations before it are replayed: egglog cannot drop a
    snapshot), so the budget holds exactly and the result does not depend on how far it overshot."""
    rep = c.saturator.phase("algebra", algebra, analysis=analysis.ANALYSIS, seed=analysis.SEED)
    if rep.stop == "node budget" and rep.iterations > 1 and rep.nodes > c.options.budget.max_nodes:
        fresh = _encode(c.program, c.options, c.saturator.progress, started=c.saturator.started)
        fresh.saturator.rule_names = c.saturator.rule_names
        again = fresh.saturator.phase("algebra", algebra, analysis=analysis.ANALYSIS, seed=analysis.SEED,
                                      max_iterations=rep.iterations - 1)
        again.stop = f"node budget (iteration {rep.iterations} undone: {rep.nodes} e-nodes)"
        c.egraph, c.encoder, c.roots, c.saturator = fresh.egraph, fresh.encoder, fresh.roots, fresh.saturator
        c.held = fresh.held


def _stabilise(c: Compilation, rules: list[Rule]) -> None:
    """The cheapest program sums exponentials that may overflow (exp(x)/Σexp(x) written naively), or
    subtracts two sums ≥ 0 (E[x²] − E[x]²): saturate a few iterations more with the STABILITY rules, which
    add the max-shifted and centred spellings, and extract again (the extractor prices an exp of an
    exponent not known ≤ 0 as an overflow risk, such a difference as a cancellation risk). Its own node budget
    (what the algebra left plus max_nodes), so a program that filled the algebra's still gets the shift."""
    before, names = c.numerics_risks, list(c.roots)
    old = c.representative
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
    _simplify(c, rules)
    _represent(c)
    c.numerics_notes = stability_notes(names, old, c.representative, before, c.numerics_risks)


def _simplify(c: Compilation, rules: list[Rule]) -> None:
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
        # or where it equates two numbers, an e-graph _saturated discards: folding constants that keep
        # doubling had run 0.5 s an iteration without a new node, to the time budget)
        done[0] += 1
        return done[0] >= 4 and (time.perf_counter() - t0 > c.options.budget.max_seconds / 4
                                 or egraph_size(c.egraph) > 1.5 * c.options.budget.max_nodes
                                 or merged_constants(build_view(c.egraph, canonical=False)) is not None)

    c.saturator.reports.append(sat.phase("simplify", _simplify_ruleset(rules), analysis=analysis.ANALYSIS,
                                         seed=analysis.SEED,
                                         stop_when=enough))


def _timed(c: Compilation, key: str, fn) -> None:
    t0 = time.perf_counter()
    fn()
    c.timings[key] = c.timings.get(key, 0.0) + time.perf_counter() - t0


def _encode(program: ir.Program, options: Options, progress, started: float | None = None) -> Compilation:
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
    eg.register(*roots.values(), *(union(a).with_(b) for a, b in held.items()))
    device = options.device or from_torch()
    sat = Saturator(eg, options.budget, progress, started=started if started is not None else t0)
    c = Compilation(program, options, device, eg, enc, roots, sat, held=list(held))
    c.timings["encode"] = time.perf_counter() - t0
    return c


def _extractor(c: Compilation, view: EGraphView) -> TermExtractor:
    held = positive_multiples(view, frozenset(class_of(c.egraph, view, t) for t in c.held))
    return TermExtractor(view, c.encoder.axis_order, dict(c.program.axes), c.encoder.loads, c.encoder.syms,
                         held=held, loop_min=c.options.inline_max)


def _represent(c: Compilation) -> None:
    """The cheapest program in the e-graph; every distinct reduction in it becomes a binding."""
    view = build_view(c.egraph, c.encoder.encoded)
    tx = _extractor(c, view)
    names = list(c.roots)
    terms, classes = tx.best_shared([class_of(c.egraph, view, c.roots[n]) for n in names])
    c.representative = dict(zip(names, terms))
    c.overflow_risks = summed_overflow_risks(terms, classes, view, c.encoder.axis_order)
    c.cancel_risks = cancellation_risks(terms, classes, view)
    bindings: list[Binding] = []
    by_node: dict[ir.Node, Binding] = {}
    taken: set[str] = set()
    for n in _binding_order(terms, c.program.axes):
        stem = name = f"{n.op}_{n.axis}"
        k = 1
        while name in taken:  # sum_j, sum_j2, ...: not the name of a sum over an axis "j2"
            k += 1
            name = f"{stem}{k}"
        taken.add(name)
        free = tuple(a for a in c.program.axes if a in n.axes)
        b = Binding(name, n, classes[n], free)
        by_node[n] = b
        bindings.append(b)
    c.bindings = bindings
    c.fusion = FusionSearch(c.egraph, c.encoder, bindings, by_node)


def _binding_order(terms: list[ir.Node], extents: dict[str, int]) -> list[ir.Reduce]:
    """The representative's reductions, producers first and otherwise the smallest result first, so
    that names (sum_j, sum_j2, ...) and plans do not depend on how the program was spelled: l = Σⱼ p
    is sum_j and Σⱼ p·v is sum_j2 whether the user divided before or after the P·V product."""
    found = list(dict.fromkeys(n for t in terms for n in ir.walk(t) if isinstance(n, ir.Reduce)))
    inner = {n: {m for m in ir.walk(n.body) if isinstance(m, ir.Reduce)} for n in found}
    points = {n: math.prod(extents[a] for a in n.axes if a in extents) for n in found}
    order: list[ir.Reduce] = []
    placed: set[ir.Reduce] = set()
    while len(order) < len(found):
        ready = [k for k, n in enumerate(found) if n not in placed and inner[n] <= placed]
        n = found[min(ready, key=lambda k: (points[found[k]], k))]
        order.append(n)
        placed.add(n)
    return order


def _fuse(c: Compilation, rules: list[Rule]) -> None:
    assert c.fusion is not None
    c.fusion.rules = rules
    c.fusion.run(c.saturator)
    # deps of the new loop terms and corrections, which extracting a loop's core and correction needs
    # (a lone reduction's core too: its references are new terms). Analysis rules add no terms (it
    # ends on its own), so it is exempt from the node budget and the per-phase iteration limit, and it
    # gets its own max_seconds rather than what the search left: when the search spent the compile's
    # time, the unfused plan's terms must still be extractable
    b = c.options.budget
    analysis_budget = Budget(max_nodes=2**62, max_seconds=b.max_seconds, max_iterations=64,
                             match_limit=b.match_limit)
    sat = Saturator(c.egraph, analysis_budget, c.saturator.progress, c.saturator.rule_names)
    c.saturator.reports.append(sat.phase("analysis", analysis.ANALYSIS))


def _split_k(c: Compilation) -> None:
    facts = []
    for ax, n in c.program.axes.items():
        for f in c.options.split_factors:
            if n >= f * c.options.min_chunk:
                facts.append(split_factor(ax, i64(f)))
    if facts:
        c.egraph.register(*facts)
        c.saturator.phase("split_k", splitk.SPLITK, max_iterations=2)


def _plans(c: Compilation) -> None:
    # the bindings' terms are encoded before the view is built: a large one is named by a new `let`,
    # which the view must already hold
    binding_terms = [c.encoder.encode(b.node) for b in c.bindings]
    c.encoder.flush()
    if binding_terms:
        c.egraph.register(*binding_terms)
    view = c.view = build_view(c.egraph, c.encoder.encoded)
    tx = _extractor(c, view)
    cid = lambda t: class_of(c.egraph, view, t)  # noqa: E731
    no_red = lambda _c, n: n.op != "red"  # noqa: E731
    bits = c.axis_bits()
    binding_leaves = {cid(t): b for t, b in zip(binding_terms, c.bindings)}
    cache: dict = {}

    tables: dict = {}

    def best(term: Term, *, allow=no_red, key=None) -> ir.Node:
        k = (key, id(term))
        if k not in cache:
            if key not in tables:  # one cost table per configuration, shared by all terms
                tables[key] = tx.costs(allow=allow)
            cache[k] = tx.decode(cid(term), tables[key])
        return cache[k]

    def comp_mask(lp, i):
        t = lp.comps[i].mask_term
        node = best(t)
        if isinstance(node, ir.Const) and node.value != 0.0:
            return None
        parts = conjuncts(node)
        unique = list(dict.fromkeys(parts))  # a ∧ b ∧ a → a ∧ b
        return node if len(unique) == len(parts) else conjunction(unique)

    def comp_core(lp, i):
        return best(lp.comps[i].core_term)

    def comp_corr(lp, i):
        comp = lp.comps[i]
        bit = bits[lp.axis]
        free = lambda cc, n: view.free_of(cc, bit) and n.op != "red"  # noqa: E731
        return best(comp.quotient_term, allow=free, key=("corr", lp.axis))

    def leaves_for(kind_of):
        return {k: b.ref(kind_of(b)) for k, b in binding_leaves.items()}

    def inline_term(b: Binding) -> ir.Node:
        key = ("inline", b.name)  # (once per binding, not per plan: each is a pass over the e-graph)
        if key not in cache:  # the binding's own reduction node is allowed; nested bindings are leaves
            leaves = {k: v for k, v in leaves_for(lambda _b: ir.RefKind.INLINE).items() if binding_leaves[k] is not b}
            cache[key] = tx.best_term(cid(c.encoder.encode(b.node)), leaves=leaves)
        return cache[key]

    def output_expr(out: ir.Output) -> ir.Node:
        key = ("out", out.name)
        if key not in cache:
            inline = space.inlinable()
            leaves = leaves_for(lambda b: ir.RefKind.INLINE if b.name in inline else ir.RefKind.FINAL)
            root = cid(c.roots[out.name])
            cache[key] = leaves[root] if root in leaves else tx.best_term(root, allow=no_red, leaves=leaves)
        return cache[key]

    split_of: dict[int, set[int]] = {}
    for ns in view.classes.values():
        for n in ns:
            if n.op == "split":
                split_of.setdefault(n.args[0], set()).add(n.args[1])
    splits: dict[int, list[int]] = {}
    for k, lp in enumerate(c.fusion.candidates):
        if lp.valid:
            splits[k] = sorted(split_of.get(cid(lp.term), ()))
    terms = PlanTerms(comp_mask, comp_core, comp_corr, inline_term, output_expr)
    space = PlanSpace(c.program, c.bindings, c.fusion.candidates, splits, terms, c.representative,
                      c.options.inline_max, c.options.max_plans)
    plans = enumerate_plans(space)
    compared = compared_with_extreme(c.representative)
    once = {b.name for b in c.bindings if b.node in compared}
    if once:  # (a value compared with its own max: the same bits for both, extract/exact_tests.py)
        plans = materialising(plans, once)
        if not plans:
            raise NeptuneError(f"{c.program.name}: no plan computes {', '.join(sorted(once))} once, which the "
                               "program compares with its own max or min (recomputed, it may round otherwise)")
    c.dropped_loops, c.plans_truncated = list(space.dropped), space.truncated
    # the closures above and the space refer to each other (output_expr reads space.inlinable): a
    # cycle holding `c`, so c and its e-graphs would wait for the cyclic collector, which may run on
    # another thread (autograd's), where egglog refuses to free an e-graph; cut it here
    space.terms = None
    alts = []
    at = priced_at(c.program)
    for plan in plans:
        costs: dict = {}  # (kernel, schedule) → its cost: each priced once per plan

        def priced(k, s, plan=plan, costs=costs):
            key = (k.name, s.key())
            if key not in costs:
                costs[key] = kernel_cost(plan, k, at, s, c.device)
            return costs[key]

        def cheapest(k, variants, priced=priced):
            return min(variants, key=lambda v: priced(k, v.schedule).time)

        def price(k, v, priced=priced):
            return priced(k, v.schedule).time

        for kind, schedules in plan_variants(plan, c.program, plan_schedules(plan, c.program), cheapest,
                                             price=price):
            cost = Cost([priced(k, s) for k, s in zip(plan.kernels, schedules)])
            alts.append(Alternative(0, plan, cost, schedules, kind))
    alts.sort(key=lambda a: a.cost.rank)
    for a in alts:  # the plan's own cost: its best schedule's
        if a.plan.cost is None:
            a.plan.cost = a.cost
    for i, a in enumerate(alts):
        a.id = i
    c.alternatives = alts
