"""User rewrite rules: accepted when sound, rejected with a counterexample when not, effective in compiles,
and caught by the saturation budget when they blow the e-graph up."""

import pytest
from egglog import String, birewrite, eq, f64, i64, rewrite, rule, union, var, vars_
from helpers import small_softmax
from neptune_eq.rules.base import free_of, positive, rw
from neptune_eq.rules.files import parse_rules
from neptune_eq.rules.user import RuleError, UnsoundRuleError, user_rules

from neptune_eq import dsl as ne
from neptune_eq.explorer import explore
from neptune_eq.ir import NeptuneError
from neptune_eq.runtime import compile_ir
from neptune_eq.terms import Term, deps, exp, red, sqrt

a, b = vars_("a b", Term)
ax = var("ax", String)
# the shipped sqrt_div is a refinement (NaN for negative operands); tests/test_rules_soundness.py checks the warning
pytestmark = pytest.mark.filterwarnings("ignore::neptune_eq.rules.user.RuleRefinementWarning")


def sqrt_sum(n_i=8, n_j=256):
    """y[i] = Σ_j sqrt(exp(x[i,j] − max_j x)): no rolling plan with the built-in rules alone."""
    P = ne.program("sqrt_sum")
    i, j = P.axes(i=n_i, j=n_j)
    x = P.input("x", i, j)
    P.output("y", ne.sum(ne.sqrt(ne.exp(x - ne.max(x, j))), j))
    return P.build()


def rolling(ex) -> list[str]:
    """The rolling plans among the alternatives (each listed once, whatever its schedule kinds)."""
    return sorted({e.structure.split(" [")[0] for e in ex.alternatives if "rolling" in e.structure})


def plans(ex) -> set[str]:
    return {e.structure.split(" [")[0] for e in ex.alternatives}


@pytest.fixture(scope="module")
def with_and_without():
    prog = sqrt_sum()
    return explore(prog), explore(prog, rules="sqrt")


# ---------------------------------------------------------------- effective


def test_user_rule_opens_a_rolling_plan_the_builtins_did_not_offer(with_and_without):
    plain, extended = with_and_without
    assert rolling(plain) == []
    assert any("sqrt" in r for r in [lp.reason for lp in plain.compilation.fusion.rejected])
    new = rolling(extended)
    assert new == ["1 kernel, rolling over j (max_j, sum_j)"]
    assert plans(extended) == plans(plain) | set(new)
    # and the cost model ranks it with the one-kernel plans (at this size all cost a launch)
    best = extended.alternatives[0].predicted_us
    assert any(e.structure.startswith(new[0]) and e.predicted_us <= 1.05 * best for e in extended.alternatives)


def test_derivation_credits_the_user_rule(with_and_without):
    _, ex = with_and_without
    text = str(ex.derivation(next(e.id for e in ex.alternatives if "rolling" in e.structure)))
    assert "rolling_update" in text
    assert "h = sqrt(exp(old:max_j - cur:max_j))" in text
    assert "minimal rules that still derive h:" in text
    minimal = next(line for line in text.splitlines() if "minimal rules" in line)
    assert "sqrt_div [user rule" in minimal and "sqrt.rules:" in minimal


def test_plan_from_user_rule_verifies(with_and_without):
    _, ex = with_and_without
    report = ex.verify(0)
    assert report.passed, str(report)
    assert ex.alternatives[0].verified is True


def test_rules_do_not_leak_between_compiles():
    prog = sqrt_sum()
    explore(prog, rules="sqrt")
    other = rw("exp_one_times", exp(Term(1.0) * a), exp(a))
    ex = explore(prog, rules=[other])
    assert rolling(ex) == []
    assert [r.name for r in ex.compilation.options.rules] == ["exp_one_times"]


def test_compile_ir_takes_rules():
    prog = compile_ir(sqrt_sum(), rules="sqrt")
    assert any("rolling" in a.structure for a in prog.alternatives)
    assert not any("rolling" in a.structure for a in compile_ir(sqrt_sum()).alternatives)


# ---------------------------------------------------------------- accepted forms


def test_rule_object_and_egglog_rewrites_are_converted():
    r1 = rw("sqrt_div_py", sqrt(a) / sqrt(b), sqrt(a / b))
    r2 = ("sum_out", rewrite(red("sum", ax, a * b)).to(red("sum", ax, a) * b, *free_of(b, ax).facts))
    r3 = birewrite(exp(a) * exp(b)).to(exp(a + b))
    rules = user_rules([r1, r2, r3])
    assert [r.name for r in rules] == ["sqrt_div_py", "sum_out", "user_rule_2"]
    assert [str(c) for c in rules[1].conds] == ["b free of ax"]
    assert rules[2].bidirectional
    assert all(r.origin == "python" for r in rules)


def test_egglog_rewrite_with_positive_constant_condition():
    k = var("k", f64)
    r = rewrite(red("max", ax, a * Term(k))).to(red("max", ax, a) * Term(k), *positive(k).facts)
    (conv,) = user_rules([("max_scale_user", r)])
    assert [c.kind for c in conv.conds] == ["positive"]


def test_egglog_rewrite_makes_a_rolling_plan():
    r = ("sqrt_div_egg", rewrite(sqrt(a) / sqrt(b)).to(sqrt(a / b)))
    ex = explore(sqrt_sum(), rules=[r])
    assert rolling(ex)


def test_uninterpretable_egglog_condition_is_rejected():
    bad = rewrite(exp(a)).to(exp(a), eq(deps(a)).to(i64(3)))
    with pytest.raises(RuleError, match="cannot interpret the condition"):
        user_rules([("weird", bad)])


def test_general_egglog_rule_is_rejected():
    with pytest.raises(RuleError, match="only egglog rewrite/birewrite"):
        user_rules([("r", rule(exp(a)).then(union(exp(a)).with_(a)))])


# ---------------------------------------------------------------- rejected


def test_unsound_rule_is_rejected_with_a_counterexample():
    with pytest.raises(UnsoundRuleError) as err:
        explore(sqrt_sum(), rules=[rw("sqrt_mul_bad", sqrt(a * b), sqrt(a) * sqrt(b))])
    msg = str(err.value)
    assert "rule 'sqrt_mul_bad'" in msg and "unsound" in msg
    assert "left side =" in msg and "right side =" in msg and "a=" in msg and "b=" in msg
    assert err.value.counterexample.rule == "sqrt_mul_bad"


def test_unsound_rule_from_file_names_the_line(tmp_path):
    f = tmp_path / "bad.rules"
    f.write_text("# fine\nok_rule: exp(a) * exp(b) -> exp(a + b)\nbad_rule: log(a * b) -> log(a) + log(b)\n")
    with pytest.raises(UnsoundRuleError, match=r"bad\.rules:3: rule 'bad_rule'"):
        user_rules(str(f))


@pytest.mark.parametrize(("text", "match"), [
    ("lone: a -> a + 0", "bare variable 'a'"),
    ("unbound: a * b -> a * c", "c on the right side is not bound"),
    ("exp_add: exp(a) * exp(b) -> exp(a + b)", "taken by a built-in rule"),
])
def test_structurally_bad_rules_are_rejected(text, match):
    with pytest.raises(RuleError, match=match):
        user_rules(parse_rules(text, "t.rules"))


def test_unknown_rules_name_is_a_clear_error():
    with pytest.raises(NeptuneError, match=r"no rules file 'nonexistent_rules'.*shipped rules files: .*sqrt"):
        user_rules("nonexistent_rules")


# ---------------------------------------------------------------- blow-up


def test_blow_up_rule_is_stopped_by_the_node_budget(tmp_path):
    f = tmp_path / "blow.rules"
    f.write_text("rescale: a * b -> (a * 2) * (b * 0.5)   # sound, but every product spawns new ones\n")
    ex = explore(small_softmax(), rules=str(f))
    sat = ex.compilation.saturator
    assert sat.budget_hit
    algebra = next(r for r in sat.reports if r.name == "algebra")
    assert algebra.stop.startswith("node budget") and algebra.matches["rescale"] > 0
    warning = "\n".join(ex.summary().splitlines())
    assert "stopped by the node budget" in warning and "user rules that matched: rescale" in warning
    assert len(ex.alternatives) >= 1  # still a usable result, not a hang or a crash
