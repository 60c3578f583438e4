"""Row softmax of 4096 × 65536 fp16: the cost model's choice beside its resident alternative (the row
read once), log-softmax's plan and a device copy of the same bytes, one process (GPU only; from bench/):

    python probe_resident_softmax.py [--rows 4096] [--cols 65536]
"""

from __future__ import annotations

import argparse

import torch
import triton.testing
from beyond.programs import log_softmax, softmax

import neptune_eq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=65536)
    args = ap.parse_args()
    x = torch.randn(args.rows, args.cols, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(x)
    copy = triton.testing.do_bench(lambda: dst.copy_(x), rep=500)
    print(f"copy {copy * 1e3:.1f} us", flush=True)
    for fn, ref in ((softmax, torch.softmax), (log_softmax, torch.log_softmax)):
        prog = neptune_eq.compile(fn, x).program
        want = ref(x.double(), -1)
        resident = [i for i, a in enumerate(prog.alternatives) if "resident 1 row" in a.structure]
        picks = [prog.choice, *resident[:2]]
        for i in dict.fromkeys(picks):
            p = prog.pin(i)
            err = (p(x).double() - want).abs().max().item()
            t = triton.testing.do_bench(lambda: p(x), rep=500)  # noqa: B023
            print(f"{fn.__name__} #{i} {'(chosen) ' if i == prog.choice else ''}{t * 1e3:.1f} us "
                  f"({copy / t:.0%} of copy), predicted {p.alternative.predicted_time * 1e6:.1f}, err {err:.1e}: "
                  f"{p.alternative.structure}", flush=True)


if __name__ == "__main__":
    main()
