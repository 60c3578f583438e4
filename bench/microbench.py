"""Micro-benchmarks that set the cost model's device constants (neptune_eq.device.DeviceSpec), so
that none of them is fitted on the programs the model is judged on (bench/beyond):

    copy        torch's device copy of 1 GiB: HBM bytes per second (read + write counted)
    mm          torch.mm of bf16 8192³: dense tensor-core FLOP/s
    exp         a Triton loop of dependent exp2 per element: special-function ops per second
    launch      back-to-back launches of an empty Triton kernel: seconds per launch
    l2          every program re-reading one 16 MiB buffer (it stays in L2): bytes L2 delivers to
                the SMs per second, the roof of a K-loop that re-reads its operand tiles
    latency     a Triton row sum streaming 64 MiB with one tile in flight per program, tiles of
                256 to 4096 values: the memory latency that Little's law needs (rate = bytes in
                flight / latency), fitted on the smallest tiles (latency-bound, far from the HBM roof)

    python bench/microbench.py [--out FILE.json]     # GPU; prints the fitted constants
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _exp_chain(x_ptr, y_ptr, n, REPS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    for _ in range(REPS):
        x = tl.exp2(x * 0.5 - 1.0)
    tl.store(y_ptr + offs, x, mask=offs < n)


@triton.jit
def _empty(x_ptr):
    pass


@triton.jit
def _row_sum(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * n_cols + offs).to(tl.float32)
    tl.store(y_ptr + row, tl.sum(acc))


@triton.jit
def _l2_read(x_ptr, out_ptr, n, reps, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    tiles = n // BLOCK
    for r in range(reps):
        t = (pid * 7 + r) % tiles
        acc += tl.load(x_ptr + t * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)


def l2_read_rates(mb: int = 16) -> dict[str, float]:
    """Bytes per second every program re-reading a `mb` MiB buffer gets, for a few block sizes,
    warps and programs per SM (the buffer stays in L2)."""
    n = mb * (1 << 20) // 2
    x = torch.randn(n, device="cuda").half()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = {}
    for block, warps, per_sm in ((4096, 8, 4), (8192, 8, 4), (8192, 16, 2)):
        programs, reps = sms * per_sm, 256
        o = torch.empty(programs * block, device="cuda")

        def run(programs=programs, o=o, reps=reps, block=block, warps=warps):
            _l2_read[(programs,)](x, o, n, reps, BLOCK=block, num_warps=warps)

        out[f"block{block}_w{warps}_x{per_sm}"] = programs * reps * block * 2 / (_ms(run) * 1e-3)
    return out


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def _copy_rate(dev) -> float:
    a = torch.empty(1 << 29, dtype=torch.float16, device=dev)
    b = torch.empty_like(a)
    return 2 * a.numel() * 2 / (_ms(lambda: b.copy_(a)) * 1e-3)


def _mm_rate(dev) -> float:
    m = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    return 2 * 8192**3 / (_ms(lambda: torch.mm(m, m)) * 1e-3)


def measure() -> dict:
    dev = torch.device("cuda")
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    out["copy_bytes_per_s"] = _copy_rate(dev)
    out["mm_flops_per_s"] = _mm_rate(dev)
    n, reps = 1 << 24, 64
    x = torch.randn(n, device=dev)
    y = torch.empty_like(x)
    t = _ms(lambda: _exp_chain[(n // 1024,)](x, y, n, REPS=reps, BLOCK=1024))
    out["sfu_ops_per_s"] = n * reps / (t * 1e-3)
    out["l2_read"] = l2_read_rates()
    out["l2_read_bytes_per_s"] = max(out["l2_read"].values())
    z = torch.empty(1, device=dev)
    k = 200

    def launches():
        for _ in range(k):
            _empty[(1,)](z)

    out["launch_s"] = _ms(launches) * 1e-3 / k
    rows, cols = 1024, 32768
    x = torch.randn(rows, cols, dtype=torch.float16, device=dev)
    y = torch.empty(rows, device=dev)
    points = []
    for block in (256, 512, 1024, 2048, 4096):
        t = _ms(lambda block=block: _row_sum[(rows,)](x, y, cols, BLOCK=block, num_warps=4, num_stages=1)) * 1e-3
        points.append({"tile_bytes": block * 2, "seconds": t, "bytes_per_s": x.numel() * 2 / t})
    out["row_sum"] = points
    # latency from the two smallest tiles, read the way extract/cost.py uses it: each of the programs
    # running together (16 per SM at 4 warps) keeps two tiles in flight, rate = 2 · tile / latency
    progs = min(rows, torch.cuda.get_device_properties(dev).multi_processor_count * 16)
    lat = [2 * p["tile_bytes"] * progs / p["bytes_per_s"] for p in points[:2]]
    out["mem_latency_s"] = sum(lat) / len(lat)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the measurements here (JSON)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("microbench: needs a CUDA GPU", file=sys.stderr)
        return 2
    res = measure()
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
