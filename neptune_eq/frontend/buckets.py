"""Buckets of lengths: which compile serves a dynamic length, and which of its alternatives runs.

A length n is served by the compile of its bucket max(16, 2^⌈log₂ n⌉), whose dynamic axes hold the
bucket's bound B. The bucket's lengths (B/2, B] fall in RANGES equal ranges; each runs the
alternative the cost model prices fastest at the range's middle (frontend/dynamic.py calls them).
"""

from __future__ import annotations

import itertools

MIN_BUCKET = 16
RANGES = 4  # a bucket's lengths fall in this many ranges, each running the plan priced best at its middle
MAX_RANGED_GROUPS = 2  # more groups of lengths than this: one plan per bucket (RANGES ** groups prices)
RANGED_ALTERNATIVES = 12  # the bucket's best-ranked alternatives (at 3/4 of its bound) each range chooses among


def bucket(n: int) -> int:
    """The largest length the compile serving length n serves."""
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


def length_range(n: int, b: int) -> int:
    """Which of bucket b's RANGES length n lies in: (b/2, b] cut in equal parts (the smallest
    bucket's lengths below b/2 in the first)."""
    lo = b // 2
    return 0 if n <= lo else min(RANGES - 1, (n - lo - 1) * RANGES // (b - lo))


def range_middle(b: int, r: int) -> int:
    """The length at the middle of range r of bucket b (where its plan is priced)."""
    lo = b // 2
    return lo + (2 * r + 1) * (b - lo) // (2 * RANGES)


def plans_by_range(prog, groups, bounds) -> dict[tuple[int, ...], object]:
    """For each combination of the groups' ranges, the alternative of compiled bucket `prog` (one
    of its RANGED_ALTERNATIVES best) that the cost model prices fastest with every group at its
    range's middle (`prog` itself where that is its own choice, else `prog.pin(id)`: the same
    compile, no new search)."""
    from ..extract.cost import plan_cost

    pinned = {prog.choice: prog}
    out = {}
    for r in itertools.product(range(RANGES), repeat=len(groups)):
        at = prog.program.with_extents({a: range_middle(b, k) for group, b, k in zip(groups, bounds, r) for a in group})

        def price(alt, at=at):
            return plan_cost(alt.plan, at, alt.schedules, prog.compilation.device).time

        best = min(prog.alternatives[:RANGED_ALTERNATIVES], key=price)
        if best.id not in pinned:
            pinned[best.id] = prog.pin(best.id)
        out[r] = pinned[best.id]
    return out
