"""Probe (H100, 2026-11-24): the cost model's first alternatives of row softmax / log-softmax, resident
rows among them, compiled by neptune_eq and timed beside a device copy (default schedules, no tuning);
each checked against float64 first. Results in probe_resident_plans.json.

    python probe_resident_plans.py OUT.json
"""

import json
import sys
import time

import torch
import triton

from neptune_eq.device import H100
from neptune_eq.frontend import capture
from neptune_eq.runtime import Options, compile_ir

FNS = {"softmax": lambda x: torch.softmax(x, -1), "log_softmax": lambda x: torch.log_softmax(x, -1)}
CASES = [("log_softmax", 4096, 65536, "float16"), ("softmax", 4096, 65536, "float16"),
         ("softmax", 8192, 32768, "float16"), ("log_softmax", 8192, 32768, "float16"),
         ("softmax", 4096, 65536, "float32"), ("softmax", 2048, 131072, "float16"),
         ("log_softmax", 16384, 16384, "bfloat16")]


def measure(name: str, M: int, N: int, dt: str) -> dict:
    t0 = time.time()
    dtype = getattr(torch, dt)
    prog = capture(FNS[name], torch.randn(8, 64, dtype=dtype)).program
    prog = prog.with_extents(dict(zip(list(prog.axes), (M, N))))
    cp = compile_ir(prog, Options(device=H100))
    x = torch.randn(M, N, device="cuda", dtype=dtype) * 3
    ref = FNS[name](x.double())
    y = torch.empty_like(x)
    row = dict(program=name, M=M, N=N, dtype=dt, compile_s=time.time() - t0, alts=[],
               copy_us=triton.testing.do_bench(lambda: y.copy_(x), rep=200) * 1e3)
    picks = list(range(min(4, len(cp.alternatives))))
    picks += [a.id for a in cp.alternatives[4:16] if "resident" in a.structure][:2]
    inp = {next(iter(prog.inputs)): x}
    for i in picks:
        a, p = cp.alternatives[i], cp.pin(i)
        err = (next(iter(p.run(inp).values())).double() - ref).abs().max().item()
        us = triton.testing.do_bench(lambda p=p: p.run(inp), rep=200) * 1e3
        row["alts"].append(dict(id=i, structure=a.structure, predicted_us=a.cost.time * 1e6, us=us,
                                err=err, pct_copy=row["copy_us"] / us))
    row["eager_us"] = triton.testing.do_bench(lambda: FNS[name](x), rep=200) * 1e3
    return row


def main(path: str) -> None:
    out = []
    for case in CASES:
        out.append(measure(*case))
        torch.cuda.empty_cache()
        with open(path, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
