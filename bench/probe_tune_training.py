"""Probe (issue 13): does prog.tune() of a training call keep fwd+bwd at least as fast as the untuned
default? Times fwd+bwd untuned, tunes with progress shown (every trial: kernel, schedule, µs), then
times fwd+bwd again, in one process; gradients of both checked against float64 at a small length first.

    python bench/probe_tune_training.py causal_pf [--L 16384]
"""

from __future__ import annotations

import argparse

import torch
import triton.testing
from cases import Case
from grad_attention import check, grads, leaves, tolerance

import neptune_eq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("op")
    ap.add_argument("--L", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    err = check(a.op, 1024, print, ("neptune_eq",))["neptune_eq"]
    assert err <= tolerance("neptune_eq"), err
    case = Case(a.op, a.L)
    xs = leaves(case)
    g = torch.randn(case.inputs("cuda")[0].shape, device="cuda", dtype=case.dtype)
    prog = neptune_eq.compile(case.fn, *xs)

    def bench():
        return triton.testing.do_bench(lambda: grads(lambda: prog(*xs), xs, g), warmup=5, rep=50,
                                       return_mode="median")

    grads(lambda: prog(*xs), xs, g)
    before = [bench() for _ in range(a.rounds)]
    print(f"{a.op} L={a.L} untuned fwd+bwd ms: " + "  ".join(f"{t:.2f}" for t in before), flush=True)
    prog.tune(*xs, progress=True)
    grads(lambda: prog(*xs), xs, g)
    after = [bench() for _ in range(a.rounds)]
    print(f"{a.op} L={a.L} tuned fwd+bwd ms: " + "  ".join(f"{t:.2f}" for t in after), flush=True)


if __name__ == "__main__":
    main()
