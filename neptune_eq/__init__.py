"""neptune_eq: an e-graph superoptimizer that fuses chains of reductions into Triton kernels."""

from ._interpret import select_interpreter_if_no_gpu

select_interpreter_if_no_gpu()  # before anything imports triton (see _interpret.py)

__version__ = "0.1.0"

from .api import Compiled, attention, compile  # noqa: E402
from .grad import NoBackward  # noqa: E402
from .ir import NeptuneError, NeptuneWarning  # noqa: E402
from .saturate import Budget  # noqa: E402


def explore(fn, *example_inputs, **options):
    """Compile `fn` (a PyTorch function with example inputs, or an ir.Program) and explore its alternatives.

    See neptune_eq.explorer.explore and docs/EXPLORER.md.
    """
    from .explorer import explore as _explore

    return _explore(fn, *example_inputs, **options)


__all__ = ["Budget", "Compiled", "NeptuneError", "NeptuneWarning", "NoBackward", "attention", "compile", "explore"]
