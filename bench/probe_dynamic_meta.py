"""Probe (issue 14): is a dynamic compile's kernel at a new length the same kernel as the static
compile's at that length, and is the time gap between them the kernel's or the order of the runs?

For each (operator, L): the dynamic function compiled at L − 7, the static at L, both called at L
and checked against each other; then the Triton kernels each launched (every compiled variant of
the generated nq_* functions, found in their JIT caches): warps, stages, shared memory, registers,
spills; then the device time of each (profiler, L2 flushed) in rounds that alternate which runs first.

    python bench/probe_dynamic_meta.py softcap_pf:12000 window_pf:3000 [--rounds 4]
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from cases import Case  # noqa: E402
from dynamic_lengths import OFFSET, _compile, _kernel_us  # noqa: E402


def launched_kernels() -> list[str]:
    """One line per compiled variant of every generated kernel (nq_*) in this process."""
    from triton.runtime.jit import JITFunction

    out = []
    for obj in gc.get_objects():
        if isinstance(obj, JITFunction) and obj.__name__.startswith("nq_"):
            for caches in getattr(obj, "device_caches", {}).values():
                for key, ck in caches[0].items():
                    md = ck.metadata
                    out.append(f"{obj.__name__} [{str(key)[:60]}...]: warps {md.num_warps}, stages {md.num_stages}, "
                               f"shared {md.shared}, registers {ck.n_regs}, spills {ck.n_spills}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+", help="op:L")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    for spec in a.cases:
        op, L = spec.split(":")
        L = int(L)
        dyn, static = _compile(op, L)
        xs = Case(op, L).inputs("cuda")
        for _ in range(3):
            dyn(*Case(op, L - OFFSET).inputs("cuda"))
        d, s = dyn(*xs), static(*xs)
        print(f"{op} L={L}: max |dynamic - static| = {(d.float() - s.float()).abs().max().item():.3g}", flush=True)
        for line in launched_kernels():
            print("  " + line)
        times = {"dynamic": [], "static": []}
        for r in range(a.rounds):
            order = (("dynamic", dyn), ("static", static)) if r % 2 == 0 else (("static", static), ("dynamic", dyn))
            for name, prog in order:
                times[name].append(_kernel_us(prog, xs))
        for name, ts in times.items():
            print(f"  {name:8s} kernel µs per round: " + "  ".join(f"{t:.1f}" for t in ts))
        ratio = sorted(x / y for x, y in zip(times["dynamic"], times["static"]))
        print(f"  dynamic / static per round: {', '.join(f'{x:.3f}' for x in ratio)}", flush=True)
        del dyn, static
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
