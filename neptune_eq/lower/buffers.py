"""A launcher's intermediate buffers: allocated once per device and per call's lengths, reused across
calls, their rows padded to the largest tile along them (plan.ROW_PAD says why)."""

from __future__ import annotations

import torch

from .. import ir
from ..plan import ROW_PAD, Plan
from .values import KernelSource

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "float64": torch.float64, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
                 "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16}


class Buffers:
    def __init__(self, program: ir.Program, plan: Plan, kernels: list[KernelSource]):
        self.program, self.plan, self.kernels = program, plan, kernels
        self._held: dict = {}  # (device, name) → tensor

    def shape(self, name: str, axes: dict[str, int] | None = None) -> tuple[int, ...]:
        buf = self.plan.buffers[name]
        chunks = next((k.chunks for k in self.plan.kernels if k.chunks > 1
                       and any(s.target == name for s in k.epilogue)), 1)
        return tuple(chunks if a is ir.CHUNK else (axes or self.program.axes)[a] for a in buf.axes)

    def row_tile(self, axis: str) -> int:
        """What a buffer's rows along `axis` are padded to a multiple of: the largest tile of at most
        ROW_PAD any kernel takes along it (each such tile, a power of two, divides it), else 1."""
        return max((t for k in self.kernels for a, t in k.schedule.tiles.items()
                    if a == axis and isinstance(t, int) and t <= ROW_PAD), default=1)

    def get(self, device, name: str, axes: dict[str, int] | None = None) -> torch.Tensor:
        key = (device, name)
        shape = self.shape(name, axes)
        t = self._held.get(key)
        if t is None or t.shape != shape:  # (a dynamic program's buffers follow the call's lengths)
            buf = self.plan.buffers[name]
            padded = shape
            if shape and isinstance(buf.axes[-1], str):
                tile = self.row_tile(buf.axes[-1])
                padded = (*shape[:-1], -(-shape[-1] // tile) * tile)
            t = torch.empty(padded, dtype=TORCH_DTYPES[buf.dtype], device=device)
            t = self._held[key] = t[..., :shape[-1]] if padded != shape else t
        return t
