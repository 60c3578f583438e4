"""Edges of the command line and of `rules=` (no kernel runs): a program file that exits or is
interrupted while loading is an error (exit code 2), not a verdict; `rules=` refuses what is not a rule
spec with a RuleError; user rules whose constants differ past 6 digits get different cache keys and are
printed apart."""

import warnings

import pytest
from neptune_eq.rules.files import parse_rules
from neptune_eq.rules.user import RuleError, RuleRefinementWarning, check_rules, user_rules

from neptune_eq import dsl as ne
from neptune_eq.cache import key_of
from neptune_eq.cli import main
from neptune_eq.device import H100
from neptune_eq.pipeline import Options


@pytest.mark.parametrize("body, raised", [
    ("import sys\nsys.exit(0)\n", "SystemExit(0)"),  # exited 0, "verified", with no output
    ("import sys\nsys.exit(1)\n", "SystemExit(1)"),  # exited 1, "verification failed"
    ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),  # a full traceback
])
@pytest.mark.parametrize("cmd", [("compile", "--json"), ("explore",)])
def test_a_file_that_exits_or_is_interrupted_while_loading_is_an_error(tmp_path, capsys, body, raised, cmd):
    f = tmp_path / "f.py"
    f.write_text(body)
    code = main([cmd[0], str(f), *cmd[1:]])
    cap = capsys.readouterr()
    assert code == 2, (cap.out, cap.err)
    assert cap.out == ""  # with --json: no JSON line to mistake for a result
    assert cap.err.startswith(f"error: running {f} raised {raised} (at {f}:") and "Traceback" not in cap.err
    assert cap.err.count("\n") == 1


def test_example_inputs_that_exit_is_an_error(tmp_path, capsys):
    f = tmp_path / "f.py"
    f.write_text("import sys\n\ndef fn(x):\n    return x\n\ndef example_inputs():\n    sys.exit(0)\n")
    code = main(["compile", str(f), "--json"])
    cap = capsys.readouterr()
    assert code == 2 and cap.out == ""
    assert f"example_inputs() raised SystemExit(0) (at {f}:7: sys.exit(0))" in cap.err


@pytest.mark.parametrize("bad", [42, 3.5, {"sqrt": 1}, {"sqrt"}, b"sqrt"])
def test_rules_that_are_not_a_rule_spec_are_a_rule_error(bad):
    """42 was a raw TypeError ('int' object is not iterable); {"sqrt": 1} loaded rules/sqrt.rules."""
    with pytest.raises(RuleError, match=r"is not a rule spec: a rules-file path .* list or tuple of those") as e:
        user_rules(bad)
    assert repr(bad) in str(e.value) and type(bad).__name__ in str(e.value)


@pytest.mark.parametrize("bad", [0, {}, False])
def test_falsy_rules_that_are_not_a_rule_spec_reach_the_check(bad):
    """compile(rules=0 / {} / False) had been read as no rules (with_user_rules' `if not rules`)."""
    from neptune_eq.pipeline import Options
    from neptune_eq.runtime import with_user_rules

    with pytest.raises(RuleError, match="is not a rule spec"):
        with_user_rules(Options(), bad)


def test_a_bad_item_in_a_rules_list_is_named():
    with pytest.raises(RuleError, match=r"cannot use 42 \(int\) as a rule: pass a rules-file path"):
        user_rules(["sqrt", 42])


def test_rules_lists_and_tuples_still_work():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuleRefinementWarning)
        assert [r.name for r in user_rules("sqrt")] == ["sqrt_div"]
        assert [r.name for r in user_rules(["sqrt"])] == [r.name for r in user_rules(("sqrt",))] == ["sqrt_div"]
    assert user_rules(None) == user_rules([]) == ()


def _rules(c: str):
    return parse_rules(f"sd: sqrt(a * {c}) / sqrt(b * {c}) -> sqrt(a / b)", "x.rules")


def test_cache_key_tells_rules_apart_past_six_digits():
    """Rule.math printed 1.0000001 and 1.0000002 both as 1: the two compiles shared a key, and the second
    got the first's plans from the cache."""
    P = ne.program("p")
    i, j = P.axes(i=2, j=3)
    P.output("y", ne.sum(P.input("x", i, j), j))
    prog = P.build()
    (a,), (b,), (a2,) = _rules("1.0000001"), _rules("1.0000002"), _rules("1.0000001")
    assert a.exact != b.exact and a.exact == a2.exact
    keys = [key_of(prog, Options(rules=(r,)), H100) for r in (a, b, a2)]
    assert keys[0] != keys[1] and keys[0] == keys[2]


def test_rule_text_prints_constants_exactly():
    (a,), (b,) = _rules("1.0000001"), _rules("1.0000002")
    assert a.math == "(sqrt((a * 1.0000001)) / sqrt((b * 1.0000001))) → sqrt((a / b))"
    assert b.math != a.math
    (short,) = parse_rules("s: a * 2 + a * 0.5 + a * 1e-3 + a * 1e20 -> a", "x.rules")
    assert "(a * 2)" in short.math and "0.5" in short.math and "0.001" in short.math and "1e+20" in short.math
    (chk,) = check_rules(_rules("1.0000002"))
    assert "1.0000002" in str(chk)
