"""Tensor-descriptor (TMA) loads: the kernels of a schedule with tma=True read their input tiles
through tl.make_tensor_descriptor (out-of-bounds rows read as zero, no masks), give the same
results as pointer loads, and fall back to pointer loads for inputs a descriptor cannot read."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_frontend import rel_err
from test_frontend_ops import small

from neptune_eq.frontend import capture
from neptune_eq.ir import NeptuneError
from neptune_eq.lower.launch import Launcher, descriptor_ok, load_module
from neptune_eq.tune import _schedule_from, _schedule_to


def with_tma(run):
    """The compiled function `run` with every kernel's schedule switched to descriptor loads."""
    prog = run.compiled
    prog.schedules["interpreter"] = [replace(s, tma=True) for s in prog._schedules("interpreter")]
    prog._modules.clear()
    return run


@pytest.mark.parametrize("name", ["causal_pf", "gqa_pf", "window_pf", "gqa_dc", "softcap_dc"])
def test_descriptor_loads_match_float64(name):
    # 37 keys / queries: not a multiple of any tile, so the last tiles reach past the tensor
    fn, args = small(name, L=37, dtype=torch.float32)
    run = with_tma(capture(fn, *args, name=name).compile())
    _, kernels = run.compiled.lowered("interpreter")
    first = kernels[0]
    assert set(first.descriptors) == {"q", "k", "v"}, first.descriptors
    assert "tl.make_tensor_descriptor(" in first.source and ".load([start_j" in first.source
    out = run(*args)
    assert rel_err(out, fn(*(a.double() for a in args))) < 1e-4


def test_inputs_a_descriptor_cannot_read_fall_back_to_pointers():
    fn, (q, k, v) = small("causal_pf", L=33, dtype=torch.float32)
    run = with_tma(capture(fn, q, k, v, name="causal_pf").compile())
    k_cols = k.transpose(-1, -2).contiguous().transpose(-1, -2)  # innermost stride is not 1
    assert not descriptor_ok(k_cols, (2, 3))
    out = run(q, k_cols, v)
    assert rel_err(out, fn(q.double(), k.double(), v.double())) < 1e-4
    # without a fallback the launcher says which input and why
    prog = run.compiled
    src, kernels = prog.lowered("interpreter")
    bare = Launcher(prog.program, prog.plan, kernels, load_module(src))
    with pytest.raises(NeptuneError, match="input 'k' cannot be read through a tensor descriptor"):
        bare(run.captured.inputs(q, k_cols, v))


def test_descriptor_requirements():
    buf = torch.zeros(2 * 4 * 32 * 16 + 8, dtype=torch.float16)
    x = buf[: 2 * 4 * 32 * 16].view(2, 4, 32, 16)
    assert descriptor_ok(x, (2, 3))
    assert not descriptor_ok(buf[1 : 1 + x.numel()].view(2, 4, 32, 16), (2, 3))  # start 2 bytes off
    assert not descriptor_ok(torch.zeros(2, 4, 32, 15, dtype=torch.float16), (2, 3))  # 30-byte rows
    assert not descriptor_ok(x.transpose(2, 3), (2, 3))  # innermost stride 32
    assert descriptor_ok(torch.zeros(1, 3, 32, 16, dtype=torch.float16)[:, 1:], (2, 3))  # extent-1 dims


def test_tuned_schedule_round_trips_through_the_cache_format():
    fn, args = small("gqa_dc", L=16, dtype=torch.float32)
    prog = capture(fn, *args).compile().compiled
    for s in prog._schedules("cuda"):
        t = replace(s, tma=True, fast_math=True, warp_specialize=True)
        assert _schedule_from(_schedule_to(t)) == t


def test_warp_specialize_marks_only_the_unmasked_cuda_loop():
    """causal: masked loops before and after the diagonal's interior; only the interior loop is
    handed to Triton's warp specialisation, and only for CUDA (the interpreter has no warps)."""
    from neptune_eq.lower.triton import write_module

    fn, args = small("causal_pf", L=37, dtype=torch.float32)
    prog = capture(fn, *args, name="causal_pf").compile().compiled
    for target, want in (("cuda", 1), ("interpreter", 0)):
        scheds = [replace(s, warp_specialize=True) for s in prog._schedules(target)]
        src, _ = write_module(prog.plan, prog.program, scheds, target, "ws")
        assert src.count("warp_specialize=True") == want
        assert src.count("for start_j in range(") == 3 - want


def test_tuning_checks_large_programs_on_sampled_rows(monkeypatch):
    """The float64 check a fast-math or TMA variant must pass before it may win: on a long attention
    it evaluates 256 sampled query rows (the whole float64 reference at 16K tokens needs 64 GiB),
    and it still catches a wrong row."""
    from test_e2e_shapes import attention_program

    from neptune_eq.runtime import compile_ir
    from neptune_eq.tune import _Tuner, sample_rows

    big = attention_program(16384, 16384, 128, 128, heads=32)
    restrict = sample_rows(big)
    assert list(restrict) == ["i"] and len(restrict["i"]) == 256
    small_prog = attention_program(40, 40, 16, 16, mask="causal")
    assert sample_rows(small_prog) == {}
    # a program just over the limit: rows sampled, the check passes, then fails on a corrupted row
    prog = attention_program(600, 600, 16, 16, mask="causal")
    compiled = compile_ir(prog)
    inputs = {n: torch.randn(*prog.input_shape(n)) for n in prog.inputs}
    tuner = _Tuner(prog, compiled.plan, inputs, None, 1, 2e-3, print)
    out = compiled.run(inputs)
    restrict = sample_rows(prog, limit=10**6)
    assert list(restrict) == ["i"]
    monkeypatch.setattr("neptune_eq.tune.sample_rows", lambda p: restrict)
    assert tuner.rel_err(out) < 1e-5
    bad = {k: v.clone() for k, v in out.items()}
    bad["o"][:, :, restrict["i"][3]] += 1.0
    assert tuner.rel_err(bad) > 1e-2


def test_rows_are_sampled_along_an_axis_no_reduction_runs_over():
    """softmax of 4096 × 65536: every output value sums over the 65536 columns, so the float64 check
    samples rows, never columns (a reference over 256 sampled columns is another softmax: every
    plan failed the stress sets on the H100 with error 0.996)."""
    from helpers import small_softmax

    from neptune_eq.tune import sample_rows

    prog = small_softmax().with_extents({"i": 4096, "j": 65536})
    restrict = sample_rows(prog)
    assert list(restrict) == ["i"] and len(restrict["i"]) == 256
