"""A Launcher's launches bound to one input layout (lower/launch.Launcher.bind): later calls pass the
tensors' addresses alone."""

from __future__ import annotations

import torch

from ..ir import NeptuneError
from .library import run_gemm


class BoundCall:
    """A Launcher's launches for one input layout, every argument fixed but the tensors'
    addresses (Triton takes a pointer argument as an int). Calling it allocates the outputs in the
    given shapes (the element counts of the program's outputs; stored contiguously) and launches
    the compiled kernels directly: no input dicts, reshapes, checks or specialisation keys, which
    a decode step, tens of microseconds of GPU work, would otherwise wait on. A library GEMM
    (lower/library.py) takes tensors: the call then also passes the tensors whose addresses `ptrs`
    are (`tensors`, `library` says so), and the GEMM runs on views of them laid out as at binding.
    (Until session 69 a plan with a library GEMM kept the checked path: RMSNorm → matmul's training
    step spent 937 µs of host time against eager PyTorch's 410, H100, bench/probe_step_host.py.)"""

    def __init__(self, launches: list, outs: list[tuple[torch.dtype, torch.device]], keep: list):
        self.launches, self.outs, self._keep = launches, outs, keep
        self.library = any(slots is None for _, _, slots in launches)

    def __call__(self, ptrs: list[int], out_shapes: list[tuple[int, ...]],
                 tensors: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        outs = [torch.empty(shape, dtype=dt, device=dev) for shape, (dt, dev) in zip(out_shapes, self.outs)]
        addr = [*ptrs, *(o.data_ptr() for o in outs)]
        for runner, argv, slots in self.launches:
            if slots is None:
                if tensors is None:
                    raise NeptuneError("internal: a bound call with a library GEMM was given addresses, not tensors")
                at = [*tensors, *outs]
                run_gemm(runner, {n: fixed if fixed is not None else at[k].as_strided(shape, stride)
                                  for n, k, shape, stride, fixed in argv})
                continue
            args = list(argv)
            for pos, k in slots:
                args[pos] = addr[k]
            runner(*args)
        return outs
