"""neptune_eq: an e-graph superoptimizer that fuses chains of reductions into Triton kernels."""

from ._interpret import select_interpreter_if_no_gpu

select_interpreter_if_no_gpu()

__version__ = "0.1.0"
