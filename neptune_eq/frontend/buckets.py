"""Buckets of lengths: which compile serves a dynamic length, and which of its alternatives runs.

A length n is served by the compile of its bucket max(16, 2^⌈log₂ n⌉), whose dynamic axes hold the
bucket's bound B. The bucket's lengths (B/2, B] (the smallest bucket's (0, 16]) fall in RANGES equal
ranges; each runs the alternative the cost model prices fastest at the range's middle, its training
too (frontend/dynamic.py calls them). With several groups of lengths, the MAX_RANGED_GROUPS of
longest bucket take ranges (a sequence's, a key cache's: what a split-K factor follows) and the others
(a batch, a head count) are priced at their bucket's middle: `dynamic=True` on attention makes batch,
heads, queries and keys four groups, which had left every bucket one plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

MIN_BUCKET = 16
RANGES = 4  # a bucket's lengths fall in this many ranges, each running the plan priced best at its middle
MAX_RANGED_GROUPS = 2  # more groups of lengths than this: one plan per bucket (RANGES ** groups prices)
RANGED_ALTERNATIVES = 12  # the bucket's best-ranked alternatives (at 3/4 of its bound) each range chooses among


def bucket(n: int) -> int:
    """The largest length the compile serving length n serves."""
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


def _low(b: int) -> int:
    """The lengths bucket b serves lie in (_low(b), b]: (b/2, b], the smallest bucket's in (0, b] (a
    batch of 4 had been priced as one of 9, the middle of (8, 16])."""
    return 0 if b <= MIN_BUCKET else b // 2


def length_range(n: int, b: int) -> int:
    """Which of bucket b's RANGES length n lies in: (_low(b), b] cut in equal parts."""
    lo = _low(b)
    return max(0, min(RANGES - 1, (n - lo - 1) * RANGES // (b - lo)))


def range_middle(b: int, r: int) -> int:
    """The length at the middle of range r of bucket b (where its plan is priced): of the lengths
    lo + r·w + 1 … lo + (r + 1)·w, w = (b − lo) / RANGES, the upper middle."""
    lo = _low(b)
    w = (b - lo) // RANGES
    return lo + r * w + (w + 2) // 2


def ranged_groups(bounds: tuple[int, ...]) -> tuple[int, ...]:
    """The groups (indices into `bounds`, a bucket's) whose lengths pick a range: the MAX_RANGED_GROUPS of
    largest bound, the later group first on a tie (keys after queries, a sequence after a batch)."""
    order = sorted(range(len(bounds)), key=lambda g: (-bounds[g], -g))
    return tuple(sorted(order[:MAX_RANGED_GROUPS]))


def ranges_of(ns: tuple[int, ...], bounds: tuple[int, ...]) -> tuple[int, ...]:
    """The ranges lengths `ns` (of bucket `bounds`) fall in, one per ranged group."""
    return tuple(length_range(ns[g], bounds[g]) for g in ranged_groups(bounds))


def range_lengths_at(bounds: tuple[int, ...], ranges: tuple[int, ...]) -> tuple[int, ...]:
    """The lengths a plan of `ranges` (ranges_of) is priced at: each ranged group at its range's middle,
    the others at their bucket's middle."""
    ns = [(_low(b) + b + 2) // 2 for b in bounds]
    for g, r in zip(ranged_groups(bounds), ranges):
        ns[g] = range_middle(bounds[g], r)
    return tuple(ns)


def range_extents(groups, bounds, ranges) -> dict[str, int]:
    """Each dynamic axis at its group's length in range_lengths_at(bounds, ranges)."""
    return {a: n for group, n in zip(groups, range_lengths_at(bounds, ranges)) for a in group}


def prices_at(prog, alts, at: dict[str, int]) -> list[float]:
    """The cost model's time of each alternative of `alts` (of compiled `prog`) with the axes `at` holding
    those extents (an axis of `at` the program lacks is left out); the program at `at` built once."""
    from ..extract.cost import plan_cost

    program = prog.program.with_extents({a: n for a, n in at.items() if a in prog.program.axes})
    return [plan_cost(alt.plan, program, alt.schedules, prog.compilation.device).time for alt in alts]


def price_at(prog, alt, at: dict[str, int]) -> float:
    """The cost model's time of alternative `alt` of compiled `prog` at extents `at` (prices_at)."""
    return prices_at(prog, [alt], at)[0]


def cheapest_at(prog, at: dict[str, int]):
    """Compiled bucket `prog` running the alternative (of its RANGED_ALTERNATIVES best) priced fastest
    at extents `at`: `prog` itself where that is its own choice, else `prog.pin(id)` (the same compile,
    no new search; every alternative serves every length of the bucket)."""
    alts = prog.alternatives[:RANGED_ALTERNATIVES]
    prices = prices_at(prog, alts, at)
    best = alts[prices.index(min(prices))]
    return prog if best.id == prog.choice else prog.pin(best.id)


@dataclass(frozen=True)
class PricedAt:
    """A compile function for a bucket's training programs (its forward and backwards) whose plans are
    chosen at the extents `at` (a range's middle), not at the bucket's bound: `compile_fn(program)`
    compiles (cached), then runs the alternative cheapest at `at`; `time(run)` prices a compiled
    program there (what the forward + backward choice compares)."""

    compile_fn: Callable
    at: tuple[tuple[str, int], ...]

    def __call__(self, program):
        return cheapest_at(self.compile_fn(program), dict(self.at))

    def time(self, run) -> float:
        return price_at(run, run.alternative, dict(self.at))


def plans_by_range(prog, groups, bounds) -> dict[tuple[int, ...], object]:
    """For each combination of the groups' ranges, the alternative of compiled bucket `prog` (one
    of its RANGED_ALTERNATIVES best) that the cost model prices fastest with every group at its
    range's middle (`prog` itself where that is its own choice, else `prog.pin(id)`: the same
    compile, no new search)."""
    pinned = {prog.choice: prog}
    out = {}
    for r in itertools.product(range(RANGES), repeat=len(ranged_groups(bounds))):
        best = cheapest_at(prog, range_extents(groups, bounds, r))
        out[r] = pinned.setdefault(best.choice, best)
    return out


def range_lengths(b: int, r: int) -> tuple[int, int]:
    """The first and last length of range r of bucket b (length_range's inverse)."""
    lo = _low(b)
    w = (b - lo) // RANGES
    return lo + r * w + 1, (b if r == RANGES - 1 else lo + (r + 1) * w)


def describe(lengths, programs: dict, ranged: dict) -> list[str]:
    """What explain() says of a dynamic function: its groups of lengths (the argument dimensions on
    each, the least length served), what stays static and why, and for each compiled bucket the plan
    each range of lengths runs with its predicted time at the range's middle (`programs`: bucket bounds
    → compiled bucket, `ranged`: bucket bounds → plans_by_range, for every key of `programs`)."""
    lines = ["dynamic lengths: one compile per bucket max(16, 2^⌈log₂ n⌉) of lengths; a length in a compiled "
             "bucket captures and compiles nothing"]
    for g, axes in enumerate(lengths.groups):
        dims = ", ".join(f"argument {pos} dim {d}" for pos, d, k in lengths.dims if k == g)
        least = lengths.least[g] if g < len(lengths.least) else 2
        lines.append(f"  group {g} (axes {', '.join(axes)}): {dims}; lengths ≥ {least} (a shorter one compiles "
                     "its own)")
    lines += [f"  static: {a}: {why}" for a, why in lengths.static]
    for bounds in sorted(programs):
        spans = ", ".join(f"{_low(b) + 1}–{b}" for b in bounds)
        plans = ranged[bounds]
        ranged_at = ranged_groups(bounds)
        priced = []  # (the ranges' lengths, the alternative run there, its predicted µs, the lengths priced)
        for r, run in plans.items():
            span = ", ".join(f"group {g} " + "{}–{}".format(*range_lengths(bounds[g], k)) for g, k in zip(ranged_at, r))
            mid = ", ".join(str(n) for n in range_lengths_at(bounds, r))
            t = price_at(run, run.alternative, range_extents(lengths.groups, bounds, r)) * 1e6
            priced.append((span, run.alternative, t, mid))
        if len({alt.id for _, alt, _, _ in priced}) == 1:
            (_, alt, t0, m0), (_, _, t1, m1) = priced[0], priced[-1]
            lines.append(f"  bucket of lengths {spans}: #{alt.id} {alt.structure} in every range ({t0:.1f} µs "
                         f"predicted at lengths {m0} … {t1:.1f} µs at {m1})")
            continue
        lines.append(f"  bucket of lengths {spans}: the plan of each range, priced at its middle:")
        lines += [f"    {span}: #{alt.id} {alt.structure} — {t:.1f} µs predicted at lengths {mid}"
                  for span, alt, t, mid in priced]
    return lines
