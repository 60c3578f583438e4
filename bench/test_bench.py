"""pytest-benchmark view of the comparison (GPU only; on a CPU every test is skipped).

    pytest bench/test_bench.py --benchmark-group-by=param:op -k "causal_pf"

Each implementation is checked against the float64 reference before it is timed; the timer
synchronises the GPU around every call. bench/run.py is the full report (CUDA-event medians,
tables, plot); this file lets pytest-benchmark's own statistics and comparisons be used too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

if not torch.cuda.is_available():
    pytest.skip("benchmarks need a CUDA GPU", allow_module_level=True)

from cases import HEADS, TOLERANCE, Case, reference, rel_err_rows
from peers import PEERS

SIZE = {"pf": 4096, "dc": 16384}


def _impl(case: Case, name: str):
    q, k, v = case.inputs("cuda")
    if name == "neptune_eq":
        import neptune_eq

        prog = neptune_eq.compile(case.fn, q, k, v)
        return (lambda: prog(q, k, v)), None
    return PEERS[name](case, q, k, v)


@pytest.mark.parametrize("impl", ["neptune_eq", *PEERS])
@pytest.mark.parametrize("op", list(HEADS))
def test_attention(benchmark, op, impl):
    from neptune_eq.frontend import capture

    case = Case(op, SIZE[op.rsplit("_", 1)[1]])
    thunk, note = _impl(case, impl)
    if thunk is None:
        pytest.skip(note)
    captured = capture(case.fn, *case.inputs("cuda"))
    ref, rows = reference(case, captured, "cuda")
    err = rel_err_rows(thunk(), ref, rows)
    tol = TOLERANCE["neptune_eq" if impl == "neptune_eq" else "peer"]
    assert err < tol, f"{impl} fails the float64 check: {err:.2e}"

    def run():
        thunk()
        torch.cuda.synchronize()

    benchmark.extra_info.update(op=op, L=case.L, useful_flops=case.useful_flops(), io_bytes=case.io_bytes())
    benchmark.pedantic(run, warmup_rounds=5, rounds=30, iterations=1)
