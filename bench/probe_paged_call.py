"""Probe (issue 14): the GPU work of one compiled paged-decode call, kernel by kernel (torch.profiler),
at the bench's size (32 requests of 1K–32K tokens, 32/8 heads, d 128, pages of 16), beside a device
copy of the bytes it reads: what the partial kernel, the combine, the per-call bounds and the index
check each cost.

    python bench/probe_paged_call.py [--ordered]   # --ordered: each request's pages consecutive
"""

from __future__ import annotations

import math
import sys
import time

import torch
import triton.testing as tt
from torch.profiler import ProfilerActivity, profile
from varlen_paged import paged_decode

import neptune_eq


def main(ordered: bool) -> None:
    dev, dt, page, requests, hi = "cuda", torch.float16, 16, 32, 32768
    g = torch.Generator().manual_seed(0)
    lens_l = torch.randint(1024, hi + 1, (requests,), generator=g).tolist()
    per = math.ceil(hi / page)
    pages = torch.arange(requests * per) if ordered else torch.randperm(requests * per, generator=g)
    table = pages.view(requests, per).to(torch.int32).to(dev)
    print(f"pages {'in order' if ordered else 'shuffled'}")
    q = torch.randn(requests, 32, 128, device=dev, dtype=dt)
    kc, vc = (torch.randn(requests * per, page, 8, 128, device=dev, dtype=dt) for _ in range(2))
    lens = torch.tensor(lens_l, device=dev)
    args = (q, kc, vc, table, lens)
    prog = neptune_eq.compile(paged_decode, *args)
    for _ in range(5):
        prog(*args)
    torch.cuda.synchronize()
    flush = torch.empty(256 << 20, dtype=torch.int8, device=dev)
    reps = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            prog(*args)
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    rows = sorted((e for e in prof.key_averages() if e.device_type == cuda), key=lambda e: -e.device_time_total)
    for e in rows:
        print(f"{e.device_time_total / reps:9.1f} us/call  x{e.count // reps:<3d} {e.key[:100]}")
    bytes_read = 2 * sum(lens_l) * 8 * 128 * 2
    src = torch.empty(bytes_read // 2, dtype=torch.int8, device=dev)
    dst = torch.empty_like(src)
    host = []
    for _ in range(51):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        prog(*args)
        host.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    print(f"host time per call: {sorted(host)[25]:.1f} us (median of 51)")
    copy_us = tt.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median") * 1e3
    call_us = tt.do_bench(lambda: prog(*args), warmup=25, rep=200, return_mode="median") * 1e3
    print(f"copy of the bytes read: {copy_us:.1f} us; call: {call_us:.1f} us ({copy_us / call_us:.1%} of copy)")


if __name__ == "__main__":
    main("--ordered" in sys.argv)
