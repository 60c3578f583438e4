"""pytest-benchmark view of bench/beyond (GPU only; on a CPU every test is skipped).

    pytest bench/beyond/test_beyond.py                       # grouped by program and size
    pytest bench/beyond/test_beyond.py -k "softmax and liger"

Each implementation is checked against float64 before it is timed (check.py); the timer
synchronises the GPU around every call. bench/beyond/run.py is the full report (CUDA-event
medians, ceilings, the cost model's alternatives, tables, plot).
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("benchmarks need a CUDA GPU", allow_module_level=True)

from beyond.check import Reference, reference, tolerance
from beyond.peers import PEERS, Peer
from beyond.programs import cases

CASES = {c.label: c for c in cases()}


@lru_cache(maxsize=1)  # the tests of one case follow each other (impl varies fastest)
def _inputs_and_reference(label: str) -> tuple[tuple, Reference]:
    torch.cuda.empty_cache()
    xs = CASES[label].inputs("cuda")
    return xs, reference(CASES[label], xs)


@pytest.mark.parametrize("impl", ["neptune_eq", *PEERS])
@pytest.mark.parametrize("label", list(CASES), ids=lambda s: s.replace(" ", "-"))
def test_program(benchmark, label: str, impl: str):
    case = CASES[label]
    xs, ref = _inputs_and_reference(label)
    if impl == "neptune_eq":
        import neptune_eq

        prog = neptune_eq.compile(case.program.fn, *xs).tune(*xs, progress=False)
        thunk = lambda: prog(*xs)  # noqa: E731
    else:
        got = PEERS[impl](case, xs)
        if not isinstance(got, Peer):
            pytest.skip(got.reason)
        thunk = got.run
    with torch.no_grad():
        err = ref.error(thunk())
    assert err <= tolerance(case, impl), f"{impl} fails the float64 check on {case.label}: {err:.2e}"

    def run():
        with torch.no_grad():
            thunk()
        torch.cuda.synchronize()

    benchmark.group = case.label
    benchmark.extra_info.update(program=case.name, dims=dict(case.dims), work=case.work, kind=case.program.kind)
    benchmark.pedantic(run, warmup_rounds=5, rounds=30, iterations=1)
