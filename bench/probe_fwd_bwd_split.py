"""Forward and backward of attention timed apart, neptune_eq beside FlexAttention, and the CUDA kernels of
one fwd+bwd step by total time (torch.profiler). GPU only; run from bench/:

    python probe_fwd_bwd_split.py [--ops causal_pf alibi_pf] [--L 16384]
"""

from __future__ import annotations

import argparse

import torch
import triton.testing
from cases import Case
from grad_attention import implementations, leaves


def _kernels(step, top: int = 8) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda e: -e.device_time_total)
    for e in rows[:top]:
        print(f"      {e.device_time_total / 1e3:8.3f} ms  x{e.count:<3d} {e.key[:100]}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="*", default=["causal_pf"])
    ap.add_argument("--L", type=int, default=16384)
    args = ap.parse_args()
    for op in args.ops:
        case = Case(op, args.L)
        xs = leaves(case)
        for name, (fn, _) in implementations(case, *xs, ("neptune_eq", "flex")).items():
            out = fn()
            g = torch.randn_like(out)
            fwd = triton.testing.do_bench(lambda: fn(), rep=300)  # noqa: B023
            both = triton.testing.do_bench(lambda: fn().backward(g), rep=300)  # noqa: B023
            print(f"{op} {name}: fwd {fwd:.2f} ms, fwd+bwd {both:.2f}, bwd {both - fwd:.2f}", flush=True)
            _kernels(lambda: fn().backward(g))  # noqa: B023


if __name__ == "__main__":
    main()
