"""What the fusion's searches found, kept for the same question asked again.

A correction or affine search is deterministic but for its time budget: asked again with the same rules,
axes, extents, node and iteration budgets and query, a search that was not cut by time gives the same
answer. A training compile asks its forward's quotients again for each backward it derives (and a
process compiling many programs asks the same few). A hit is only served to a budget with at least the
seconds the search took, so a compile whose time is spent still gets what its budget would have found
and no more. A cache of values (bounded, least recently used first out), not state: a process that
never hits it compiles the same plans.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class Found:
    def __init__(self, size: int = 2048):
        self._kept: OrderedDict[Hashable, tuple[Any, float, tuple]] = OrderedDict()
        self.size = size

    def get(self, key: Hashable, max_seconds: float) -> Any | None:
        """The value kept for `key` if its search took at most `max_seconds`, else None."""
        hit = self._kept.get(key)
        if hit is None or hit[1] > max_seconds:
            return None
        self._kept.move_to_end(key)
        return hit[0]

    def put(self, key: Hashable, value: Any, seconds: float, alive: tuple = ()) -> None:
        """Keep `value` (found in `seconds`). `alive`: objects whose ids the key holds (the rules), kept
        alive with it so that no other object takes their ids while it is kept."""
        self._kept[key] = (value, seconds, alive)
        if len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def answer(self, key: Hashable, max_seconds: float, search: Callable[[], tuple[Any, float, bool]],
               alive: tuple = ()) -> Any:
        """The value kept for `key`, else `search()` → (value, seconds, cut by time), kept unless cut."""
        value = self.get(key, max_seconds)
        if value is None:
            value, seconds, cut = search()
            if not cut:
                self.put(key, value, seconds, alive)
        return value


def rules_key(rules) -> tuple[int, ...]:
    """The rules of a search by identity (a Rule compares as egglog expressions, not by value)."""
    return tuple(id(r) for r in rules)


def searcher_key(axis_order, extents, rules, dynamic) -> tuple:
    """What a searcher's e-graph is made from: its rules (by identity), axes, extents and dynamic axes."""
    return rules_key(rules), tuple(axis_order), tuple(sorted(dict(extents).items())), frozenset(dynamic)


class Searchers:
    """Searchers kept for the next compile with the same rules, axes and extents. Making
    one declares its rules in a new egglog e-graph (~75 ms on this repository's 2-core CPU, two or three
    a compile, a training compiles three programs); each search runs between the e-graph's push and pop,
    so a kept searcher answers as a new one would. Kept for the main thread alone: an e-graph may not be
    used or freed from another thread, and what a thread keeps is freed when it ends, not always by that
    thread (a searcher a finished thread kept was dropped from the main one, which egglog refuses).
    Bounded, least recently used first out."""

    def __init__(self, size: int = 8):
        self._kept: OrderedDict[Hashable, Any] = OrderedDict()
        self.size = size

    def get(self, key: Hashable, make: Callable[[], Any], alive: tuple = ()) -> Any:
        """On the main thread the searcher kept for `key`, else `make()` (kept); on another, `make()`.
        `alive`: objects whose ids the key holds (the rules: rules_key), kept alive with it."""
        if threading.current_thread() is not threading.main_thread():
            return make()
        kept = self._kept
        got = kept.get(key)
        if got is None:
            got = kept[key] = (make(), alive)
            if len(kept) > self.size:
                kept.popitem(last=False)
        else:
            kept.move_to_end(key)
        return got[0]
