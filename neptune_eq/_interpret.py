"""Triton runs on a CPU only through its interpreter, which must be chosen before triton is imported.

Importing neptune_eq on a machine without a CUDA GPU therefore sets TRITON_INTERPRET=1 if triton
has not been imported yet. If it has (without the variable), kernels cannot run on the CPU and
`require_interpreter()` says so with the fix.
"""

from __future__ import annotations

import os
import sys


def select_interpreter_if_no_gpu() -> None:
    if "triton" in sys.modules or os.environ.get("TRITON_INTERPRET"):
        return
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_gpu = False
    if not has_gpu:
        os.environ["TRITON_INTERPRET"] = "1"


def interpreter_active() -> bool:
    from triton import knobs

    return bool(knobs.runtime.interpret)


def require_interpreter() -> None:
    from .ir import NeptuneError

    if not interpreter_active():
        raise NeptuneError(
            "kernels on CPU tensors run through Triton's interpreter, but triton was imported before "
            "neptune_eq without TRITON_INTERPRET=1; import neptune_eq first or set TRITON_INTERPRET=1"
        )


def quiet_ieee():
    """A context in which numpy does not warn about overflow, division by zero, invalid operations
    or underflow. The interpreter evaluates kernels with numpy; there inf and NaN are the results
    IEEE arithmetic gives (as on the GPU), not mistakes to report. Only numpy's floating-point
    error handling changes, and only inside the context: warnings from other code still show."""
    import numpy as np

    return np.errstate(all="ignore")
