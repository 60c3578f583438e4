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
