"""Candidate plans from the e-graph: which loops compute which reductions, split how, in which kernels.

Every reduction of the representative program (a binding) is computed either inline (a
contraction over a small axis, evaluated per element where it is used) or by exactly one loop
group whose `get(loop, name)` the fusion rules unioned into the reduction's e-class; each group
runs whole or in one of the chunk counts the split-K rule offered. Enumerating these exact covers,
and two kernel policies (fuse consecutive compatible passes into one kernel, or one kernel per
pass with intermediates through HBM), gives the alternatives the cost model ranks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from neptune_eq import ir
from neptune_eq.contraction import is_product, opened
from neptune_eq.fusion.types import Binding, LoopCandidate, direct_bindings
from neptune_eq.numeric import compute_dtype, input_leaf, integral
from neptune_eq.plan import BufferSpec, Combine, CompPlan, KernelPlan, Pass, Plan, StorePlan

from .exact_tests import self_tested, spell_tests_alike
from .fold_rows import fold_row_kernels
from .gemm_split import split_gemm_epilogues
from .hoist import hoist_row_conditions
from .materialise import materialise_inline, materialise_operands
from .merge import merge_shared_sums


class LoopTermError(LookupError):
    """A loop's correction or body has no term in the e-graph (its analysis was cut by a budget)."""

    def __init__(self, loop: int, why: str):
        super().__init__(why)
        self.loop, self.why = loop, why


@dataclass
class PlanTerms:
    """The extracted terms plans are assembled from (callables over the final e-graph)."""

    comp_mask: Callable[[LoopCandidate, int], ir.Node | None]
    comp_core: Callable[[LoopCandidate, int], ir.Node]
    comp_corr: Callable[[LoopCandidate, int], ir.Node | None]
    inline_term: Callable[[Binding], ir.Node]
    output_expr: Callable[[ir.Output], ir.Node]


@dataclass
class PlanSpace:
    program: ir.Program
    bindings: list[Binding]
    loops: list[LoopCandidate]
    splits: dict[int, list[int]]  # loop index → chunk counts offered by the split-K rule
    terms: PlanTerms
    representative: dict[str, ir.Node]  # output name → the representative expression
    inline_max: int = 256
    max_plans: int = 200
    fold_rows: bool = False  # also offer each plan with a row kernel folded (fold_rows.py)
    gemm_split: bool = False  # also offer each plan with its products' epilogues split off (gemm_split.py)
    _cache: dict = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)  # loops whose terms could not be extracted, and why
    bad_loops: set[int] = field(default_factory=set)
    truncated: bool = False  # stopped at max_plans (or after exploring 50·max_plans covers)

    @property
    def by_name(self) -> dict[str, Binding]:
        return {b.name: b for b in self.bindings}

    def integer_bindings(self) -> set[str]:
        """Reductions whose values are integers computed exactly (neptune_eq.numeric)."""
        key = "integer_bindings"
        if key not in self._cache:
            leaf = input_leaf(self.program)
            self._cache[key] = {b.name for b in self.bindings if integral(b.node, leaf)}
        return self._cache[key]

    def self_tested(self) -> set[str]:
        """The maxes and mins the program compares with nothing but their own value (exact_tests.py)."""
        key = "self_tested"
        if key not in self._cache:
            self._cache[key] = self_tested(self.representative.values(), self.bindings)
        return self._cache[key]

    def inlinable(self, long: bool = True) -> set[str]:
        """Reductions used only inside bodies of reductions over other axes: over small axes (computed
        whole per tile) and, with `long`, over longer ones too (a K-loop nested where they are used:
        linear cross-entropy's logits inside the pass over the vocabulary)."""
        by_node = {b.node: b for b in self.bindings}
        used_inside: set[str] = set()
        same_axis_use: set[str] = set()
        for b in self.bindings:
            for u in direct_bindings(b.node.body, by_node):
                used_inside.add(u)
                if self.by_name[u].axis == b.axis:
                    same_axis_use.add(u)
        used_by_outputs: set[str] = set()
        for expr in self.representative.values():
            used_by_outputs |= direct_bindings(expr, by_node) | ({by_node[expr].name} if expr in by_node else set())
        out = {b.name for b in self.bindings
               if (self.program.axes[b.axis] <= self.inline_max or (long and _tile_contraction(b)))
               and b.name in used_inside and b.name not in used_by_outputs}
        # a reduction used inside another over its own axis is inline only with that one, the axis then
        # held whole in the tile (QK-norm's Σ_d k² inside the scores Σ_d q̂·k̂ of a key tile); inside a
        # loop over the axis it would need the whole axis at each step
        while drop := {u for u in out & same_axis_use
                       if any(u in direct_bindings(b.node.body, by_node) and b.axis == self.by_name[u].axis
                              and (b.name not in out or self.program.axes[b.axis] > self.inline_max)
                              for b in self.bindings)}:
            out -= drop
        return out


def _tile_contraction(b: Binding) -> bool:
    """A sum of products into two free axes, each missing from a factor that varies along the sum
    (A[m, k]·B[k, n]): per tile a tl.dot, over a long axis a K-loop of them. A row dot whose factors
    all span the free axes (attention's D = Σ_e dO[i, e]·O[i, e]) is no matrix product: inlined in a
    loop over i it would reload O every step, so the plan space also writes it once."""
    if not (b.op == "sum" and len(b.free) >= 2 and is_product(b.node.body)):
        return False
    free = set(b.free)
    missing = [free - f.axes for f in opened(b.node.body).factors if b.axis in f.axes]
    return any(m and n and len(m | n) >= 2 for m, n in itertools.combinations(missing, 2))


def _covers(names: list[str], loops: list[tuple[int, LoopCandidate]]):
    """Exact covers of `names` by loops (each name in exactly one loop), in the order of `loops`."""
    holding: dict[str, list[tuple[int, LoopCandidate, frozenset[str]]]] = {}  # name → the loops holding it
    for idx, loop in loops:
        comp_names = frozenset(loop.names)
        for n in comp_names:
            holding.setdefault(n, []).append((idx, loop, comp_names))
    yield from _covers_of(names, holding)


def _covers_of(names: list[str], holding: dict[str, list[tuple[int, LoopCandidate, frozenset[str]]]]):
    if not names:
        yield []
        return
    have = set(names)
    for idx, loop, comp_names in holding.get(names[0], ()):
        if comp_names <= have:
            rest = [n for n in names if n not in comp_names]
            for tail in _covers_of(rest, holding):
                yield [(idx, loop), *tail]


def enumerate_plans(space: PlanSpace) -> list[Plan]:
    plans: list[Plan] = []
    seen: set = set()
    policies: list[set[str]] = []
    long, short = space.inlinable(long=True), space.inlinable(long=False)
    # and each with its tile contractions alone inline, every other reduction a pass of its own whose
    # result later kernels read (attention's backward D = Σ_e dO·O, written once rather than
    # recomputed per key tile)
    def contractions(names: set[str]) -> set[str]:
        return {n for n in names if _tile_contraction(space.by_name[n])}

    for inline in (long, short, contractions(long), contractions(short), set()):
        if inline not in policies:
            policies.append(inline)

    def plans_of(inline: set[str], covers):
        """The new plans of `covers` under `inline`, fewest passes first: every cover unsplit, then
        each with one pass split (at most one split pass per plan keeps the space small). Cover by
        cover, a cover's five split counts of a pass it need not split had filled max_plans before
        the covers that keep each product alone (linear cross-entropy's joint loss and gradients:
        200 plans, every one fusing its gather into the logits' GEMM)."""
        ordered = sorted(covers, key=len)
        unsplit = ((c, (1,) * len(c)) for c in ordered)
        split = ((c, s) for c in ordered for s in itertools.product(*[[1, *space.splits.get(idx, [])] for idx, _ in c])
                 if sum(n > 1 for n in s) == 1)
        for cover, splits in itertools.chain(unsplit, split):
            # (operands not written; written, by map passes where they read no reduction; written,
            # by an earlier kernel's epilogue where they can)
            nothing: set[bool] = set()  # `fused` choices with no operand to write (with or without epilogues)
            for fused, (materialise, epilogues, row_factors) in itertools.product(
                    (True, False), ((False, False, False), (True, False, False), (True, True, False),
                                    (True, False, True))):
                if any(idx in space.bad_loops for idx, _ in cover) or (
                        materialise and not row_factors and fused in nothing):  # (a row factor makes one)
                    continue
                try:
                    plan = build_plan(space, inline, cover, splits, fused, materialise, epilogues, row_factors)
                except NoOperands:
                    nothing.add(fused)
                    continue
                except LoopTermError as e:  # a correction the (budget-cut) e-graph cannot give
                    space.bad_loops.add(e.loop)
                    space.dropped.append(e.why)
                    continue
                except LookupError as e:  # an output's term, cut the same way: this plan only
                    why = str(e).strip("'\"")
                    if why not in space.dropped:  # (each reason once: the message had repeated it per plan)
                        space.dropped.append(why)
                    continue
                if plan is None:
                    continue
                variants = [plan, *(fold_row_kernels(plan, space.program) if space.fold_rows else ())]
                if space.gemm_split:
                    variants += [s for p in variants if (s := split_gemm_epilogues(p, space.program))]
                for p in variants:
                    sig = _signature(p)
                    if sig not in seen:
                        seen.add(sig)
                        yield p

    explored = 0
    streams = []  # each policy's plans, in the order its covers give them
    for inline in policies:
        scheduled = [b.name for b in space.bindings if b.name not in inline]
        loops = [(k, lp) for k, lp in enumerate(space.loops) if lp.valid and not set(lp.names) & inline]
        # the covers of many overlapping groups grow exponentially: at most 50·max_plans are looked at,
        # fewest passes first, so that a cut-short space keeps the fused plans (each cover brings a plan
        # per split choice, and the unfused cover alone may fill max_plans)
        # (each later policy still looks at 5·max_plans: the inlining policy had taken the whole room
        # with covers of CLIP's loss, whose float32 logits were then recomputed by both log-sum-exps,
        # never written once by the unfused policy)
        room = max(50 * space.max_plans - explored, 5 * space.max_plans)
        covers = list(itertools.islice(_covers(scheduled, loops), room + 1))
        if len(covers) > room:
            space.truncated = True
            covers.pop()
        explored += len(covers)
        if _waits_for_a_loop(space, inline):
            # every cover of this policy would be refused at its end; its covers still count against
            # the room, as when they were built (a policy after it sees the space it always saw)
            continue
        streams.append(plans_of(inline, covers))
    # every policy first gets its share of max_plans, then the rest goes to the policies in order: the
    # inline policies alone had filled the space with plans that recompute a contraction per tile (the
    # backward of SigLIP at d 768: 200 plans holding d whole, none writing the 8192² logits once)
    share = math.ceil(space.max_plans / max(1, len(streams)))
    for quota in (share, space.max_plans):
        for stream in streams:
            for _ in range(quota):
                if len(plans) >= space.max_plans:
                    space.truncated = True
                    return plans
                plan = next(stream, None)
                if plan is None:
                    break
                plans.append(plan)
    if not plans and set() in policies:
        # the policies before the unfused one took the whole room, their covers all refused (a
        # backward of 21 sums over 5 axes): the unfused policy, which always has a plan, on its own
        scheduled = [b.name for b in space.bindings]
        loops = [(k, lp) for k, lp in enumerate(space.loops) if lp.valid]
        plans += itertools.islice(plans_of(set(), itertools.islice(_covers(scheduled, loops), 50 * space.max_plans)),
                                  space.max_plans)
    return plans


class NoOperands(Exception):
    """build_plan with `materialise`: the plan has no computed GEMM operand to write (nor would it with
    `epilogues`, which only places them elsewhere)."""


def _waits_for_a_loop(space: PlanSpace, inline: set[str]) -> bool:
    """An inline term computed per tile cannot wait for a loop's result: a policy inlining a term that
    reads a reduction it does not inline gives no plan."""
    try:
        terms = [space.terms.inline_term(space.by_name[name]) for name in inline]
    except LookupError:  # (a term cut by the budget: build_plan reports it)
        return False
    return any(isinstance(n, ir.StateRef) and n.kind is ir.RefKind.INLINE and n.name not in inline
               for t in terms for n in ir.walk(t))


def _signature(plan: Plan) -> tuple:
    return (tuple(sorted(plan.inline)), tuple(sorted(plan.buffers)), tuple(
        (k.grid, k.chunks, tuple((type(p).__name__, getattr(p, "axis", None),
                                  tuple(c.name for c in (p.source.comps if isinstance(p, Combine) else p.comps)))
                                 for p in k.phases)) for k in plan.kernels))


def _topo(cover, by_name: dict[str, Binding], extents: dict[str, int]) -> list[int] | None:
    """Order of cover entries so that producers' groups come first; among groups that do not need
    each other, the one with the smaller results first (Σ_d x² [i] before Σ_d x·W [i, e]): a kernel
    boundary between them then buffers the small result, and the large one stays in the kernel
    that stores the output."""
    owner = {n: k for k, (_, lp) in enumerate(cover) for n in lp.names}
    by_node = {b.node: b for b in by_name.values()}
    deps = {k: set() for k in range(len(cover))}
    for k, (_, lp) in enumerate(cover):
        for n in lp.names:
            for d in direct_bindings(by_name[n].node.body, by_node):
                if d in owner and owner[d] != k:
                    deps[k].add(owner[d])
    def points(k: int) -> int:
        return sum(math.prod(extents[a] for a in by_name[n].free) for n in cover[k][1].names)

    order, done = [], set()
    while len(order) < len(cover):
        ready = [k for k in range(len(cover)) if k not in done and deps[k] <= done]
        if not ready:
            return None  # the groups need each other's final values
        first = min(ready, key=points)
        order.append(first)
        done.add(first)
    return order


def _grid_of(comps: list[CompPlan], program: ir.Program) -> tuple[str, ...]:
    axes = set().union(*(c.free for c in comps)) if comps else set()
    return tuple(a for a in program.axes if a in axes)


def _program_order(program: ir.Program, axes) -> tuple[str, ...]:
    return tuple(a for a in program.axes if a in set(axes))


def build_plan(space: PlanSpace, inline: set[str], cover, splits, fused: bool,
               materialise: bool = False, epilogues: bool = False, row_factors: bool = False) -> Plan | None:
    """The plan of one cover: `fused` merges consecutive compatible passes into one kernel;
    `materialise` writes each computed GEMM operand once (extract/materialise.py), None when the plan
    has none; `epilogues` lets an earlier kernel's epilogue write an operand that reads no reduction;
    `row_factors` writes a row's statistic into its operand too (None when none is)."""
    program, by_name = space.program, space.by_name
    order = _topo(cover, by_name, program.axes)
    if order is None:
        return None
    passes: list[tuple[Pass, LoopCandidate, int]] = []
    derivation: list[str] = []
    ints = space.integer_bindings()
    for k in order:
        idx, lp = cover[k]
        comps = []
        for ci, c in enumerate(lp.comps):
            if c.count_name is not None:  # the element count an affine repair multiplies h₀ by
                comps.append(CompPlan(name=c.count_name, op="sum", free=c.binding.free,
                                      mask=space.terms.comp_mask(lp, ci), core=ir.Const(1.0)))
        for ci, c in enumerate(lp.comps):
            b = c.binding
            aff = c.chosen_affine
            try:
                corr = space.terms.comp_corr(lp, ci) if c.producers and aff is None else None
                core = space.terms.comp_core(lp, ci)
            except LookupError as e:
                raise LoopTermError(idx, f"{', '.join(lp.names)} over {lp.axis}: {e}") from None
            # (a reset needs no guard against a max still at its identity: elements at −∞ attain it)
            reset = c.chosen is not None and c.chosen.kind == "reset"
            guard = any(by_name[p].op in ("max", "min") for p in c.producers) and not reset
            if b.name in ints and ((c.producers and not reset)
                                   or not integral(core, input_leaf(program, int_syms=ints))):
                # an integer reduction is computed exactly and unfused, or not at all — or rolled by a
                # reset, which keeps or restarts its integer state (lower/passes._apply)
                return None
            comps.append(CompPlan(
                name=b.name, op=b.op, free=b.free, mask=space.terms.comp_mask(lp, ci),
                core=core, producers=c.producers, corr=corr,
                dist=c.chosen.dist if c.chosen else None, guard=guard,
                annihilator=c.chosen.annihilator if c.chosen else 0.0, integer=b.name in ints,
                affine=() if aff is None else (*aff.terms.items(),
                                               *(((c.count_name, aff.constant),) if aff.constant is not None else ())),
            ))
        ps = Pass(lp.axis, comps, split=splits[k], rules=tuple(a.rule for a in lp.applications))
        passes.append((ps, lp, idx))
        derivation += [str(a) for a in lp.applications]
        if splits[k] > 1:
            derivation.append(f"split_k: the pass over {lp.axis} ({', '.join(lp.names)}) runs as {splits[k]} "
                              f"chunks whose states are combined with the same corrections")
    for name in sorted(inline):
        derivation.append(f"inline: {name} is computed per tile where it is used (not materialised)")

    # ---- kernels
    kernels: list[KernelPlan] = []
    cur: KernelPlan | None = None
    for ps, _lp, _ in passes:
        grid = _grid_of(ps.comps, program)
        if ps.split > 1:
            part = KernelPlan(f"k{len(kernels)}_partial", grid, [ps], chunks=ps.split)
            for c in ps.comps:
                part.epilogue.append(StorePlan(f"part_{c.name}", (ir.CHUNK, *c.free), c.ref(ir.RefKind.FINAL)))
            kernels.append(part)
            cur = KernelPlan(f"k{len(kernels)}", grid, [Combine(ps, ps.split)])
            kernels.append(cur)
            continue
        loop_axes = {p.axis for p in cur.passes()} | {ps.axis} if cur is not None else set()
        merged = set(cur.grid) | set(grid) if cur is not None else set()
        if fused and cur is not None and _compatible(cur.grid, grid) and not merged & loop_axes:
            cur.grid = _program_order(program, set(cur.grid) | set(grid))
            cur.phases.append(ps)
        else:
            cur = KernelPlan(f"k{len(kernels)}", grid, [ps])
            kernels.append(cur)
    # ---- outputs
    owner_kernel: dict[str, int] = {}
    for ki, k in enumerate(kernels):
        for ph in k.phases:
            src = ph.source if isinstance(ph, Combine) else ph
            if isinstance(ph, Combine) or src.split == 1:
                for c in src.comps:
                    owner_kernel[c.name] = ki
    by_node = {b.node: b for b in space.bindings}
    for out in program.outputs:
        expr = space.terms.output_expr(out)
        used = {n.name for n in ir.walk(expr) if isinstance(n, ir.StateRef)}
        used |= direct_bindings(space.representative[out.name], by_node)
        ks = [owner_kernel[u] for u in used if u in owner_kernel]
        if not kernels:
            kernels.append(KernelPlan("k0", _program_order(program, out.axes), []))
        ki = max(ks) if ks else len(kernels) - 1
        k = kernels[ki]
        loops = {p.axis for p in k.passes()}
        mapped = set(k.grid) <= set(out.axes) <= set(k.grid) | loops and (k.phases or set(k.grid) == set(out.axes))
        if not ks and not mapped:
            # an output that reads no reduction, over other axes than the kernel's grid and loops, gets a
            # kernel of its own (RoPE's rotated q over i, k over j; its gradient's beside Σ_b,h dcos): a
            # grid over both would replicate one output, or a reduction, over the other's axes
            k = KernelPlan(f"k{len(kernels)}", _program_order(program, out.axes), [])
            kernels.append(k)
        loop_axes = {p.axis for p in k.passes()}
        extra = [a for a in out.axes if a not in k.grid]
        map_axes = [a for a in extra if a in loop_axes]
        other = [a for a in extra if a not in loop_axes]
        if len(map_axes) > 1:
            return None  # an output needing two map passes at once is not supported
        if other:
            k.grid = _program_order(program, set(k.grid) | set(other))
        store = StorePlan(out.name, out.axes, expr, out.dtype or "float32")
        if map_axes:
            k.phases.append(Pass(map_axes[0], [], [store]))
        else:
            k.epilogue.append(store)
    floats = compute_dtype(program)
    buffers: dict[str, BufferSpec] = {}
    derivation += merge_shared_sums(kernels, owner_kernel)
    spelled = spell_tests_alike(kernels, space.self_tested())
    if spelled is None:
        return None
    derivation += spelled
    inline_terms = {name: space.terms.inline_term(by_name[name]) for name in inline}
    if materialise:
        mats = materialise_operands(kernels, program, owner_kernel, epilogues, row_factors)
        if mats is None:
            return None
        mats.update(materialise_inline(kernels, inline_terms, program, owner_kernel))
        if not mats:
            raise NoOperands
        buffers.update(mats)
        derivation += [f"materialise: {b.name}[{', '.join(map(str, b.axes))}] ({b.dtype}) is written once and read "
                       f"by the contraction as data, not recomputed per output tile" for b in mats.values()]
    # ---- buffers between kernels
    for k in kernels:
        if k.chunks > 1:
            for st in k.epilogue:
                name = st.target.removeprefix("part_")
                buffers[st.target] = BufferSpec(st.target, st.axes, "int64" if name in ints else floats)
    computed = {ki: {c.name for ph in k.phases for c in (ph.source.comps if isinstance(ph, Combine) else ph.comps)}
                for ki, k in enumerate(kernels)}
    for ki, k in enumerate(kernels):
        refs = _syms_needed(k)
        needed, pending, loads = set(refs), {}, []
        for name in refs:  # (in the order the kernel reads them, not a set's: buffers and stores alike everywhere)
            if name in inline or name in computed[ki] or name not in by_name:
                continue
            src = owner_kernel.get(name)
            if src is None or src >= ki:
                return None
            b = by_name[name]
            buf = f"buf_{name}"
            if buf not in buffers:
                streamed = [set(by_name[n].free) for n in needed if n in by_name and n not in inline
                            and n not in computed[ki]] + [set(ld.axes) for e in k.exprs() for ld in e.loads
                                                          ] + [set(ld.axes) for ld in loads]
                axes = _buffer_layout(b.free, k, streamed)
                buffers[buf] = BufferSpec(buf, axes, "int64" if name in ints else floats)
                kernels[src].epilogue.append(StorePlan(buf, axes, b.ref(ir.RefKind.FINAL)))
            load = ir.Load(buf, tuple(ir.Index(a) for a in buffers[buf].axes))
            loads.append(load)
            pending.update(dict.fromkeys(refs[name], load))
        if pending:  # (one rebuild of the kernel's expressions for all its buffers)
            k.substitute(pending)
    derivation += hoist_row_conditions(kernels)
    groups = [(lp.axis, lp.names, ps.split) for ps, lp, _ in passes]
    return Plan(kernels, buffers, inline_terms, groups, fused, derivation)


def _buffer_layout(free: tuple[str, ...], k: KernelPlan, streamed: list[set[str]]) -> tuple[str, ...]:
    """The axis order of a buffer written by one kernel and read by `k`. Its last axis is the contiguous
    one; when `k` reads a single index of it per program (a grid axis that every tensor `k` streams
    has, so no vector tile: schedule.row_axes), each element costs a memory sector of its own, and
    that axis moves to the front. A grouped-query gradient's sum over the heads of a group read its
    per-head partials [h, d, j] one key j per program (4-byte reads 64 KiB apart)."""
    loop = {p.axis for p in k.passes()}
    last = free[-1] if free else None
    if last is None or last not in k.grid or last in loop or not all(last in s for s in streamed if s & loop):
        return free
    return (last, *free[:-1])


def _compatible(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return set(a) <= set(b) or set(b) <= set(a)


_VALUES = (ir.RefKind.FINAL, ir.RefKind.INLINE)  # references a kernel needs computed, loaded or inline


def _syms_needed(k: KernelPlan) -> dict[str, set[ir.Node]]:
    """The values the kernel reads by reference (a loop's final value, an inline term): name → its
    reference nodes."""
    out: dict[str, set[ir.Node]] = {}
    for e in k.exprs():
        for n in ir.walk(e):
            if isinstance(n, ir.StateRef) and n.kind in _VALUES:
                out.setdefault(n.name, set()).add(n)
    return out
