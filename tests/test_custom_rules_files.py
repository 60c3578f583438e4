"""Rules files are data: parsed with a whitelist, never executed; bad lines get errors naming the line."""

import pytest
from neptune_eq.rules.files import RuleFileError, load_rules_file, parse_rules
from neptune_eq.rules.user import RuleRefinementWarning, check_rules, user_rules

from neptune_eq.cli import main

GOOD = """\
# a comment, then a blank line

sqrt_div:   sqrt(a) / sqrt(b) -> sqrt(a / b)          # trailing comment
exp_split:  exp(a + b) <-> exp(a) * exp(b)
sum_scale:  sum_j(a * k) -> sum_j(a) * k              if k free of j, finite(k)
max_scale2: max_j(a * c) -> max_j(a) * c              if positive(c)
inf_absorb: a + -inf -> -inf                          if finite(a)
flip_sel:   where(a < b, c, d) -> where(b > a, c, d)
"""


def test_rules_file_format():
    rules = parse_rules(GOOD, "good.rules")
    assert [r.name for r in rules] == ["sqrt_div", "exp_split", "sum_scale", "max_scale2", "inf_absorb", "flip_sel"]
    assert [r.origin for r in rules][:2] == ["good.rules:3", "good.rules:4"]
    assert rules[1].bidirectional and not rules[0].bidirectional
    assert [str(c) for c in rules[2].conds] == ["k free of j", "finite(k)"]
    assert rules[3].conds[0].kind == "positive" and rules[3].rhs_pattern.vars()["c"] == "f64"  # a constant variable
    assert rules[2].math == "sum_j((a * k)) → (sum_j(a) * k)   if k free of j, finite(k)"
    assert all(chk.ok for chk in check_rules(rules)), [str(c) for c in check_rules(rules)]
    with pytest.warns(RuleRefinementWarning) as caught:
        assert len(user_rules(rules)) == 6
    assert sorted(str(w.message).split("rule '")[1].split("'")[0] for w in caught) == [
        "inf_absorb", "sqrt_div", "sum_scale"]


def test_shipped_rules_file_loads_by_name():
    with pytest.warns(RuleRefinementWarning, match="sqrt_div"):  # sqrt(a)/sqrt(b) is NaN for a, b < 0
        (r,) = user_rules("sqrt")
    assert r.name == "sqrt_div" and r.origin.endswith("sqrt.rules:6")


@pytest.mark.parametrize(("line", "match"), [
    ("no_arrow: exp(a) exp(b)", "cannot read the left side|exactly one arrow"),
    ("two: a -> b -> c", "exactly one arrow"),
    ("missing name -> b", "expected `name: lhs -> rhs"),
    ("f: frob(a) -> a", "unknown function 'frob'"),
    ("g: exp(a, b) -> a", r"exp\(\) takes 1 argument, got 2"),
    ("h: a ** 2 -> a * a", r"operator \*\* is not supported"),
    ("i: exp(a) -> a if maybe(a)", "unknown condition `maybe"),
    ("j: sum_j(a) -> a if a free of k", "'k' in `a free of k` is not the axis"),
    ("k: exp(a) -> exp(a) if positive(q)", "condition on 'q', which does not occur"),
    ("l: exp(a) -> ", "the right side is empty"),
    ("m: exp(A) -> A", "'A' is not a pattern variable"),
    ("n: exp('a') -> a", "only numbers may appear as constants"),
    ("o: exp(a) -> exp(a) if ,", "empty condition"),
])
def test_malformed_lines_name_file_and_line(line, match):
    text = f"ok: exp(a) * exp(b) -> exp(a + b)\n\n{line}\n"
    with pytest.raises(RuleFileError, match=match) as err:
        parse_rules(text, "my.rules")
    assert str(err.value).startswith("my.rules:3: ")
    assert line.strip() in str(err.value)


@pytest.mark.parametrize(("payload", "match"), [
    ("__import__('os').system('touch {marker}')", "calling attribute access is not allowed"),
    ("__import__('os')", "unknown function '__import__'"),
    ("exec('open(\"{marker}\", \"w\")')", "unknown function 'exec'"),
    ("a.__class__", "not allowed in a rule: attribute access"),
    ("(lambda q: q)(a)", "calling a lambda is not allowed"),
    ("a[0]", "not allowed in a rule: subscripts"),
    ("f'{{a}}'", "not allowed in a rule: f-strings"),
    ("(z := a) + z", "not allowed in a rule: assignment expressions"),
    ("[q for q in a]", "not allowed in a rule: comprehensions"),
    ("exp(*a)", "positional arguments only"),
    ("exp(a, **{{'x': 1}})", "positional arguments only"),
    ("a if a else a", "not allowed in a rule: conditional expressions"),
])
def test_smuggled_code_is_rejected_and_never_runs(tmp_path, payload, match):
    marker = tmp_path / "pwned"
    f = tmp_path / "evil.rules"
    f.write_text(f"fine: exp(a) * exp(b) -> exp(a + b)\nevil: {payload.format(marker=marker)} -> a\n")
    with pytest.raises(RuleFileError, match=match) as err:
        load_rules_file(f)
    assert "evil.rules:2: " in str(err.value)
    assert not marker.exists()


def test_huge_expressions_are_refused_not_recursed(tmp_path):
    with pytest.raises(RuleFileError, match="too large"):
        parse_rules("long: a" + " + a" * 300 + " -> a\n", "long.rules")  # a 300-deep tree
    with pytest.raises(RuleFileError, match=r"deep\.rules:1: cannot read the left side"):
        parse_rules("deep: " + "exp(" * 300 + "a" + ")" * 300 + " -> a\n", "deep.rules")  # the parser's own limit


def test_binary_and_missing_files(tmp_path):
    f = tmp_path / "bin.rules"
    f.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(RuleFileError, match="not a UTF-8 text file"):
        load_rules_file(f)
    with pytest.raises(RuleFileError, match="no such rules file"):
        load_rules_file(tmp_path / "absent.rules")


def test_duplicate_names_in_a_file():
    with pytest.raises(RuleFileError, match="already defined on line 1"):
        parse_rules("r: exp(a) -> exp(a)\nr: log(a) -> log(a)\n", "dup.rules")


# ---------------------------------------------------------------- neptune-eq rules check


def test_rules_check_good_file(tmp_path, capsys):
    f = tmp_path / "good.rules"
    f.write_text(GOOD)
    assert main(["rules", "check", str(f)]) == 0
    out = capsys.readouterr().out
    assert "6 rule(s)" in out and out.count("ok    ") == 6 and "all rules ok (3 refinement(s)" in out
    assert out.count("(refinement: left side undefined (nan) at ") == 3  # sqrt_div, sum_scale, inf_absorb


def test_rules_check_unsound_rule_exits_nonzero(tmp_path, capsys):
    f = tmp_path / "mixed.rules"
    f.write_text("good: exp(a) * exp(b) -> exp(a + b)\nbad: sqrt(a * b) -> sqrt(a) * sqrt(b)\n")
    assert main(["rules", "check", str(f)]) == 1
    out = capsys.readouterr().out
    assert "ok    good" in out and "FAIL  bad" in out
    assert "unsound: with a=" in out and "left side =" in out and "1 problem(s)" in out


def test_rules_check_malformed_file_exits_nonzero(tmp_path, capsys):
    f = tmp_path / "broken.rules"
    f.write_text("x: a.b -> a\n")
    assert main(["rules", "check", str(f), "sqrt"]) == 1
    out = capsys.readouterr().out
    assert "broken.rules:1: not allowed in a rule: attribute access" in out
    assert "ok    sqrt_div" in out  # the other file is still checked
