"""Dump the plans the compiler picks for the ten Neptune operators (forward at their largest sizes, and
their saved backward at L 4096) and bench/beyond's programs (the top 5 alternatives with predictions):
a change to the search, the masks or the cost model shows up as a diff of two dumps.

    TRITON_INTERPRET=1 .venv/bin/python scripts/plan_dump.py > /tmp/plans_before.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "bench" / "beyond")]

from cases import DC_SIZES, HEADS, PF_SIZES, Case, saved_backward  # noqa: E402
from programs import cases  # noqa: E402

import neptune_eq  # noqa: E402


def show(comp, top: int = 5) -> None:
    for k, alt in enumerate(comp.alternatives[:top]):
        print(f"  #{k} {alt.predicted_time * 1e6:10.1f} us  {alt.structure}", flush=True)
    for s in comp._schedules("cuda"):
        print(f"    schedule {s}", flush=True)


def main() -> None:
    for op in HEADS:
        L = PF_SIZES[-1] if op.endswith("_pf") else DC_SIZES[-1]
        c = Case(op, L)
        print(f"{op} L={L}", flush=True)
        show(neptune_eq.compile(c.fn, *c.inputs("cpu")).program)
        if op.endswith("_pf"):
            c = Case(op, 4096)
            print(f"{op} L=4096 saved backward", flush=True)
            show(saved_backward(c.fn, *c.inputs("cpu"))[1])
    for bc in cases():
        print(f"beyond {bc.program.name} {bc.label if hasattr(bc, 'label') else ''}", flush=True)
        show(neptune_eq.compile(bc.program.fn, *bc.inputs("cpu")).program)


if __name__ == "__main__":
    main()
