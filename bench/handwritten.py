"""The issue's hand-written baseline, re-measured beside the generated kernel: a FlashAttention
forward written by hand as the issue describes it (pointer loads, exp2 with log2(e) and the softmax
scale folded into one multiply, fp16 P for the second dot, 128×64 tiles, 8 warps, 3 stages; causal
tiles below the diagonal in one unmasked loop, the diagonal ones in their own masked loop).

    python bench/handwritten.py                  # global_pf and causal_pf at L = 8192

Every kernel is checked against the float64 reference before it is timed (do_bench median, L2
flushed), all in one process: hand-written configurations, neptune_eq's tuned plan, SDPA.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from cases import TOLERANCE, Case, reference, rel_err_rows  # noqa: E402
from peers import PEERS  # noqa: E402


@triton.jit
def _update(q, k_ptrs, v_ptrs, m_i, l_i, acc, scale, mask, MASKED: tl.constexpr):
    """One key tile of the online softmax: scores in the log2 domain, running max m_i, sum l_i."""
    s = tl.dot(q, tl.load(k_ptrs)) * scale
    if MASKED:
        s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(tl.float16), tl.load(v_ptrs), acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def flash_fwd(Q, K, V, O, scale, N: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              CAUSAL: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:  # the longest rows first
        pid_m = tl.num_programs(0) - 1 - pid_m
    base = tl.program_id(1).to(tl.int64) * N * D
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    full_hi = pid_m * BM if CAUSAL else N
    for start in range(0, full_hi, BN):
        cols = start + offs_n
        m_i, l_i, acc = _update(q, K + base + cols[None, :] * D + offs_d[:, None],
                                V + base + cols[:, None] * D + offs_d[None, :], m_i, l_i, acc, scale, None, False)
    if CAUSAL:
        for start in range(full_hi, full_hi + BM, BN):
            cols = start + offs_n
            m_i, l_i, acc = _update(q, K + base + cols[None, :] * D + offs_d[:, None],
                                    V + base + cols[:, None] * D + offs_d[None, :], m_i, l_i, acc, scale,
                                    offs_m[:, None] >= cols[None, :], True)
    tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16))


def handwritten(q, k, v, causal: bool, bm: int, bn: int, warps: int, stages: int) -> torch.Tensor:
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    scale = 1.0 / math.sqrt(d) * 1.4426950408889634  # log2(e) folded in
    flash_fwd[(n // bm, b * h)](q, k, v, o, scale, n, d, bm, bn, causal, num_warps=warps, num_stages=stages)
    return o


CONFIGS = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 2)]


def measure(op: str, L: int) -> None:
    from triton.testing import do_bench

    from neptune_eq.frontend import capture
    from neptune_eq.tune import autotune, choose_plan

    case = Case(op, L)
    q, k, v = case.inputs("cuda")
    assert q.is_contiguous() and k.shape == q.shape, "the hand-written kernel takes [B, H, L, D] contiguous"
    captured = capture(case.fn, q, k, v)
    ref, rows = reference(case, captured, "cuda")
    run = captured.compile()
    inputs = captured.inputs(q, k, v)
    run.compiled = choose_plan(run.compiled, inputs, candidates=3, progress=False)
    autotune(run.compiled, inputs, progress=False)
    thunks = {"neptune_eq": lambda: run(q, k, v)}
    for bm, bn, w, s in CONFIGS:
        thunks[f"hand {bm}x{bn} w{w} s{s}"] = (lambda bm=bm, bn=bn, w=w, s=s:
                                              handwritten(q, k, v, op == "causal_pf", bm, bn, w, s))
    thunks["sdpa"] = PEERS["sdpa"](case, q, k, v)[0]
    for name, thunk in thunks.items():
        err = rel_err_rows(thunk(), ref, rows)
        if not err <= TOLERANCE["peer"]:
            print(f"{case.label} {name}: failed the float64 check (rel err {err:.2e})")
            continue
        ms = do_bench(thunk, return_mode="median")
        print(f"{case.label} {name}: {ms * 1e3:.0f} µs, {case.useful_flops() / ms / 1e9:.0f} TF/s (rel err {err:.1e})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--L", type=int, default=8192)
    ap.add_argument("--ops", nargs="*", default=["global_pf", "causal_pf"])
    args = ap.parse_args(argv)
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}, triton {triton.__version__}")
    for op in args.ops:
        measure(op, args.L)
    return 0


if __name__ == "__main__":
    sys.exit(main())
