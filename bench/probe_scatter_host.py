"""Where a scatter of rows spends its time on the GPU (session 73): the centre loss's training step
with the Triton kernel of atomic adds against torch's sorted index_put_ (deterministic mode), and the
scatter alone — kernel against index_add_, device time and the call's host time.

    python bench/probe_scatter_host.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_seventh import _center_make, center_loss

import neptune_eq
from neptune_eq.lower.scatter_rows import scatter_rows


def host_us(fn, n=200) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    x, c, lab = _center_make("cuda", g, False)
    prog = neptune_eq.compile(center_loss, x, c, lab)
    xs, cs = x.clone().requires_grad_(), c.clone().requires_grad_()

    def step():
        xs.grad = cs.grad = None
        prog(xs, cs, lab).backward()

    for det in (False, True):
        torch.use_deterministic_algorithms(det)
        step()
        ms = triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")
        print(f"centre loss step, deterministic={det}: {ms * 1e3:.1f} us device-timed, host {host_us(step):.1f} us")
    torch.use_deterministic_algorithms(False)
    rows = torch.randn(65536, 512, device="cuda")
    at = lab.clone()
    acc = torch.zeros(10001, 512, device="cuda")
    for name, fn in (("triton scatter_rows", lambda: scatter_rows(acc, at, rows, 1)),
                     ("index_add_", lambda: acc.index_add_(0, at, rows))):
        fn()
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        print(f"{name}: {ms * 1e3:.1f} us device-timed, host {host_us(fn):.1f} us")


if __name__ == "__main__":
    main()
