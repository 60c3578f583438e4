"""Affine corrections: t′ = Σₖ hₖ(R, R′)·tₖ + h₀(R, R′)·n, found by saturation.

A multiplicative repair (correction.py) moves one accumulator's reference point on its own:
g(R′, c) = g(R, c)·h. Many sums need the others: the entropy term Σ e^{x−m}(x − m) moves with
e^{m−m′} *and* borrows (m − m′)·Σ e^{x−m}; a sum of squares around a running mean borrows the running
sum and the count (Welford / Chan). Here the body at the new reference, g(R′, c), is rewritten into a
sum over the bodies bₖ(R, c) of the sums carried in the same pass:

    g(R′, c) = Σₖ hₖ(R, R′)·bₖ(R, c) + h₀(R, R′)        (h free of the loop axis)

so that, summed over the elements already seen, Σ g(R′, c) = Σₖ hₖ·tₖ + h₀·n. How:

1. Rebase. Every largest subterm r′ of g(R′, c) that is free of the loop axis and reads a running
   value is unioned with r + (r′ − r) and with r·(r′/r), r its old-reference counterpart: identities
   that give the rules something to expand around.
2. Expand. The algebra and rules/affine.py's expansions (distribute, split exponentials, reassociate)
   saturate g(R′, c) in a small e-graph of its own, within a budget.
3. Extract linearly. After each iteration a dynamic programme looks for the cheapest term of g(R′, c)'s
   e-class that is *linear* in the e-classes of the bodies bₖ (each used as a leaf, at most once per
   product, never inside a nonlinear function) with coefficients free of the loop axis. Found: the
   leaves become the old running values tₖ and the term is split into its coefficients.
4. Check. The identity is evaluated in float64 on random values before the repair may be used.

Nothing here knows entropy or variance: they are what the rules find (tests/test_affine.py).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import replace

import numpy as np
from egglog import EGraph, ruleset, union

from neptune_eq import ir
from neptune_eq.egg_write import write
from neptune_eq.extract.terms import TermExtractor, op_cost
from neptune_eq.extract.view import build_view, class_of
from neptune_eq.ops import OPS
from neptune_eq.rules import analysis
from neptune_eq.rules.affine import EXPAND
from neptune_eq.rules.base import Rule
from neptune_eq.saturate import Budget, Saturator, prime
from neptune_eq.terms import Encoder

from .found import Found, Searchers, searcher_key
from .types import AffineResult

AFFINE_BUDGET = Budget(max_nodes=20_000, max_seconds=2.0, max_iterations=6)
_FOUND = Found()  # what searches found, by rules, axes, extents, budget less its seconds and query (found.py)
_KEPT = Searchers()  # searchers by rules, axes and extents, for the main thread (found.py)
OLD, CUR = ir.RefKind.OLD, ir.RefKind.CURRENT
# a basis body used as a leaf of the linear term: the *accumulated* sum tₖ it stands for is the old
# running value of that reduction, but the leaf must not be confused with old:k appearing inside a
# coefficient, so it is marked by a kind no correction term holds for a carried reduction
_LEAF = ir.RefKind.INLINE


def _leaf(name: str) -> ir.StateRef:
    return ir.StateRef(_LEAF, name, ())


def _is_leaf(n: ir.Node, names) -> bool:
    return isinstance(n, ir.StateRef) and n.kind is _LEAF and n.name in names and not n.ref_axes
# algebra rules that only change how a value is written (exp → exp2, masks hoisted): they would
# multiply the e-graph of an expansion without bringing a linear form nearer
_NOT_HERE = frozenset({"exp_to_exp2", "log_to_log2", "mul_const_out", "div_by_const"}
                      | {f"where_{n}" for n in ("exp", "exp2", "neg", "log", "log2")}
                      | {f"where_{n}_{s}" for n in ("add", "sub", "mul", "div") for s in "lr"})
_LINEAR_OPS = ("add", "sub", "neg", "mul", "div", "where")


def _varies(n: ir.Node, axis: str) -> bool:
    return axis in n.axes


def _running(n: ir.Node) -> bool:
    return any(isinstance(m, ir.StateRef) and m.kind is CUR for m in ir.walk(n))


def references(node: ir.Node, axis: str) -> list[ir.Node]:
    """The largest subterms of `node` free of `axis` that read a running (current) value."""
    out: list[ir.Node] = []

    def go(n: ir.Node) -> None:
        if not _varies(n, axis) and _running(n):
            if n not in out:
                out.append(n)
            return
        for c in n.children():
            go(c)

    go(node)
    return out


_RELATIVE = frozenset({"log", "log2", "eq", "ne", "lt", "le", "gt", "ge"})  # scale-free uses


def additive_uses(core: ir.Node, sums: set[str], counts: frozenset[str] = frozenset()) -> set[str]:
    """The sums of `sums` whose running value `core` uses other than relatively (under a log, as a
    divisor, compared, or divided by a running count of `counts`: a mean). A partial sum is a biased
    estimate of the final one (Σ over the first n of N elements); its log or a ratio moves by a bounded
    repair, but a body polynomial in it (Σ (x − s/N)²) would be accumulated around a reference far from
    the final one and repaired by cancelling large terms: exact over the reals, not in float32."""
    found: set[str] = set()

    def go(n: ir.Node, relative: bool) -> None:
        if isinstance(n, ir.StateRef) and n.kind is CUR and n.name in sums and not relative:
            found.add(n.name)
            return
        if isinstance(n, ir.Call):
            by_count = (n.op == "div" and isinstance(n.args[1], ir.StateRef) and n.args[1].kind is CUR
                        and n.args[1].name in counts)
            for k, a in enumerate(n.args):
                go(a, relative or n.op in _RELATIVE or (n.op == "div" and (k == 1 or by_count)))

    go(core, False)
    return found


def relative_uses(core: ir.Node, sums: set[str], counts: frozenset[str] = frozenset()) -> bool:
    """Every running value of the sums `sums` in `core` is used relatively (additive_uses)."""
    return not additive_uses(core, sums, counts)


def to_old(node: ir.Node, names) -> ir.Node:
    """`node` with the current values of the reductions `names` replaced by their old values."""
    names = set(names)
    return ir.rebuild(node, lambda _o, n: ir.StateRef(OLD, n.name, n.ref_axes)
                      if isinstance(n, ir.StateRef) and n.kind is CUR and n.name in names else n)


class AffineSearcher:
    """One e-graph for the affine searches of a compile (each query between push() and pop())."""

    def __init__(self, axis_order, extents, rules: list[Rule], budget: Budget = AFFINE_BUDGET,
                 dynamic: frozenset[str] = frozenset()):
        self.axis_order, self.extents, self.budget = tuple(axis_order), dict(extents), budget
        self.egraph = EGraph()
        self.base = Encoder(self.egraph, self.axis_order, self.extents, dynamic)
        rs = [r for r in rules if r.name not in _NOT_HERE] + EXPAND
        self.schedule = ruleset(*[r.egglog() for r in rs], name=f"affine_rules_{len(rs)}") | analysis.ANALYSIS
        self.names = {r.egglog().decl: r.name for r in rs}
        prime(self.egraph, self.schedule, analysis.SEED)  # (each search, pushed, then runs them unmerged)
        self.rules = tuple(rs)
        self.key = searcher_key(self.axis_order, self.extents, rs, dynamic)

    def search(self, core: ir.Node, basis: dict[str, ir.Node], running: set[str], axis: str,
               zero: frozenset[str] = frozenset()) -> AffineResult:
        """Rewrite `core` (a body at the current references of `running`) over the `basis` bodies
        (name → body at the old references). The bodies named in `zero` sum to 0 over the elements
        seen: a term on them costs nothing, since it is dropped (fusion/extrapolate.py).

        A body with several running references (KL: the two log-sum-exps) moves them one at a time:
        g(R₁′, R₂′) is rewritten over g(R₁, R₂′) and the basis, that over g(R₁, R₂), and the repairs
        compose. Each step is a search as small as one reference's; all at once, the e-graph must hold
        every order of the expansions and outgrows its budget."""
        refs = references(core, axis)
        own = next((k for k, b in basis.items() if b == to_old(core, running)), None)
        if len(refs) < 2 or own is None:
            return self._search(core, basis, running, axis, zero, refs)
        steps, cur = [], core
        for r in refs:
            nxt = ir.substitute(cur, {r: to_old(r, running)})
            steps.append((cur, nxt, r))
            cur = nxt
        if cur != basis[own]:
            return self._search(core, basis, running, axis, zero, refs)
        terms: dict[str, ir.Node] = {}
        constant: ir.Node | None = None
        scale: ir.Node = ir.Const(1.0)  # the product of the own-body coefficients of the steps so far
        its = nodes = 0
        seconds = 0.0
        for cur, nxt, r in steps:
            res = self._search(cur, {**basis, own: nxt}, running, axis, zero, [r])
            its, nodes, seconds = its + res.iterations, max(nodes, res.nodes), seconds + res.seconds
            if not res.found:
                return replace(res, iterations=its, nodes=nodes, seconds=seconds,
                               reason=f"moving the reference {ir.show(r)}: {res.reason}")
            for k, h in res.terms.items():
                if k != own:
                    term = _simplify(ir.Call("mul", (scale, h)))
                    terms[k] = _add(terms[k], term) if k in terms else term
            if res.constant is not None:
                term = _simplify(ir.Call("mul", (scale, res.constant)))
                constant = term if constant is None else _add(constant, term)
            scale = _simplify(ir.Call("mul", (scale, res.terms.get(own, ir.Const(0.0)))))
        terms = {own: scale, **terms}
        return AffineResult(terms, constant, iterations=its, nodes=nodes, seconds=seconds)

    def _search(self, core: ir.Node, basis: dict[str, ir.Node], running: set[str], axis: str,
                zero: frozenset[str], refs: list[ir.Node]) -> AffineResult:
        """One search: `core` rewritten over `basis` with the references `refs` rebased."""
        b = self.budget
        key = (self.key, b.max_nodes, b.max_iterations, b.match_limit, core, tuple(basis.items()),
               frozenset(running), axis, frozenset(zero), tuple(refs))

        def search():
            res, stop = self._search_once(core, basis, running, axis, zero, refs)
            return res, res.seconds, stop == "time budget"

        return _FOUND.answer(key, b.max_seconds, search, alive=self.rules)

    def _search_once(self, core: ir.Node, basis: dict[str, ir.Node], running: set[str], axis: str,
                     zero: frozenset[str], refs: list[ir.Node]) -> tuple[AffineResult, str]:
        t0 = time.perf_counter()
        eg = self.egraph
        eg.push()
        try:
            enc = self.base.fresh()
            g = enc.encode(core)
            basis_terms = {k: enc.encode(b) for k, b in basis.items()}
            facts = []
            for r_new in refs:
                r_old = to_old(r_new, running)
                if r_old == r_new:
                    continue
                tn, to = enc.encode(r_new), enc.encode(r_old)
                facts.append(union(tn).with_(to + (tn - to)))  # r′ = r + (r′ − r)
                facts.append(union(tn).with_(to * (tn / to)))  # r′ = r·(r′/r)
            for k in zero:  # a centred body b − m: b = (b − m) + m, so b can be read through it
                body = basis[k]
                if isinstance(body, ir.Call) and body.op == "sub":
                    facts.append(union(enc.encode(body.args[0])).with_(basis_terms[k] + enc.encode(body.args[1])))
            enc.flush()
            write(eg, g, *basis_terms.values(), *facts)
            bit = 1 << self.axis_order.index(axis)
            sat = Saturator(eg, self.budget, rule_names=self.names)
            found: list[ir.Node] = []

            def done() -> bool:
                # (egglog's numbering, not the canonical one: this runs every iteration, and the canonical
                # view of a 40 000-node e-graph costs a second; the coefficients' terms are extracted alike
                # in every process, only two linear forms of equal cost could be taken in either order)
                view = build_view(eg, enc.encoded, canonical=False)
                tx = TermExtractor(view, self.axis_order, self.extents, enc.loads, enc.syms)
                leaves = {class_of(eg, view, t): k for k, t in basis_terms.items()}
                term = linear_term(view, tx, class_of(eg, view, g), leaves, bit,
                                   {c for c, k in leaves.items() if k in zero})
                if term is not None:
                    found.append(term)
                return term is not None

            if not done():
                sat.phase("affine", self.schedule, seed=analysis.SEED, stop_when=done)
            rep = sat.reports[-1] if sat.reports else None
            its, nodes = (rep.iterations, rep.nodes) if rep else (0, 0)
            stop = rep.stop if rep else "goal reached"
            if not found:
                why = (f"no sum over {', '.join(basis)} with coefficients free of {axis} in the e-class of "
                       f"{ir.show(core)}" + (f" after {its} iterations ({rep.stop})" if rep else ""))
                return AffineResult(iterations=its, nodes=nodes, seconds=time.perf_counter() - t0, reason=why), stop
            split = split_linear(found[0], set(basis))
            if split is None:  # (linear_term only builds linear terms)
                return AffineResult(reason="the linear term could not be split", seconds=time.perf_counter() - t0), stop
            terms, const = split
            return AffineResult(terms, const, iterations=its, nodes=nodes, seconds=time.perf_counter() - t0), stop
        finally:
            eg.pop()


def searcher(axis_order, extents, rules: list[Rule], dynamic: frozenset[str] = frozenset()) -> AffineSearcher:
    """An AffineSearcher for these rules, axes and extents: one the main thread kept from an earlier compile,
    else a new one (its budget is the caller's to set before each search)."""
    return _KEPT.get(searcher_key(axis_order, extents, rules, dynamic),
                     lambda: AffineSearcher(axis_order, extents, rules, dynamic=dynamic), tuple(rules))


# ---------------------------------------------------------------- linear extraction


def linear_term(view, tx: TermExtractor, root: int, leaves: dict[int, str], bit: int,
                zero: set[int] = frozenset()) -> ir.Node | None:
    """The cheapest term of `root` linear in the `leaves` classes (decoded as _leaf(name))
    with coefficients free of the axis `bit`; None if there is none. A product with a leaf of `zero`
    (a body that sums to 0) costs nothing: the repair drops it."""
    nodes = [(c, n) for c, ns in view.classes.items() if view.sort.get(c) == "Term"
             for n in ns if n.op in _LINEAR_OPS]
    users: dict[int, list[int]] = {}  # class → the nodes that take it as an argument
    for k, (_, n) in enumerate(nodes):
        for a in set(n.args):
            users.setdefault(a, []).append(k)
    if root not in _maybe_linear(nodes, users, set(leaves), lambda c: view.free_of(c, bit)):
        return None  # (before the costs, a pass over the whole e-graph, at every iteration of a search)
    free = lambda c, n: view.free_of(c, bit) and n.op != "red"  # noqa: E731
    c0 = tx.costs(allow=free)
    cost0 = {c: v[0] for c, v in c0.items() if v[1] is not None}
    best1: dict[int, tuple[float, object, tuple[int, ...]]] = {c: (0.0 if c in zero else 0.5, None, ()) for c in leaves}
    inf = math.inf
    # rounds over the nodes in a fixed order (which of two equal costs is kept depends on it), each visiting
    # only the nodes an argument of which changed since their last visit (the others would choose what
    # they chose): a node dirtied ahead of the one being visited is visited in this round, else the next
    now, later = list(range(len(nodes))), set()
    for _ in range(64):
        queued = set(now)
        while now:
            k = heapq.heappop(now)
            c, n = nodes[k]
            d = _degree_choice(n, cost0, best1, inf, zero)
            if d is None or not d[0] < best1.get(c, (inf,))[0] - 1e-12:
                continue
            best1[c] = (d[0], n, d[1])
            for u in users.get(c, ()):
                if u > k and u not in queued:
                    heapq.heappush(now, u)
                    queued.add(u)
                elif u <= k:
                    later.add(u)
        if not later:
            break
        now, later = sorted(later), set()
    if root not in best1:
        return None

    def go1(c: int) -> ir.Node:
        _cost, n, degs = best1[c]
        if n is None:
            return _leaf(leaves[c])
        args = [go1(a) if dg else tx.decode(a, c0) for a, dg in zip(n.args, degs)]
        return ir.Call(n.op, tuple(args))

    return go1(root)


def _maybe_linear(nodes, users: dict[int, list[int]], leaves: set[int], free) -> set[int]:
    """The classes that may have a term linear in `leaves`, by the argument patterns _degree_choice
    takes, with `free` (the class does not vary along the axis) for "has a term free of the axis":
    a superset of what linear_term finds (a class free of the axis may still have no such term)."""
    patterns = {"neg": ((1,),), "add": ((1, 1), (1, 0), (0, 1)), "sub": ((1, 1), (1, 0), (0, 1)),
                "mul": ((1, 0), (0, 1)), "div": ((1, 0),), "where": ((0, 1, 1), (0, 0, 1), (0, 1, 0))}
    reach, work = set(leaves), list(leaves)
    while work:
        for k in users.get(work.pop(), ()):
            c, n = nodes[k]
            if c not in reach and any(all((a in reach) if d else free(a) for a, d in zip(n.args, p))
                                      for p in patterns[n.op]):
                reach.add(c)
                work.append(c)
    return reach


def _degree_choice(n, cost0, best1, inf, zero=frozenset()):
    """(cost, degree of each argument) of the cheapest way node `n` is linear in the leaves."""
    own = op_cost(n.op) + 0.01
    if n.op == "mul" and any(a in zero and cost0.get(b, inf) < inf for a, b in (n.args, n.args[::-1])):
        return 0.0, ((1, 0) if n.args[0] in zero and cost0.get(n.args[1], inf) < inf else (0, 1))
    d0 = [cost0.get(a, inf) for a in n.args]
    d1 = [best1[a][0] if a in best1 else inf for a in n.args]
    if n.op == "neg":
        return (own + d1[0], (1,)) if d1[0] < inf else None
    options = []
    if n.op in ("add", "sub"):
        options = [(d1[0] + d1[1], (1, 1)), (d1[0] + d0[1], (1, 0)), (d0[0] + d1[1], (0, 1))]
    elif n.op == "mul":
        options = [(d1[0] + d0[1], (1, 0)), (d0[0] + d1[1], (0, 1))]
    elif n.op == "div":
        options = [(d1[0] + d0[1], (1, 0))]
    elif n.op == "where":  # a predicate free of the axis picks between two linear forms
        options = [(d0[0] + d1[1] + d1[2], (0, 1, 1)), (d0[0] + d0[1] + d1[2], (0, 0, 1)),
                   (d0[0] + d1[1] + d0[2], (0, 1, 0))]
    cost, degs = min(options, key=lambda o: o[0])
    return (own + cost, degs) if cost < inf else None


def split_linear(node: ir.Node, names: set[str]) -> tuple[dict[str, ir.Node], ir.Node | None] | None:
    """node = Σₖ hₖ·leafₖ + h₀ → ({name: hₖ}, h₀ or None); None if node is not linear in the leaves."""

    def lin(n: ir.Node):
        if _is_leaf(n, names):
            return {n.name: ir.Const(1.0)}, None
        if not any(_is_leaf(m, names) for m in ir.walk(n)):
            return {}, n
        if not isinstance(n, ir.Call) or n.op not in _LINEAR_OPS:
            return None
        if n.op == "where":
            if any(_is_leaf(m, names) for m in ir.walk(n.args[0])):
                return None
            ga, gb = lin(n.args[1]), lin(n.args[2])
            if ga is None or gb is None:
                return None
            zero = ir.Const(0.0)
            pick = lambda a, b: ir.Call("where", (n.args[0], a or zero, b or zero))  # noqa: E731
            keys = list(dict.fromkeys([*ga[0], *gb[0]]))
            k = None if ga[1] is None and gb[1] is None else pick(ga[1], gb[1])
            return {a: pick(ga[0].get(a), gb[0].get(a)) for a in keys}, k
        parts = [lin(a) for a in n.args]
        if any(p is None for p in parts):
            return None
        if n.op == "neg":
            t, k = parts[0]
            return {a: _neg(h) for a, h in t.items()}, (None if k is None else _neg(k))
        if n.op in ("add", "sub"):
            (ta, ka), (tb, kb) = parts
            sign = _neg if n.op == "sub" else (lambda x: x)
            terms = dict(ta)
            for a, h in tb.items():
                terms[a] = _add(terms[a], sign(h)) if a in terms else sign(h)
            k = ka if kb is None else (sign(kb) if ka is None else ir.Call(n.op, (ka, kb)))
            return terms, k
        (ta, ka), (tb, kb) = parts
        if n.op == "mul":
            if ta and tb:
                return None
            (t, k), f = ((ta, ka), kb) if ta else ((tb, kb), ka)
            if f is None:
                return None
            return {a: ir.Call("mul", (h, f)) for a, h in t.items()}, (None if k is None else ir.Call("mul", (k, f)))
        if tb or kb is None:  # div: only by a coefficient
            return None
        return {a: ir.Call("div", (h, kb)) for a, h in ta.items()}, (None if ka is None else ir.Call("div", (ka, kb)))

    got = lin(node)
    if got is None:
        return None
    terms, k = got
    return {a: _simplify(h) for a, h in terms.items()}, (None if k is None else _simplify(k))


def _neg(n: ir.Node) -> ir.Node:
    return ir.Call("neg", (n,))


def _add(a: ir.Node, b: ir.Node) -> ir.Node:
    return ir.Call("add", (a, b))


def _is_neg(n: ir.Node) -> bool:
    return isinstance(n, ir.Call) and n.op == "neg"


def _simplify(n: ir.Node) -> ir.Node:
    """Fold the constant arithmetic and signs extraction and split_linear leave (c₁ op c₂, x·1, x ± 0,
    0·c, −(−a), (−a)·b)."""
    def const(m):
        return m.value if isinstance(m, ir.Const) else None

    def f(_old, m):
        if not isinstance(m, ir.Call) or m.op not in OPS or m.op not in ("add", "sub", "mul", "div", "neg"):
            return m
        vals = [const(a) for a in m.args]
        if all(v is not None for v in vals) and not (m.op == "div" and vals[1] == 0.0):
            return ir.Const(float(OPS[m.op].numpy(*[np.float64(v) for v in vals])))
        if m.op == "mul":
            a, b = m.args
            for x, y in ((a, b), (b, a)):
                if const(x) == 1.0:
                    return y
                if const(x) == 0.0 and const(y) is not None:
                    return ir.Const(0.0)
        if m.op == "neg" and isinstance(m.args[0], ir.Call) and m.args[0].op == "neg":  # −(−a) → a
            return m.args[0].args[0]
        if m.op == "mul" and (_is_neg(m.args[0]) or _is_neg(m.args[1])):  # (−a)·b → −(a·b), exact in IEEE
            (a, b), (na, nb) = m.args, (_is_neg(m.args[0]), _is_neg(m.args[1]))
            inner = ir.Call("mul", (a.args[0] if na else a, b.args[0] if nb else b))
            return inner if na and nb else ir.Call("neg", (inner,))
        if m.op in ("add", "sub") and const(m.args[1]) == 0.0:
            return m.args[0]
        if m.op == "add" and const(m.args[0]) == 0.0:
            return m.args[1]
        if m.op == "div" and const(m.args[1]) == 1.0:
            return m.args[0]
        return m
    return ir.rebuild(n, f)
