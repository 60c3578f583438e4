"""What ptxas makes of the generated kernels, on any host (no GPU): each kernel of a benchmark operator's
forward (or saved backward) is compiled for sm_90 by the installed Triton with the launch's
specialisation (strides and lengths as the compile fixes them, pointers 16-byte aligned), and its PTX
given to Triton's bundled ptxas with -v: registers, spills and the performance advisories (C7515:
"wgmma.mma_async instructions are serialized due to ..."), with the shared memory the kernel asks for
beside what the schedule rules estimate (shared_memory.shared_bytes). --tiles / --stages override the
schedule of every kernel.

With the GPU image's Triton (3.6, ptxas of CUDA 12.8) on PYTHONPATH it reproduces the device's verdict
(causal_pf's forward at L 4096: 227 registers and C7515 here and on the H100; session 38); the newer
Triton of this repository's environment compiles differently (no C7515 where 3.6 has it).

    pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36 TRITON_INTERPRET=0 python bench/ptxas_check.py causal_pf [--L 4096] [--backward] [--source F]
    PYTHONPATH=/tmp/t36 TRITON_INTERPRET=0 python bench/ptxas_check.py rmsnorm_matmul --beyond
    PYTHONPATH=/tmp/t36 TRITON_INTERPRET=0 python bench/ptxas_check.py window_pf --L 3000 --dynamic
    PYTHONPATH=/tmp/t36 TRITON_INTERPRET=0 python bench/ptxas_check.py varlen --L 32768   # packed prefill
    TRITON_INTERPRET=0 python bench/ptxas_check.py --sweep "cosface fwd+bwd" --backward   # a training call's backward
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import Case, saved_backward
from probe_wgmma_serial import advisories

import neptune_eq

TRITON_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64", "int64": "i64",
                "int32": "i32", "bool": "i1"}


def contiguous_strides(shape: list[int]) -> list[int]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return out[::-1]


def compile_kernel(module, ks, axes: dict[str, int]):
    """Triton's compiled kernel of KernelSource `ks` for sm_90: constexpr strides of contiguous tensors
    and the static lengths, every pointer 16-byte aligned (what the JIT sees at a launch)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(module, ks.name)
    tensors = {t.name: t for t in ks.tensors}
    sig, consts, values = {}, {**ks.constexprs, "USE_PDL": False}, {}
    for name in fn.arg_names:
        m = re.fullmatch(r"(\w+)_s(\d+)", name)
        if name.endswith("_ptr") and name[:-4] in tensors:
            sig[name] = "*" + TRITON_TYPES.get(tensors[name[:-4]].dtype, "fp32")
        elif name.endswith("_ptr"):  # a table of per-call loop bounds (lower/databounds.py)
            sig[name] = "*i32"
        elif m and m.group(1) in tensors:
            shape = [axes.get(a, 1) if isinstance(a, str) else 1 for a in tensors[m.group(1)].axes]
            values[name] = contiguous_strides(shape)[int(m.group(2))]
        elif name.startswith("n_") and name[2:] in axes:
            values[name] = axes[name[2:]]
    # a dynamic program's lengths and strides are arguments: the JIT specialises an int on 1 (a
    # constant) and on divisibility by 16, except the names it is told not to (the lengths)
    free = {p.name for p in fn.params if not p.is_constexpr}
    skip = {fn.arg_names[i] if isinstance(i, int) else i for i in getattr(fn, "do_not_specialize", ())}
    divisible = set()
    for name, v in values.items():
        if name not in free or (v == 1 and name not in skip):
            consts[name] = v
        elif v % 16 == 0 and name not in skip:
            divisible.add(name)
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        sig.setdefault(name, "i32")
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in divisible}
    src = ASTSource(fn, sig, constexprs={k: v for k, v in consts.items() if k in fn.arg_names}, attrs=attrs)
    opts = {"num_warps": ks.schedule.num_warps, "num_stages": ks.schedule.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def _chosen_backward(fn, xs, buffers):
    """The compiled backward program a training call of `fn` at `xs` chooses (every floating input
    but `buffers` needing gradients), derived and compiled as the first such call would."""
    from neptune_eq import autograd

    prog = neptune_eq.compile(fn, *xs)
    qual = prog._first().op.qualname
    names = autograd._ATTACHED[qual][1]
    key, t = autograd._variant(qual, [n for k, n in enumerate(names) if k not in buffers])
    back = autograd._choose(key, t, t.compile_fn)
    return autograd._compiled(f"{key}:{autograd._mode(back)}", back.program, t.compile_fn)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("op")
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--backward", action="store_true",
                    help="the saved backward's kernels (with --sweep: the backward a training call chooses)")
    ap.add_argument("--source", help="a hand-edited module to compile in place of the generated one")
    ap.add_argument("--beyond", action="store_true", help="op names a bench/beyond program (its first size)")
    ap.add_argument("--sweep", action="store_true", help="op starts the name of a sweep row (bench/sweeps.py)")
    ap.add_argument("--tiles", default="", help="schedule override of every kernel, e.g. j=128")
    ap.add_argument("--stages", type=int, default=None, help="pipeline stages override")
    ap.add_argument("--dynamic", action="store_true",
                    help="the kernels a dynamic compile (at L - 7) runs at L: lengths and strides as arguments")
    a = ap.parse_args()
    if a.op == "varlen":  # bench/varlen_paged.py's packed prefill: 16 documents in L tokens, 32 heads
        from varlen_paged import random_lengths, varlen_attention

        lengths = torch.tensor(random_lengths(16, a.L, 0))
        fn = varlen_attention
        xs = (*(torch.randn(32, a.L, 128, dtype=torch.float16) for _ in range(3)),
              torch.repeat_interleave(torch.arange(16), lengths))
    elif a.sweep:
        from sweeps import row_named

        row = row_named(a.op)
        fn, xs = row.fn, row.make("cpu", torch.Generator().manual_seed(0), False)
    elif a.beyond:
        sys.path.insert(0, str(Path(__file__).resolve().parent / "beyond"))
        from programs import cases

        bc = cases([a.op])[0]
        fn, xs = bc.program.fn, bc.inputs("cpu")
    else:
        c = Case(a.op, a.L)
        fn, xs = c.fn, c.inputs("cpu")
    if a.backward and a.sweep:  # the backward a training call of the row runs (the cost model's choice)
        comp = _chosen_backward(fn, xs, row.buffers)
        prog = comp.program
    elif a.backward:
        prog, comp = saved_backward(fn, *xs)
    else:
        comp = neptune_eq.compile(fn, *xs).program
        prog = comp.program
    if a.dynamic:  # the static compile's axes are the call's lengths
        small = Case(a.op, a.L - 7).inputs("cpu")
        fam = neptune_eq.compile(fn, *small, dynamic=True).family
        comp = fam.program_for(fam.serves(xs))
    if a.tiles or a.stages:
        from dataclasses import replace

        over = {k: int(v) for k, v in (t.split("=") for t in a.tiles.split(",") if t)}
        comp.schedules["cuda"] = [replace(sc.with_tiles(**{k: v for k, v in over.items() if k in sc.tiles}),
                                          num_stages=a.stages or sc.num_stages) for sc in comp._schedules("cuda")]
    src, kernels = comp.lowered("cuda")
    if a.source:
        src = Path(a.source).read_text()
    path = Path(tempfile.mkdtemp()) / "module.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import triton

    size = ("" if a.beyond or a.sweep else f" L={a.L}") + (" dynamic" if a.dynamic else "")
    print(f"{a.op}{size} {'backward' if a.backward else 'forward'}, Triton {triton.__version__}", flush=True)
    from neptune_eq.shared_memory import shared_bytes

    plan = comp.plan
    for ks, kp in zip(kernels, plan.kernels):
        if not hasattr(module, ks.name):  # (a library GEMM: the vendor's, no Triton kernel)
            continue
        ck = compile_kernel(module, ks, dict(prog.axes))
        shared = getattr(ck.metadata, "shared", None)
        model = shared_bytes(kp, comp.program, plan, ks.schedule)  # what the schedule rules price it at
        tiles = {x: t for x, t in ks.schedule.tiles.items() if t > 1}
        print(f"  {ks.name} {tiles} w{ks.schedule.num_warps} s{ks.schedule.num_stages}: {shared} bytes of shared "
              f"memory (shared_memory.shared_bytes {model}); " + "; ".join(advisories(ck.asm["ptx"])), flush=True)


if __name__ == "__main__":
    main()
