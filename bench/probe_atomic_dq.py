"""Probe: does an attention backward that adds dQ from the dK/dV kernel by atomics (FlashAttention-2's
five GEMMs) beat two kernels (dK/dV over query tiles, dQ over key tiles: seven GEMMs) on this GPU?

Hand-written kernels of the same structure as the generated ones (S^T tiles in the dK/dV kernel, the
diagonal tiles masked in their own loop), causal, fp16, one batch. Each variant's dQ, dK, dV are first
checked against float64 autograd at a small length, then timed (do_bench medians) at the target length.

    python bench/probe_atomic_dq.py [--L 16384] [--H 32]
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@triton.jit
def _dkdv_step(start_i, offs_j, kt, vt, q_ptr, do_ptr, lse_ptr, dd_ptr, dq_ptr, dk, dv, scale, L,
               D: tl.constexpr, BI: tl.constexpr, MASK: tl.constexpr, ATOMIC: tl.constexpr):
    offs_i = start_i + tl.arange(0, BI)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + offs_i[:, None] * D + offs_d[None, :])
    do = tl.load(do_ptr + offs_i[:, None] * D + offs_d[None, :])
    lse = tl.load(lse_ptr + offs_i)
    dd = tl.load(dd_ptr + offs_i)
    st = tl.dot(kt, tl.trans(q))  # [BJ, BI]
    pt = tl.exp(st * scale - lse[None, :])
    if MASK:
        pt = tl.where(offs_j[:, None] <= offs_i[None, :], pt, 0.0)
    dpt = tl.dot(vt, tl.trans(do))
    dst = pt * (dpt - dd[None, :])
    dv = tl.dot(pt.to(tl.float16), do, dv)
    ds16 = dst.to(tl.float16)
    dk = tl.dot(ds16, q, dk)
    if ATOMIC == 1:  # element atomics from registers
        dq = tl.dot(tl.trans(ds16), kt) * scale  # [BI, D]
        tl.atomic_add(dq_ptr + offs_i[:, None] * D + offs_d[None, :], dq, sem="relaxed")
    if ATOMIC == 2:  # a bulk reduce-add of the tile through a tensor descriptor (TMA)
        dq = tl.dot(tl.trans(ds16), kt) * scale
        dq_ptr.atomic_add([start_i + tl.program_id(1) * L, 0], dq)
    return dk, dv


@triton.jit
def dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, dd_ptr, dq_ptr, dk_ptr, dv_ptr, scale, L,
                D: tl.constexpr, BJ: tl.constexpr, BI: tl.constexpr, ATOMIC: tl.constexpr):
    tj = tl.program_id(0)
    h = tl.program_id(1)
    base = h * L * D
    q_ptr += base
    k_ptr += base
    v_ptr += base
    do_ptr += base
    if ATOMIC == 1:
        dq_ptr += base
    lse_ptr += h * L
    dd_ptr += h * L
    offs_j = tj * BJ + tl.arange(0, BJ)
    offs_d = tl.arange(0, D)
    kt = tl.load(k_ptr + offs_j[:, None] * D + offs_d[None, :])
    vt = tl.load(v_ptr + offs_j[:, None] * D + offs_d[None, :])
    dk = tl.zeros([BJ, D], tl.float32)
    dv = tl.zeros([BJ, D], tl.float32)
    lo = (tj * BJ) // BI * BI
    mid = tl.minimum((tj * BJ + BJ + BI - 1) // BI * BI, L)
    for start_i in range(lo, mid, BI):
        dk, dv = _dkdv_step(start_i, offs_j, kt, vt, q_ptr, do_ptr, lse_ptr, dd_ptr, dq_ptr, dk, dv, scale, L,
                            D, BI, True, ATOMIC)
    for start_i in range(mid, L, BI):
        dk, dv = _dkdv_step(start_i, offs_j, kt, vt, q_ptr, do_ptr, lse_ptr, dd_ptr, dq_ptr, dk, dv, scale, L,
                            D, BI, False, ATOMIC)
    tl.store(dk_ptr + base + offs_j[:, None] * D + offs_d[None, :], (dk * scale).to(tl.float16))
    tl.store(dv_ptr + base + offs_j[:, None] * D + offs_d[None, :], dv.to(tl.float16))


@triton.jit
def _dq_step(start_j, offs_i, q, do, lse, dd, k_ptr, v_ptr, dq, scale, D: tl.constexpr, BJ: tl.constexpr,
             MASK: tl.constexpr):
    offs_j = start_j + tl.arange(0, BJ)
    offs_d = tl.arange(0, D)
    k = tl.load(k_ptr + offs_j[:, None] * D + offs_d[None, :])
    v = tl.load(v_ptr + offs_j[:, None] * D + offs_d[None, :])
    p = tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None])
    if MASK:
        p = tl.where(offs_j[None, :] <= offs_i[:, None], p, 0.0)
    dp = tl.dot(do, tl.trans(v))
    ds = (p * (dp - dd[:, None])).to(tl.float16)
    return tl.dot(ds, k, dq)


@triton.jit
def dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, dd_ptr, dq_ptr, scale, L,
              D: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr):
    ti = tl.program_id(0)
    h = tl.program_id(1)
    base = h * L * D
    k_ptr += base
    v_ptr += base
    offs_i = ti * BI + tl.arange(0, BI)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + base + offs_i[:, None] * D + offs_d[None, :])
    do = tl.load(do_ptr + base + offs_i[:, None] * D + offs_d[None, :])
    lse = tl.load(lse_ptr + h * L + offs_i)
    dd = tl.load(dd_ptr + h * L + offs_i)
    dq = tl.zeros([BI, D], tl.float32)
    hi_unmasked = (ti * BI) // BJ * BJ
    for start_j in range(0, hi_unmasked, BJ):
        dq = _dq_step(start_j, offs_i, q, do, lse, dd, k_ptr, v_ptr, dq, scale, D, BJ, False)
    for start_j in range(hi_unmasked, ti * BI + BI, BJ):
        dq = _dq_step(start_j, offs_i, q, do, lse, dd, k_ptr, v_ptr, dq, scale, D, BJ, True)
    tl.store(dq_ptr + base + offs_i[:, None] * D + offs_d[None, :], (dq * scale).to(tl.float16))


def inputs(H, L, D=128, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q, k, v, do = (torch.randn(H, L, D, device=DEV, generator=g, dtype=torch.float16) for _ in range(4))
    scale = 1 / math.sqrt(D)
    s = (q.float() @ k.float().transpose(1, 2)) * scale if L <= 4096 else None
    if s is None:  # statistics only need to be plausible for timing
        lse = torch.full((H, L), math.log(L) * 0.5, device=DEV)
        dd = torch.randn(H, L, device=DEV) * 0.1
    else:
        s = s.masked_fill(torch.ones(L, L, device=DEV, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, -1)
        o = torch.softmax(s, -1) @ v.float()
        dd = (o * do.float()).sum(-1)
    return q, k, v, do, lse.contiguous(), dd.contiguous(), scale


def two_kernels(q, k, v, do, lse, dd, scale, cfg_a, cfg_b):
    H, L, D = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    bj, bi, w, s = cfg_a
    dkdv_kernel[(L // bj, H)](q, k, v, do, lse, dd, dq, dk, dv, scale, L, D=D, BJ=bj, BI=bi, ATOMIC=0,
                              num_warps=w, num_stages=s)
    bi2, bj2, w2, s2 = cfg_b
    dq_kernel[(L // bi2, H)](q, k, v, do, lse, dd, dq, scale, L, D=D, BI=bi2, BJ=bj2, num_warps=w2, num_stages=s2)
    return dq, dk, dv


def atomic(q, k, v, do, lse, dd, scale, cfg_a, mode=1):
    H, L, D = q.shape
    dqa = torch.zeros(q.shape, device=DEV, dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    bj, bi, w, s = cfg_a
    target = dqa if mode == 1 else TensorDescriptor.from_tensor(dqa.view(H * L, D), [bi, D])
    dkdv_kernel[(L // bj, H)](q, k, v, do, lse, dd, target, dk, dv, scale, L, D=D, BJ=bj, BI=bi, ATOMIC=mode,
                              num_warps=w, num_stages=s)
    return dqa.to(torch.float16), dk, dv


def reference(q, k, v, do):
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    L = q.shape[1]
    s = (q64 @ k64.transpose(1, 2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(L, L, device=DEV, dtype=torch.bool).triu(1), float("-inf"))
    (torch.softmax(s, -1) @ v64).backward(do.double())
    return q64.grad, k64.grad, v64.grad


def err(a, b):
    return max(((x.double() - y).norm() / y.norm()).item() for x, y in zip(a, b))


CFG_A = [(128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 4, 2), (64, 32, 4, 4)]
CFG_B = [(128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--L", type=int, default=16384)
    ap.add_argument("--H", type=int, default=32)
    a = ap.parse_args()
    small = inputs(*((1, 256) if DEV == "cpu" else (4, 1024)))
    ref = reference(*small[:4])
    print("check at H=4 L=1024 (max rel err of dq, dk, dv against float64)")
    for ca in CFG_A:
        tma = err(atomic(*small, ca, 2), ref) if DEV == "cuda" else float("nan")  # (no TMA in the interpreter)
        print(f"  atomic {ca}: {err(atomic(*small, ca), ref):.2e}  tma {tma:.2e}   two {ca}+{CFG_B[0]}: "
              f"{err(two_kernels(*small, ca, CFG_B[0]), ref):.2e}", flush=True)
    if DEV == "cpu":
        return
    big = inputs(a.H, a.L)
    H, L, D = big[0].shape
    gemm = H * L * L * D  # one causal GEMM's FLOPs: L²/2 pairs per head, D multiply-adds each
    print(f"H={H} L={L} D={D}: ms (TF/s counting 5 GEMMs for atomic, 7 for two kernels)")
    bench = dict(warmup=50, rep=400, return_mode="median")
    for ca in CFG_A:
        try:
            t = triton.testing.do_bench(lambda ca=ca: atomic(*big, ca), **bench)
            t2 = triton.testing.do_bench(lambda ca=ca: atomic(*big, ca, 2), **bench)
            ta = triton.testing.do_bench(lambda ca=ca: two_kernels(*big, ca, CFG_B[0])[1], **bench)
        except Exception as e:
            print(f"  {ca}: FAIL {str(e)[:100]}")
            continue
        print(f"  dkdv {ca}: atomic (zero+kernel+cast) {t:.3f} ms ({5 * gemm / t * 1e-9:.0f}); "
              f"tma {t2:.3f} ({5 * gemm / t2 * 1e-9:.0f}); two-kernel total with dq {CFG_B[0]}: {ta:.3f}", flush=True)
    dq = torch.empty_like(big[0])
    for cb in CFG_B:
        def run(cb=cb):
            bi2, bj2, w2, s2 = cb
            dq_kernel[(L // bi2, H)](*big[:6], dq, big[6], L, D=D, BI=bi2, BJ=bj2, num_warps=w2, num_stages=s2)
        t = triton.testing.do_bench(run, **bench)
        print(f"  dq alone {cb}: {t:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
