"""Probe (issue 13): which generated attention kernels does ptxas compile with their wgmma serialized
(its advisory C7515: "wgmma.mma_async instructions are serialized due to ...")? Each kernel of the
forward and of the saved backward of the operators given, compiled by Triton for this GPU; its PTX is
compiled again by Triton's bundled ptxas with -v, and the advisory lines are printed with the
kernel's registers. GPU only.

    python bench/probe_wgmma_serial.py --ops causal_pf global_pf [--L 4096]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import Case, saved_backward
from probe_bwd_rows import feed_for

import neptune_eq

PTXAS = Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"


def advisories(ptx: str) -> list[str]:
    """ptxas's performance advisories (C75xx) and its register / stack line for one kernel's PTX."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        Path(path).write_text(ptx)
        for ptxas in (PTXAS, PTXAS.parent / "ptxas-blackwell"):  # (a newer Triton's PTX needs the newer one)
            out = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.cubin")],
                                 capture_output=True, text=True)
            if "Unsupported .version" not in out.stderr or not (PTXAS.parent / "ptxas-blackwell").exists():
                break
    return [ln.split(": ", 1)[-1][:150] for ln in (out.stdout + out.stderr).splitlines()
            if "(C75" in ln or "Used " in ln]


def report(label: str, compiled: list) -> None:
    for ck in compiled:
        adv = [a for a in advisories(ck.asm["ptx"]) if "(C75" in a]
        print(f"  {label} {ck.name}: {ck.n_regs} registers, {ck.n_spills} spills; "
              + ("; ".join(adv) if adv else "wgmma not serialized"), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="*", default=["causal_pf"])
    ap.add_argument("--L", type=int, default=4096)
    a = ap.parse_args()
    for op in a.ops:
        c = Case(op, a.L)
        xs = c.inputs("cuda")
        fwd = neptune_eq.compile(c.fn, *xs)
        compiled: list = []
        fwd.program.launcher("cuda")(fwd.captured.inputs(*xs), None, compiled)
        report(f"{op} forward", compiled)
        back, comp = saved_backward(c.fn, *c.inputs("cpu"))
        compiled = []
        comp.launcher("cuda")(feed_for(back), None, compiled)
        report(f"{op} backward", compiled)


if __name__ == "__main__":
    main()
