"""Per-kernel GPU times (torch.profiler, mean of 3 calls) of the saved backward of Neptune operators at
L = 16384, fed random inputs of the right shapes (timing only: the gradients are checked elsewhere).
Run from the repository root on the GPU: python <this file> gqa_pf window_pf ..."""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")
from cases import Case

from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir


def kernel_times(op: str) -> None:
    case = Case(op, 16384)
    cap = capture(case.fn, *[x.cpu() for x in case.inputs("cuda")])
    back = backward_program(cap.program, saved=True).program
    comp = compile_ir(back, Options())
    print(op, comp.alternative.structure, flush=True)
    feed = {}
    for n, spec in back.inputs.items():
        x = torch.randn(tuple(back.axes[a] for a in spec.axes), device="cuda").abs()
        feed[n] = (x * 0.1 + 1 if n.startswith("saved") else x).to(getattr(torch, spec.dtype))
    comp.run(feed)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            comp.run(feed)
        torch.cuda.synchronize()
    for e in p.key_averages():
        if e.key.startswith("nq_"):
            print(f"   {e.key:40s} {e.device_time / 1e3:.2f} ms avg x{e.count}", flush=True)


if __name__ == "__main__":
    for op in sys.argv[1:]:
        kernel_times(op)
