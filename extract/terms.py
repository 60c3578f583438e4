"""Cheapest terms of e-classes, costed by the work they do.

A node's cost is its op's cost times the size of the iteration space it is evaluated over: the axes
its e-class varies over (the deps analysis) and, for a term inside a reduction's body, every axis of
that reduction — the reduced axis and its free axes — since a loop evaluates its body at every point
(a per-row factor multiplied in a contraction's body is paid per (row, column, k), not per row). So an
operation per (query, key) pair weighs L² times one per query row, and work inside a loop weighs
more than the same work after it. This is what makes the extractor prefer `(Σⱼ p·v)/l` over
`Σⱼ (p/l)·v` and `r·Σ_d x·w·W` over `Σ_d x·r·w·W` (the factor applied once per output, and the
reductions left independent), and fold log₂e into the score scale. A reduction's own node is costed
by its result (it is one loop of its own, not recomputed inside others). Shared subterms are counted
per use.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from neptune_eq import ir
from neptune_eq.ops import OPS
from neptune_eq.terms import LEAVES

from .canonical import StableHashes
from .view import EGraphView, ENode

# cost of one op per element, in FMA-pipe instruction equivalents (special functions count as 4:
# the SFU issues 16 ops/clk/SM against 64 FMA ops per clk/SM on Hopper, minus overlap)
SFU_COST = 4.0
# exp/exp2 of an exponent the nonpos analysis cannot show ≤ 0 may overflow float32 (e^88.7) or fp16
# (e^11.1) where the program's value is finite: such a node costs this many ops per point more, so a
# max-shifted equivalent, when the e-graph holds one (rules.algebra.STABILITY), wins over the cheaper
# unshifted form by far more than the max pass it adds (a few ops per element). Added, not multiplied:
# among spellings with the same exponentials (e^a against 2^(a·log₂e)) the work still decides.
OVERFLOW_RISK = 64.0
# a difference of two values ≥ 0 that both accumulate a sum over the same axis (E[x²] − E[x]²) loses the
# digits the two share: with a mean of 1e4 against a spread of 1, all of float32's. Such a subtraction
# costs this many ops more per point summed, so a centred equivalent (rules.algebra.STABILITY:
# Σa²/n − (Σa/n)² = Σ(a − Σa/n)²/n) wins over it despite the pass it adds.
CANCEL_RISK = 64.0
_LEAF_COST = {"const": 0.0, "index": 0.5, "load": 1.0, "sym": 0.0, "length": 0.0}


def op_cost(op: str) -> float:
    if op in _LEAF_COST:
        return _LEAF_COST[op]
    if op == "red":
        return 1.0
    info = OPS.get(op)
    if info is None:
        return math.inf
    extra = 1.0 if op in ("exp", "log") else 0.0  # exp(x) = ex2(x·log₂e): one FMUL more than exp2
    if op == "neg":
        return 0.5
    return (SFU_COST * info.weight if info.unit == "sfu" else info.weight) + extra


@dataclass
class TermExtractor:
    """Best IR terms for e-classes of `view` under optional leaves and bans."""

    view: EGraphView
    axis_order: tuple[str, ...]
    extents: dict[str, int]
    loads: dict[str, ir.Load]
    syms: dict[str, ir.StateRef]  # Term.sym key → the reference (Encoder.syms)
    _size: dict[int, float] = field(default_factory=dict)
    _weights: dict[int, float] = field(default_factory=dict)
    _space: dict[int, int] | None = None
    overflow_risk: float = OVERFLOW_RISK  # 0.0: price exponents by work alone (numerics-blind)
    cancel_risk: float = CANCEL_RISK  # 0.0: price differences of sums by work alone
    _sums: dict[int, int] | None = None
    held: frozenset[int] = frozenset()  # classes of inputs holding a computed value: never recomputed
    loop_min: int = 256  # a reduction over a longer axis is a loop (pipeline.Options.inline_max)

    def size(self, cid: int) -> float:
        """Number of points the class varies over (product of extents of its deps)."""
        s = self._size.get(cid)
        if s is None:
            s = self._size[cid] = self._points(self.view.deps.get(cid, 0))
        return s

    def _points(self, mask: int) -> float:
        s = 1.0
        for k, ax in enumerate(self.axis_order):
            if mask >> k & 1:
                s *= self.extents[ax]
        return s

    def weight(self, cid: int, n: ENode) -> float:
        """Cost of node `n` of class `cid`: its op's cost times the points it is evaluated at."""
        if n.op == "red":  # the reduction's result, once per point of its free axes
            return math.inf if cid in self.held else op_cost(n.op) * self.size(cid)
        w = self._weights.get(cid)
        if w is None:
            w = self._weights[cid] = self._points(self._spaces().get(cid, 0))
        own = (op_cost(n.op) + (self.overflow_risk if self.may_overflow(n) else 0.0)) * w
        common = self.may_cancel(n) if self.cancel_risk else 0
        return own + (self.cancel_risk * self._points(self.view.deps.get(cid, 0) | common) if common else 0.0)

    def may_overflow(self, n: ENode) -> bool:
        """An exponential whose exponent is not known to be ≤ 0."""
        return n.op in ("exp", "exp2") and n.args[0] not in self.view.nonpos

    def may_cancel(self, n: ENode) -> int:
        """For a − b with a, b ≥ 0: the axes both sum over (bits; 0 when none, or not such a difference)."""
        if n.op != "sub" or not all(a in self.view.nonneg for a in n.args):
            return 0
        sums = self.summed()
        return sums.get(n.args[0], 0) & sums.get(n.args[1], 0)

    def summed(self) -> dict[int, int]:
        """Per class: the axes some sum inside some member of it reduces (bits; over all alternatives)."""
        if self._sums is None:
            bit = {ax: 1 << k for k, ax in enumerate(self.axis_order)}
            acc: dict[int, int] = {}
            parents: dict[int, list[int]] = {}
            work = []
            for c, ns in self.view.classes.items():
                for n in ns:
                    if n.op == "red" and n.args[0] == "sum" and n.args[1] in bit:
                        acc[c] = acc.get(c, 0) | bit[n.args[1]]
                        work.append(c)
                    if n.op != "get":
                        for a in self._child_classes(n):
                            parents.setdefault(a, []).append(c)
            while work:
                c = work.pop()
                for p in parents.get(c, ()):
                    m = acc.get(p, 0) | acc[c]
                    if m != acc.get(p, 0):
                        acc[p] = m
                        work.append(p)
            self._sums = acc
        return self._sums

    def _spaces(self) -> dict[int, int]:
        """Per class: its deps plus the axes of every reduction whose body may evaluate it (any member
        of any class that uses it, down to the reduction): an over-approximation over alternatives."""
        if self._space is None:
            deps = self.view.deps
            space = {c: deps.get(c, 0) for c, ns in self.view.classes.items() if self.view.sort.get(c) == "Term"}
            bit = {ax: 1 << k for k, ax in enumerate(self.axis_order)}
            work = list(space)
            looped = self._looped(bit)
            while work:
                c = work.pop()
                for n in self.view.nodes(c):
                    if n.op == "get":
                        continue
                    # a reduction's body runs over the reduction's own axes; other operands where their user does
                    inner = deps.get(c, 0) | bit.get(n.args[1], 0) if n.op == "red" else space[c]
                    for a in self._child_classes(n):
                        # a value that does not vary along a loop is computed once outside it, not per step
                        mine = inner & ~(looped & ~deps.get(a, 0))
                        if a in space and mine & ~space[a]:
                            space[a] |= mine
                            work.append(a)
            self._space = space
        return self._space

    def _index(self):
        """Per Term node: (class, node, own cost, child classes); and parents per class. Built once."""
        if not hasattr(self, "_idx"):
            entries = []
            parents: dict[int, list[int]] = {}
            for c, ns in self.view.classes.items():
                if self.view.sort.get(c) != "Term":
                    continue
                for n in ns:
                    if n.op == "get":
                        continue
                    kids = self._child_classes(n)
                    k = len(entries)
                    entries.append((c, n, self.weight(c, n), kids))
                    for a in kids:
                        parents.setdefault(a, []).append(k)
            self._idx = (entries, parents)
        return self._idx

    def costs(self, *, leaves: dict[int, ir.Node] | None = None,
              allow: Callable[[int, ENode], bool] | None = None,
              shared: dict[int, ENode] | None = None) -> dict[int, tuple[float, ENode | None]]:
        """Best (cost, node) per class; leaves get cost 0 and node None.

        `shared` classes are already computed elsewhere in the plan: reusing them costs nothing.
        Knuth's generalisation of Dijkstra's algorithm (a node's cost is its own plus its children's,
        so a class is final once popped in cost order): O(E log V), deterministic, where relaxing
        in any order can redo work exponentially often.
        """
        leaves = leaves or {}
        shared = shared or {}
        entries, parents = self._index()
        labels, written = self._labels()
        best: dict[int, tuple[float, ENode | None]] = {c: (0.0, None) for c in leaves}
        for c, n in shared.items():
            best.setdefault(c, (0.0, n))
        final: set[int] = set()
        hashes = StableHashes()  # a hash of each final class's term (of a leaf: its printed value)
        spelled = {c: hashes.of(ir.show(leaves[c]) if c in leaves else shared[c].op) for c in best}
        waiting = [len(kids) for _, _, _, kids in entries]  # children not final yet, per entry
        ok = [c not in best and (allow is None or allow(c, n)) and own < math.inf
              for c, n, own, _ in entries]
        # a tie in cost goes to the node as written, then to a constant on the right (x·c, as people write
        # it), then to the smaller hash of the term it spells: the same term in every process and every
        # e-graph holding the same candidates (two corrections found in two searches agree on e^(a−b)
        # against 2^((a−b)·log₂e), and the cost model sees one). Among constants of one class (real
        # algebra over rounded folds merges 0 with 8.97e-15), the plainest: see _plainness
        heap = [(0.0, 0, 0, spelled[c], c, -1) for c in best]
        heap += [(own, written[k], _plainness(n), hash((labels[k],)), c, k)
                 for k, (c, n, own, kids) in enumerate(entries) if ok[k] and not kids]
        heapq.heapify(heap)

        def constant_first(kids: list[int]) -> int:
            first = best[kids[0]][1]
            return int(len(kids) == 2 and first is not None and first.op == "const")

        while heap:
            total, _, _, term, c, k = heapq.heappop(heap)
            if c in final:
                continue
            final.add(c)
            spelled[c] = term
            if k >= 0:
                best[c] = (total, entries[k][1])
            for p in parents.get(c, ()):
                waiting[p] -= 1
                if waiting[p] == 0 and ok[p] and entries[p][0] not in final:
                    pc, _, own, kids = entries[p]
                    # (fsum: exactly rounded, so a·b and b·a cost the same to the last bit and tie)
                    total = math.fsum([own, *(best[a][0] for a in kids)])
                    term = hash((labels[p], tuple(spelled[a] for a in kids)))
                    heapq.heappush(heap, (total, written[p], constant_first(kids), term, pc, p))
        return best

    def _labels(self) -> tuple[list[int], list[int]]:
        """Per entry of _index: a hash of its op and primitive arguments, the same in every process; and
        0 where the view marks it written, else 1."""
        if not hasattr(self, "_label_cache"):
            entries, _ = self._index()
            hashes = StableHashes()
            labels = [hashes.label(n.op, n.sort, n.args[:len(n.args) - len(kids)]) for _, n, _, kids in entries]
            written = [0 if (c, n) in self.view.written else 1 for c, n, _, _ in entries]
            self._label_cache = (labels, written)
        return self._label_cache

    def _looped(self, bit: dict[str, int]) -> int:
        """Bits of the axes reductions run as loops (longer than a tile: a shorter one is a tile dot)."""
        return sum(b for ax, b in bit.items() if self.extents.get(ax, 0) > self.loop_min)

    @staticmethod
    def _child_classes(n: ENode) -> list[int]:
        if n.op == "red":
            return [n.args[2]]
        if n.op in LEAVES:
            return []
        return list(n.args)

    def decode(self, cid: int, best: dict[int, tuple[float, ENode | None]],
               leaves: dict[int, ir.Node] | None = None, classes: dict[ir.Node, int] | None = None) -> ir.Node:
        """The IR tree of the best term of `cid`; `classes` (if given) records node → e-class."""
        leaves = leaves or {}
        memo: dict[int, ir.Node] = {}

        def go(c: int) -> ir.Node:
            if c in leaves:
                return leaves[c]
            hit = memo.get(c)
            if hit is not None:
                return hit
            got = best.get(c)
            if got is None or got[1] is None:
                raise LookupError(f"e-class {c} has no extractable term")
            n = got[1]
            if n.op == "const":
                out: ir.Node = ir.Const(n.args[0])
            elif n.op == "load":
                out = self.loads[n.args[0]]
            elif n.op == "index":
                out = ir.Index(n.args[0])
            elif n.op == "sym":
                out = self.syms[n.args[0]]
            elif n.op == "length":
                out = ir.Length(n.args[0])
            elif n.op == "red":
                out = ir.Reduce(n.args[0], n.args[1], go(n.args[2]))
            else:
                out = ir.Call(n.op, tuple(go(a) for a in n.args))
            memo[c] = out
            if classes is not None:
                classes.setdefault(out, c)
            return out

        return go(cid)

    def best_term(self, cid: int, **kw) -> ir.Node:
        leaves = kw.get("leaves")
        return self.decode(cid, self.costs(**kw), leaves)

    def _prefer_shared_ties(self, roots, best, choice, leaves, allow, rounds: int = 3) -> None:
        """Among nodes of equal tree cost, take the one whose children the rest of the DAG already uses."""
        for _ in range(rounds):
            uses: dict[int, int] = {}
            stack, seen = list(roots), set()
            while stack:
                c = stack.pop()
                if c in seen or c in leaves or c not in choice:
                    continue
                seen.add(c)
                for a in self._child_classes(choice[c]):
                    uses[a] = uses.get(a, 0) + 1
                    stack.append(a)
            changed = False
            for c in seen:
                target = best[c][0]
                mine = self._child_classes(choice[c])
                scored = []
                for n in self.view.nodes(c):
                    if n.op == "get" or (allow is not None and not allow(c, n)):
                        continue
                    kids = self._child_classes(n)
                    # children strictly cheaper than the class keep the choice acyclic (a tie within
                    # rounding would otherwise admit c = c − 0 once tree costs reach 1e9)
                    if not all(a in best and best[a][0] < target for a in kids):
                        continue
                    tree = self.weight(c, n) + sum(best[a][0] for a in kids)
                    if tree <= target + 1e-9 * max(1.0, abs(target)):
                        # uses by the rest of the DAG (not by this class's current node)
                        scored.append((sum(uses.get(a, 0) - mine.count(a) for a in kids), n is choice[c], n))
                if scored:
                    top = max(scored, key=lambda t: (t[0], t[1]))[2]
                    if top is not choice[c]:
                        choice[c] = top
                        changed = True
            if not changed:
                return

    def _reachable(self, roots: list[int], choice: dict[int, ENode], leaves) -> list[int]:
        """Classes the current choice uses from `roots`, in a fixed order."""
        seen: set[int] = set()
        order: list[int] = []
        stack = list(roots)
        while stack:
            c = stack.pop()
            if c in seen or c in leaves or c not in choice:
                continue
            seen.add(c)
            order.append(c)
            stack.extend(self._child_classes(choice[c]))
        return order

    def best_shared(self, roots: list[int], sweeps: int = 4, **kw) -> tuple[list[ir.Node], dict[ir.Node, int]]:
        """Best terms for several roots, costed as a DAG: a subterm used twice is computed once.

        Starts from the tree-cost choice and improves it greedily: repeatedly make the single
        switch of an e-class to another of its nodes that lowers the total cost of the distinct
        e-classes used the most (e.g. two bodies agreeing on one running max).
        """
        leaves = kw.get("leaves") or {}
        allow = kw.get("allow")
        best = self.costs(**kw)
        choice = {c: n for c, (_, n) in best.items() if n is not None}

        def dag_cost() -> float | None:
            seen: set[int] = set()
            onstack: set[int] = set()
            total = 0.0

            def go(c: int) -> bool:
                nonlocal total
                if c in seen or c in leaves:
                    return True
                if c in onstack:
                    return False
                n = choice.get(c)
                if n is None:
                    return False
                onstack.add(c)
                for a in self._child_classes(n):
                    if not go(a):
                        return False
                onstack.discard(c)
                seen.add(c)
                total += self.weight(c, n)
                return True

            return total if all(go(r) for r in roots) else None

        self._prefer_shared_ties(roots, best, choice, leaves, allow)
        current = dag_cost()
        for _ in range(sweeps * 8):
            best_move, best_cost = None, current
            for c in self._reachable(roots, choice, leaves):  # switches elsewhere change nothing
                for n in self.view.nodes(c):
                    if n.op == "get" or n is choice[c] or (allow is not None and not allow(c, n)):
                        continue
                    if not all(a in choice or a in leaves for a in self._child_classes(n)):
                        continue
                    old = choice[c]
                    choice[c] = n
                    cost = dag_cost()
                    choice[c] = old
                    if cost is not None and best_cost is not None and cost < best_cost - 1e-9 * max(1.0, best_cost):
                        best_move, best_cost = (c, n), cost
            if best_move is None:
                break
            choice[best_move[0]] = best_move[1]
            current = best_cost
        table = {c: (0.0, n) for c, n in choice.items()}
        classes: dict[ir.Node, int] = {}
        terms = [self.decode(r, table, leaves, classes) for r in roots]
        return terms, classes


def _plainness(n: ENode) -> int:
    """The tie-break of a leaf: 0 for the constant 0, 1 for another integer, 2 + its digits for another
    constant, 0 for every other leaf. Folding constants in doubles is not associative, so real algebra
    merges spellings that differ by rounding — 0 with 8.97e-15 (a fold of products and differences in
    two orders) — and the program's 0 in max(e − 4, 0), an index, came out as 8.97e-15: every kernel
    then read element 0 of the second half of a concatenation as out of range (a silent wrong answer,
    found by scripts/fuzz_programs.py, seed 3009). A class's zero or integer is the value as written,
    the others drifted from it."""
    if n.op != "const" or not n.args:
        return 0
    v = float(n.args[0])
    if v != v or v in (math.inf, -math.inf):
        return 1
    if v == 0.0:
        return 0
    return 1 if v == int(v) else 2 + len(repr(v))
