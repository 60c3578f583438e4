"""Loading generated modules and launching their kernels on torch tensors.

The generated source is written to a file named by its hash (Triton reads kernel source from
files) and imported from there; on a CPU the kernels run through Triton's interpreter.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import ir
from .._interpret import require_interpreter
from ..ir import NeptuneError
from ..plan import Plan
from .triton import KernelSource, _ident

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "float64": torch.float64, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neptune_eq"


def load_module(source: str, cache_dir: Path | None = None):
    """Import generated source from `cache_dir/kernels/<hash>.py` (written atomically)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    d = (cache_dir or default_cache_dir()) / "kernels"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"nq_{digest}.py"
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    name = f"neptune_eq_kernels_{digest}"
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@dataclass
class Launcher:
    """Runs a plan's kernels: allocates outputs and intermediate buffers, computes grids and strides."""

    program: ir.Program
    plan: Plan
    kernels: list[KernelSource]
    module: object

    def buffer_shape(self, name: str) -> tuple[int, ...]:
        buf = self.plan.buffers[name]
        chunks = next((k.chunks for k in self.plan.kernels if k.chunks > 1
                       and any(s.target == name for s in k.epilogue)), 1)
        return tuple(chunks if a == "chunk" else self.program.axes[a] for a in buf.axes)

    def __call__(self, inputs: dict[str, torch.Tensor], out_dtypes: dict[str, torch.dtype] | None = None
                 ) -> dict[str, torch.Tensor]:
        device = next(iter(inputs.values())).device
        tensors: dict[str, torch.Tensor] = dict(inputs)
        for out in self.program.outputs:
            dt = (out_dtypes or {}).get(out.name) or _TORCH_DTYPES[out.dtype or "float32"]
            tensors[out.name] = torch.empty(self.program.output_shape(out), dtype=dt, device=device)
        for name, buf in self.plan.buffers.items():
            tensors[name] = torch.empty(self.buffer_shape(name), dtype=_TORCH_DTYPES[buf.dtype], device=device)
        interpret = device.type != "cuda"
        for ks in self.kernels:
            fn = getattr(self.module, ks.name)
            args = []
            for t in ks.tensors:
                x = tensors[t.name]
                args.append(x)
                args += list(x.stride()) if x.dim() else []
            args += [self.program.axes[a] for a in ks.extents]
            n_prog = ks.chunks
            for a, step in ks.grid:
                n_prog *= math.ceil(self.program.axes[a] / step)
            grid = (n_prog,)
            if interpret:
                require_interpreter()
                fn[grid](*args, **ks.constexprs)
            else:
                fn[grid](*args, **ks.constexprs, num_warps=ks.schedule.num_warps,
                         num_stages=ks.schedule.num_stages)
        return {o.name: tensors[o.name] for o in self.program.outputs}


def check_inputs(program: ir.Program, inputs: dict[str, torch.Tensor]) -> None:
    for name, spec in program.inputs.items():
        if name not in inputs:
            raise NeptuneError(f"missing input '{name}' (expected axes {spec.axes})")
        t = inputs[name]
        if not isinstance(t, torch.Tensor):
            raise NeptuneError(f"input '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != _TORCH_DTYPES[spec.dtype]:
            raise NeptuneError(f"input '{name}' has dtype {str(t.dtype).replace('torch.', '')}; the program was "
                               f"compiled for {spec.dtype}")
        want = program.input_shape(name)
        if tuple(t.shape) != want:
            pairs = ", ".join(f"{a}={n}" for a, n in zip(spec.axes, want))
            raise NeptuneError(f"input '{name}' has shape {tuple(t.shape)}; expected {want} ({pairs})")
    extra = set(inputs) - set(program.inputs)
    if extra:
        raise NeptuneError(f"unexpected inputs {sorted(extra)} (program inputs: {sorted(program.inputs)})")


_ = _ident
