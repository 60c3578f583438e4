"""pytest-benchmark view of the comparison (GPU only; on a CPU every test is skipped).

    pytest bench/test_bench.py --benchmark-group-by=param:op -k "causal_pf"

Each implementation is checked against the float64 reference before it is timed; the timer
synchronises the GPU around every call. bench/run.py is the full report (CUDA-event medians,
tables, plot); this file lets pytest-benchmark's own statistics and comparisons be used too.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

if not torch.cuda.is_available():
    pytest.skip("benchmarks need a CUDA GPU", allow_module_level=True)

from cases import HEADS, TOLERANCE, Case, reference, rel_err_rows
from grad_attention import PREFILL, check, grads, implementations, leaves, tolerance
from peers import PEERS

SIZE = {"pf": 4096, "dc": 16384}
GRAD_CHECK_L = 1024


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


@functools.cache
def _grad_errors(op: str) -> dict[str, float]:
    return check(op, GRAD_CHECK_L, log=lambda msg: None)


@pytest.mark.parametrize("impl", ["neptune_eq", "sdpa", "flex"])
@pytest.mark.parametrize("op", PREFILL)
def test_attention_fwd_bwd(benchmark, op, impl):
    """Forward + backward (gradients of q, k and v), each implementation's gradients first checked
    against float64 autograd of the plain operator at GRAD_CHECK_L."""
    errs = _grad_errors(op)
    if impl not in errs:
        pytest.skip(f"{impl} does not run {op}")
    assert errs[impl] <= tolerance(impl), f"{impl} fails the float64 gradient check: {errs[impl]:.2e}"
    case = Case(op, SIZE["pf"])
    xs = leaves(case)
    g = torch.randn(case.inputs("cuda")[0].shape, device="cuda", dtype=case.dtype)
    fn = implementations(case, *xs)[impl][0]

    def run():
        grads(fn, xs, g)
        torch.cuda.synchronize()

    benchmark.extra_info.update(op=op, L=case.L, check_L=GRAD_CHECK_L, grad_rel_err=errs[impl])
    benchmark.pedantic(run, warmup_rounds=3, rounds=20, iterations=1)


@pytest.mark.parametrize("op,L", [("causal_pf", 2048), ("gqa_dc", 8192)])
def test_compiled_tune(tmp_path, capsys, op, L):
    """The public tuning step: the tuned function still matches float64, and tuning the same plan
    again takes every kernel's schedule (padded rows included) from the cache on disk."""
    import neptune_eq
    from neptune_eq.frontend import capture
    from neptune_eq.tune import autotune, cache_path

    case = Case(op, L)
    q, k, v = case.inputs("cuda")
    prog = neptune_eq.compile(case.fn, q, k, v, cache_dir=tmp_path).tune(q, k, v, progress=False)
    ref, rows = reference(case, capture(case.fn, q, k, v), "cuda")
    err = rel_err_rows(prog(q, k, v), ref, rows)
    assert err < TOLERANCE["neptune_eq"], f"tuned {op}: rel err {err:.2e}"
    tuned = prog.variants[prog.first].prog
    before = list(tuned.schedules["cuda"])
    capsys.readouterr()
    again = autotune(tuned, prog.variants[prog.first].captured.inputs(q, k, v), cache_file=cache_path(tmp_path))
    log = capsys.readouterr().err
    assert again == before and log.count("cached") == len(before), log
    err = rel_err_rows(prog(q, k, v), ref, rows)
    assert err < TOLERANCE["neptune_eq"], f"{op} from the tuning cache: rel err {err:.2e}"
