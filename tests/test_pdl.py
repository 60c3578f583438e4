"""Programmatic dependent launch: on CUDA, a kernel that reads what the kernel before it wrote
(split-K's combine, the second pass of a two-pass plan) is launched with launch_pdl and waits for
its producer with gdc_wait before anything else; kernels reading only the program's inputs, and
every kernel on the interpreter, launch plainly."""

from __future__ import annotations

import pytest
import torch
from helpers import load_example
from test_frontend_ops import small

from neptune_eq.frontend import capture
from neptune_eq.lower.triton import pdl_supported, write_module
from neptune_eq.runtime import compile_ir

pytestmark = pytest.mark.skipif(not pdl_supported(), reason="this Triton has no programmatic dependent launch")


def _alternative(prog, words: str):
    return next(a for a in prog.alternatives if words in a.structure)


def _program(split: bool):
    if split:  # the decode example's plan splits its pass over the keys
        return compile_ir(load_example("decode_attention"))
    fn, args = small("causal_pf", L=64, dtype=torch.float32)
    return capture(fn, *args, name="causal_pf").compile().compiled


@pytest.mark.parametrize("split, words", [(True, "split-K"),
                                          (False, "2 kernels, pass over j (max_j); pass over j (sum_j, sum_j2)")])
def test_a_kernel_reading_its_predecessors_buffers_waits_for_it(split, words):
    prog = _program(split)
    pinned = prog.pin(_alternative(prog, words).id)
    _, ks = write_module(pinned.plan, pinned.program, pinned._schedules("cuda"), "cuda", "t")
    assert len(ks) == 2 and ks[1].buffers_read <= ks[0].buffers_written and ks[1].buffers_read
    assert [k.pdl for k in ks] == [False, True]
    body = [k.source.split("):\n", 1)[1].splitlines() for k in ks]
    # under a constexpr the launcher sets where the GPU has grid dependency control (sm_90+)
    assert [line.strip() for line in body[0][:2]] == ["if USE_PDL:", "tl.extra.cuda.gdc_launch_dependents()"]
    assert [line.strip() for line in body[1][:2]] == ["if USE_PDL:", "tl.extra.cuda.gdc_wait()"]  # before any load
    assert all("USE_PDL: tl.constexpr" in k.source and k.constexprs["USE_PDL"] for k in ks)
    src_i, ks_i = write_module(pinned.plan, pinned.program, pinned._schedules("interpreter"), "interpreter", "t")
    assert "gdc_" not in src_i and not any(k.pdl for k in ks_i)


def test_single_kernel_plans_launch_plainly():
    fn, args = small("causal_pf", L=64, dtype=torch.float32)
    prog = capture(fn, *args, name="causal_pf").compile().compiled
    pinned = prog.pin(_alternative(prog, "1 kernel, rolling").id)
    src, ks = write_module(pinned.plan, pinned.program, pinned._schedules("cuda"), "cuda", "t")
    assert "gdc_" not in src and not ks[0].pdl
