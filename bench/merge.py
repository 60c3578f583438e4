"""Merge rows of several runs into one report. Every row (one operator at one size) comes whole from
one run, so each implementation in it was measured beside its peers in one process.

    python bench/merge.py OUT_DIR OP=RUN.json [OP:L,L=RUN.json ...]   # OP: all its sizes; OP:L,L: those
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cases import HEADS  # noqa: E402
from run import write_results  # noqa: E402


def main(argv):
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    rows, metas, sources = [], [], {}
    for spec in argv[1:]:
        sel, path = spec.split("=", 1)
        op, _, sizes = sel.partition(":")
        want = {int(x) for x in sizes.split(",")} if sizes else None
        data = json.loads(Path(path).read_text())
        metas.append(data["meta"])
        picked = [r for r in data["rows"] if r["op"] == op and (want is None or r["L"] in want)]
        if want is not None and {r["L"] for r in picked} != want:
            raise SystemExit(f"{path} lacks {op} at {sorted(want - {r['L'] for r in picked})}")
        rows += picked
        sources[sel] = Path(path).name
    meta = dict(metas[0])
    assert all(m["device"] == meta["device"] and m["torch"] == meta["torch"] for m in metas), "mixed devices"
    meta["sources"] = sources
    order = list(HEADS)  # the paper's order of the operators
    rows.sort(key=lambda r: (order.index(r["op"]), r["L"]))
    md = write_results(out, rows, meta, footer="\nRows taken from: "
                       + ", ".join(f"{op} ← {src}" for op, src in sources.items()) + "\n")
    from plot import plot

    plot(out / "results.json", out / "results.png")
    print(md)


if __name__ == "__main__":
    main(sys.argv[1:])
