"""Sweep the tiles, warps, stages (and warp specialisation) of one kernel of an operator's saved
backward at L = 16384: the whole backward's do_bench median per variant, the other kernels at their
defaults, with the variant's registers and spills. usage: CFGS="j,i,warps,stages,ws ..." op ki"""

import os
import sys
import time
from dataclasses import replace

import torch
import triton

sys.path.insert(0, "bench")
from cases import Case

from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir


def random_feed(name, shape, dtype):
    """Timing inputs: saved row statistics small and positive (the row sums at least 1)."""
    t = (torch.randn(shape, device="cuda") * (0.1 if name.startswith("saved") else 1)).abs()
    return t.to(getattr(torch, dtype)) + (1 if name == "saved_1" else 0)


def main(op: str, ki: int, grid: list[tuple[int, ...]]) -> None:
    c = Case(op, 16384)
    cap = capture(c.fn, *c.inputs("cpu"))
    back = backward_program(cap.program, saved=True).program
    comp = compile_ir(back, Options())
    alt = comp.alternative
    print(op, alt.structure, flush=True)
    feed = {n: random_feed(n, tuple(back.axes[a] for a in s.axes), s.dtype) for n, s in back.inputs.items()}
    base = list(comp._schedules("cuda"))
    for i, s in enumerate(base):
        tiles = {a: t for a, t in s.tiles.items() if t > 1}
        print(" default", i, alt.plan.kernels[i].name, tiles, s.num_warps, s.num_stages, flush=True)

    def timeit(scheds):
        comp.schedules["cuda"] = scheds
        comp._modules.clear()
        comp.run(feed)
        torch.cuda.synchronize()
        return triton.testing.do_bench(lambda: comp.run(feed), warmup=50, rep=300, return_mode="median")

    print(" base", round(timeit(base), 3), flush=True)
    s0 = base[ki]
    a0, a1 = [a for a, t in s0.tiles.items() if t >= 64 and a not in ("d", "e")][:2]
    for t0, t1, w, st, ws in grid:
        s = replace(s0, tiles={**s0.tiles, a0: t0, a1: t1}, num_warps=w, num_stages=st, warp_specialize=bool(ws))
        sch = list(base)
        sch[ki] = s
        t = time.time()
        label = f"{a0}{t0} {a1}{t1} w{w} s{st} ws{ws}"
        try:
            ms = timeit(sch)
        except Exception as e:  # a variant Triton cannot compile
            print(f"  {label}: FAIL {type(e).__name__} {str(e)[:80]}", flush=True)
            continue
        regs = [(getattr(ck, "n_regs", "?"), getattr(ck, "n_spills", "?")) for m in comp._modules.values()
                for ck in getattr(m, "_runners", {}).values() if getattr(ck, "name", "").endswith(f"_k{ki}")]
        print(f"  {label}: {ms:.3f} ms regs/spills {regs} ({time.time() - t:.0f}s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), [tuple(int(x) for x in c.split(",")) for c in os.environ["CFGS"].split()])
