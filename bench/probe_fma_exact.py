"""On the GPU: kernels that compare a value with its own min (or compute a min some kernel compares a
value with) compile without FMA contraction (lower/exact.py), so the value has the same bits in every
kernel recomputing it. This runs a training whose amin's gradient needs that (fuzz seed 1511's program:
softmax rows, log-softmax over the other axis, the rows' min), with the rule and, in a second process,
without it (`--contract`: the lowering's exact_kernels patched to none), and counts the rows whose gradient
is off float64's.

    python bench/probe_fma_exact.py [--contract]
"""

from __future__ import annotations

import argparse

import torch

import neptune_eq
import neptune_eq.lower.triton as lowering


def fn(x):
    t = x.mT
    band = (torch.arange(t.shape[-1], device=x.device)[None, :]
            - torch.arange(t.shape[-2], device=x.device)[:, None]).abs() <= 40
    p = torch.softmax(t.masked_fill(~band, float("-inf")), -1)
    return torch.log_softmax(p * 3.0 + 0.5, -2).amin(-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contract", action="store_true", help="let every kernel contract multiply-adds")
    args = ap.parse_args()
    if args.contract:
        lowering.exact_kernels = lambda plan: set()
    torch.manual_seed(0)
    prog = None
    for trial in range(5):
        x = torch.randn(64, 300, 96, device="cuda")
        prog = prog or neptune_eq.compile(fn, x)
        ins = x.clone().requires_grad_()
        got = torch.autograd.grad(prog(ins).sum(), ins)[0].double()
        ref = x.double().requires_grad_()
        want = torch.autograd.grad(fn(ref).sum(), ref)[0]
        off = ((got - want).abs() > 1e-4 * float(want.abs().max())).any(-1)
        print(f"{'contracting' if args.contract else 'exact'} trial {trial}: {int(off.sum())} of {off.numel()} "
              f"(batch, i) gradient rows off float64; max error {float((got - want).abs().max()):.3g} "
              f"of {float(want.abs().max()):.3g}", flush=True)
    from neptune_eq.autograd_run import _RUNNERS

    for name, run in _RUNNERS.items():
        if hasattr(run, "lowered"):
            print(name.split(":")[-1], "kernels without contraction:",
                  [k.name for k in run.lowered("cuda")[1] if k.exact_arith])


if __name__ == "__main__":
    main()
