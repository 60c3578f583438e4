"""Packed prefill given as document ids against the same documents given as offsets (cu_seqlens), apart:
do_bench's time per call, the device time of the kernels (torch profiler, L2 flushed) and the host time
of one call issued on an idle GPU. A call whose do_bench time exceeds its kernels' time waits on the host.
GPU only.

    python bench/probe_offsets_prefill.py [--docs 16 --total 32768 --heads 32 --dim 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_profile import kernel_times, one_call_us
from varlen_paged import random_lengths, varlen_attention, varlen_offsets

import neptune_eq


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--total", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    a = ap.parse_args()
    lengths = random_lengths(a.docs, a.total, 0)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(a.heads, a.total, a.dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    doc = torch.repeat_interleave(torch.arange(a.docs, device="cuda"), torch.tensor(lengths, device="cuda"))
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(lengths), 0).tolist()], device="cuda")
    ids = neptune_eq.compile(varlen_attention, q, k, v, doc)
    offs = neptune_eq.compile(varlen_offsets, q, k, v, cu)
    want = ids(q, k, v, doc).float()
    for name, prog, call in (("ids", ids, lambda: ids(q, k, v, doc)), ("offsets", offs, lambda: offs(q, k, v, cu))):
        err = ((call().float() - want).abs().max() / want.abs().max()).item()
        ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
        kernels = kernel_times(call)
        host = statistics.median(one_call_us(call) for _ in range(30))
        print(f"== {name}: {prog.program.alternative.structure}; max diff to ids {err:.1e}", flush=True)
        print(f"   do_bench {ms * 1e3:.1f} us, host {host:.1f} us a call, kernels:", flush=True)
        for kname, us, n in kernels[:12]:
            print(f"     {us:9.1f}  x{n}  {kname[:110]}", flush=True)


if __name__ == "__main__":
    main()
