"""`neptune-eq explore FILE`: the terminal session, driven by scripted stdin."""

import io

from helpers import EXAMPLES, run_cli

from neptune_eq.cli import main
from neptune_eq.explorer.core import explore
from neptune_eq.explorer.session import Session, load_target


def test_session_through_the_cli(tmp_path):
    svg = tmp_path / "eg.svg"
    script = f"list\nshow 0\ndiff 0 1\nverify 0\nbench 0\nsvg {svg} 1\nrules\nbogus\nshow 42\nshow x\nquit\n"
    r = run_cli("explore", str(EXAMPLES / "sqrt_sum.py"), "--rules", "sqrt", stdin=script)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "user rules: sqrt_div" in out
    assert out.count("3 alternatives, predicted on") == 2  # at start and for `list`
    assert "#0          " in out and "1 kernel, rolling over j (max_j, sum_j)" in out
    assert "== derivation ==" in out and "sqrt_div [user rule" in out and "@triton.jit" in out
    assert "== #0 vs #1 ==" in out and "--- #0" in out
    assert "#0: verification PASS" in out
    assert "no CUDA GPU" in out or "measured on" in out
    assert f"wrote {svg}" in out and svg.read_text().count("<svg") == 1
    assert "sqrt_div" in out.split("user rule(s)")[1]
    assert "error: unknown command 'bogus'" in out
    assert "error: no alternative 42; there are 3" in out
    assert "error: alternative ids are numbers; usage: show N" in out
    assert "saturate algebra: iteration 1" in r.stderr  # progress during saturation


def test_missing_file_is_a_clear_error(capsys):
    assert main(["explore", "no_such_file.py"]) == 2
    assert "no such file: no_such_file.py" in capsys.readouterr().err


def test_pytorch_file_target():
    fn, inputs = load_target(str(EXAMPLES / "sqrt_sum_torch.py"))
    assert callable(fn) and inputs[0].shape == (64, 1000)
    ex = explore(fn, *inputs, rules="sqrt")
    out = io.StringIO()
    code = Session(ex, io.StringIO("list\nshow 0\n"), out).run()  # ends at end of input
    text = out.getvalue()
    assert code == 0
    assert "rolling over" in text and "rolling_update" in text and "sqrt_div" in text


def test_split_k_derivation_in_a_session():
    prog, _ = load_target(str(EXAMPLES / "decode_attention.py"))
    ex = explore(prog)
    split = next(e.id for e in ex.alternatives if "split-K" in e.structure)
    out = io.StringIO()
    Session(ex, io.StringIO(f"help\ndiff 0 {split}\n"), out).run()
    text = out.getvalue()
    assert "svg PATH [N]" in text  # help
    assert "split-K" in text and f"#0 vs #{split}" in text
    d = ex.derivation(split, minimal_rules=False)
    assert "split_k" in d.rules() and "rolling_update" in d.rules()
    assert any(s.rule == "materialise" and "part_" in s.text for s in d.steps)
