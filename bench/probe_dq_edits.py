"""Probe: why does the generated dQ kernel of causal attention's backward (6.7 ms at L = 16384, 32 heads)
run slower than a hand-written one with the same tiles (bench/probe_atomic_dq.py's dq_kernel, 5.9 ms)?

Times the generated kernel (a saved cuda-target source) and hand edits of it, each one difference from
the hand-written kernel, beside that kernel, interleaved over rounds (do_bench medians). The statistics
are random (timing only); each edit's dQ is compared with the unedited kernel's on the same inputs.
With --kernel dkdv: the generated dK/dV kernel of session 37 (exp2, scale folded) against itself with
exp (it measured 0.4-0.6 ms slower than the exp version in the whole backward), each with and without
the unmasked loop's per-element select of rows whose softmax sum is 0.

    python bench/probe_dq_edits.py [--rounds 3] [--kernel dq|dkdv] [--dump DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
import sys
import tempfile
from pathlib import Path

import torch
import triton.testing

HERE = Path(__file__).resolve().parent
SRC = HERE / "results/h100_2026-11-27/session37/causal_bwd_k0_cuda.txt"
SRC_DKDV = HERE / "results/h100_2026-11-27/session37/causal_bwd_k1_cuda.txt"
sys.path.insert(0, str(HERE))

from probe_atomic_dq import dq_kernel  # noqa: E402
from probe_bwd_rows import as_exp  # noqa: E402
from probe_bwd_rows import no_row_check as no_row_select  # noqa: E402  (dK/dV's form of the row test)

LOG2E = 1.4426950408889634


def no_row_check(s):  # the unmasked loop's select of rows whose softmax sum is 0 (fully masked rows)
    return s.replace("p46 = tl.where(m19[:, None], t45, 0.0)", "p46 = t45")


def kv_rows(s):  # K and V loaded as [key, dim] tiles (transposed in the dots) instead of [dim, key]
    s = re.sub(r"offs_j\[None, :\] \* (k|v)_s1 \+ offs_(d|e)\[:, None\] \* (k|v)_s2",
               r"offs_j[:, None] * \1_s1 + offs_\2[None, :] * \3_s2", s)
    s = s.replace("mask=(offs_j < n_j)[None, :], other=0)", "mask=(offs_j < n_j)[:, None], other=0)")
    for x in ("x24", "x37", "x52", "x28", "x40", "x55"):
        s = s.replace(f"tl.dot(x23, {x})", f"tl.dot(x23, tl.trans({x}))")
        s = s.replace(f"tl.dot(x27, {x})", f"tl.dot(x27, tl.trans({x}))")
        s = s.replace(f"tl.trans({x}), st_sum_j)", f"{x}, st_sum_j)")
    return s


def exp2(s):  # exp(s·c − lse) as exp2(s·c·log2e − lse·log2e), lse scaled once per row
    s = s.replace("x31 = tl.load(saved_lse_ptr + t_h * saved_lse_s0 + offs_i * saved_lse_s1)",
                  f"x31 = tl.load(saved_lse_ptr + t_h * saved_lse_s0 + offs_i * saved_lse_s1) * {LOG2E}")
    for t in ("t30", "t42", "t57"):
        s = re.sub(rf"{t} = \((d\d+) \* 0\.08838834764831843\)", rf"{t} = (\1 * {0.08838834764831843 * LOG2E})", s)
    return s.replace("tl.exp(", "tl.exp2(")


def natural_order(s):  # query tiles in launch order (the generated kernel runs the longest rows first)
    return s.replace("t_i = ((n_i + 128 - 1) // 128) - 1 - pid % ((n_i + 128 - 1) // 128)",
                     "t_i = pid % ((n_i + 128 - 1) // 128)")


def no_first_loop(s):  # the empty leading masked loop (no key below 0) left out
    return s.replace("for start_j in range(lo_j, flo_j, BLOCK_j):", "for start_j in range(lo_j, lo_j, BLOCK_j):")


def d_from_buffer(s):  # D = rowsum(dO∘O) read from a buffer rather than computed by the kernel's first pass
    i, j = s.index("    st_sum_e = tl.full("), s.index("    st_sum_j = tl.full(")
    return s[:i] + "    st_sum_e = tl.load(buf_sum_e_ptr + t_h * buf_sum_e_s0 + offs_i * buf_sum_e_s1)\n" + s[j:]


def s_first(s):  # S = QKᵀ and its exp emitted before dP = dO·Vᵀ (the generated order is dP first)
    lines, out, i = s.split("\n"), [], 0
    while i < len(lines):
        if "tl.load(v_ptr" in lines[i] and "tl.load(k_ptr" in lines[i + 3]:
            out += lines[i + 3:i + 8] + lines[i:i + 3]
            i += 8
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out)


EDITS = {"generated": [], "no_row_check": [no_row_check], "exp2": [exp2], "kv_rows": [kv_rows],
         "natural_order": [natural_order], "no_first_loop": [no_first_loop], "d_from_buffer": [d_from_buffer],
         "like_hand": [no_row_check, exp2, kv_rows, s_first, natural_order, no_first_loop, d_from_buffer],
         "s_first": [s_first], "s_first_row_exp2": [s_first, no_row_check, exp2]}


def prescaled(s):  # the loop's lse·log2(e) read from a buffer that holds it (no multiply per step)
    out = re.sub(r"(t\d+) = \((x\d+) \* 1\.4426950408889634\)", r"\1 = \2", s)
    assert out != s
    return out


def asm_exp2(s, ftz=True):  # tl.exp2 (libdevice in triton 3.6: LLVM may move it) as PTX's ex2 in inline asm
    op = "ex2.approx.ftz.f32" if ftz else "ex2.approx.f32"
    helper = (f"@triton.jit\ndef _ex2(x):\n    return tl.inline_asm_elementwise(\"{op} $0, $1;\", \"=r,r\", [x], "
              "dtype=tl.float32, is_pure=True, pack=1)\n\n\n")
    i = s.index("@triton.jit")
    return s[:i] + helper + s[i:].replace("tl.exp2(", "_ex2(")


def dkdv(rounds: int, dump_dir: str | None) -> None:
    H, L, D = 32, 16384, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(H, L, D, device="cuda", generator=g, dtype=torch.float16) for _ in range(4))
    lse = (torch.rand(H, L, device="cuda", generator=g) + math.log(L) / 2).contiguous()
    l1 = torch.rand(H, L, device="cuda", generator=g) + 1
    dd = torch.randn(H, L, device="cuda", generator=g) * 0.1
    base = SRC_DKDV.read_text()
    no_row = no_row_select(base)
    variants = {"generated_exp2": base, "exp": as_exp(base), "exp2_no_row_check": no_row,
                "exp_no_row_check": as_exp(no_row), "exp2_lse2": prescaled(base), "exp2_no_row_lse2": prescaled(no_row),
                "asm_ftz": asm_exp2(base), "asm_ftz_no_row": asm_exp2(no_row), "asm_no_row": asm_exp2(no_row, False)}
    assert len({*variants.values()}) == len(variants), "an edit changed nothing"
    lse2 = lse * LOG2E  # what the "_lse2" variants read: the log-sum-exp already times log2(e)
    outs, runs = {}, {}
    for name, text in variants.items():
        lse_in = lse2 if name.endswith("_lse2") else lse
        fn = _kernel(name, text, "k1")
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        outs[name] = (dk, dv)

        def run(fn=fn, dk=dk, dv=dv, lse=lse_in):
            return fn[(L // 64 * H,)](l1, *l1.stride(), v, *v.stride(), do, *do.stride(), dd, *dd.stride(), k,
                                      *k.stride(), q, *q.stride(), lse, *lse.stride(), dk, *dk.stride(), dv,
                                      *dv.stride(), n_e=D, n_j=L, n_d=D, n_h=H, n_i=L, BLOCK_h=1, BLOCK_d=128,
                                      BLOCK_j=64, BLOCK_e=128, BLOCK_i=64, USE_PDL=False, num_warps=4, num_stages=2)
        dump(name, run(), dump_dir)
        runs[name] = run
    for name in variants:
        a, b = outs["generated_exp2"], outs[name]
        print(f"max |generated - {name}| dK, dV:", [(x.float() - y.float()).abs().max().item() for x, y in zip(a, b)])
    times = {n: [] for n in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(triton.testing.do_bench(run, warmup=50, rep=400, return_mode="median"))
    print(f"H100 dK/dV kernel, H={H} L={L} D={D} causal, ms per round:")
    for name, ts in times.items():
        print(f"  {name:16s} " + "  ".join(f"{t:.3f}" for t in ts))


def _kernel(name, text, which):
    path = Path(tempfile.mkdtemp()) / f"{which}_{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"{which}_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, f"nq_causal_pf_backward_{which}")


def load(name, text):
    return _kernel(name, text, "k0")


def dump(name, ck, folder):
    ttgir = ck.asm["ttgir"]
    print(f"  {name}: {ck.n_regs} registers, {ck.n_spills} spills; TTGIR: {ttgir.count('convert_layout')} "
          f"convert_layout, {ttgir.count('local_alloc')} local_alloc, {ttgir.count('local_load')} local_load",
          flush=True)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        for kind in ("ttgir", "ptx"):
            (Path(folder) / f"{name}.{kind}").write_text(ck.asm[kind])
        (Path(folder) / f"{name}.cubin").write_bytes(ck.asm["cubin"])  # nvdisasm reads it off the GPU


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--L", type=int, default=16384)
    ap.add_argument("--dump", default=None, help="folder for each variant's TTGIR and PTX")
    ap.add_argument("--kernel", choices=("dq", "dkdv"), default="dq")
    a = ap.parse_args()
    if a.kernel == "dkdv":
        return dkdv(a.rounds, a.dump)
    H, L, D = 32, a.L, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do, o = (torch.randn(H, L, D, device="cuda", generator=g, dtype=torch.float16) for _ in range(5))
    lse = (torch.rand(H, L, device="cuda", generator=g) + math.log(L) / 2).contiguous()
    l1 = torch.rand(H, L, device="cuda", generator=g) + 1
    base = SRC.read_text()
    kernels = {}
    for name, edits in EDITS.items():
        text = base
        for e in edits:
            new = e(text)
            assert new != text, f"edit {e.__name__} changed nothing"
            text = new
        kernels[name] = load(name, text)
    dd = torch.empty(H, L, device="cuda")

    def gen(fn):
        def run(dq):
            return fn[(H * L // 128,)](do, *do.stride(), o, *o.stride(), l1, *l1.stride(), v, *v.stride(), q,
                                *q.stride(), k, *k.stride(), lse, *lse.stride(), dq, *dq.stride(), dd, *dd.stride(),
                                n_d=D, n_i=L, n_h=H, n_e=D, n_j=L, BLOCK_h=1, BLOCK_i=128, BLOCK_d=128, BLOCK_e=128,
                                BLOCK_j=64, USE_PDL=False, num_warps=8, num_stages=3)
        return run

    runs = {name: gen(fn) for name, fn in kernels.items()}
    dqs = {}
    for name, run in runs.items():
        dqs[name] = torch.empty_like(q)
        ck = run(dqs[name])
        dump(name, ck, a.dump)
    for name, run in runs.items():
        run(dqs[name])
        err = (dqs[name].float() - dqs["generated"].float()).abs().max().item()
        print(f"{name}: max |dQ - generated's| = {err:.3g}", flush=True)
    dqh = torch.empty_like(q)
    runs = {name: (lambda run=run, out=dqs[name]: run(out)) for name, run in runs.items()}
    runs["hand-written"] = lambda: dq_kernel[(L // 128, H)](q, k, v, do, lse, dd, dqh, 1 / math.sqrt(D), L, D=D, BI=128,
                                                           BJ=64, num_warps=8, num_stages=3)
    dump("hand-written", runs["hand-written"](), a.dump)
    times = {n: [] for n in runs}
    for _ in range(a.rounds):
        for name, run in runs.items():
            times[name].append(triton.testing.do_bench(run, warmup=50, rep=400, return_mode="median"))
    print(f"H100 dQ kernel, H={H} L={L} D={D} causal, ms per round:")
    for name, ts in times.items():
        print(f"  {name:14s} " + "  ".join(f"{t:.3f}" for t in ts))


if __name__ == "__main__":
    main()
