"""Probe (session 64): sweep 5's rows that fell off a cliff, timed after the fix beside eager and
torch.compile, each checked against float64 first (cosine retrieval: an fp32 IEEE dot before).

    python bench/probe_sweep5_fix.py [--only NAME ...] [--no-compile]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_fifth as s5

import neptune_eq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=["cosine_retrieval"])
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for name in a.only:
        row = next(r for r in s5.ROWS if r.name.startswith(name))
        xs = row.make("cuda", torch.Generator(device="cuda").manual_seed(0), False)
        ref = row.fn(*[x.double() if x.is_floating_point() else x for x in xs])
        impls = {"neptune_eq": neptune_eq.compile(row.fn, *xs), "eager": row.fn}
        if not a.no_compile:
            impls["compile"] = torch.compile(row.fn)
        for label, f in impls.items():
            out = f(*xs)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            ms = triton.testing.do_bench(lambda f=f, xs=xs: f(*xs), warmup=10, rep=100, return_mode="median") \
                if err < 1e-2 else float("nan")
            print(f"{row.name:45s} {label:11s} {ms:9.4f} ms  rel err {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
