"""Probe (session 66), on any host: do schedule.FMA_*'s bounds tell which IEEE schedules of a float32
attention pass ptxas spills? Compiles the one-pass kernel of an fp32 attention (head dim --d) for sm_90
with Triton 3.6's ptxas at each schedule given and prints extract/onchip.fma_dots_fit's verdict beside
ptxas's registers and stack. The bounds were fitted at d 128; d 64 is out of sample.

    pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36 TRITON_INTERPRET=0 python bench/probe_fma_bounds.py --d 64 64,32,8 128,32,8 32,32,4
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from neptune_eq.extract.onchip import fma_dots_fit
from probe_wgmma_serial import advisories
from ptxas_check import compile_kernel

from neptune_eq import dsl as ne
from neptune_eq.library import attention
from neptune_eq.lower.triton import write_module
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("schedules", nargs="+", help="rows,keys,warps")
    a = ap.parse_args()
    P = ne.program("fp32_attention")
    b, h, i, j, d, e = P.axes(b=2, h=16, i=2048, j=2048, d=a.d, e=a.d)
    q, k, v = P.input("q", b, h, i, d), P.input("k", b, h, j, d), P.input("v", b, h, j, e)
    P.output("o", attention(q, k, v, key_axis=j, dim_axis=d, scale=a.d ** -0.5), (b, h, i, e))
    program = P.build()
    prog = compile_ir(program, Options(float32_products=("ieee",)))
    alt = next(x for x in prog.alternatives if len(x.plan.kernels) == 1 and x.structure.startswith("1 kernel, rolling"))
    kp, base = alt.plan.kernels[0], alt.schedules[0]
    for spec in a.schedules:
        rows, keys, warps = map(int, spec.split(","))
        sc = replace(base, tiles={**base.tiles, "i": rows, "j": keys}, num_warps=warps, num_stages=2)
        src, ks = write_module(alt.plan, program, [sc], "cuda", "probe")
        path = Path(tempfile.mkdtemp()) / "module.py"
        path.write_text(src)
        spec_ = importlib.util.spec_from_file_location("module", path)
        module = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(module)
        used = [x for x in advisories(compile_kernel(module, ks[0], dict(program.axes)).asm["ptx"]) if "Used" in x]
        verdict = "within" if fma_dots_fit(kp, sc, program, alt.plan) else "past"
        print(f"d {a.d} rows {rows} keys {keys} warps {warps}: {verdict} the bounds; ptxas: {used}", flush=True)


if __name__ == "__main__":
    main()
