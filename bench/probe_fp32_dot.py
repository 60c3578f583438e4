"""Calibration probe (session 65): what a float32 IEEE `tl.dot` sustains on the FMA pipe, beside torch's
SGEMM (cuBLAS at torch's default float32 precision) and TF32, on one square product. The cost model
prices float32 dots by these (neptune_eq/device.py: fma_dot_efficiency, sgemm_efficiency); the
programs it is judged on play no part.

    python bench/probe_fp32_dot.py [--n 4096]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
import triton.testing


@triton.jit
def _mm(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
        KMAJOR: tl.constexpr = False):
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        if KMAJOR:  # b holds Bᵀ [N, K]: the K axis contiguous in both operands (as attention's Kᵀ)
            y = tl.load(b + rn[None, :] * K + (k + rk)[:, None])
        else:
            y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(x, y, acc, input_precision=PREC)
    tl.store(c + rm[:, None] * N + rn[None, :], acc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--tf32", action="store_true", help="session 66: TF32 and TF32x3 with B K-major or N-major")
    args = ap.parse_args()
    n = args.n
    props = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(n, n, device="cuda", generator=g) for _ in range(2))
    ref = a.double() @ b.double()
    flops = 2.0 * n ** 3
    rows = {}

    def timed(label, f, out):
        f()
        err = float((out.double() - ref).norm() / ref.norm())
        ms = triton.testing.do_bench(f, warmup=10, rep=200, return_mode="median")
        rows[label] = {"ms": ms, "tflops": flops / ms / 1e9, "rel_err": err}
        print(f"{label:34s} {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TF/s  rel err {err:.1e}", flush=True)

    out = torch.empty(n, n, device="cuda")
    if args.tf32:
        bt = b.t().contiguous()
        for bm, bn, bk, warps, stages in ((128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (128, 128, 64, 8, 3)):
            for prec in ("tf32", "tf32x3"):
                for kmajor in (False, True):
                    cfg = dict(BM=bm, BN=bn, BK=bk, PREC=prec, KMAJOR=kmajor, num_warps=warps, num_stages=stages)
                    label = f"tl.dot {prec} {bm}x{bn}x{bk} w{warps} s{stages} B {'K' if kmajor else 'N'}-major"
                    try:
                        timed(label, lambda g=(n // bm, n // bn), cfg=cfg, kmajor=kmajor:
                              _mm[g](a, bt if kmajor else b, out, n, n, n, **cfg), out)
                    except Exception as e:
                        print(f"{label}: {type(e).__name__} {str(e)[:100]}", flush=True)
        print(json.dumps({"n": n, "rows": rows}))
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    timed("torch.mm float32 (IEEE)", lambda: torch.mm(a, b, out=out), out)
    torch.backends.cuda.matmul.allow_tf32 = True
    timed("torch.mm float32 (TF32 allowed)", lambda: torch.mm(a, b, out=out), out)
    torch.backends.cuda.matmul.allow_tf32 = False
    for bm, bn, bk, warps, stages in ((128, 128, 16, 8, 2), (128, 128, 32, 8, 2), (64, 64, 32, 4, 2),
                                      (128, 64, 32, 4, 2), (64, 128, 16, 4, 3), (128, 256, 16, 8, 2)):
        for prec in ("ieee", "tf32"):
            if prec == "tf32" and (bm, bn) != (128, 128):
                continue
            grid = (n // bm, n // bn)
            try:
                cfg = dict(BM=bm, BN=bn, BK=bk, PREC=prec, num_warps=warps, num_stages=stages)
                timed(f"tl.dot {prec} {bm}x{bn}x{bk} w{warps} s{stages}",
                      lambda grid=grid, cfg=cfg: _mm[grid](a, b, out, n, n, n, **cfg), out)
            except Exception as e:  # (a tile that does not fit is reported, not fatal)
                print(f"tl.dot {prec} {bm}x{bn}x{bk}: {type(e).__name__} {str(e)[:100]}", flush=True)
    fma_peak = props.multi_processor_count * 128 * 2 * 1.755e9 / 1e12  # the spec's clock (device.py)
    print(f"FMA peak at 1.755 GHz: {fma_peak:.1f} TF/s", flush=True)
    print(json.dumps({"n": n, "fma_peak_tflops": fma_peak, "rows": rows}))


if __name__ == "__main__":
    main()
