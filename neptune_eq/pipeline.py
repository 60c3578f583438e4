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

from egglog import i64

from . import ir
from .budget_notes import budget_notes
from .compilation import Alternative, Compilation, Options
from .egg_write import write
from .extract.cost import Cost, kernel_cost, priced_at
from .extract.exact_tests import compared_with_extreme, materialising, tested_in_reductions
from .extract.numerics import cancellation_risks, stability_notes, summed_overflow_risks
from .extract.plans import PlanSpace, PlanTerms, enumerate_plans
from .extract.sanity import differs, lost_axis, unready_state
from .extract.terms import TermExtractor
from .extract.view import EGraphView, build_view, class_of, positive_multiples
from .fusion.search import FusionSearch
from .fusion.types import Binding
from .ir import NeptuneError
from .lower.names import check_names
from .masks import conjunction, conjuncts
from .numeric import written_out
from .phases import encode, saturated, stabilise, timed
from .rules import analysis, splitk
from .rules.base import Rule
from .saturate import Budget, Saturator, egraph_size, stderr_progress
from .schedule import plan_schedules
from .space import plan_variants
from .stopgrad import without_stopgrad
from .terms import Term, split_factor

__all__ = ["Alternative", "Compilation", "Options", "compile_program"]  # (Options and the results: compilation.py)


def compile_program(program: ir.Program, options: Options | None = None) -> Compilation:
    options = options or Options()
    if not isinstance(options, Options):
        raise NeptuneError(f"options must be a neptune_eq.pipeline.Options, got {type(options).__name__}")
    program = without_stopgrad(program.validate()).with_static_lengths()
    check_names(program)
    progress = stderr_progress if options.progress is True else (options.progress or None)
    c, rules = saturated(encode(program, options, progress), options)
    timed(c, "extract", lambda: _represent(c))
    if c.numerics_risks:
        _stabilise(c, rules)
    timed(c, "fuse", lambda: _fuse(c, rules))
    timed(c, "saturate", lambda: _split_k(c))
    timed(c, "extract", lambda: _plans(c))
    c.nodes = egraph_size(c.egraph)
    c.budget_notes = budget_notes(c) + ([c.refinements_dropped] if c.refinements_dropped else [])
    if not c.alternatives:
        why = [*c.dropped_loops, *c.budget_notes]
        raise NeptuneError(f"no executable plan found for program '{program.name}'"
                           + (": " + "; ".join(why) if why else ""))
    return c


def _stabilise(c: Compilation, rules: list[Rule]) -> None:
    """phases.stabilise, then the cheapest program again; the notes say which spelling it chose."""
    before, names, old = c.numerics_risks, list(c.roots), c.representative
    timed(c, "saturate", lambda: stabilise(c, rules))
    timed(c, "extract", lambda: _represent(c))
    c.numerics_notes = stability_notes(names, old, c.representative, before, c.numerics_risks)


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
        write(c.egraph, *facts)
        c.saturator.phase("split_k", splitk.SPLITK, max_iterations=2)


def _plans(c: Compilation) -> None:
    # the bindings' terms are encoded before the view is built: a large one is named by a new `let`,
    # which the view must already hold
    binding_terms = [c.encoder.encode(b.node) for b in c.bindings]
    c.encoder.flush()
    if binding_terms:
        write(c.egraph, *binding_terms)
    view = c.view = build_view(c.egraph, c.encoder.encoded)
    tx = _extractor(c, view)
    cid = lambda t: class_of(c.egraph, view, t)  # noqa: E731
    no_red = lambda _c, n: n.op != "red"  # noqa: E731
    bits = c.axis_bits()
    binding_leaves = {cid(t): b for t, b in zip(binding_terms, c.bindings)}
    cache: dict = {}

    tables: dict = {}

    def best(term: Term, *, allow=no_red, key=None) -> ir.Node:
        # (keyed by the term's id, so the entry keeps the term alive: a term freed after its lookup, its
        # id then taken by another, had given that other one its term — a training forward's rolling sum
        # decoded as exp(cur:max_d − max) instead of exp(x − max), every rolling plan of the compile
        # silently wrong, and cached on disk; it depended on what the process had allocated before)
        k = (key, id(term))
        hit = cache.get(k)
        if hit is None or hit[0] is not term:
            if key not in tables:  # one cost table per configuration, shared by all terms
                tables[key] = tx.costs(allow=allow)
            hit = cache[k] = (term, tx.decode(cid(term), tables[key]))
        return hit[1]

    def comp_mask(lp, i):
        t = lp.comps[i].mask_term
        node = best(t)
        if isinstance(node, ir.Const) and node.value != 0.0:
            return None
        parts = conjuncts(node)
        unique = list(dict.fromkeys(parts))  # a ∧ b ∧ a → a ∧ b
        return node if len(unique) == len(parts) else conjunction(unique)

    def comp_core(lp, i):
        comp = lp.comps[i]
        node = best(comp.core_term)
        key = ("checked", id(comp))
        if key not in cache:  # (once per component; the entry keeps it alive, so its id stays its own)
            cache[key] = (comp, differs(node, comp.core))
        if cache[key][1] is not None:  # (a LookupError: the loop is dropped, its reason said)
            raise LookupError(f"internal inconsistency, the e-graph's term for the body of {comp.binding.name} "
                              f"does not take its values: {cache[key][1]}")
        return node

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
            try:
                cache[key] = leaves[root] if root in leaves else tx.best_term(root, allow=no_red, leaves=leaves)
            except LookupError as e:  # (said once per output, naming it: plans.py collects the reasons)
                raise LookupError(f"output '{out.name}' has no term over this plan's reductions ({e})") from None
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
                      c.options.inline_max, c.options.max_plans, fold_rows=c.options.fold_rows,
                      gemm_split=c.options.library_gemm)
    plans = enumerate_plans(space)
    wrong = {id(p): why for p in plans if (why := lost_axis(p, c.bindings) or unready_state(p)) is not None}
    if wrong:  # (never cached, never run: an internal error, named, rather than a silent wrong answer)
        kept = [p for p in plans if id(p) not in wrong]
        if not kept:
            raise NeptuneError(f"{c.program.name}: internal error, every plan fails its check against the "
                               f"program: {next(iter(wrong.values()))}")
        c.numerics_notes.append(f"{len(wrong)} plan(s) dropped, failing their check against the program: "
                                f"{next(iter(wrong.values()))}")
        plans = kept
    compared = compared_with_extreme(c.representative)
    # (a short reduction written out in index order has the same bits in every kernel: numeric.written_out)
    once = {b.name for b in c.bindings if b.node in compared and not written_out(b.node, c.program)}
    if once:  # (a value compared with its own max: the same bits for both, extract/exact_tests.py)
        plans = materialising(plans, once, tested_in_reductions(c.representative, c.bindings))
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
        memo: dict = {}  # what pricing a kernel finds of the plan alone

        def priced(k, s, plan=plan, costs=costs, memo=memo):
            key = (k.name, s.key())
            if key not in costs:
                costs[key] = kernel_cost(plan, k, at, s, c.device, memo)
            return costs[key]

        def cheapest(k, variants, priced=priced):
            return min(variants, key=lambda v: priced(k, v.schedule).time)

        def price(k, v, priced=priced):
            return priced(k, v.schedule).time

        for kind, schedules in plan_variants(plan, c.program, plan_schedules(plan, c.program), cheapest,
                                             price=price, library=c.options.library_gemm,
                                             precisions=c.options.float32_products):
            cost = Cost([priced(k, s) for k, s in zip(plan.kernels, schedules)])
            alts.append(Alternative(0, plan, cost, schedules, kind))
    alts.sort(key=lambda a: a.cost.rank)
    for a in alts:  # the plan's own cost: its best schedule's
        if a.plan.cost is None:
            a.plan.cost = a.cost
    for i, a in enumerate(alts):
        a.id = i
    c.alternatives = alts
