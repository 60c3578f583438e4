"""The cost model's decisions at H100 scale (compile only; nothing runs)."""

from helpers import load_example

from neptune_eq.device import H100
from neptune_eq.pipeline import Options, compile_program


def split_of(alt):
    return max(p.split for k in alt.plan.kernels for p in k.passes())


def test_long_decode_uses_split_k_to_fill_the_sms():
    prog = load_example("decode_attention").with_extents({"h": 32, "j": 32768, "d": 128, "e": 128})
    c = compile_program(prog, Options(device=H100))
    assert split_of(c.best) >= 4
    assert len(c.best.plan.kernels) == 2  # partial states + combine, no score matrix


def test_prefill_keeps_one_pass():
    c = compile_program(load_example("decode_attention", "prefill"), Options(device=H100))
    assert split_of(c.best) == 1 and len(c.best.plan.kernels) == 1


def test_materialising_scores_costs_hbm():
    c = compile_program(load_example("decode_attention", "prefill"), Options(device=H100))
    fused = c.best.cost
    materialised = [a for a in c.alternatives if "sum_d" in " ".join(a.plan.buffers)]
    assert materialised and min(a.cost.hbm_bytes for a in materialised) > 3 * fused.hbm_bytes
