"""Host time of a training step (forward + backward) beside the peers, and where neptune_eq's goes.

A step's host time is measured with steps issued back to back on small inputs (the GPU then waits
on the host, not the other way round); a cProfile of neptune_eq's steps lists the Python functions
by their own time. GPU only.

    python bench/grad_host.py [--only rmsnorm_mm] [--steps 200]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beyond.programs import linear_ce, rmsnorm_matmul
from host_profile import host_us, profile_calls

import neptune_eq


def _small(name: str, g: torch.Generator):
    """Inputs small enough that a step's kernels take less time than its host work."""
    if name == "rmsnorm_mm":
        x = torch.randn(64, 256, generator=g, device="cuda").bfloat16()
        w = torch.randn(256, generator=g, device="cuda").bfloat16()
        W = torch.randn(256, 256, generator=g, device="cuda").bfloat16()
        return rmsnorm_matmul, (x, w, W), (0, 1, 2)
    h = torch.randn(64, 256, generator=g, device="cuda").bfloat16()
    W = torch.randn(1024, 256, generator=g, device="cuda").bfloat16()
    t = torch.randint(0, 1024, (64,), generator=g, device="cuda")
    return linear_ce, (h, W, t), (0, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=["rmsnorm_mm", "linear_ce"])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    for name in args.only:
        fn, xs, diff = _small(name, torch.Generator(device="cuda").manual_seed(0))
        peers = {"neptune_eq": neptune_eq.compile(fn, *xs), "eager": fn, "compile": torch.compile(fn)}
        for label, f in peers.items():
            leaves = [x.detach().clone().requires_grad_() if k in diff else x for k, x in enumerate(xs)]

            def step(f=f, leaves=leaves, diff=diff):
                for k in diff:
                    leaves[k].grad = None
                f(*leaves).sum().backward()

            for _ in range(5):  # the first calls compile
                step()
            print(f"{name} {label}: {host_us(step, args.steps):.0f} µs host per fwd+bwd step", flush=True)
            if label == "neptune_eq":
                profile_calls(step, args.steps, 25)


if __name__ == "__main__":
    main()
