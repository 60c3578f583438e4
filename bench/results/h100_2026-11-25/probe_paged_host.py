"""Paged decode: host time per compiled call vs per pinned-plan run, and the GPU kernels of one call."""
import math
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")
from varlen_paged import paged_decode

import neptune_eq


def main(page):
    dev, dt = "cuda", torch.float16
    g = torch.Generator().manual_seed(0)
    requests, lo, hi, hq, hkv, dim = 32, 1024, 32768, 32, 8, 128
    lens_l = torch.randint(lo, hi + 1, (requests,), generator=g).tolist()
    per = math.ceil(hi / page)
    n_pages = requests * per
    table = torch.randperm(n_pages, generator=g).view(requests, per).to(torch.int32).to(dev)
    gd = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(requests, hq, dim, device=dev, dtype=dt, generator=gd)
    kc, vc = (torch.randn(n_pages, page, hkv, dim, device=dev, dtype=dt, generator=gd) for _ in range(2))
    lens = torch.tensor(lens_l, device=dev)
    prog = neptune_eq.compile(paged_decode, q, kc, vc, table, lens)
    names = {"q": q, "k_cache": kc, "v_cache": vc, "block_table": table, "lens": lens}
    plan = prog.program
    for label, fn in (("compiled call", lambda: prog(q, kc, vc, table, lens)), ("plan.run", lambda: plan.run(names))):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(50):
            fn()
        host = (time.perf_counter() - t) / 50
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / 50
        print(f"page {page} {label}: host {host * 1e3:.3f} ms/call, wall {wall * 1e3:.3f} ms/call", flush=True)
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
            fn()
            torch.cuda.synchronize()
        evs = [e for e in p.key_averages() if e.device_time > 0]
        tot = sum(e.device_time for e in evs)
        print(f"   {len(evs)} kernels, {tot / 1e3:.3f} ms device", flush=True)
        for e in sorted(evs, key=lambda e: -e.device_time)[:12]:
            print(f"   {e.key[:70]:70s} {e.device_time / 1e3:.3f} ms x{e.count}", flush=True)
        top = sorted(p.key_averages(), key=lambda e: -e.cpu_time_total)[:15]
        for e in top:
            print(f"   cpu {e.key[:60]:60s} {e.cpu_time_total / 1e3:.3f} ms x{e.count}", flush=True)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(int(p))
