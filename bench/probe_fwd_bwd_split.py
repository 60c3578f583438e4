"""Forward and backward of attention timed apart, neptune_eq beside FlexAttention, and the CUDA kernels of
one fwd+bwd step (host_profile.kernel_times). GPU only; run from bench/:

    python probe_fwd_bwd_split.py [--ops causal_pf alibi_pf] [--L 16384]
"""

from __future__ import annotations

import argparse

import torch
import triton.testing
from cases import Case
from grad_attention import implementations, leaves
from host_profile import kernel_times


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
            for key, us, n in kernel_times(lambda: fn().backward(g), reps=3)[:8]:  # noqa: B023
                print(f"      {us / 1e3:8.3f} ms  x{n:<3d} {key[:100]}", flush=True)


if __name__ == "__main__":
    main()
