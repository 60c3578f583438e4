"""exp2 on the GPU is PTX's ex2.approx.ftz.f32 in inline assembly (lower/triton.py EXP2_CUDA).

Triton 3.6's tl.exp2 is libdevice's exp2f, the same instruction after its flush-to-zero reflect, but one
LLVM schedules freely: in the masked loops of attention's dK/dV kernel it moved the ex2s among the
warp-group MMAs and ptxas serialised every wgmma of the kernel (H100: 9.6-10.0 against 8.2-8.5 ms).
These tests check what the generated code holds and what the helper compiles to for sm_90 (Triton's
CUDA backend compiles to PTX without a GPU); the speed is bench/probe_dq_edits.py's on the GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import neptune_eq
from neptune_eq.lower.triton import EXP2_CUDA


def _causal(q, k, v):
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[-2])
    s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v


def _kernel_bodies(src: str) -> str:
    """The generated kernels (nq_*), without the module's helpers."""
    return src[src.index("def nq_"):]


def test_cuda_kernels_call_the_inline_ex2_and_the_interpreter_keeps_tl_exp2():
    x = torch.randn(2, 40, 16)
    prog = neptune_eq.compile(_causal, x, x, x).program
    cuda = prog.lowered("cuda")[0]
    assert "_exp2(" in _kernel_bodies(cuda) and "tl.exp2(" not in _kernel_bodies(cuda)
    assert 'inline_asm_elementwise("ex2.approx.ftz.f32' in cuda
    interp = prog.lowered("interpreter")[0]
    assert "ex2.approx" not in interp
    out = prog.run({"q": x, "k": x, "v": x})["out0"]  # the interpreter's _exp2 is tl.exp2
    ref = _causal(x.double(), x.double(), x.double())
    assert (out.double() - ref).abs().max().item() < 1e-5


_COMPILE = """
import importlib.util, sys
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
path = Path(sys.argv[1])
spec = importlib.util.spec_from_file_location(path.stem, path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
sig = {"x_ptr": "*" + sys.argv[2], "y_ptr": "*" + sys.argv[2]}
ck = triton.compile(ASTSource(mod.k, sig, constexprs={}), target=GPUTarget("cuda", 90, 32))
print(ck.asm["ptx"])
"""


def _compile_for_sm90(tmp_path: Path, dtype: str) -> str:
    """The PTX of a kernel storing _exp2 of a loaded `dtype` tile, compiled for sm_90 by Triton's CUDA
    backend in a fresh process (this one runs Triton's interpreter, which patches triton.language)."""
    src = "import triton\nimport triton.language as tl\n" + EXP2_CUDA + '''

@triton.jit
def k(x_ptr, y_ptr):
    offs = tl.arange(0, 128)
    tl.store(y_ptr + offs, _exp2(tl.load(x_ptr + offs)))
'''
    path = tmp_path / f"exp2_{dtype}.py"
    path.write_text(src)
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", _COMPILE, str(path), dtype], capture_output=True, text=True, env=env,
                         timeout=300)
    if out.returncode != 0 and "ex2" not in out.stdout:
        if "CompilationError" in out.stderr:  # the helper itself failed to compile: a real failure
            raise AssertionError(out.stderr[-2000:])
        pytest.skip(f"no CUDA compile here: {out.stderr.strip().splitlines()[-1][:200] if out.stderr else ''}")
    return out.stdout


def test_the_helper_is_the_ftz_ex2_for_fp32_and_libdevice_for_fp64(tmp_path):
    ptx32 = _compile_for_sm90(tmp_path, "fp32")
    # inside an inline-asm block (tl.exp2 would give the same instruction outside one, free to move)
    blocks = re.findall(r"// begin inline asm(.*?)// end inline asm", ptx32, re.S)
    assert any("ex2.approx.ftz.f32" in b for b in blocks)
    ptx64 = _compile_for_sm90(tmp_path, "fp64")
    assert "ex2.approx" not in ptx64  # float64 programs keep an exact exp2 (no fp32 approximation)


def test_the_masked_tiles_run_before_the_full_ones():
    """A pass split into masked and full tiles runs its masked loops first (lower/passes.py): with the
    full tiles' loop after a masked one, ptxas serialised every wgmma of the kernel (Triton 3.6, CUDA
    12.8: causal attention's forward, dQ and dK/dV kernels; bench/ptxas_check.py). The order of the
    tiles is free (monoids and rolling updates): the result matches float64 at a length that is not
    a tile multiple, with the diagonal tiles of every program visited first."""
    x = torch.randn(2, 300, 16)
    prog = neptune_eq.compile(_causal, x, x, x).program
    src = _kernel_bodies(prog.lowered("cuda")[0])
    loops = re.findall(r"for start_j in range\((\w+), (\w+), BLOCK_j\)", src)
    assert [lo[:3] for lo, _ in loops] == ["lo_", "fhi", "flo"], loops  # masked, masked, then full tiles
    out = prog.run({"q": x, "k": x, "v": x})["out0"]
    ref = _causal(x.double(), x.double(), x.double())
    assert (out.double() - ref).abs().max().item() < 1e-5
