"""Calibrate the cost model's device constants against measured alternatives.

    python bench/calibrate.py RESULTS.json [RESULTS.json ...]

For every (op, L) in the results, the plans are recompiled here (no GPU needed) with a device spec
matching the measuring GPU, each measured alternative is matched by its structure, and the
predicted and measured times are compared: Spearman rank correlation over all points, mean
|log(pred/meas)|, and whether the plan the model ranks first among the measured ones is within
10% of the fastest measured. A small grid over the per-program streaming rate, the launch cost and
the overlap factor reports the best-fitting constants.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cases import Case  # noqa: E402
from neptune_eq.extract.cost import plan_cost  # noqa: E402
from run import spearman  # noqa: E402

import neptune_eq  # noqa: E402, F401
from neptune_eq.device import H100  # noqa: E402
from neptune_eq.frontend import capture  # noqa: E402
from neptune_eq.pipeline import Options, compile_program  # noqa: E402

# the GPU the results came from (KINDS.md: 132 SMs, 1.98 GHz boost, copies at about 4.3 TB/s)
H200 = replace(H100, name="NVIDIA H200", clock_hz=1.98e9, hbm_bytes_per_s=4.3e12, l2_bytes=60 * 2**20,
               tensor_flops=790e12)


def load_points(paths):
    rows = []
    for p in paths:
        rows += json.loads(Path(p).read_text())["rows"]
    return [r for r in rows if r.get("alternatives")]


def evaluate(rows, dev, compiled):
    preds, meas, within = [], [], []
    logerr = []
    for r in rows:
        c = compiled[(r["op"], r["L"])]
        by_structure = {a.structure: a for a in c.alternatives}
        pts = []
        for a in r["alternatives"]:
            alt = by_structure.get(a.get("structure"))
            if alt is None or "ms" not in a:
                continue
            t = plan_cost(alt.plan, c.program, alt.schedules, dev).time * 1e3
            pts.append((t, a["ms"]))
        if len(pts) < 2:
            continue
        preds += [p for p, _ in pts]
        meas += [m for _, m in pts]
        logerr += [abs(math.log(p / m)) for p, m in pts]
        best = min(m for _, m in pts)
        chosen = min(pts, key=lambda t: t[0])[1]
        within.append(chosen <= 1.10 * best)
    return spearman(preds, meas), sum(logerr) / max(1, len(logerr)), sum(within), len(within), len(preds)


def main(argv):
    rows = load_points(argv)
    compiled = {}
    for r in rows:
        key = (r["op"], r["L"])
        if key in compiled:
            continue
        case = Case(r["op"], r["L"])
        cap = capture(case.fn, *case.inputs("meta"))
        compiled[key] = compile_program(cap.program, Options(device=H200))
    print(f"{len(rows)} measured (op, L) with alternatives")
    base = evaluate(rows, H200, compiled)
    print(f"current constants: spearman {base[0]:.3f}, mean |log err| {base[1]:.2f}, "
          f"chosen within 10%: {base[2]}/{base[3]} over {base[4]} points")
    best = None
    for stream, launch, overlap in itertools.product((25e9, 38e9, 50e9), (4e-6, 8e-6, 12e-6), (0.25, 0.5)):
        dev = replace(H200, sm_stream_bytes_per_s=stream, launch_s=launch, overlap=overlap)
        s, le, w, n, _ = evaluate(rows, dev, compiled)
        score = (w, s, -le)
        if best is None or score > best[0]:
            best = (score, stream, launch, overlap, s, le, w, n)
    _, stream, launch, overlap, s, le, w, n = best
    print(f"best grid point: sm_stream {stream / 1e9:.0f} GB/s, launch {launch * 1e6:.0f} µs, overlap {overlap}: "
          f"spearman {s:.3f}, mean |log err| {le:.2f}, chosen within 10%: {w}/{n}")


if __name__ == "__main__":
    main(sys.argv[1:])
