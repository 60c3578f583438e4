"""bench/beyond's harness in its CPU dry mode: tiny sizes, kernels through Triton's interpreter,
every code path of a GPU run (float64 check, peers, neptune_eq with its alternatives, ceilings,
report) with timings that mean nothing. Nothing here times anything for real."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from beyond.check import checked_time, reference, tolerance
from beyond.peers import PEERS, Peer, Skipped
from beyond.programs import PROGRAMS, Case, CopyCeiling, MatmulCeiling, cases
from beyond.run import RunOptions, main, run_all

pytestmark = pytest.mark.slow


def _wrong(case: Case, xs: tuple) -> Peer:
    """A peer that is off by 5 %: the check must catch it."""
    return Peer(lambda: case.program.fn(*xs) * 1.05, "deliberately wrong")


def _settled(name: str, e: dict) -> bool:
    """Timed after a passed check, or not run for a reason that is not a failure."""
    if "ms" in e:
        return e["rel_err"] <= e["tolerance"]
    return e.get("error", "").startswith(("not applicable", "not available"))


def test_dry_run_checks_times_and_reports(tmp_path):
    peers = {n: PEERS[n] for n in ("eager", "sdpa", "flex", "liger")} | {"wrong": _wrong}
    todo = cases(["rmsnorm_matmul", "causal_gqa"], dry=True)
    # each implementation runs once, for its check (the dry timer itself: test_cli_dry)
    opts = RunOptions(dry=True, alternatives=1, cache_dir=str(tmp_path / "cache"))
    rows = run_all(todo, opts, peers, tmp_path, measure=lambda thunk: 1.0)
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["program"] for r in data["rows"]] == ["rmsnorm_matmul", "causal_gqa"] == [r["program"] for r in rows]
    for r in data["rows"]:
        ours = r["impls"]["neptune_eq"]
        assert "ms" in ours and ours["rel_err"] <= ours["tolerance"], ours
        assert r["plan"] and r["kernels"] >= 1 and r["compile_s"] > 0
        assert r["impls"]["eager"]["ms"] > 0
        wrong = r["impls"]["wrong"]
        assert "ms" not in wrong and wrong["error"].startswith("failed the float64 check"), wrong
        assert all(_settled(n, e) for n, e in r["impls"].items() if n != "wrong"), r["impls"]
        assert r["alternatives"] and r["alternatives"][0]["id"] == 0
        assert all("predicted_ms" in a and "structure" in a for a in r["alternatives"])
        assert r["ceiling"]["ms"] > 0 and r["ceiling"]["rate"] > 0 and r["of_ceiling"] > 0
    gqa = data["rows"][1]
    assert gqa["checked_rows"] == 1  # a sample of the batch, as at full size
    assert all("ms" in gqa["impls"][n] for n in ("sdpa", "flex")), gqa["impls"]
    assert data["rows"][0]["impls"]["sdpa"]["error"].startswith("not applicable")
    s = data["summary"]
    assert set(s) >= {"speedup_over_best_peer", "geomean_speedup", "of_ceiling", "spearman_per_case",
                      "spearman_all", "points"}
    assert s["points"] == sum(1 for r in rows for a in r["alternatives"] if "ms" in a)
    md = (tmp_path / "results.md").read_text()
    assert "| rmsnorm_matmul |" in md and "failed the float64 check" in md


def test_cli_dry(tmp_path, capsys):
    assert main(["--dry", "--programs", "logsumexp", "--peers", "eager", "--alternatives", "0",
                 "--out", str(tmp_path), "--cache-dir", str(tmp_path / "cache")]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    (row,) = data["rows"]
    assert data["meta"]["dry"] and row["ceiling"]["what"].startswith("copy")
    assert set(row["impls"]) == {"neptune_eq", "eager"} and all("ms" in e for e in row["impls"].values())
    assert "| logsumexp |" in capsys.readouterr().out
    pytest.importorskip("matplotlib")
    assert (tmp_path / "results.png").stat().st_size > 0
    merged = tmp_path / "merged"
    assert main(["--merge", str(tmp_path / "results.json"), "--out", str(merged)]) == 0
    assert json.loads((merged / "results.json").read_text())["rows"][0]["program"] == "logsumexp"


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_every_program_eager_passes_its_check(name):
    """Each program, its input maker and its float64 reference agree at the tiny size (eager)."""
    case = Case(PROGRAMS[name], PROGRAMS[name].tiny)
    xs = case.inputs("cpu")
    ref = reference(case, xs)
    e = checked_time(lambda: case.program.fn(*xs), ref, tolerance(case, "eager"), lambda f: 1.0)
    assert e.get("ms") == 1.0, e


def test_check_fails_wrong_and_nonfinite():
    case = Case(PROGRAMS["softmax"], PROGRAMS["softmax"].tiny)
    (x,) = case.inputs("cpu")
    ref = reference(case, (x,))
    tol = tolerance(case, "neptune_eq")
    assert tol == pytest.approx(4 * 2.0**-11)  # fp16: the library's own default
    bad = checked_time(lambda: torch.softmax(x.float() * 1.01, -1).half(), ref, tol, lambda f: 1.0)
    assert "ms" not in bad and bad["error"].startswith("failed the float64 check")
    nan = checked_time(lambda: torch.full_like(x, math.nan), ref, tol, lambda f: 1.0)
    assert nan["rel_err"] == math.inf and "ms" not in nan
    raised = checked_time(lambda: 1 / 0, ref, tol, lambda f: 1.0)
    assert raised["error"].startswith("ZeroDivisionError")


def test_full_sizes_and_ceilings():
    """The issue's sizes, their work and ceilings (nothing allocated)."""
    full = {c.label: c for c in cases()}
    assert len(full) == 25
    long = full["row_variance M=512 N=262144"]  # a row no program holds on chip (Welford's case)
    assert long.ceiling == CopyCeiling(512 * 262144 * 2 + 512 * 2) and "layer_norm_rows M=512 N=262144" in full
    kl = full["kl_rows M=4096 N=32768"]  # issue 12's programs at its row length
    assert kl.ceiling == CopyCeiling(2 * 4096 * 32768 * 2 + 4096 * 4) and kl.program.check.input_dims == (0, 0)
    rms = full["rmsnorm_matmul M=4096 K=8192 N=8192"]
    assert rms.ceiling == MatmulCeiling(4096, 8192, 8192) and rms.work == 2.0 * 4096 * 8192 * 8192
    ce = full["linear_ce T=8192 H=4096 V=128256"]
    assert ce.ceiling == MatmulCeiling(8192, 4096, 128256) and ce.program.dtype == torch.bfloat16
    sm = full["softmax M=4096 N=65536"]
    assert sm.ceiling == CopyCeiling(2 * 4096 * 65536 * 2) and sm.program.dtype == torch.float16
    assert full["logsumexp M=65536 N=1024"].work == 65536 * 1024 * 2 + 65536 * 2
    assert full["bias_attention B=2 H=16 L=4096 D=64"].ceiling == MatmulCeiling(4096, 4096, 4096)
    gqa = full["causal_gqa B=4 H=32 Hkv=8 L=4096 D=128"]
    assert gqa.work == 4.0 * 4 * 32 * 128 * (4096 * 4097 // 2)
    assert "causal_attention B=8 H=16 L=2048 D=64" in full
    assert isinstance(PEERS["sdpa"](sm, ()), Skipped)
