"""Probe (issue 14): the GPU work of one compiled paged-decode call, kernel by kernel (torch.profiler),
at the bench's size (32 requests of 1K–32K tokens, 32/8 heads, d 128, pages of 16), beside a device
copy of the bytes it reads: what the partial kernel, the combine, the per-call bounds and the index
check each cost.

    python bench/probe_paged_call.py [--ordered]   # --ordered: each request's pages consecutive
"""

from __future__ import annotations

import math
import sys

import torch
import triton.testing as tt
from host_profile import kernel_times, one_call_us
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
    for key, us, count in kernel_times(lambda: prog(*args), reps=20):
        if not key.startswith("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<signed"):
            print(f"{us:9.1f} us/call  x{count:<3d} {key[:100]}")  # (all but the L2 flush)
    bytes_read = 2 * sum(lens_l) * 8 * 128 * 2
    src = torch.empty(bytes_read // 2, dtype=torch.int8, device=dev)
    dst = torch.empty_like(src)
    host = sorted(one_call_us(lambda: prog(*args)) for _ in range(51))
    print(f"host time per call: {host[25]:.1f} us (median of 51)")
    copy_us = tt.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median") * 1e3
    call_us = tt.do_bench(lambda: prog(*args), warmup=25, rep=200, return_mode="median") * 1e3
    print(f"copy of the bytes read: {copy_us:.1f} us; call: {call_us:.1f} us ({copy_us / call_us:.1%} of copy)")


if __name__ == "__main__":
    main("--ordered" in sys.argv)
