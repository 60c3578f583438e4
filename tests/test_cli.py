"""The command line, driven as a user would."""

import json

import pytest
from helpers import EXAMPLES, run_cli

from neptune_eq.cli import main


def test_compile_json_last_line():
    r = run_cli("compile", str(EXAMPLES / "softmax.py"), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout.strip().splitlines()[-1])
    assert data["kernels"] == 1
    assert isinstance(data["alternatives"], list) and len(data["alternatives"]) >= 2
    assert all(a["predicted_time_us"] > 0 for a in data["alternatives"])
    assert data["max_rel_err"] < 1e-3
    assert data["plan"].startswith("1 kernel") and ("rolling" in data["plan"] or "resident" in data["plan"])


def test_compile_human_output_shows_plan_and_verification():
    r = run_cli("compile", str(EXAMPLES / "causal_attention.py"))
    assert r.returncode == 0, r.stderr
    assert "rolling_update" in r.stdout and "alternatives" in r.stdout
    assert "verification PASS" in r.stdout


def test_missing_file_is_a_clear_error():
    r = run_cli("compile", "no_such_example.py")
    assert r.returncode == 2 and "no such file" in r.stderr


def _main(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_compile_accepts_the_pytorch_file_that_explore_takes(capsys):
    """`compile` used to refuse a file defining `fn` and `example_inputs` ("defines no program")."""
    code, out, err = _main(capsys, "compile", str(EXAMPLES / "sqrt_sum_torch.py"), "--json")
    assert code == 0, err
    data = json.loads(out.strip().splitlines()[-1])
    assert data["program"] == "fn" and data["kernels"] >= 1 and data["verified"] is True
    assert set(data["verify"]) == {"normal"} and data["verify"]["normal"]["max_rel_err"] == data["max_rel_err"] < 1e-3
    assert "verification PASS" in err and "alternatives (predicted on" in err


EXP_SUM = '''
from neptune_eq import dsl as ne

P = ne.program("exp_sum")
i, j = P.axes(i=4, j=256)
x = P.input("x", i, j)
P.output("y", ne.sum(ne.exp(x), j))  # its value passes float32's range on wide inputs (e^100): no spelling helps
program = P.build()
'''


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_stress_failure_fails_the_verdict_and_the_exit_code(tmp_path, capsys):
    path = tmp_path / "exp_sum.py"
    path.write_text(EXP_SUM)
    code, out, err = _main(capsys, "compile", str(path), "--seed", "0")
    assert code == 0 and "verification PASS" in out, err
    code, out, err = _main(capsys, "compile", str(path), "--stress", "--json", "--seed", "0")
    assert code == 1, err  # was 0: the stress sets were printed but did not count
    data = json.loads(out.strip().splitlines()[-1])
    assert data["verified"] is False and set(data["verify"]) == {"normal", "offset", "wide"}
    assert data["verify"]["normal"]["passed"] is True and data["verify"]["offset"]["passed"] is True
    wide = data["verify"]["wide"]
    assert wide["passed"] is False and wide["nonfinite"] > 0 and wide["outputs"]["y"]["tolerance"] == 1e-3
    assert data["max_rel_err"] == wide["max_rel_err"] > 1e-3
    assert "verification FAIL" in err and "wide: max rel err" in err


def test_file_errors_are_clear(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = 1 / 0\n")
    code, _, err = _main(capsys, "compile", str(bad))
    assert code == 2 and "ZeroDivisionError" in err and f"{bad}:2: x = 1 / 0" in err
    assert "Traceback" not in err
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def f(:\n")
    code, _, err = _main(capsys, "explore", str(syntax))
    assert code == 2 and f"{syntax}:1: syntax error" in err
    empty = tmp_path / "empty.py"
    empty.write_text("y = 3\n")
    code, _, err = _main(capsys, "compile", str(empty))
    assert code == 2 and "defines neither a program" in err and "`fn` with `example_inputs`" in err


def test_strict_rules_flag_on_compile_and_explore():
    for cmd in (("compile", "examples/sqrt_sum.py", "--no-verify"), ("explore", "examples/sqrt_sum.py", "--quiet")):
        r = run_cli(*cmd, "--rules", "sqrt", "--strict-rules", stdin="quit\n")
        assert r.returncode == 2 and "rejected by strict rule checking" in r.stderr, (cmd, r.stderr[-500:])
