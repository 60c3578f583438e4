"""Re-rank stored bench/beyond measurements with the cost model as it is now (no GPU needed).

    python bench/beyond/rescore.py bench/beyond/results/h100_2026-11-24/results.json [--programs softmax ...]

Each (program, size) of the results is captured and compiled here for the H100
spec; each measured alternative is matched by its structure and priced again. Printed per case: the
Spearman rank correlation of the new predictions against the stored times, which measured plan the
model now ranks first and how far it is from the fastest measured one, and the model's first plan
overall (which may be one that was never measured). Pooled: Spearman over every point and the number
of cases whose first measured plan is within 10 % of the best. A change to the model is checked
against measurements it was not fitted to before it is taken to the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if __name__ == "__main__" and not __package__:
    sys.path[0] = str(HERE.parent)
    sys.path.append(str(HERE.parent.parent))
    from beyond.rescore import main

    sys.exit(main())

from run import spearman  # noqa: E402  (bench/run.py)

from neptune_eq.device import H100  # noqa: E402
from neptune_eq.frontend import capture  # noqa: E402
from neptune_eq.pipeline import Options, compile_program  # noqa: E402

from .programs import PROGRAMS, Case  # noqa: E402


def rescore(rows: list[dict], log=print) -> dict:
    pooled_pred, pooled_meas, within, cases = [], [], 0, 0
    for r in rows:
        alts = [a for a in r.get("alternatives", []) if "ms" in a]
        if len(alts) < 2:
            continue
        case = Case(PROGRAMS[r["program"]], r["dims"])
        cap = capture(case.program.fn, *case.inputs("cpu"))  # (values unused: capture reads shapes)
        comp = compile_program(cap.program, Options(device=H100))
        by_structure = {a.structure: a for a in comp.alternatives}
        pts = [(by_structure[a["structure"]].cost.time * 1e3, a["ms"], a["structure"]) for a in alts
               if a["structure"] in by_structure]
        if len(pts) < 2:
            log(f"{r['program']} {r['shape']}: {len(pts)} of {len(alts)} measured plans still offered")
            continue
        best = min(m for _, m, _ in pts)
        first = min(pts, key=lambda t: t[0])
        cases += 1
        within += first[1] <= 1.10 * best
        pooled_pred += [p for p, _, _ in pts]
        pooled_meas += [m for _, m, _ in pts]
        s = spearman([p for p, _, _ in pts], [m for _, m, _ in pts]) if len(pts) >= 3 else float("nan")
        top = comp.alternatives[0]
        log(f"{r['program']} {r['shape']}: {len(pts)} points, Spearman {s:.2f}; first measured "
            f"{first[2]} {first[1] * 1e3:.0f} µs (best {best * 1e3:.0f}); model's first overall: "
            f"{top.structure} {top.cost.time * 1e6:.0f} µs predicted"
            + ("" if top.structure in {a['structure'] for a in alts} else " (never measured)"))
    out = {"cases": cases, "within_10pct": within, "points": len(pooled_pred),
           "spearman_all": spearman(pooled_pred, pooled_meas) if len(pooled_pred) >= 3 else None}
    log(f"pooled: Spearman {out['spearman_all']:.2f} over {out['points']} points; first measured plan within "
        f"10 % of the best on {within} of {cases} cases")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--programs", nargs="*")
    args = ap.parse_args(argv)
    rows = [r for p in args.results for r in json.loads(Path(p).read_text())["rows"]
            if not args.programs or r["program"] in args.programs]
    rescore(rows)
    return 0
