"""Issue 10: user rules that are right only for one extent or wrong at NaN are rejected with a counterexample
naming the extent or the NaN; refinements are accepted with a warning, or rejected under strict checking."""

import warnings

import pytest
import torch
from egglog import String, f64, i64, rewrite, var, vars_
from helpers import small_softmax
from neptune_eq.rules.base import extent_of, free_of, rw
from neptune_eq.rules.files import parse_rules
from neptune_eq.rules.soundness import EXTENTS, rule_verdict
from neptune_eq.rules.user import (
    RefinementRuleError,
    RuleRefinementWarning,
    UnsoundRuleError,
    check_rules,
    user_rules,
)

import neptune_eq
from neptune_eq.cli import main
from neptune_eq.explorer import explore
from neptune_eq.terms import Term, eq_, red, where

a, b = vars_("a b", Term)
j, k = vars_("j k", String)
n = var("n", i64)


def _file(tmp_path, text: str, name: str = "r.rules", bom: bool = False):
    f = tmp_path / name
    f.write_bytes(("\ufeff" if bom else "").encode() + text.encode())
    return f


# ---------------------------------------------------------------- right for one extent only


@pytest.mark.parametrize("line", [
    "times5: sum_j(a) -> a*5 if a free of j",
    "fifth: sum_j(a)*0.2 -> max_j(a)",
    "fifth_free: sum_j(a)*0.2 -> max_j(a) if a free of j",
])
def test_rule_right_for_one_extent_is_rejected_naming_the_extent(line):
    with pytest.raises(UnsoundRuleError, match=r"x\.rules:1: rule '\w+'") as err:
        user_rules(parse_rules(line, "x.rules"))
    msg = str(err.value)
    assert "is unsound: with extent(j)=" in msg and "left side =" in msg and "right side =" in msg
    assert err.value.counterexample.values["extent(j)"] != 5  # 5 is the extent the rule happens to fit


@pytest.mark.parametrize("extent", EXTENTS)
def test_a_rule_fitting_any_single_extent_is_caught(extent):
    for line in (f"fit: sum_j(a) -> a * {extent} if a free of j",
                 f"fit: max_j(a) * {extent} -> sum_j(a) if a free of j"):
        cx = rule_verdict(parse_rules(line, "x.rules")[0]).counterexample
        assert cx is not None and cx.values["extent(j)"] != extent, line


def test_extents_tried_include_one_and_several():
    assert 1 in EXTENTS and len(EXTENTS) >= 4


def test_python_and_egglog_forms_right_for_one_extent():
    as_rule = rw("times5_py", red("sum", j, a), a * Term(5.0), free_of(a, j))
    as_egglog = ("fifth_egg", rewrite(red("sum", j, a) * Term(0.2)).to(red("max", j, a), *free_of(a, j).facts))
    for spec in (as_rule, as_egglog):
        with pytest.raises(UnsoundRuleError, match=r"with extent\(j\)=\d"):
            user_rules([spec])


def test_extent_variable_is_bound_to_the_extent_tried():
    good = rw("sum_free_user", red("sum", j, b), b * Term(f64.from_i64(n)), free_of(b, j), extent_of(n, j))
    assert rule_verdict(good).sound
    bad = rw("max_free_times_n", red("max", j, b), b * Term(f64.from_i64(n)), free_of(b, j), extent_of(n, j))
    cx = rule_verdict(bad).counterexample
    assert cx is not None and cx.values["n"] == cx.values["extent(j)"] != 1


def test_two_axes_get_different_extents_and_are_also_tried_as_one():
    swap = "swap: sum_j(max_k(b)) -> sum_k(max_j(b)) if b free of j, b free of k"  # right only when |j| = |k|
    cx = rule_verdict(parse_rules(swap, "x.rules")[0]).counterexample
    assert cx is not None and cx.values["extent(j)"] != cx.values["extent(k)"]
    assert rule_verdict(parse_rules("comm: sum_j(sum_k(a)) -> sum_k(sum_j(a))", "x.rules")[0]).sound
    inner_twice = "twice: sum_j(sum_k(a)) -> sum_k(sum_k(a))"  # sums k twice instead of j then k
    assert not rule_verdict(parse_rules(inner_twice, "x.rules")[0]).sound


# ---------------------------------------------------------------- NaN


def test_rule_wrong_at_nan_is_rejected():
    with pytest.raises(UnsoundRuleError) as err:
        user_rules(parse_rules("drop_guard: where(a == a, a, 0) -> a", "x.rules"))
    assert "with a=nan: left side = 0.0, right side = nan" in str(err.value)


def test_rule_wrong_at_nan_python_and_egglog_forms():
    for spec in (rw("drop_guard_py", where(eq_(a, a), a, Term(0.0)), a),
                 ("drop_guard_egg", rewrite(where(eq_(a, a), a, Term(0.0))).to(a))):
        with pytest.raises(UnsoundRuleError, match=r"a=nan: left side = 0\.0, right side = nan"):
            user_rules([spec])


def test_min_select_is_not_min2_at_nan():
    cx = rule_verdict(parse_rules("min_sel: where(a < b, a, b) -> min2(a, b)", "x.rules")[0]).counterexample
    assert cx is not None and "nan" in cx.where


# ---------------------------------------------------------------- refinements


def test_refinement_is_accepted_with_a_warning_naming_the_sample():
    with pytest.warns(RuleRefinementWarning) as caught:
        (r,) = user_rules(parse_rules("self_div: a / a -> 1", "x.rules"))
    assert r.name == "self_div"
    msg = str(caught[0].message)
    assert "x.rules:1: rule 'self_div'" in msg and "accepted as a refinement" in msg
    assert "left side undefined (nan) at a=0.0, right side 1.0" in msg and "strict_rules=True" in msg
    assert caught[0].filename == __file__  # points at the caller's line, not into neptune_eq


def test_refinement_python_and_egglog_forms_warn():
    for spec in (rw("self_div_py", a / a, Term(1.0)), ("self_div_egg", rewrite(a / a).to(Term(1.0)))):
        with pytest.warns(RuleRefinementWarning, match="a=0.0, right side 1.0"):
            user_rules([spec])


def test_strict_rejects_a_refinement():
    with pytest.raises(RefinementRuleError, match=r"x\.rules:1: rule 'self_div' .* is a refinement, rejected by "
                                                  r"strict rule checking: left side undefined \(nan\) at a=0.0"):
        user_rules(parse_rules("self_div: a / a -> 1", "x.rules"), strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert user_rules(parse_rules("exp_sum: exp(a + b) -> exp(a) * exp(b)", "x.rules"), strict=True)


def test_sound_rule_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        user_rules(parse_rules("exp_sum: exp(a + b) -> exp(a) * exp(b)", "x.rules"))


def _tiny(x):
    return torch.softmax(x, dim=-1)


def test_compile_warns_on_a_refinement_and_strict_rules_rejects_it(tmp_path):
    f = _file(tmp_path, "self_div: a / a -> 1\n")
    x = torch.randn(4, 16)
    with pytest.raises(RefinementRuleError, match="self_div"):
        neptune_eq.compile(_tiny, x, rules=[str(f)], strict_rules=True, cache_dir=tmp_path)
    with pytest.raises(RefinementRuleError, match="self_div"):
        explore(small_softmax(), rules=[str(f)], strict_rules=True)
    with pytest.warns(RuleRefinementWarning, match="self_div"):
        compiled = neptune_eq.compile(_tiny, x, rules=[str(f)], cache_dir=tmp_path)
    assert callable(compiled)


def test_finite_guard_does_not_hide_a_refinement():
    # finite(a) only keeps syntactic ±inf out of the e-graph; data may still be ±inf, where a − a is NaN
    with pytest.raises(RefinementRuleError, match=r"a=inf, right side 0\.0"):
        user_rules(parse_rules("my_sub_self: a - a -> 0 if finite(a)", "x.rules"), strict=True)


# ---------------------------------------------------------------- neptune-eq rules check [--strict]


MIXED = """\
self_div: a / a -> 1
exp_sum:  exp(a + b) -> exp(a) * exp(b)
"""


def test_rules_check_marks_a_refinement(tmp_path, capsys):
    f = _file(tmp_path, MIXED)
    assert main(["rules", "check", str(f)]) == 0
    out = capsys.readouterr().out
    assert "ok    self_div: (a / a) → 1" in out
    assert "(refinement: left side undefined (nan) at a=0.0, right side 1.0; --strict rejects it)" in out
    assert "ok    exp_sum" in out and "all rules ok (1 refinement(s), accepted; --strict rejects them)" in out


def test_rules_check_strict_rejects_a_refinement(tmp_path, capsys):
    f = _file(tmp_path, MIXED)
    assert main(["rules", "check", "--strict", str(f)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  self_div" in out and "refinement rejected (strict): left side undefined (nan) at a=0.0" in out
    assert "ok    exp_sum" in out and "1 problem(s)" in out


def test_rules_check_rejects_the_issue_rules(tmp_path, capsys):
    f = _file(tmp_path, "s5: sum_j(a) -> a*5 if a free of j\nm5: sum_j(a)*0.2 -> max_j(a)\n"
                        "nan: where(a == a, a, 0) -> a\n")
    assert main(["rules", "check", str(f)]) == 1
    out = capsys.readouterr().out
    assert out.count("FAIL  ") == 3 and "unsound: with extent(j)=" in out and "a=nan" in out and "3 problem(s)" in out


def test_check_rules_strict_flag():
    (chk,) = check_rules(parse_rules("self_div: a / a -> 1", "x.rules"), strict=True)
    assert not chk.ok and chk.refinement is not None and chk.refinement.values == {"a": 0.0}
