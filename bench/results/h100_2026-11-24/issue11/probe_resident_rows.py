"""Probe (H100, 2026-11-24): a 64K fp16 row held whole in registers (one read) against the streamed
two-read kernel and a device copy; results in probe_resident_rows.json (n_regs / n_spills per kernel).

    python probe_resident_rows.py OUT.json

Modes of the resident kernel: 0 softmax keeping exp(x − m) for the store (as lowered), 1 softmax
recomputing the store as exp(x − (m + ln s)), 2 softmax reading x through an opaque copy for the
store (no CSE of the exp), 3 log-softmax (x kept), 4 as 0 with the max taken in fp16.
"""

import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def sm_res(x_ptr, o_ptr, N: tl.constexpr, BLOCK: tl.constexpr, MODE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * N + offs, mask=mask, other=-float("inf"))
    if MODE == 0:
        xf = x.to(tl.float32)
        m = tl.max(xf, 0)
        e = tl.exp(xf - m)
        y = e / tl.sum(e, 0)
    elif MODE == 1:
        m = tl.max(x, 0).to(tl.float32)
        s = tl.sum(tl.exp(x.to(tl.float32) - m), 0)
        y = tl.exp(x.to(tl.float32) - (m + tl.log(s)))
    elif MODE == 2:
        m = tl.max(x, 0).to(tl.float32)
        s = tl.sum(tl.exp(x.to(tl.float32) - m), 0)
        xb = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float16, is_pure=False, pack=2)
        y = tl.exp(xb.to(tl.float32) - m) / s
    elif MODE == 3:
        m = tl.max(x, 0).to(tl.float32)
        s = tl.sum(tl.exp(x.to(tl.float32) - m), 0)
        y = x.to(tl.float32) - (m + tl.log(s))
    else:
        m = tl.max(x, 0).to(tl.float32)
        e = tl.exp(x.to(tl.float32) - m)
        y = e / tl.sum(e, 0)
    tl.store(o_ptr + row * N + offs, y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sm_stream(x_ptr, o_ptr, N: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    m = tl.full([], -float("inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for start in range(0, N, BLOCK):
        x = tl.load(x_ptr + row * N + start + tl.arange(0, BLOCK)).to(tl.float32)
        mn = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - mn) + tl.sum(tl.exp(x - mn), 0)
        m = mn
    for start in range(0, N, BLOCK):
        x = tl.load(x_ptr + row * N + start + tl.arange(0, BLOCK)).to(tl.float32)
        y = x - (m + tl.log(s)) if LOG else tl.exp(x - m) / s
        tl.store(o_ptr + row * N + start + tl.arange(0, BLOCK), y.to(o_ptr.dtype.element_ty))


def measure(M: int, N: int) -> list[dict]:
    res = []
    x = torch.randn(M, N, device="cuda", dtype=torch.float16) * 3
    refs = {0: torch.softmax(x.double(), -1), 1: torch.log_softmax(x.double(), -1)}
    y = torch.empty_like(x)
    gb = 2 * x.numel() * 2 / 1e9
    t = triton.testing.do_bench(lambda: y.copy_(x), rep=300)
    res.append(dict(M=M, N=N, kind="copy", us=t * 1e3, gbps=gb / t * 1e3))
    for log in (0, 1):
        for blk, w in ((2048, 8), (4096, 8), (4096, 16)):
            def f(blk=blk, w=w, log=log):
                sm_stream[(M,)](x, y, N, blk, log, num_warps=w)
            f()
            err = (y.double() - refs[log]).abs().max().item()
            t = triton.testing.do_bench(f, rep=300)
            res.append(dict(M=M, N=N, kind=f"stream{'_log' if log else ''} {blk} w{w}", us=t * 1e3,
                            gbps=gb / t * 1e3, err=err))
    for mode in range(5):
        for w in (16, 32):
            def g(mode=mode, w=w):
                return sm_res[(M,)](x, y, N, triton.next_power_of_2(N), mode, num_warps=w)
            k = g()
            err = (y.double() - refs[int(mode == 3)]).abs().max().item()
            t = triton.testing.do_bench(g, rep=300)
            res.append(dict(M=M, N=N, kind=f"resident mode{mode} w{w}", us=t * 1e3, gbps=gb / t * 1e3,
                            err=err, regs=k.n_regs, spills=k.n_spills))
    return res


def main(path: str) -> None:
    res = []
    for M, N in [(4096, 65536), (8192, 32768), (2048, 131072)]:
        res += measure(M, N)
        torch.cuda.empty_cache()
    with open(path, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
