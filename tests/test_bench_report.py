"""bench/run.py's summary: speedups at the largest size, the cost model's Spearman, and whether the
model's first choice was within 10 % of the best measured alternative (a failed first choice is not)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from run import summarize


def row(op, L, ours, peer, alts):
    return {"op": op, "L": L, "impls": {"neptune_eq": {"ms": ours}, "sdpa": {"ms": peer}},
            "alternatives": [dict(a) for a in alts]}


def test_summary():
    good = [{"ms": 1.0, "predicted_ms": 1.0}, {"ms": 2.0, "predicted_ms": 2.0}, {"ms": 3.0, "predicted_ms": 3.5}]
    slow_first = [{"ms": 1.5, "predicted_ms": 1.0}, {"ms": 1.0, "predicted_ms": 2.0}]
    failed_first = [{"error": "does not compile", "predicted_ms": 1.0}, {"ms": 1.0, "predicted_ms": 2.0}]
    rows = [row("a_pf", 1024, 1.0, 0.5, slow_first), row("a_pf", 4096, 2.0, 3.0, good),
            row("b_dc", 4096, 1.0, 1.0, failed_first)]
    s = summarize(rows)
    assert s["ratio_largest_L"] == {"a_pf": 1.5, "b_dc": 1.0}
    assert abs(s["geomean"] - 1.5 ** 0.5) < 1e-12
    assert s["points"] == 6
    assert s["chosen_within_10pct_of_best_measured"] == {"a_pf": False, "b_dc": False}
    assert s["chosen_within_10pct_at_largest_L"] == {"a_pf": True, "b_dc": False}
