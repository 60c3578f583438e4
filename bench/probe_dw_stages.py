"""Probe: linear cross-entropy's backward chunk (2048 tokens, 4096 -> 128256, bf16), per kernel, with
its dW GEMM (K = the chunk's tokens, the fp32 gradient accumulator read in the epilogue) at 128 × 128
in 2, 3 and 4 pipeline stages and 128 × 256 in 2 and 3 (the model's shared-memory count had added the
epilogue's accumulator tile to the pipeline's buffers, leaving 128 × 256 two). GPU only.

    python bench/probe_dw_stages.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beyond.programs import linear_ce
from host_profile import schedule_times

import neptune_eq
from neptune_eq import autograd


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(8192, 4096, generator=g, device="cuda").bfloat16()
    W = (torch.randn(128256, 4096, generator=g, device="cuda") * 4096 ** -0.5).bfloat16()
    t = torch.randint(0, 128256, (8192,), generator=g, device="cuda")
    neptune_eq.compile(linear_ce, h, W, t)
    q, tr = next(iter(autograd._TRAINING.items()))
    back = autograd._compiled(f"{q}:saved", tr.saved.program, tr.compile_fn)
    chunk = back.chunk_compiled
    prog = chunk.program
    n = prog.axes["i"]
    feed = {"h": h[:n], "W": W, "target": t[:n], "grad_out0": torch.ones((), device="cuda"),
            "saved_1": torch.full((n,), 4.0, device="cuda"), "saved_2": torch.full((n,), 3e4, device="cuda"),
            "saved_4": torch.full((), 8192.0, device="cuda"),
            "acc_grad_W": torch.zeros(128256, 4096, device="cuda")}
    feed = {k: feed[k] for k in prog.inputs}
    a = chunk.alternative
    print(a.structure, flush=True)
    gemm = len(a.plan.kernels) - 1
    print("dW kernel", a.plan.kernels[gemm].name, a.schedules[gemm], flush=True)
    rows, cols = [x for x in a.plan.kernels[gemm].grid if a.schedules[gemm].tiles.get(x, 1) > 1]
    for rt, ct, stages in ((128, 128, 2), (128, 128, 3), (128, 128, 4), (128, 256, 2), (128, 256, 3)):
        scheds = list(a.schedules)
        scheds[gemm] = replace(scheds[gemm].with_tiles(**{rows: rt, cols: ct}), num_stages=stages)
        times = schedule_times(chunk, a.id, scheds, feed, f"{rt}×{ct}, stages {stages}")
        if times is None:
            continue
        mine = [(name[-30:], round(us)) for name, us, _ in times if name.startswith("nq_")]
        print(f"{rows} {rt} × {cols} {ct}, stages {stages}:", mine, flush=True)


if __name__ == "__main__":
    main()
