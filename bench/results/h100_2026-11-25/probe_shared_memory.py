"""Shared memory: shared_memory.shared_bytes (the model) beside what Triton requires, for attention's forward
and its saved backward (causal, d 128) over row / key tiles of 64 and 128, 1-4 stages, 4 and 8 warps.
A launch over the device's limit raises "out of resource: shared memory, Required: N"; one that fits
runs. Run from the repository root on the GPU: python <this file> out.json"""

import itertools
import json
import sys
import time
from dataclasses import replace

import torch

sys.path.insert(0, "bench")
from cases import Case

from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir
from neptune_eq.shared_memory import shared_bytes


def feed_of(prog) -> dict:
    feed = {}
    for n, spec in prog.inputs.items():
        shape, dt = tuple(prog.axes[a] for a in spec.axes), getattr(torch, spec.dtype)
        x = torch.randn(shape, device="cuda") if dt.is_floating_point else torch.zeros(shape, device="cuda")
        feed[n] = x.to(dt)
    return feed


def probe(label: str, prog, rows: list) -> None:
    comp = compile_ir(prog, Options())
    alt, feed = comp.alternative, feed_of(prog)
    base = list(alt.schedules)
    for ki, k in enumerate(alt.plan.kernels):
        big = [a for a in base[ki].tiles if prog.axes[a] >= 1024 and base[ki].tiles[a] > 1]
        for vals, st, w in itertools.product(itertools.product((64, 128), repeat=len(big)), (1, 2, 3, 4), (4, 8)):
            s = replace(base[ki].with_tiles(**dict(zip(big, vals))), num_stages=st, num_warps=w)
            comp.schedules["cuda"] = [s if i == ki else b for i, b in enumerate(base)]
            comp._modules.clear()
            rec = {"case": label, "kernel": k.name, "tiles": dict(s.tiles), "stages": st, "warps": w,
                   "model": shared_bytes(k, prog, alt.plan, s)}
            try:
                comp.run(feed)
                torch.cuda.synchronize()
                rec["launched"] = True
            except Exception as e:
                rec["error"] = str(e)[-160:]
            print(rec, flush=True)
            rows.append(rec)
    comp.schedules["cuda"] = base


def main() -> None:
    t, rows = time.time(), []
    case = Case("causal_pf", 2048)
    cap = capture(case.fn, *[x.cpu() for x in case.inputs("cuda")])
    probe("causal fwd", cap.program, rows)
    probe("causal bwd", backward_program(cap.program, saved=True).program, rows)
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)
    print("took", time.time() - t)


if __name__ == "__main__":
    main()
