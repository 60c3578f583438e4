"""Probe (issue 14): where paged decode's partial kernel loses bandwidth. At the bench's size
(32 requests of 1K–32K tokens, 32/8 heads, d 128, pages of 16), the model's plan is run with a few
schedules (key tile, warps, stages); each is timed (do_bench median, whole call with its bounds)
and its TTGIR written to OUT, to read whether the page-table load feeding the K/V addresses is
pipelined (async copies) or waited on in every step.

    python bench/probe_paged_kernel.py OUTDIR
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import torch
import triton.testing as tt
from varlen_paged import paged_decode

import neptune_eq
from neptune_eq.runtime import CompiledProgram

SCHEDULES = [(64, 4, 3), (64, 4, 2), (128, 8, 2), (128, 4, 2), (32, 4, 3), (64, 8, 2), (128, 8, 3)]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dev, dt, page, requests, hi = "cuda", torch.float16, 16, 32, 32768
    g = torch.Generator().manual_seed(0)
    lens_l = torch.randint(1024, hi + 1, (requests,), generator=g).tolist()
    per = math.ceil(hi / page)
    table = torch.randperm(requests * per, generator=g).view(requests, per).to(torch.int32).to(dev)
    q = torch.randn(requests, 32, 128, device=dev, dtype=dt)
    kc, vc = (torch.randn(requests * per, page, 8, 128, device=dev, dtype=dt) for _ in range(2))
    lens = torch.tensor(lens_l, device=dev)
    bytes_read = 2 * sum(lens_l) * 8 * 128 * 2
    prog = neptune_eq.compile(paged_decode, q, kc, vc, table, lens)
    cp = prog._variant((q, kc, vc, table, lens)).prog
    names = {"q": q, "k_cache": kc, "v_cache": vc, "block_table": table, "lens": lens}
    ref = cp.run(names)["out0"].float()
    src = torch.empty(bytes_read // 2, dtype=torch.int8, device=dev)
    dst = torch.empty_like(src)
    copy_ms = tt.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    rows = {"device": torch.cuda.get_device_name(), "copy_ms": copy_ms, "bytes_read": bytes_read, "runs": []}
    base = list(cp.alternative.schedules)
    for bk, w, s in SCHEDULES:
        first = dataclasses.replace(base[0], tiles={**base[0].tiles, "k": bk}, num_warps=w, num_stages=s)
        p = CompiledProgram(cp.compilation, cp.choice, schedules={"cuda": [first, *base[1:]]})
        compiled: list = []
        launcher = p.launcher("cuda")
        got = launcher(names, None, compiled)["out0"].float()
        err = ((got - ref).norm() / ref.norm()).item()
        ms = tt.do_bench(lambda la=launcher: la(names), warmup=25, rep=200, return_mode="median")
        tag = f"k{bk}_w{w}_s{s}"
        (out / f"{tag}.ttgir").write_text(compiled[0].asm["ttgir"])
        regs = getattr(compiled[0], "n_regs", None)
        row = {"schedule": tag, "ms": ms, "frac_copy": copy_ms / ms, "rel_err_vs_default": err, "regs": regs,
               "spills": getattr(compiled[0], "n_spills", None), "shared": compiled[0].metadata.shared}
        print(row, flush=True)
        rows["runs"].append(row)
    (out / "probe_paged_kernel.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
