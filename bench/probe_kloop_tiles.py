"""Probe: what a K-loop kernel's row tile costs, and what L2 delivers to the SMs. GPU only.

1. L2 → SM bandwidth (microbench.l2_read_rates: every program re-reads one `--l2-mb` buffer),
   beside a device copy of 1 GiB (HBM).
2. Linear cross-entropy's training forward (8192 tokens, hidden 4096, vocabulary 128256, bf16): its
   K-loop kernel (the logits GEMM inside the vocabulary loop) under several (rows, loop tile, K tile,
   warps, stages), each timed by the profiler and priced by the cost model. A program of m rows reads
   the whole weight once from L2, so halving m doubles the weight's L2 reads.

    python bench/probe_kloop_tiles.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beyond.programs import linear_ce
from host_profile import schedule_times
from microbench import l2_read_rates
from neptune_eq.extract.cost import plan_cost

import neptune_eq
from neptune_eq import autograd
from neptune_eq.device import from_torch


def l2_bandwidth(mb: int) -> dict:
    out = {k: v / 1e12 for k, v in l2_read_rates(mb).items()}
    big = torch.empty(1 << 30, dtype=torch.int8, device="cuda")
    dst = torch.empty_like(big)
    ms = triton.testing.do_bench(lambda: dst.copy_(big), warmup=20, rep=200)
    out["hbm_copy_TBps"] = 2 * big.numel() / (ms * 1e-3) / 1e12
    return out


SWEEP = [  # rows, loop tile, K tile, warps, stages
    (64, 256, 64, 8, 2), (64, 256, 64, 8, 3), (128, 256, 64, 8, 2), (128, 256, 64, 8, 3),
    (128, 256, 32, 8, 4), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (64, 128, 64, 4, 3), (256, 128, 64, 8, 3),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--l2-mb", type=int, default=16)
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    result["l2_TBps"] = l2_bandwidth(args.l2_mb)
    print("L2 → SM (TB/s):", result["l2_TBps"], flush=True)

    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(8192, 4096, generator=g, device="cuda").bfloat16()
    W = (torch.randn(128256, 4096, generator=g, device="cuda") * 4096 ** -0.5).bfloat16()
    t = torch.randint(0, 128256, (8192,), generator=g, device="cuda")
    neptune_eq.compile(linear_ce, h, W, t)
    tr = next(iter(autograd._TRAINING.values()))
    fwd = tr.compile_fn(tr.forward)
    a = fwd.alternative
    feed = {"h": h.detach(), "W": W, "target": t}
    feed = {n: feed[n] for n in fwd.program.inputs}
    dev = from_torch()
    ki = next(i for i, s in enumerate(a.schedules) if s.tiles.get("d", 4096) < 4096)
    k = a.plan.kernels[ki]
    rows = next(x for x in k.grid if s_tiles(a, ki, x) > 1)
    loop = k.passes()[0].axis
    print(f"plan: {a.structure}\nK-loop kernel {k.name}: rows {rows}, loop {loop}, default {a.schedules[ki]}",
          flush=True)
    result["plan"] = a.structure
    result["runs"] = []
    for bm, bn, bk, warps, stages in SWEEP:
        scheds = list(a.schedules)
        scheds[ki] = replace(scheds[ki].with_tiles(**{rows: bm, loop: bn, "d": bk}), num_warps=warps,
                             num_stages=stages)
        if ki + 1 < len(scheds):  # the combine kernel follows the partial kernel's row tile
            scheds[ki + 1] = scheds[ki + 1].with_tiles(**{x: v for x, v in scheds[ki].tiles.items()
                                                         if x in a.plan.kernels[ki + 1].grid})
        pred = plan_cost(a.plan, fwd.program, scheds, dev).kernels[ki]
        times = schedule_times(fwd, a.id, scheds, feed, f"{bm}×{bn}×{bk} w{warps} s{stages}")
        if times is None:
            continue
        us = next((t for name, t, _ in times if name.endswith(k.name)), None)
        row = {"tiles": [bm, bn, bk], "warps": warps, "stages": stages, "kernel_us": us,
               "predicted_us": pred.time * 1e6, "pred_tc_us": pred.t_tc * 1e6, "pred_mem_us": pred.t_mem * 1e6,
               "requested_GB": pred.requested_bytes / 1e9}
        result["runs"].append(row)
        print(row, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


def s_tiles(a, ki, axis):
    return a.schedules[ki].tiles.get(axis, 1)


if __name__ == "__main__":
    main()
