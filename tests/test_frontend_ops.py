"""The ten Neptune operators of examples/neptune_ops.py, written in plain PyTorch, captured at small
sizes and checked in float64; four of them also run end to end through the Triton interpreter."""

from __future__ import annotations

import functools
import importlib.util
import math

import pytest
import torch
from helpers import EXAMPLES
from test_frontend import calls, nodes, rel_err

from neptune_eq import ir, masks
from neptune_eq.frontend import capture

_SPEC = importlib.util.spec_from_file_location("neptune_ops", EXAMPLES / "neptune_ops.py")
neptune_ops = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(neptune_ops)

SMALL_HEADS = {"gqa_pf": (8, 2), "gqa_dc": (8, 2), "softcap_pf": (4, 2), "window_pf": (4, 2), "softcap_dc": (4, 2)}
AFFINE_MASKED = {"causal_pf", "alibi_pf", "gqa_pf", "softcap_pf", "window_pf"}
GQA = {"gqa_pf", "gqa_dc", "softcap_pf", "window_pf", "softcap_dc"}


def small(name: str, L: int = 40, dtype=torch.float64, head_dim: int = 16):
    fn, _ = neptune_ops.OPS[name]
    if name == "window_pf":
        fn = functools.partial(fn, window=8)
    args = neptune_ops.example_inputs(name, L, dtype=dtype, head_dim=head_dim, batch=2,
                                      heads=SMALL_HEADS.get(name, (2, 2)))
    return fn, args


@pytest.mark.parametrize("name", list(neptune_ops.OPS))
def test_neptune_op_captures_and_matches(name):
    fn, args = small(name)
    c = capture(fn, *args, name=name)
    assert rel_err(c.reference(*args), fn(*args)) < 1e-10
    prog = c.program
    assert list(prog.inputs) == ["q", "k", "v"]
    kind = neptune_ops.OPS[name][1]
    assert prog.outputs[0].axes == (("b", "h", "i", "e") if kind == "prefill" else ("b", "h", "e"))
    if name in AFFINE_MASKED:
        preds = [w.args[0] for w in calls(prog, "where") if w.args[2] == ir.Const(-math.inf)]
        assert preds and all(masks.affine(p) is not None for p in preds), [ir.show(p) for p in preds]
    if name in GQA:
        group = SMALL_HEADS[name][0] // SMALL_HEADS[name][1]
        k_loads = [n for n in nodes(prog, ir.Load) if n.tensor == "k"]
        assert all(n.index[1] == ir.Call("floordiv", (ir.Index("h"), ir.Const(group))) for n in k_loads)


def test_example_inputs_shapes():
    q, k, v = neptune_ops.example_inputs("gqa_dc", 256, head_dim=64)
    assert q.shape == (1, 64, 1, 64) and k.shape == v.shape == (1, 8, 256, 64)
    q, k, v = neptune_ops.example_inputs("window_pf", 16, dtype=torch.float16, batch=2)
    assert q.shape == (2, 32, 16, 128) and k.shape == (2, 8, 16, 128) and q.dtype == torch.float16
    with pytest.raises(KeyError):
        neptune_ops.example_inputs("nope", 4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["causal_pf", "causal_dc", "gqa_pf", "window_pf"])
def test_neptune_op_end_to_end(name):
    fn, args = small(name, L=32, dtype=torch.float32)
    run = capture(fn, *args, name=name).compile()
    out = run(*args)
    want = fn(*(a.double() for a in args))
    assert out.dtype == torch.float32
    assert rel_err(out, want) < 1e-4


@pytest.mark.slow
def test_captured_causal_is_one_flash_pass_with_bounded_loop():
    from neptune_eq.plan import Pass

    fn, args = small("causal_pf", L=96, dtype=torch.float32, head_dim=32)
    prog = capture(fn, *args).compile().compiled
    passes = [ph for k in prog.plan.kernels for ph in k.phases if isinstance(ph, Pass) and ph.comps]
    assert len(prog.kernels) == 1 and len(passes) == 1 and passes[0].kind == "rolling"
    assert not prog.plan.buffers, "no score matrix written to memory"
    assert "flo_j" in prog.source and "fhi_j" in prog.source, "the causal mask bounds the key loop"


@pytest.mark.parametrize("name", list(neptune_ops.OPS))
def test_neptune_op_plan_at_benchmark_size(name):
    """At the benchmark's shapes (fp16, head_dim 128, the paper's heads) on the H100 spec, every
    prefill op is one fused kernel without split-K and every decode op at a 32768-key cache is a
    split-K plan (compile only; nothing runs)."""
    from neptune_eq.device import H100
    from neptune_eq.pipeline import Options, compile_program

    hq, hkv = neptune_ops.HEADS[name]
    prefill = neptune_ops.OPS[name][1] == "prefill"
    L = 4096 if prefill else 32768
    q = torch.empty(1, hq, L if prefill else 1, 128, dtype=torch.float16)
    k, v = (torch.empty(1, hkv, L, 128, dtype=torch.float16) for _ in range(2))
    best = compile_program(capture(neptune_ops.OPS[name][0], q, k, v).program, Options(device=H100)).best
    split = max(p.split for kern in best.plan.kernels for p in kern.passes())
    if prefill:
        assert len(best.plan.kernels) == 1 and split == 1, best.structure
    else:
        assert split > 1, best.structure
