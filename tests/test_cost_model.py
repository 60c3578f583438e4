"""The cost model's decisions at H100 scale (compile only; nothing runs)."""

from helpers import load_example

from neptune_eq.device import H100
from neptune_eq.pipeline import Options, compile_program


def split_of(alt):
    return max(p.split for k in alt.plan.kernels for p in k.passes())


def _half(program):
    """The example in fp16, as attention runs (in float32 its products are IEEE dots on the FMA pipe,
    priced so since session 65: writing the scores with cuBLAS's SGEMM then ranks near the fused pass)."""
    return program.with_dtypes({n: "float16" for n in program.inputs}, outputs="float16")


def test_long_decode_uses_split_k_to_fill_the_sms():
    prog = _half(load_example("decode_attention").with_extents({"h": 32, "j": 32768, "d": 128, "e": 128}))
    c = compile_program(prog, Options(device=H100))
    assert split_of(c.best) >= 4
    assert len(c.best.plan.kernels) == 2  # partial states + combine, no score matrix


def test_prefill_keeps_one_pass():
    c = compile_program(_half(load_example("decode_attention", "prefill")), Options(device=H100))
    assert split_of(c.best) == 1 and len(c.best.plan.kernels) == 1


def test_materialising_scores_costs_hbm():
    c = compile_program(_half(load_example("decode_attention", "prefill")), Options(device=H100))
    fused = c.best.cost
    materialised = [a for a in c.alternatives if "sum_d" in " ".join(a.plan.buffers)]
    assert materialised and min(a.cost.hbm_bytes for a in materialised) > 3 * fused.hbm_bytes


def test_masked_tiles_counted_like_the_kernel_skips_them():
    """The live (row tile, key tile) count of an affine mask: causal j ≤ i visits the tiles on and
    below the diagonal; a band also drops those below it; counted in blocks of rows, it matches a
    per-pair enumeration on lengths that are not tile multiples."""
    from itertools import product

    from neptune_eq.extract.cost import _live_tiles

    causal = (((("i", -1), ("j", 1)), 0),)  # j − i ≤ 0
    n, R, T = 1000, 64, 32
    rows = -(-n // R)
    expect = sum(min(-(-n // T), (min(n, ti * R + R) - 1) // T + 1) for ti in range(rows))
    assert _live_tiles((causal,), "i", n, R, "j", n, T) == expect / rows
    band = (causal[0], ((("i", 1), ("j", -1)), -100))  # and i − j − 100 ≤ 0
    got = _live_tiles((band,), "i", n, R, "j", n, T)
    brute = 0
    for ti, tj in product(range(rows), range(-(-n // T))):
        i_lo, i_hi, j_lo, j_hi = ti * R, min(n, ti * R + R) - 1, tj * T, min(n, tj * T + T) - 1
        brute += j_lo - i_hi <= 0 and i_lo - j_hi - 100 <= 0
    assert got == brute / rows < expect / rows


def test_what_an_epilogue_writes_does_not_crowd_the_wave_out_of_l2():
    # a GEMM that also writes an operand from its epilogue (RMSNorm's x̂ by dY·Wᵀ) reads as much from
    # HBM as without that store: the epilogue writes after the loop's reads. Counted as live during
    # them, it had priced 128×256 tiles as thrashing L2 (1.10 ms at 128×128 where 128×256 ran 0.84)
    from dataclasses import replace as dc_replace

    from neptune_eq.extract.cost import kernel_cost

    from neptune_eq import dsl as ne
    from neptune_eq.grad import backward_program
    from neptune_eq.space import kernel_variants

    m, k_, n = 4096, 8192, 8192
    P = ne.program("rms_matmul_bf16")
    i, d, e = P.axes(i=m, d=k_, e=n)
    x, w, W = (P.input("x", i, d, dtype="bfloat16"), P.input("w", d, dtype="bfloat16"),
               P.input("W", d, e, dtype="bfloat16"))
    r = ne.rsqrt(ne.sum(x * x, d) * (1.0 / k_) + 1e-6)
    P.output("o", ne.sum(x * r * w * W, d), (i, e), dtype="bfloat16")
    back = backward_program(P.build(), saved=True).program
    c = compile_program(back, Options(device=H100))

    def written(a, kernel):
        return [st for st in kernel.epilogue if a.plan.buffers.get(st.target) is not None
                and a.plan.buffers[st.target].operand]

    # (a GEMM's epilogue: since session 72 an operand map kernel of its own may rank before it)
    writer = next(a for a in c.alternatives if any(written(a, kk) and kk.passes() for kk in a.plan.kernels))
    ki, kern = next((j, kk) for j, kk in enumerate(writer.plan.kernels) if written(writer, kk) and kk.passes())
    bare = dc_replace(kern, epilogue=[st for st in kern.epilogue if st not in written(writer, kern)])
    wide = next(v.schedule for v in kernel_variants(kern, writer.plan, back, writer.schedules[ki])
                if "128×256" in v.kind)
    with_store = kernel_cost(writer.plan, kern, back, wide, H100)
    without = kernel_cost(writer.plan, bare, back, wide, H100)
    # x̂ written (bf16) and x read for it: nothing more (the L2 penalty had added over 1 GB)
    extra = with_store.hbm_bytes - without.hbm_bytes
    assert 1.9 * m * k_ * 2 < extra < 2.1 * m * k_ * 2, (with_store, without)


def test_a_row_dot_inlined_in_a_loop_is_alu_work_not_tensor_core_work():
    """Attention's D = Σ_e dO[i, e]·O[i, e] computed per query tile inside the dK/dV pass is an
    elementwise product and a tl.sum (lower/contract.py emits a dot only into two tiled axes): the
    kernel recomputing it has the tensor-core work of the one reading D from its buffer, and more ALU
    work. (It had been priced as a dot, so recomputing D per key tile looked nearly free.)"""
    import torch
    from test_grad_saved import _global

    from neptune_eq.frontend import capture
    from neptune_eq.grad import backward_program
    from neptune_eq.runtime import compile_ir

    xs = [torch.randn(1, 4, 2048, 64, dtype=torch.float16) for _ in range(3)]
    alts = compile_ir(backward_program(capture(_global, *xs).program, saved=True).program).alternatives

    def dkdv(prefix):
        alt = next(a for a in alts if a.structure.split(", ", 1)[1].startswith(prefix))
        return next(kc for k, kc in zip(alt.plan.kernels, alt.cost.kernels) if k.passes()[-1].axis == "i")

    inline = dkdv("pass over j (sum_j); pass over i (sum_i, sum_i2)")
    read = dkdv("pass over e (sum_e); pass over j (sum_j); pass over i (sum_i, sum_i2)")
    assert inline.tensor_flops == read.tensor_flops
    assert inline.alu_ops > read.alu_ops


def _first_plan(fn, *shapes, dtype=None):
    import torch

    from neptune_eq.frontend import capture

    xs = [torch.empty(s, dtype=dtype) if isinstance(s, tuple) else s for s in shapes]
    return compile_program(capture(fn, *xs).program, Options(device=H100)).alternatives[0]


def test_a_loop_of_many_small_steps_is_priced_by_its_chain():
    """A program's loop steps wait on one another (loads, reductions across warps): about a memory
    latency each. Without that bound the model split cross-entropy over 50257 words 16 ways into
    tiles of 256 (measured 865 µs on an H100, where split 2 into tiles of 2048 took 389) and ran a
    column softmax of 4096 × 8192 as 128 programs of 64 steps down the rows (201 µs; split-K 4: 98)."""
    import torch
    import torch.nn.functional as F

    target = torch.zeros(8192, dtype=torch.int64)
    from neptune_eq.frontend import capture

    captured = capture(lambda x, t: F.cross_entropy(x.float(), t), torch.empty(8192, 50257, dtype=torch.bfloat16),
                       target)
    alts = compile_program(captured.program, Options(device=H100)).alternatives
    ce = alts[0]
    # not the many short steps (a program streams a row in steps of 1024 values or more, six or more rows'
    # worth of work a step): since session 63 the combine's steps are priced too, and the plan measured
    # fast (split 2, tiles of 2048) ties within 1 % with split 8 of 4 rows × 1024, which is chosen
    d = ce.schedules[0].tiles["d"]
    assert d * ce.schedules[0].tiles.get("i", 1) >= 2048 and d >= 1024, ce.structure
    fast = next(a for a in alts if "split-K 2" in a.structure and a.schedules[0].tiles.get("d") == 2048)
    assert fast.cost.time < 1.02 * ce.cost.time, (fast.structure, ce.structure)
    col = _first_plan(lambda x: torch.softmax(x, dim=0), (4096, 8192), dtype=torch.float16)
    # (split into chunks, or 256-row steps: on an H200, session 46, 64-row steps ran 193 µs, 256-row 104,
    # split-K 4 of 64-row steps 88 — the model now takes the 256-row steps, 16 % behind the split)
    assert "split-K" in col.structure or col.schedules[0].tiles["i"] >= 256, col.structure


def test_tensor_core_accumulators_past_the_registers_are_priced_as_spilled():
    """SwiGLU's x·W1 and x·W3 share one pass over d: two fp32 accumulators per output tile. At
    128 × 256 (8 warps: 256 registers a thread for them) the kernel ran 2840 µs on the H100 against 367
    predicted, at 128 × 128 459.5; the model now prices the tensor-core time of accumulators past
    ACC_REGISTERS by the measured slowdown, so the 128 × 256 schedule ranks below the 128 × 128 one."""
    import torch
    import torch.nn.functional as F

    from extract.cost import kernel_cost
    from extract.onchip import ACC_REGISTERS, accumulator_registers, mma_spill
    from neptune_eq.frontend import capture

    def swiglu(x, w1, w3, w2):
        return (F.silu(x @ w1) * (x @ w3)) @ w2

    shapes = [(4096, 2048), (2048, 5632), (2048, 5632), (5632, 2048)]
    prog = capture(swiglu, *[torch.empty(s, dtype=torch.bfloat16) for s in shapes]).program
    c = compile_program(prog, Options(device=H100))
    fused = next(a for a in c.alternatives if a.structure.split(", ", 1)[1].startswith("pass over d (sum_d, sum_d2)"))
    k, sched = fused.plan.kernels[0], fused.schedules[0]
    assert len(k.passes()[0].comps) == 2
    m, n = (a for a in k.grid if sched.tiles.get(a, 1) > 1)
    wide = sched.with_tiles(**{m: 128, n: 256})
    narrow = sched.with_tiles(**{m: 128, n: 128})
    assert wide.num_warps == narrow.num_warps == 8
    assert accumulator_registers(k, wide, prog, fused.plan) == 256 > ACC_REGISTERS
    assert mma_spill(k, narrow, prog, fused.plan) == 1.0 and mma_spill(k, wide, prog, fused.plan) > 7
    assert kernel_cost(fused.plan, k, prog, wide, H100).time > 3 * kernel_cost(fused.plan, k, prog, narrow, H100).time
    assert (sched.tiles[m], sched.tiles[n]) != (128, 256)
