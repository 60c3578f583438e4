"""The command line, driven as a user would."""

import json

from helpers import EXAMPLES, run_cli


def test_compile_json_last_line():
    r = run_cli("compile", str(EXAMPLES / "softmax.py"), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout.strip().splitlines()[-1])
    assert data["kernels"] == 1
    assert isinstance(data["alternatives"], list) and len(data["alternatives"]) >= 2
    assert all(a["predicted_time_us"] > 0 for a in data["alternatives"])
    assert data["max_rel_err"] < 1e-3
    assert "rolling" in data["plan"]


def test_compile_human_output_shows_plan_and_verification():
    r = run_cli("compile", str(EXAMPLES / "causal_attention.py"))
    assert r.returncode == 0, r.stderr
    assert "rolling_update" in r.stdout and "alternatives" in r.stdout
    assert "verification PASS" in r.stdout


def test_missing_file_is_a_clear_error():
    r = run_cli("compile", "no_such_example.py")
    assert r.returncode == 2 and "no such file" in r.stderr
