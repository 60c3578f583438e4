"""Per-kernel GPU times (torch.profiler), registers and spills of an operator's forward and saved
backward at L = 16384. usage: op [op ...]"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

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


def profile_op(op: str) -> None:
    c = Case(op, 16384)
    cap = capture(c.fn, *c.inputs("cpu"))
    for label, prog in (("fwd", cap.program), ("bwd", backward_program(cap.program, saved=True).program)):
        comp = compile_ir(prog, Options())
        print(op, label, comp.alternative.structure, flush=True)
        for k, s in zip(comp.alternative.plan.kernels, comp.alternative.schedules):
            print("   ", k.name, {a: t for a, t in s.tiles.items() if t > 1}, "w", s.num_warps, "s", s.num_stages)
        feed = {n: random_feed(n, tuple(prog.axes[a] for a in s.axes), s.dtype) for n, s in prog.inputs.items()}
        comp.run(feed)
        torch.cuda.synchronize()
        for m in comp._modules.values():
            for ck in getattr(m, "_runners", {}).values():
                print("    regs", getattr(ck, "name", "?"), "n_regs", getattr(ck, "n_regs", "?"),
                      "n_spills", getattr(ck, "n_spills", "?"))
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(3):
                comp.run(feed)
            torch.cuda.synchronize()
        for e in p.key_averages():
            if "nq_" in e.key:
                print(f"   {e.key[:60]:60s} {e.device_time / 1e3:.2f} ms avg x{e.count}", flush=True)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        profile_op(name)
