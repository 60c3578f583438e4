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


@pytest.mark.parametrize("op,L", [("causal_pf", 2048), ("gqa_dc", 8192)])
def test_compiled_tune(tmp_path, op, L):
    """The public tuning step: the tuned function still matches float64, and a second compile in
    the same cache directory takes the tuned schedules (padded rows and TMA included) from disk."""
    import neptune_eq
    from neptune_eq.frontend import capture

    case = Case(op, L)
    q, k, v = case.inputs("cuda")
    prog = neptune_eq.compile(case.fn, q, k, v, cache_dir=tmp_path).tune(q, k, v, progress=False)
    ref, rows = reference(case, capture(case.fn, q, k, v), "cuda")
    assert rel_err_rows(prog(q, k, v), ref, rows) < TOLERANCE["neptune_eq"]
    again = neptune_eq.compile(case.fn, q, k, v, cache_dir=tmp_path).tune(q, k, v, progress=False)
    first, second = (p.variants[p.first].prog for p in (prog, again))
    assert first.schedules["cuda"] == second.schedules["cuda"]
    assert rel_err_rows(again(q, k, v), ref, rows) < TOLERANCE["neptune_eq"]
