"""pytest-benchmark view of the out-of-sample sweeps (bench/sweeps.py: sweep_unseen, sweep_fresh,
sweep_third, sweep_fourth, sweep_fifth, sweep_sixth; GPU only, on a CPU every test is skipped).

    pytest bench/test_sweep.py                                   # grouped by row
    pytest bench/test_sweep.py -k "cross_entropy and liger"

Each implementation is checked against float64 (its output, and every input gradient for the fwd+bwd
rows) before it is timed; neptune_eq is compiled untuned, as a new user gets it. The timer synchronises
the GPU around every call. bench/sweep_unseen.py writes the JSON report (do_bench medians).
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("benchmarks need a CUDA GPU", allow_module_level=True)

import sweep_unseen as S
from sweeps import all_rows

from neptune_eq import NeptuneError

ROWS = {r.name: r for r in all_rows()}
IMPLS = ["neptune_eq", "eager", "compile", "sdpa", "liger"]


@lru_cache(maxsize=1)  # the tests of one row follow each other (impl varies fastest)
def _reference(name: str) -> S.Reference:
    torch.cuda.empty_cache()
    return S.reference(ROWS[name], "cuda", dry=False)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", list(ROWS), ids=lambda s: s.replace(" ", "-"))
def test_row(benchmark, name: str, impl: str):
    row, ref = ROWS[name], _reference(name)
    builders = dict(S._implementations(row, ref.xs, set(IMPLS)))
    if impl not in builders:
        pytest.skip(f"{impl} has no such operation")
    if impl == "neptune_eq" and row.notes.get("expect", "").startswith("refusal"):
        with pytest.raises(NeptuneError, match=row.notes["expect"].removeprefix("refusal: ")):
            builders[impl]()
        return
    errs, tol, timed = S.checked(impl, builders[impl](), ref)
    assert max(errs) <= tol, f"{impl} fails the float64 check on {name}: {errs}"

    def run():
        timed()
        torch.cuda.synchronize()

    benchmark.group = name
    benchmark.extra_info.update(backward=row.backward)
    benchmark.pedantic(run, warmup_rounds=3, rounds=20)
