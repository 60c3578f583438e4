"""`neptune-eq explore FILE`: the terminal session, driven by scripted stdin."""

import io
import os
import re
import select
import signal
import sys
import time

import pytest
from helpers import EXAMPLES, ROOT, run_cli

from neptune_eq.cli import main
from neptune_eq.explorer import graph
from neptune_eq.explorer.core import explore
from neptune_eq.explorer.session import Session, line_editing, load_target, run_session


def test_session_through_the_cli(tmp_path):
    svg = tmp_path / "eg.svg"
    prog, _ = load_target(str(EXAMPLES / "sqrt_sum.py"))
    r0 = next(e.id for e in explore(prog, rules="sqrt").alternatives if "rolling" in e.structure)
    script = f"list\nshow {r0}\ndiff {r0} 1\nverify {r0}\nbench 0\nsvg {svg} 1\nrules\nbogus\nshow 42\nshow x\nquit\n"
    r = run_cli("explore", str(EXAMPLES / "sqrt_sum.py"), "--rules", "sqrt", stdin=script)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "user rules: sqrt_div" in out
    assert len(re.findall(r"\d+ alternatives, predicted on", out)) == 2  # at start and for `list`
    assert "#0          " in out and "1 kernel, rolling over" in out
    assert "== derivation ==" in out and "sqrt_div [user rule" in out and "@triton.jit" in out
    assert f"== #{r0} vs #1 ==" in out and f"--- #{r0}" in out
    assert f"#{r0}: verification PASS" in out
    assert "no CUDA GPU" in out or "measured on" in out
    if graph.have_dot():
        assert f"wrote {svg}" in out and svg.read_text().count("<svg") == 1
    else:  # the session says why and goes on
        assert "error: graphviz `dot` is not on PATH" in out and not svg.exists()
    assert "sqrt_div" in out.split("user rule(s)")[1]
    assert "error: unknown command 'bogus'" in out
    assert re.search(r"error: no alternative 42; there are \d+", out)
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
    rolling = next(e.id for e in ex.alternatives if "rolling" in e.structure)
    code = Session(ex, io.StringIO(f"list\nshow {rolling}\n"), out).run()  # ends at end of input
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


@pytest.fixture(scope="module")
def sqrt_ex():
    prog, _ = load_target(str(EXAMPLES / "sqrt_sum.py"))
    return explore(prog, rules="sqrt")


def test_session_fits_a_narrow_terminal(sqrt_ex, monkeypatch):
    """Tables wrapped at 80 columns: at COLUMNS=60 no line of the listing, the rules or the prose is longer."""
    monkeypatch.setenv("COLUMNS", "60")
    out = io.StringIO()
    Session(sqrt_ex, io.StringIO("list\nrules\nverify 0\n"), out).run()
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 60, max(lines, key=len)
    n = len(sqrt_ex.alternatives)
    assert sum(bool(re.match(r"#\d+ ", line)) for line in lines) == 2 * n  # a row per alternative, none wrapped
    assert "…" in out.getvalue()
    out = io.StringIO()
    Session(sqrt_ex, io.StringIO("list\n"), out, width=40).run()
    assert max(len(line) for line in out.getvalue().splitlines()) <= 40


def test_piped_session_keeps_no_history(tmp_path):
    history = tmp_path / "history"
    out = io.StringIO()
    assert run_session(str(EXAMPLES / "sqrt_sum.py"), "sqrt", inp=io.StringIO("list\n"), out=out,
                       progress=False, history=history) == 0
    assert "explore> " not in out.getvalue() and not history.exists()


def test_line_editing_keeps_history(tmp_path):
    readline = pytest.importorskip("readline")
    history = tmp_path / "sub" / "history"
    with line_editing(history):
        readline.add_history("show 0")
    assert "show 0" in history.read_text()
    with line_editing(history):  # loaded again in the next session
        assert readline.get_history_item(readline.get_current_history_length()) == "show 0"


def test_line_editing_without_readline(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "readline", None)  # `import readline` raises ImportError
    with line_editing(tmp_path / "history"):
        pass
    assert not (tmp_path / "history").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_arrow_keys_recall_history_at_a_terminal(tmp_path):
    """At a terminal, ↑ brings back the last command (readline); the history file is written at the end."""
    pytest.importorskip("readline")
    import pty

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "COLUMNS": "100", "TERM": "xterm"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on the pseudo-terminal
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "neptune_eq.cli", "explore", "examples/sqrt_sum.py",
                                   "--rules", "sqrt", "--quiet"], env)
    out = b""

    def read_until(done, seconds: float = 120) -> None:
        """Read the terminal until done(output) or the time is up (never blocks past it)."""
        nonlocal out
        end = time.monotonic() + seconds
        while not done(out) and time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the child closed the terminal
                    return
                if not chunk:
                    return
                out += chunk

    try:
        read_until(lambda o: o.count(b"explore> ") >= 1)
        os.write(fd, b"rules\r")
        read_until(lambda o: o.count(b"explore> ") >= 2)
        n_before = out.count(b"user rule(s)")
        os.write(fd, b"\x1b[A\r")  # up arrow, enter: `rules` again
        read_until(lambda o: o.count(b"explore> ") >= 3)
        os.write(fd, b"quit\r")
        read_until(lambda o: False, 10)  # to the end of output (the child exits)
    finally:
        os.close(fd)
        status = _reap(pid)
    assert out.count(b"user rule(s)") == n_before + 1, out[-2000:]
    assert os.waitstatus_to_exitcode(status) == 0
    assert "rules" in (tmp_path / "neptune_eq" / "explore_history").read_text()


def _reap(pid: int, seconds: float = 10) -> int:
    """The child's wait status; killed (this test started it) if it has not exited in time."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]
