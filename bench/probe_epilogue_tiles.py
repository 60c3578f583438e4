"""Probe: does a GEMM that also writes a materialised operand from its epilogue need smaller tiles?
RMSNorm → matmul's saved backward (x̂ written by the dY·Wᵀ GEMM's epilogue) timed per kernel with
the model's tiles for that GEMM and with 128×256, beside the plan without the epilogue store. GPU only.

    python bench/probe_epilogue_tiles.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beyond.programs import rmsnorm_matmul

import neptune_eq
from neptune_eq import autograd


def kernel_ms(prog, feed, reps: int = 20) -> dict[str, float]:
    for _ in range(3):
        prog.run(feed)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            prog.run(feed)
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / reps / 1e3 for e in prof.key_averages()
            if e.key.startswith("nq_") and e.device_time_total > 0}


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 8192, generator=g, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(8192, generator=g, device="cuda")).bfloat16()
    W = (torch.randn(8192, 8192, generator=g, device="cuda") * 8192 ** -0.5).bfloat16()
    neptune_eq.compile(rmsnorm_matmul, x, w, W)
    t = next(iter(autograd._TRAINING.values()))
    back = t.saved
    bwd = t.compile_fn(back.program)
    feed = {"x": x, "w": w, "W": W, "grad_out0": torch.randn(4096, 8192, generator=g, device="cuda").bfloat16(),
            "saved_0": (x.float() ** 2).sum(1)}
    feed = {n: feed[n] for n in back.program.inputs}
    epi = [a for a in bwd.alternatives if any(st.target in a.plan.buffers and a.plan.buffers[st.target].operand
                                              for k in a.plan.kernels for st in k.epilogue)]
    mapped = [a for a in bwd.alternatives if any(b.operand for b in a.plan.buffers.values()) and a not in epi]
    for label, a in (("epilogue x̂, model's tiles", epi[0]), ("x̂ by a map pass", mapped[0])):
        prog = bwd.pin(a.id)
        print(f"{label}: {a.structure}\n  predicted {a.predicted_time * 1e6:.0f} µs; measured per kernel (ms):",
              {k: round(v, 3) for k, v in kernel_ms(prog, feed).items()}, flush=True)
    a = epi[0]
    scheds = list(a.schedules)
    gemm = next(i for i, k in enumerate(a.plan.kernels) if any(st.target in a.plan.buffers and
                                                               a.plan.buffers[st.target].operand for st in k.epilogue))
    m, n = [ax for ax in a.plan.kernels[gemm].grid]
    scheds[gemm] = replace(scheds[gemm].with_tiles(**{m: 128, n: 256}), num_warps=8, num_stages=3)
    prog = bwd.pin(a.id)
    prog.schedules["cuda"] = scheds
    print("epilogue x̂, 128×256: measured per kernel (ms):",
          {k: round(v, 3) for k, v in kernel_ms(prog, feed).items()}, flush=True)


if __name__ == "__main__":
    main()
