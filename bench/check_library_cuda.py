"""Check (session 65): the vendor's GEMM kinds added this session run on CUDA and match float64 — a
float32 SGEMM, a constant alpha (addmm_ / baddbmm_), and a float32 result of 16-bit operands (aten's
addmm / baddbmm dtype_out). The CPU suite covers them through its widened-products path only.

    python bench/check_library_cuda.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_library_gemm import _library, _product

from neptune_eq.lower.library import library_gemm
from neptune_eq.runtime import compile_ir


def main() -> int:
    bad = 0
    for dtype, scale, batched, out_dtype in (("float32", None, False, None), ("bfloat16", 0.5, False, None),
                                             ("float16", -3.0, True, None), ("bfloat16", None, False, "float32"),
                                             ("float16", 2.0, True, "float32")):
        b = ("b",) if batched else ()
        extents = {"b": 3, "i": 333, "d": 700, "e": 190} if batched else {"i": 333, "d": 700, "e": 190}
        program = _product((*b, "i", "d"), (*b, "d", "e"), (*b, "i", "e"), extents, dtype=dtype, scale=scale,
                           out_dtype=out_dtype)
        prog = _library(compile_ir(program))
        g = library_gemm(prog.plan.kernels[-1], prog.plan, prog.program)
        gen = torch.Generator(device="cuda").manual_seed(0)
        xs = {n: torch.randn(*(program.axes[a] for a in s.axes), device="cuda", generator=gen)
              .to(getattr(torch, s.dtype)) for n, s in program.inputs.items()}
        ref = torch.einsum("...id,...de->...ie", xs["a"].double(), xs["b"].double()) * (scale or 1.0)
        out = prog.run(xs)["o"]
        err = float((out.double() - ref).norm() / ref.norm())
        ok = out.dtype == getattr(torch, out_dtype or dtype) and err < (1e-5 if (out_dtype or dtype) == "float32"
                                                                         else 1e-2)
        bad += not ok
        print(f"{g.describe():60s} {dtype:9s} -> {out.dtype}  rel err {err:.1e}  {'ok' if ok else 'WRONG'}", flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(main())
