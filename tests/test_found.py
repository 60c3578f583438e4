"""Searches asked the same question again answer from what they found (fusion/found.py), and only
where the search was not cut by time and the budget asked with has the seconds it took."""

from neptune_eq.rules.algebra import ALGEBRA

from neptune_eq import ir
from neptune_eq.fusion import correction
from neptune_eq.fusion.correction import CORRECTION_BUDGET, CorrectionSearcher
from neptune_eq.fusion.found import Found
from neptune_eq.saturate import Budget

AXES = ("i", "j")
x = ir.Load("x", (ir.Index("i"), ir.Index("j")))
cur, old = ir.StateRef(ir.RefKind.CURRENT, "m", ("i",)), ir.StateRef(ir.RefKind.OLD, "m", ("i",))
CORE = ir.Call("exp", (ir.Call("sub", (x, cur)),))  # a softmax's exponential: its repair is exp(old − cur)


def _counting(monkeypatch):
    calls = []
    real = CorrectionSearcher._search

    def counted(self, *args):
        calls.append(args)
        return real(self, *args)

    monkeypatch.setattr(CorrectionSearcher, "_search", counted)
    monkeypatch.setattr(correction, "_FOUND", Found())
    return calls


def _ask(extents, budget=CORRECTION_BUDGET, rules=ALGEBRA):
    old_core = ir.substitute(CORE, {cur: old})
    return CorrectionSearcher(AXES, extents, rules, budget).correction_for(CORE, old_core, "sum", "j")


def test_a_second_searcher_answers_from_what_the_first_found(monkeypatch):
    calls = _counting(monkeypatch)
    first = _ask({"i": 8, "j": 64})
    n = len(calls)
    again = _ask({"i": 8, "j": 64})
    assert first.found and len(calls) == n and again.correction == first.correction
    _ask({"i": 8, "j": 128})  # other extents: another question
    assert len(calls) > n


def test_other_rules_ask_again(monkeypatch):
    calls = _counting(monkeypatch)
    _ask({"i": 8, "j": 64})
    n = len(calls)
    _ask({"i": 8, "j": 64}, rules=list(ALGEBRA[:-1]))
    assert len(calls) > n


def test_a_budget_shorter_than_the_search_took_searches_itself(monkeypatch):
    calls = _counting(monkeypatch)
    _ask({"i": 8, "j": 64})
    n = len(calls)
    _ask({"i": 8, "j": 64}, budget=Budget(max_nodes=CORRECTION_BUDGET.max_nodes, max_seconds=0.0,
                                          max_iterations=CORRECTION_BUDGET.max_iterations))
    assert len(calls) > n


def test_a_search_cut_by_time_is_not_kept(monkeypatch):
    calls = _counting(monkeypatch)
    cut = Budget(max_nodes=CORRECTION_BUDGET.max_nodes, max_seconds=0.0,
                 max_iterations=CORRECTION_BUDGET.max_iterations)
    assert not _ask({"i": 8, "j": 64}, budget=cut).found
    n = len(calls)
    assert _ask({"i": 8, "j": 64}).found and len(calls) > n


def test_found_is_bounded_and_keeps_the_recently_used():
    f = Found(size=2)
    f.put("a", 1, 0.5)
    f.put("b", 2, 0.5)
    assert f.get("a", 1.0) == 1  # a is now the most recent
    f.put("c", 3, 0.5)
    assert f.get("b", 1.0) is None and f.get("a", 1.0) == 1 and f.get("c", 1.0) == 3
    assert f.get("a", 0.25) is None  # found in 0.5 s: not for a budget of 0.25 s


def test_a_kept_searcher_answers_as_a_new_one_and_is_kept_for_the_main_thread(monkeypatch):
    """Searchers are kept for the main thread (an egglog e-graph may not cross threads) by rules, axes and
    extents; a kept one's searches run pushed and popped, so after other searches it answers as a new one."""
    import threading

    from neptune_eq.fusion.found import Searchers

    monkeypatch.setattr(correction, "_KEPT", Searchers(size=2))
    ext = {"i": 8, "j": 64}
    s = correction.searcher(AXES, ext, ALGEBRA)
    assert correction.searcher(AXES, dict(ext), ALGEBRA) is s
    assert correction.searcher(AXES, {"i": 8, "j": 32}, ALGEBRA) is not s
    # another thread gets a new one each time, kept by none (plain objects stand in for searchers here:
    # egglog refuses to free an e-graph from a thread other than its own, and a cycle may be collected anywhere)
    pool, other = Searchers(), []
    t = threading.Thread(target=lambda: other.extend(pool.get("k", object) for _ in range(2)))
    t.start()
    t.join()
    assert other[0] is not other[1] and pool.get("k", object) is pool.get("k", object)
    monkeypatch.setattr(correction, "_FOUND", Found())  # (each question searched, not served)
    old_core = ir.substitute(CORE, {cur: old})
    queries = [(CORE, old_core), (ir.Call("mul", (CORE, x)), ir.Call("mul", (old_core, x))),
               (ir.Call("add", (x, cur)), ir.Call("add", (x, old)))]
    kept = [s.correction_for(c, o, "sum", "j") for c, o in queries]
    assert kept[0].found
    monkeypatch.setattr(correction, "_FOUND", Found())  # (searched again on the kept searcher, in reverse)
    again = [correction.searcher(AXES, ext, ALGEBRA).correction_for(c, o, "sum", "j") for c, o in reversed(queries)]
    monkeypatch.setattr(correction, "_FOUND", Found())
    new = [CorrectionSearcher(AXES, ext, ALGEBRA).correction_for(c, o, "sum", "j") for c, o in queries]
    for a, b, c in zip(kept, reversed(again), new):
        assert (a.found, a.correction, a.iterations, a.nodes) == (b.found, b.correction, b.iterations, b.nodes) \
            == (c.found, c.correction, c.iterations, c.nodes)
    correction.searcher(AXES, {"i": 8, "j": 32}, ALGEBRA)
    correction.searcher(AXES, {"i": 4, "j": 64}, ALGEBRA)  # a third key: the least recently used goes
    assert correction.searcher(AXES, ext, ALGEBRA) is not s
