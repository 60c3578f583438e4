"""What the GPU runs: instruction counts of a benchmark kernel's SASS (PTX where the machine has no
disassembler), per schedule variant.

    python bench/sass.py global_pf 8192                  # default schedule, then with TMA loads
    python bench/sass.py causal_pf 8192 --tiles j=128 --warps 8 --stages 3

For each variant it prints the kernel time (do_bench median), whether the TTGIR uses tensor-memory
copies (TMA) and warp-group MMA, and counts of the instruction classes that bound an attention
kernel: tensor-core MMAs, special-function ops (exp2, rcp, tanh), FP32 ALU ops, global and
shared-memory traffic and barriers. Static counts over the whole kernel (three loops for a causal
kernel), not executed counts: they show what one tile costs, not how often it runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from cases import Case  # noqa: E402

import neptune_eq  # noqa: E402, F401

CLASSES = {  # SASS opcode (before the first '.') → class
    "HGMMA": "mma", "HMMA": "mma", "MUFU": "sfu", "FFMA": "fp32", "FMUL": "fp32", "FADD": "fp32",
    "FMNMX": "fp32", "FSEL": "fp32", "FSETP": "fp32", "F2F": "cvt", "F2FP": "cvt", "LDG": "global",
    "LDGSTS": "global", "UTMALDG": "tma", "UBLKCP": "tma", "STG": "global", "LDS": "shared", "LDSM": "shared",
    "STS": "shared", "BAR": "sync", "SYNCS": "sync", "WARPGROUP": "sync",
}


def sass_counts(sass: str) -> Counter:
    ops = Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?", line)
        if not m:
            continue
        op = m.group(1)
        ops[op] += 1
        if op == "MUFU":
            ops["MUFU" + (m.group(2) or "")] += 1
    return ops


def ptx_counts(ptx: str) -> Counter:
    """Opcode counts of PTX (before ptxas: a mul and an add it may still fuse count as two)."""
    ops = Counter()
    for line in ptx.splitlines():
        m = re.match(r"\s*(?:@%p\d+\s+)?([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*)\s", line)
        if m and not line.lstrip().startswith(("//", ".")):
            ops[m.group(1)] += 1
    return ops


PTX_SHOWN = ("wgmma.mma_async", "ex2.approx", "tanh.approx", "fma.rn", "mul", "add", "sub", "max", "cp.async",
             "cp.async.bulk.tensor", "ld.global", "st.global", "bar.sync")


def ptx_summary(ops: Counter) -> str:
    shown = Counter()
    for op, n in ops.items():
        for p in PTX_SHOWN:
            if op.startswith(p):
                shown[p] += n
    return ", ".join(f"{p} {shown[p]}" for p in PTX_SHOWN if shown[p])


def summary(ops: Counter) -> str:
    by_class = Counter()
    for op, n in ops.items():
        if op in CLASSES:
            by_class[CLASSES[op]] += n
    detail = ", ".join(f"{op} {n}" for op, n in sorted(ops.items()) if op.startswith("MUFU.") or op in
                       ("HGMMA", "FFMA", "FMUL", "FADD", "FMNMX", "UTMALDG", "LDGSTS", "LDG"))
    return f"{dict(sorted(by_class.items()))}  [{detail}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("op")
    ap.add_argument("L", type=int)
    ap.add_argument("--tiles", nargs="*", default=[], help="axis=size, e.g. j=128")
    ap.add_argument("--warps", type=int)
    ap.add_argument("--stages", type=int)
    ap.add_argument("--tma", choices=("off", "on", "both"), default="both", help="tensor-descriptor loads")
    ap.add_argument("--ws", choices=("off", "on", "both"), default="off",
                    help="warp-specialised unmasked loops (tl.range(..., warp_specialize=True))")
    ap.add_argument("--out", help="folder to write each variant's SASS to")
    args = ap.parse_args(argv)
    import triton.testing

    from neptune_eq.frontend import capture
    from neptune_eq.runtime import compile_ir

    case = Case(args.op, args.L)
    q, k, v = case.inputs("cuda")
    captured = capture(case.fn, q, k, v)
    compiled = compile_ir(captured.program)
    inputs = captured.inputs(q, k, v)
    base = compiled._schedules("cuda")
    tiles = {a: int(n) for a, n in (t.split("=") for t in args.tiles)}
    base = [replace(s.with_tiles(**{a: n for a, n in tiles.items() if a in s.tiles}),
                    num_warps=args.warps or s.num_warps, num_stages=args.stages or s.num_stages) for s in base]
    print(f"{case.label}: {compiled.alternative.structure}")
    modes = {"off": (False,), "on": (True,), "both": (False, True)}
    ref = None
    for tma in modes[args.tma]:
        for ws in modes[args.ws]:
            compiled.schedules["cuda"] = [replace(s, tma=tma, warp_specialize=ws) for s in base]
            compiled._modules.clear()
            launcher = compiled.launcher("cuda")
            kernels: list = []
            try:
                out = launcher(inputs, compiled=kernels)
            except Exception as e:
                print(f"  tma={tma} ws={ws}: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            ref = ref if ref is not None else out  # variants must agree with the first one
            diff = max(float((out[n].float() - ref[n].float()).abs().max()) for n in out)
            ms = triton.testing.do_bench(lambda launcher=launcher: launcher(inputs), return_mode="median")
            print(f"  tma={tma} ws={ws}: {ms * 1e3:.1f} µs, max |diff| to the first variant {diff:.2e}")
            report(args, launcher, kernels, ms, tma, ws)
    torch.cuda.synchronize()
    return 0


def report(args, launcher, kernels, ms, tma, ws) -> None:
    """Per kernel: TTGIR features, registers, spills and the SASS (or PTX) instruction mix."""
    for ks, ck in zip(launcher.kernels, kernels):
        ttgir = ck.asm["ttgir"]
        try:
            sass = ck.asm["sass"]  # disassembled on first access (cuobjdump / nvdisasm)
        except Exception as e:
            sass = ""
            print(f"    no SASS: {type(e).__name__}: {e}")
        flags = [f for f, pat in (("tma", "async_tma_copy"), ("wgmma", "warp_group_dot"),
                                  ("ws", "warp_specialize")) if pat in ttgir]
        s = ks.schedule
        print(f"  {ks.name} tma={tma} {s.tiles} w{s.num_warps} s{s.num_stages}: plan {ms * 1e3:.1f} µs, "
              f"ttgir {flags}, regs {getattr(ck, 'n_regs', '?')}, spills {getattr(ck, 'n_spills', '?')}")
        if sass:
            print(f"    sass: {summary(sass_counts(sass))}")
        else:  # no disassembler on the machine: the PTX mix instead
            print(f"    ptx: {ptx_summary(ptx_counts(ck.asm['ptx']))}")
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"{args.op}_{args.L}_{ks.name}_tma{int(tma)}_ws{int(ws)}.sass").write_text(sass)


if __name__ == "__main__":
    sys.exit(main())
