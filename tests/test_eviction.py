"""Cache hints for a tensor a kernel streams in more than one pass (neptune_eq/lower/eviction.py): the
passes before the last keep it in L2 (evict_last), the last one and its stores let it go (evict_first);
the cost model prices the second read from L2 only for such a kernel; the wide streamed tiles they go
with run end to end in the interpreter."""

import re

import pytest
import torch
from neptune_eq.extract import cost as cost_mod

from neptune_eq import dsl as ne
from neptune_eq.device import H100
from neptune_eq.lower.eviction import DROP, KEEP, pass_hints, reread
from neptune_eq.pipeline import Options
from neptune_eq.plan import Pass
from neptune_eq.runtime import compile_ir


def _softmax_lse(m: int, n: int):
    P = ne.program("softmax_lse_rows")
    i, d = P.axes(i=m, d=n)
    x = P.input("x", i, d, dtype="float16")
    mx = ne.max(x, d)
    p = ne.exp(x - mx)
    P.output("y", p / ne.sum(p, d), (i, d))
    P.output("lse", ne.log(ne.sum(p, d)) + mx, (i,))
    return P.build()


@pytest.fixture(scope="module")
def rows():
    # 40000 is no multiple of the 16384-wide tile: two full tiles and a masked tail a pass
    return compile_ir(_softmax_lse(3, 40000), Options(device=H100))


def _wide(prog, passes: int):
    for a in prog.alternatives:
        k = a.plan.kernels
        if len(k) == 1 and a.kind == "streamed 16384" and len(k[0].passes()) == passes:
            return a
    raise AssertionError([a.structure for a in prog.alternatives])


def _loads(src: str, tensor: str) -> list[str]:
    return [ln.strip() for ln in src.splitlines() if f"tl.load({tensor}_ptr" in ln]


@pytest.mark.parametrize("passes", [2, 3])
def test_a_row_streamed_twice_is_kept_in_l2_between_its_passes_and_matches_float64(rows, passes):
    alt = _wide(rows, passes)
    k = alt.plan.kernels[0]
    hints = pass_hints(k, alt.plan, alt.schedules[0])
    at = [i for i, ph in enumerate(k.phases) if isinstance(ph, Pass)]
    assert [hints[i]["x"] for i in at] == [KEEP] * (passes - 1) + [DROP]
    assert hints[at[-1]]["y"] == DROP  # the normalised rows, written by the last pass, stream out
    prog = rows.pin(alt.id)
    src = prog.lowered("interpreter")[0]
    policies = [re.search(r"eviction_policy='(\w+)'", ln).group(1) for ln in _loads(src, "x")]
    assert policies and policies[-1] == DROP and KEEP in policies and set(policies) == {KEEP, DROP}
    assert re.search(r"tl\.store\(y_ptr.*eviction_policy='evict_first'", src)
    x = torch.randn(3, 40000, dtype=torch.float16) * 4
    out = prog.run({"x": x})
    xd = x.double()
    assert float((out["y"].double() - torch.softmax(xd, -1)).abs().max()) < 1e-6
    assert float((out["lse"].double() - torch.logsumexp(xd, -1)).abs().max()) < 1e-4


def test_a_row_read_once_takes_no_hint(rows):
    held = next(a for a in rows.alternatives if len(a.plan.kernels) == 1 and a.schedules[0].resident)
    assert pass_hints(held.plan.kernels[0], held.plan, held.schedules[0]) == {}
    assert "eviction_policy" not in rows.pin(held.id).lowered("interpreter")[0]
    P = ne.program("lse_rows")
    i, d = P.axes(i=3, d=40000)
    x = P.input("x", i, d, dtype="float16")
    mx = ne.max(x, d)
    P.output("lse", ne.log(ne.sum(ne.exp(x - mx), d)) + mx, (i,))
    one = compile_ir(P.build(), Options(device=H100))
    for a in one.alternatives:  # one rolling pass (or split-K partials, then their combine)
        if all(len(k.passes()) == 1 for k in a.plan.kernels):
            assert not any(reread(k, a.plan) for k in a.plan.kernels)
            assert "eviction_policy" not in one.pin(a.id).lowered("interpreter")[0]
            return
    raise AssertionError("no single-pass plan")


def test_the_second_read_is_priced_from_l2_only_where_it_is_kept(monkeypatch):
    prog = compile_ir(_softmax_lse(4096, 65536), Options(device=H100))
    alt = _wide(prog, 2)
    k, sched = alt.plan.kernels[0], alt.schedules[0]
    at = prog.program
    kept = cost_mod.kernel_cost(alt.plan, k, at, sched, H100)
    monkeypatch.setattr(cost_mod, "reread", lambda k, plan: {})  # as if the lowering gave no hint
    plain = cost_mod.kernel_cost(alt.plan, k, at, sched, H100)
    once = 4096 * 65536 * 2 * 3 + 4096 * 4  # x read once, y written (fp32), lse
    assert kept.hbm_bytes <= 1.01 * once < 1.05 * once < plain.hbm_bytes
