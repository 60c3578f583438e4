"""Paged decode (session 30, before the replay): the compiled call on a shuffled page table vs the same
pages in order, beside a device copy; each split alternative too. Is the gap the kernel or the pages?"""
import math
import sys

import torch
import triton.testing as tt

sys.path.insert(0, "bench")
from varlen_paged import paged_decode

import neptune_eq
from neptune_eq.plan import Combine


def bench(fn):
    return tt.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main(page):
    dev, dt = "cuda", torch.float16
    g = torch.Generator().manual_seed(0)
    requests, lo, hi, hq, hkv, dim = 32, 1024, 32768, 32, 8, 128
    lens_l = torch.randint(lo, hi + 1, (requests,), generator=g).tolist()
    per = math.ceil(hi / page)
    n_pages = requests * per
    shuffled = torch.randperm(n_pages, generator=g).view(requests, per).to(torch.int32).to(dev)
    ordered = torch.arange(n_pages, dtype=torch.int32, device=dev).view(requests, per)
    gd = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(requests, hq, dim, device=dev, dtype=dt, generator=gd)
    kc, vc = (torch.randn(n_pages, page, hkv, dim, device=dev, dtype=dt, generator=gd) for _ in range(2))
    lens = torch.tensor(lens_l, device=dev)
    nbytes = 2 * sum(lens_l) * hkv * dim * 2
    prog = neptune_eq.compile(paged_decode, q, kc, vc, shuffled, lens)
    print("page", page, "plan", prog.program.alternative.structure, flush=True)
    for label, table in (("shuffled", shuffled), ("ordered", ordered)):
        ref = paged_decode(q.float(), kc.float(), vc.float(), table, lens)
        out = prog(q, kc, vc, table, lens)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        ms = [bench(lambda t=table: prog(q, kc, vc, t, lens)) for _ in range(3)]
        print(f"  {label}: compiled call {[round(m, 3) for m in ms]} ms err {err:.1e} "
              f"({nbytes / min(ms) / 1e6:.0f} GB/s)", flush=True)
        names = {"q": q, "k_cache": kc, "v_cache": vc, "block_table": table, "lens": lens}
        for a in prog.program.alternatives[:12]:
            chunks = [ph.chunks for k in a.plan.kernels for ph in k.phases if isinstance(ph, Combine)]
            if chunks:
                p = prog.program.pin(a.id)
                ms = [bench(lambda p=p, names=names: p.run(names)) for _ in range(2)]
                print(f"    split {chunks[0]}: {[round(m, 3) for m in ms]} ms", flush=True)
    src = torch.empty(nbytes // 2, dtype=torch.int8, device=dev)
    dst = torch.empty_like(src)
    print("  copy", round(bench(lambda: dst.copy_(src)), 3), "ms for", nbytes // 2, "bytes each way", flush=True)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(int(p))
