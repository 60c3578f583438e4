"""bench/beyond: programs bench/ does not time (row softmax family, norms feeding a matmul, linear
cross-entropy, biased / causal / grouped-query attention), neptune_eq beside the peers a user would
otherwise run, with ceilings. See README.md beside this file.

Its modules reuse bench/'s (`run`, `cases`: bench/run.py, bench/cases.py), so bench/ is put on the
module path here, as bench/'s own scripts do."""

import sys
from pathlib import Path

_BENCH = str(Path(__file__).resolve().parent.parent)
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
