"""Probe: how fast can a warp-specialised attention forward written in Gluon (Triton 3.6) run on
Hopper, beside SDPA and neptune_eq's generated Triton kernel?

Not a product path: a hand-written kernel to measure the ceiling that a Gluon lowering of the rolling
plan could reach before building that lowering (sessions 39 and 49 found plain Triton at 80–89 % of
SDPA on causal / plain prefill, the tensor cores idle while each warp group does its softmax).

Structure (FlashAttention-3's, in Gluon): per program one 128-row query tile; a loader warp streams
K and V tiles by TMA into rings of shared memory; two consumer warp groups own 64 rows each and run
independently (no CTA-wide barrier between them), each issuing the next tile's QKᵀ before the
previous tile's PV so that its softmax overlaps the tensor cores (intra-warp-group pipelining).

    python bench/probe_gluon_attention.py                  # GPU: check vs float64, time vs SDPA / ours
    python bench/probe_gluon_attention.py --compile-only   # any host with triton 3.6: sm_90 compile, ptxas report

Status (session 51, 2026-12-04): written and compiled for sm_90 with triton 3.6 on a CPU host (no
GPU was lent that session): 168 registers at launch (the consumers raise theirs by setmaxnreg), no
spills or local memory, 192 KB of shared memory at head_dim 128, the PV product taking P from
registers (HGMMA with a register A operand), no shared-memory round trip for P. Not yet run: its
correctness and speed are unknown. Sequence lengths must be multiples of 128 (a probe, not a kernel
the compiler emits).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
            q_row, kv_row, n_tiles, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    # the query tile once, then K and V tiles through their rings
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + q_desc.block_type.shape[0], 0], q_bar, q_smem.index(1))
    for t in range(n_tiles):
        s = t % STAGES
        ph = (t // STAGES) & 1
        mbarrier.wait(k_empty.index(s), ph ^ 1)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + t * BLOCK_N, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.wait(v_empty.index(s), ph ^ 1)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + t * BLOCK_N, 0], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _consumer(o_desc, q_smem, k_smem, v_smem, o_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
              q_row, row0, n_tiles, first_masked, qk_scale,
              HALF: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    scol: gl.constexpr = gl.SliceLayout(0, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)

    q = q_smem.index(HALF)
    rows = row0 + HALF * BLOCK_M + gl.arange(0, BLOCK_M, layout=srow)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=srow)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=srow)
    o = gl.zeros([BLOCK_M, HEAD_D], gl.float32, layout=o_layout)
    mbarrier.wait(q_bar, 0)

    # tile 0: scores, then its probabilities (no PV yet)
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                      use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s,))
    mbarrier.arrive(k_empty.index(0), count=1)
    s = s * qk_scale
    if CAUSAL:  # noqa: SIM102  (a constexpr test apart from the runtime one)
        if first_masked <= 0:
            cols = gl.arange(0, BLOCK_N, layout=scol)
            s = gl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_safe[:, None])
    l_i = gl.sum(p, axis=1)
    m_i = m_new
    p16 = gl.convert_layout(p.to(gl.float16), p_layout)

    for t in range(1, n_tiles):
        st = t % STAGES
        ph = (t // STAGES) & 1
        pst = (t - 1) % STAGES
        pph = ((t - 1) // STAGES) & 1
        mbarrier.wait(k_ready.index(st), ph)
        s = warpgroup_mma(q, k_smem.index(st).permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                          use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(pst), pph)
        o = warpgroup_mma(p16, v_smem.index(pst), o, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s,))          # the older group (QKᵀ) is done; PV may still run
        mbarrier.arrive(k_empty.index(st), count=1)
        s = s * qk_scale
        if CAUSAL:  # noqa: SIM102
            if t >= first_masked:
                cols = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=scol)
                s = gl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        m_old = gl.where(m_i == float("-inf"), 0.0, m_i)
        alpha = gl.exp2(m_old - m_safe)
        p = gl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        o = warpgroup_mma_wait(0, deps=(o,))
        mbarrier.arrive(v_empty.index(pst), count=1)
        o = o * gl.convert_layout(alpha, orow)[:, None]
        p16 = gl.convert_layout(p.to(gl.float16), p_layout)

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
    o = warpgroup_mma(p16, v_smem.index(last), o, is_async=True)
    o = warpgroup_mma_wait(0, deps=(o,))
    mbarrier.arrive(v_empty.index(last), count=1)
    l_o = gl.convert_layout(l_i, orow)
    o = o / gl.where(l_o == 0.0, 1.0, l_o)[:, None]
    o_smem.store(o.to(gl.float16))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row + HALF * BLOCK_M, 0], o_smem)
    tma.store_wait(0)


@gluon.jit
def attn_fwd_ws(q_desc, k_desc, v_desc, o_desc, L, qk_scale,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    n_m = gl.cdiv(L, 2 * BLOCK_M)
    pid_m = n_m - 1 - gl.program_id(0)          # longest causal tiles first
    bh = gl.program_id(1)
    row0 = pid_m * 2 * BLOCK_M
    q_row = bh * L + row0
    kv_row = bh * L
    if CAUSAL:
        n_tiles = gl.cdiv(gl.minimum(L, row0 + 2 * BLOCK_M), BLOCK_N)
        first_masked = row0 // BLOCK_N
    else:
        n_tiles = gl.cdiv(L, BLOCK_N)
        first_masked = n_tiles

    q_smem = gl.allocate_shared_memory(gl.float16, [2, BLOCK_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    o_smem = gl.allocate_shared_memory(gl.float16, [2, BLOCK_M, HEAD_D], o_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)

    # (the tuples inline: a tuple bound to a name first loses its constexprs in triton 3.6)
    gl.warp_specialize([
        (_consumer, (o_desc, q_smem, k_smem, v_smem, o_smem.index(0), q_bar, k_ready, k_empty, v_ready, v_empty,
                     q_row, row0, n_tiles, first_masked, qk_scale, 0, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CAUSAL)),
        (_consumer, (o_desc, q_smem, k_smem, v_smem, o_smem.index(1), q_bar, k_ready, k_empty, v_ready, v_empty,
                     q_row, row0, n_tiles, first_masked, qk_scale, 1, BLOCK_M, BLOCK_N, HEAD_D, STAGES, CAUSAL)),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                   q_row, kv_row, n_tiles, BLOCK_N, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])


def _layout(block, dtype=gl.float16):
    return gl.NVMMASharedLayout.get_default_for(block, dtype)


def gluon_attention(q, k, v, causal, block_n=128, stages=2, regs=240):
    B, H, L, D = q.shape
    BM = 64
    assert L % (2 * BM) == 0 and L % block_n == 0, "probe: L a multiple of the tiles"
    q2, k2, v2 = (t.reshape(B * H * L, D) for t in (q, k, v))
    o = torch.empty_like(q)
    o2 = o.view(B * H * L, D)
    qd = TensorDescriptor.from_tensor(q2, [BM, D], _layout([BM, D]))
    kd = TensorDescriptor.from_tensor(k2, [block_n, D], _layout([block_n, D]))
    vd = TensorDescriptor.from_tensor(v2, [block_n, D], _layout([block_n, D]))
    od = TensorDescriptor.from_tensor(o2, [BM, D], _layout([BM, D]))
    grid = (L // (2 * BM), B * H)
    attn_fwd_ws[grid](qd, kd, vd, od, L, LOG2E / math.sqrt(D), BM, block_n, D, stages, causal, regs, num_warps=4)
    return o


def compile_only(D=128, block_n=128, causal=True, stages=2, regs=240):
    """Compile for sm_90 without a GPU and print ptxas's resource report."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    BM = 64
    def desc(block):
        return f"tensordesc<fp16[{block[0]}, {block[1]}],{_layout(block)!r}>"
    sig = {"q_desc": desc([BM, D]), "k_desc": desc([block_n, D]), "v_desc": desc([block_n, D]),
           "o_desc": desc([BM, D]), "L": "i32", "qk_scale": "fp32", "BLOCK_M": "constexpr",
           "BLOCK_N": "constexpr", "HEAD_D": "constexpr", "STAGES": "constexpr", "CAUSAL": "constexpr",
           "CONSUMER_REGS": "constexpr"}
    consts = {"BLOCK_M": BM, "BLOCK_N": block_n, "HEAD_D": D, "STAGES": stages, "CAUSAL": causal,
              "CONSUMER_REGS": regs}
    names = attn_fwd_ws.arg_names
    src = GluonASTSource(attn_fwd_ws, sig, {(names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    import subprocess
    import tempfile
    from pathlib import Path

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([str(tool), "--dump-sass", f.name], capture_output=True, text=True).stdout
    ops = {op: sass.count(op) for op in ("HGMMA", "MUFU.EX2", "LDL", "STL", "BAR.SYNC", "SYNCS")}
    res = " ".join(line.strip() for line in usage.splitlines() if "REG" in line)
    print(f"D={D} BN={block_n} causal={causal}: shared {k.metadata.shared} B; {res}; {ops}")
    return k


CONFIGS = {128: [(128, 2), (64, 3), (64, 2)], 64: [(128, 2), (128, 3), (64, 3)]}  # (key tile, ring depth) by head dim


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if args.compile_only:
        for D in (64, 128):
            for block_n, stages in CONFIGS[D]:
                for causal in (False, True):
                    compile_only(D=D, block_n=block_n, stages=stages, causal=causal)
        return
    import neptune_eq

    torch.manual_seed(0)
    rows = []
    shapes = [(1, 32, 16384, 128, True), (1, 32, 16384, 128, False), (8, 16, 2048, 64, True),
              (4, 32, 4096, 128, True), (1, 32, 8192, 128, True)]
    for B, H, L, D, causal in shapes:
        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.float16) for _ in range(3))

        def ref_fn(q, k, v, causal=causal):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def plain(q, k, v, causal=causal):
            s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            if causal:
                n = s.shape[-1]
                keep = torch.arange(n, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None]
                s = s.masked_fill(~keep, float("-inf"))
            return torch.softmax(s, -1) @ v

        sub = (slice(0, 1), slice(0, 2))
        ref = ref_fn(*(t[sub].double() for t in (q, k, v)))
        ours = neptune_eq.compile(plain, q, k, v)
        impls = {f"gluon_ws[{bn},{st}]": lambda q=q, k=k, v=v, c=causal, bn=bn, st=st: gluon_attention(
                     q, k, v, c, block_n=bn, stages=st) for bn, st in CONFIGS[D]}
        impls |= {"neptune_eq": lambda q=q, k=k, v=v, f=ours: f(q, k, v),
                  "sdpa": lambda q=q, k=k, v=v, f=ref_fn: f(q, k, v)}
        flops = 4 * B * H * L * L * D * (0.5 if causal else 1.0)
        row = {"shape": [B, H, L, D], "causal": causal}
        for name, fn in impls.items():
            try:
                out = fn()
                torch.cuda.synchronize()
            except Exception as e:  # (a config that does not compile or launch: said, the others still run)
                row[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                continue
            err = ((out[sub].double() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:  # (NaN too: never timed as if it were right)
                row[name] = {"rel_err": err}
                continue
            ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
            row[name] = {"ms": ms, "rel_err": err, "tflops": flops / ms / 1e9}
        timed = [n for n in row if n.startswith("gluon_ws") and "ms" in row[n]]
        row["gluon_ws"] = row[min(timed, key=lambda n: row[n]["ms"])] | {"config": min(
            timed, key=lambda n: row[n]["ms"])} if timed else {"ms": float("nan"), "tflops": float("nan")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, "gluon_attention.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'shape':>24} {'causal':>6} " + " ".join(f"{n:>16}" for n in ("gluon_ws", "neptune_eq", "sdpa")))
    for r in rows:
        cells = " ".join(f"{r[n]['ms']:7.3f}ms {r[n]['tflops']:4.0f}TF" for n in ("gluon_ws", "neptune_eq", "sdpa"))
        print(f"{r['shape']!s:>24} {r['causal']!s:>6} {cells}")


if __name__ == "__main__":
    sys.exit(main())
