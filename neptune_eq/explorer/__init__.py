"""Explore the fusion alternatives of a compile (Python API, Jupyter HTML, terminal session).

    import neptune_eq
    ex = neptune_eq.explore(fn, *example_inputs)      # or neptune_eq.explore(program)
    ex.alternatives; ex.show(0); ex.diff(0, 1); ex.verify(1); ex.egraph_svg(); ex.benchmark([0, 1]); ex.pin(1)

docs/EXPLORER.md walks through it; `neptune-eq explore FILE` opens the terminal session.
"""

from .bench import BenchmarkReport
from .core import AlternativeTable, Entry, Explorer, explore
from .derivation import Derivation, Step

__all__ = ["AlternativeTable", "BenchmarkReport", "Derivation", "Entry", "Explorer", "Step", "explore"]
