"""Run rulesets under node and time budgets enforced from Python (egglog 13 has none of its own).

Each phase runs one iteration at a time, with egglog's back-off scheduler past a small e-graph
(PLAIN_NODES); after every iteration the driver checks the e-graph size and the clock and stops the
phase when a budget is spent (an iteration past the node budget may be undone: undo_past_nodes).
A phase may name analysis rules (facts about terms, no new terms) that run to their fixpoint after
every rewrite iteration: a side condition such as "l is finite" or "b is free of j" then holds in
the iteration after its term appears, however deep the term, instead of one level per iteration.
The report says how every phase ended and which rules matched how often.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from egglog import EGraph, RunReport, back_off, run, seq

from .ir import NeptuneError


def _run(egraph: EGraph, step) -> RunReport:
    """egraph.run(step), without merging the step's declarations into the e-graph's when it holds the
    step's rulesets already. egglog 13.2's run() merges every rule of the step's rulesets (through runtime
    protocol checks) on every call, ~15–20 ms a run on this repository's 2-core CPU: a fifth of causal
    attention's first training call, and again in each search of a CorrectionSearcher's pushed e-graph
    (primed before its first push: prime). Where egglog does not know a ruleset of the step (KeyError:
    a phase's first run on a fresh e-graph), or its internals differ, run() itself."""
    try:
        state, run_program = egraph._state, egraph._run_program
        command = state.run_schedule_to_egg(step.schedule)
    except (AttributeError, KeyError):
        return egraph.run(step)
    (output,) = run_program(command)
    return RunReport._from_bindings(output.report, state)


def prime(egraph: EGraph, *rulesets) -> None:
    """Declare `rulesets` in `egraph` without running them (its pushed states then share them: _run)."""
    for rs in rulesets:
        egraph.run(run(rs) * 0)


@dataclass(frozen=True)
class Budget:
    """Limits for one compile. `max_seconds` bounds the whole search (saturation, correction searches,
    fusion proposals); what it cuts short is reported, and the unfused plan always remains.
    `max_nodes` bounds the e-graph's size in every saturation phase (an algebra iteration that
    would pass it is undone), `max_iterations` each phase's iterations."""

    max_nodes: int = 4_000
    max_seconds: float = 20.0
    max_iterations: int = 10  # per phase
    match_limit: int = 20_000  # back-off scheduler: a rule matching more often in one iteration is banned

    def __post_init__(self) -> None:
        for name, kind, low in (("max_nodes", int, 0), ("max_seconds", (int, float), 0), ("max_iterations", int, 0),
                                ("match_limit", int, 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, kind) or not v >= low:
                raise BudgetError(f"Budget.{name} must be a number >= {low}, got {v!r}")


class BudgetError(NeptuneError):
    """A budget that cannot be used as given."""


@dataclass
class PhaseReport:
    name: str
    iterations: int = 0
    nodes: int = 0
    seconds: float = 0.0
    stop: str = "saturated"  # saturated | node budget | time budget | iteration limit
    matches: Counter = field(default_factory=Counter)
    undone: tuple[int, int] | None = None  # (iteration, its e-nodes) undone for passing the node budget

    def __str__(self) -> str:
        return f"{self.name}: {self.iterations} iterations, {self.nodes} nodes, {self.seconds:.2f}s ({self.stop})"


Progress = Callable[[str], None] | None


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# An iteration of an e-graph of at most this many nodes runs without the back-off scheduler. egglog 13
# creates that scheduler afresh for every run, so it carries no bans over and only drops the matches of
# a rule matching more than `match_limit` times in the run; and under it a run matches every rule against
# the whole e-graph (not only what changed): ~8 ms a run on this repository's 2-core CPU where the same
# rules take ~0.6 ms on a small e-graph, most of a correction search's time (a few hundred nodes, 7–10
# iterations), and its pushed state took ~45 ms to pop. The e-graphs come out the same (iterations,
# sizes, the rules that matched: tests/test_budgets.py; the ten operators' and bench/beyond's plans
# identical, scripts/plan_dump.py). Only where the limit is at least ten matches a node (the default's
# 20,000 is); should a rule's new matches pass it in a plain iteration, the back-off runs from the next.
PLAIN_NODES = 2_000

# relations the node budget does not count: `bounded` (session 51) holds a tuple for nearly every term, and
# counted, it had cut the saturation of budgeted programs an iteration earlier than before it existed
UNCOUNTED = frozenset({"bounded"})


def egraph_size(egraph: EGraph) -> int:
    return sum(size for f, size in egraph.all_function_sizes() if str(f) not in UNCOUNTED)


@dataclass
class Saturator:
    """Runs named phases on one e-graph, sharing one budget."""

    egraph: EGraph
    budget: Budget = field(default_factory=Budget)
    progress: Progress = None
    rule_names: dict = field(default_factory=dict)  # egglog rule decl → our rule name
    started: float = field(default_factory=time.perf_counter)
    reports: list[PhaseReport] = field(default_factory=list)

    def phase(self, name: str, schedule, *, analysis=None, seed=None, max_iterations: int | None = None,
              stop_when=None, undo_past_nodes: bool = False) -> PhaseReport:
        """Run `schedule` one iteration at a time until saturation, a budget, or `stop_when()`;
        `analysis` (a ruleset that adds no terms) is saturated after each iteration, `seed` (another) once
        before the first: a rule conditioned on it fires from the first iteration. `undo_past_nodes`: an
        iteration after the first that takes the e-graph past the node budget is undone (the e-graph is
        pushed before each; `undone` says which and its size), so the budget holds exactly."""
        rep = PhaseReport(name)
        if seed is not None:
            _run(self.egraph, run(seed).saturate())
        limit = self.budget.max_iterations if max_iterations is None else min(max_iterations,
                                                                              self.budget.max_iterations)
        t0 = time.perf_counter()
        backed, plain = run(schedule, scheduler=back_off(match_limit=self.budget.match_limit)), run(schedule)
        if analysis is not None:
            backed, plain = (seq(s, run(analysis).saturate()) for s in (backed, plain))
        rep.nodes = egraph_size(self.egraph)
        plain_ok = True  # (see PLAIN_NODES)
        while True:
            if rep.iterations >= limit:
                rep.stop = "iteration limit"
                break
            if self.remaining() <= 0:
                rep.stop = "time budget"
                break
            if rep.nodes > self.budget.max_nodes:
                rep.stop = "node budget"
                break
            step = plain if plain_ok and rep.nodes <= PLAIN_NODES <= self.budget.match_limit // 10 else backed
            before = (rep.nodes, Counter(rep.matches)) if undo_past_nodes and rep.iterations >= 1 else None
            if before is not None:
                self.egraph.push()  # (egglog has no way to drop a snapshot: one per iteration stays, small)
            result = _run(self.egraph, step)
            rep.iterations += 1
            if step is plain and any(n > self.budget.match_limit for n in result.num_matches_per_rule.values()):
                plain_ok = False  # a rule the back-off would have banned: it bans from the next iteration on
            for decl, count in result.num_matches_per_rule.items():
                if count:  # (str(decl) of a rule is long to build: only for a rule without a name)
                    rule = self.rule_names.get(decl)
                    rep.matches[rule if rule is not None else str(decl)[:60]] += count
            rep.nodes = egraph_size(self.egraph)
            if self.progress is not None:
                self.progress(f"  saturate {name}: iteration {rep.iterations}, {rep.nodes} nodes, "
                              f"{time.perf_counter() - self.started:.2f}s")
            if not result.updated:
                rep.stop = "saturated"
                break
            if stop_when is not None and stop_when():
                rep.stop = "goal reached"
                break
            if rep.nodes > self.budget.max_nodes:
                rep.stop = "node budget"
                if before is not None:
                    self.egraph.pop()
                    rep.undone = (rep.iterations, rep.nodes)
                    rep.iterations -= 1
                    rep.nodes, rep.matches = before
                break
        rep.seconds = time.perf_counter() - t0
        self.reports.append(rep)
        return rep

    def remaining(self) -> float:
        """Seconds left of the budget's max_seconds."""
        return self.budget.max_seconds - (time.perf_counter() - self.started)

    @property
    def budget_hit(self) -> bool:
        return any("budget" in r.stop for r in self.reports)
