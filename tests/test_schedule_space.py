"""The schedule space (neptune_eq/space.py): every kind runs end to end in the interpreter on
sizes that are not tile multiples and matches float64; the cost model's choice between kinds at
H100 sizes (compile only, nothing runs)."""

import math
from dataclasses import replace

import pytest
import torch

from neptune_eq import dsl as ne
from neptune_eq.device import H100
from neptune_eq.pipeline import Options, compile_program
from neptune_eq.runtime import compile_ir
from neptune_eq.schedule import sums_whole


def _rms_matmul(m=40, k=96, n=72):
    P = ne.program("rms_matmul")
    i, d, e = P.axes(i=m, d=k, e=n)
    x, w, W = P.input("x", i, d), P.input("w", d), P.input("W", d, e)
    r = ne.rsqrt(ne.sum(x * x, d) * (1.0 / k) + 1e-6)
    P.output("o", ne.sum(x * r * w * W, d), (i, e))
    return P.build()


def _softmax_lse(m=10, n=100):
    P = ne.program("softmax_lse")
    i, d = P.axes(i=m, d=n)
    x = P.input("x", i, d)
    mx = ne.max(x, d)
    p = ne.exp(x - mx)
    P.output("y", p / ne.sum(p, d), (i, d))
    P.output("lse", ne.log(ne.sum(p, d)) + mx, (i,))
    return P.build()


def _logit_lse(t=20, h=300, v=70, dtype="float32"):
    """log Σ_v exp(Σ_h X·W): a contraction over h inside a pass over v (linear cross-entropy's
    normaliser). h = 300 is longer than one tile: a K-loop."""
    P = ne.program("logit_lse")
    ti, hi, vi = P.axes(t=t, h=h, v=v)
    X, W = P.input("X", ti, hi, dtype=dtype), P.input("W", vi, hi, dtype=dtype)
    z = ne.sum(X * W, hi)
    m = ne.max(z, vi)
    P.output("lse", ne.log(ne.sum(ne.exp(z - m), vi)) + m, (ti,))
    return P.build()


def _pick(prog, kind: str, structure: str = ""):
    for a in prog.alternatives:
        if kind in a.kind and structure in a.plan.structure():
            return prog.pin(a.id)
    raise AssertionError(f"no alternative of kind {kind!r} among {[a.structure for a in prog.alternatives]}")


def _run(prog, inputs, schedules=None):
    if schedules is not None:
        prog.schedules["interpreter"] = schedules
    return prog.run(inputs)


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.fixture(scope="module")
def rms():
    return compile_ir(_rms_matmul())


def test_2d_tiles_grouped_order_on_ragged_sizes(rms):
    g = torch.Generator().manual_seed(0)
    xs = {"x": torch.randn(40, 96, generator=g), "w": torch.randn(96, generator=g),
          "W": torch.randn(96, 72, generator=g)}
    x = xs["x"].double()
    ref = (x * torch.rsqrt((x ** 2).mean(-1, keepdim=True) + 1e-6) * xs["w"].double()) @ xs["W"].double()
    prog = _pick(rms, "2-D")
    k = next(i for i, s in enumerate(prog.alternative.schedules) if s.group > 1)
    scheds = list(prog.alternative.schedules)
    # 16 × 16 output tiles, K tiles of 32: 40 rows, 72 columns and 96 = 3 K tiles (none divide but K)
    scheds[k] = replace(scheds[k].with_tiles(i=16, e=16, d=32), group=2)
    src = prog.lowered("interpreter")[0]
    out = _run(prog, xs, scheds)["o"]
    assert _rel(out, ref) < 1e-5
    assert "first_m" in prog.lowered("interpreter")[0] and "first_m" not in src.split("def ")[0]
    # the row factor scales the A operand: the tensor cores accumulate into the state in place
    assert "tl.dot(" in src and ", st_sum_d2" in src.split("tl.dot(", 1)[1].split("\n")[0]


def test_nested_k_loop_inside_the_vocabulary_pass():
    prog = compile_ir(_logit_lse())
    g = torch.Generator().manual_seed(1)
    xs = {"X": torch.randn(20, 300, generator=g) / 8, "W": torch.randn(70, 300, generator=g) / 8}
    ref = torch.logsumexp(xs["X"].double() @ xs["W"].double().T, -1)
    kl = [a for a in prog.alternatives if "K-loop over h" in a.kind]
    assert kl, [a.structure for a in prog.alternatives]
    one = prog.pin(kl[0].id)
    src = one.lowered("interpreter")[0]
    assert "for start_h in tl.range(" in src  # nested in the pass over v
    assert _rel(_run(one, xs)["lse"], ref) < 1e-5
    # a K tile that leaves a ragged last step (300 = 4 · 64 + 44), and rows of 20 in a 32-row tile
    scheds = [s.with_tiles(h=64) for s in one.alternative.schedules]
    assert _rel(_run(one.pin(one.choice), xs, scheds)["lse"], ref) < 1e-5


@pytest.mark.parametrize("rows", [1, 4])
def test_resident_rows_read_once(rows):
    prog = compile_ir(_softmax_lse(10, 100))
    g = torch.Generator().manual_seed(2)
    xs = {"x": torch.randn(10, 100, generator=g) * 4}
    x = xs["x"].double()
    for a in prog.alternatives:
        if a.kind.startswith("resident") and len(a.plan.kernels) == 1:
            one = prog.pin(a.id)
            scheds = [s.with_tiles(i=rows) for s in a.schedules]
            out = _run(one, xs, scheds)
            assert _rel(out["y"], torch.softmax(x, -1)) < 1e-5
            assert _rel(out["lse"], torch.logsumexp(x, -1)) < 1e-5
            src = one.lowered("interpreter")[0]
            assert "for start_d" not in src and src.count("tl.load(x_ptr") == 1  # one read of the row
            return
    raise AssertionError("no resident alternative")


def test_several_rows_per_program_when_rows_are_narrow():
    prog = compile_ir(_softmax_lse(33, 50))
    g = torch.Generator().manual_seed(3)
    xs = {"x": torch.randn(33, 50, generator=g)}
    x = xs["x"].double()
    multi = [a for a in prog.alternatives if any(s.tiles.get("i", 1) > 1 for s in a.schedules)]
    assert multi, [a.structure for a in prog.alternatives]
    for a in multi[:3]:
        out = _run(prog.pin(a.id), xs)
        assert _rel(out["y"], torch.softmax(x, -1)) < 1e-5, a.structure
        assert _rel(out["lse"], torch.logsumexp(x, -1)) < 1e-5, a.structure


# ---------------------------------------------------------------- the model's choices at H100 sizes


def _best(program):
    return compile_program(program, Options(device=H100)).best


def _hbm(alt) -> float:
    return sum(kc.hbm_bytes for kc in alt.cost.kernels)


def _once(program) -> float:
    """Bytes of every input read once and every output written once."""
    from neptune_eq.ir import DTYPE_BYTES

    size = lambda axes: math.prod(program.axes[a] for a in axes)  # noqa: E731
    return (sum(size(s.axes) * DTYPE_BYTES[s.dtype] for s in program.inputs.values())
            + sum(size(o.axes) * DTYPE_BYTES[o.dtype or "float32"] for o in program.outputs))


def test_a_row_that_fits_on_chip_is_read_once():
    # held whole, or streamed with its second read kept in L2 (lower/eviction.py): once from HBM either way
    program = _softmax_lse().with_extents({"i": 8192, "d": 32768})
    best = _best(program)
    assert len(best.plan.kernels) == 1 and _hbm(best) <= 1.01 * _once(program)


def test_a_row_too_long_for_the_chip_is_streamed():
    best = _best(_softmax_lse().with_extents({"i": 4096, "d": 65536}))
    assert not any(s.resident for s in best.schedules)  # 65536 fp32 values are past the registers


def _log_softmax(m=3, n=40000, dtype="float16"):
    P = ne.program("log_softmax_rows")
    i, d = P.axes(i=m, d=n)
    x = P.input("x", i, d, dtype=dtype)
    P.output("y", x - (ne.log(ne.sum(ne.exp(x - ne.max(x, d)), d)) + ne.max(x, d)), (i, d))
    return P.build()


def test_what_a_resident_row_keeps_is_priced_at_its_width():
    from neptune_eq.extract.onchip import resident_live_bytes, thread_registers

    def kept(program):
        c = compile_program(program, Options(device=H100))
        a = next(a for a in c.alternatives if len(a.plan.kernels) == 1 and a.schedules[0].resident)
        return resident_live_bytes(a.plan.kernels[0], c.program, a.plan)

    assert kept(_log_softmax()) == 2  # x, read once and kept at fp16 for the sum and the store
    assert kept(_log_softmax(dtype="float32")) == 4
    assert kept(_softmax_lse(3, 40000)) == 4  # exp(x − m) kept from the sum for the store
    assert (thread_registers(8), thread_registers(16), thread_registers(32)) == (255, 128, 64)


def test_a_64k_fp16_row_is_read_once_held_whole_or_kept_in_l2():
    # H100, 2026-12-06 (bench/results/h100_2026-12-06/s62/beyond1): log-softmax of 4096 × 65536 fp16
    # streamed in tiles of 16384, its second read kept in L2, 392 µs (held whole 434); softmax, whose
    # exp(x − m) kept in fp32 would spill if held, 374 µs (its split-K plan had measured 552)
    for program in (_log_softmax(), _softmax_lse().with_dtypes({"x": "float16"})):
        program = program.with_extents({"i": 4096, "d": 65536})
        best = _best(program)
        assert len(best.plan.kernels) == 1 and _hbm(best) <= 1.01 * _once(program), best.structure
        assert best.schedules[0].tiles["d"] == 16384 and best.schedules[0].num_warps == 32
    assert not best.schedules[0].resident  # (softmax, the last of the two)
    wide = _log_softmax(dtype="float32").with_extents({"i": 4096, "d": 65536})
    assert not any(s.resident for s in _best(wide).schedules)


def test_rows_re_read_from_l2_are_kept_there_past_what_the_wave_writes():
    # 16K bf16 rows: the rows of one wave fit in half of L2 but not beside the rows they write.
    # Without cache hints three streamed passes measured 660 µs on the H100 against the resident
    # row's 359; with the re-read rows kept (evict_last) and the writes streamed (evict_first),
    # softmax of 16384 × 16384 fp16 rows in tiles of 8192 measured 355 (a copy 361; 2026-12-06)
    program = _log_softmax(dtype="bfloat16").with_extents({"i": 16384, "d": 16384})
    best = _best(program)
    assert len(best.plan.kernels) == 1 and _hbm(best) <= 1.01 * _once(program)


def test_a_64k_resident_row_runs_in_the_interpreter():
    prog = compile_ir(_log_softmax(), Options(device=H100))  # 3 × 40000: a 65536 tile, a masked tail
    held = next(a for a in prog.alternatives if len(a.plan.kernels) == 1 and a.schedules[0].resident)
    assert held.schedules[0].tiles["d"] == 65536 and held.schedules[0].num_warps == 32
    x = torch.randn(3, 40000, dtype=torch.float16) * 4
    out = _run(prog.pin(held.id), {"x": x})
    assert _rel(out["y"], torch.log_softmax(x.double(), -1)) < 2e-3


def test_narrow_rows_offer_several_per_program():
    c = compile_program(_softmax_lse().with_extents({"i": 65536, "d": 256}), Options(device=H100))
    assert len(c.best.plan.kernels) == 1 and c.best.schedules[0].resident
    multi = [a for a in c.alternatives if len(a.plan.kernels) == 1 and a.schedules[0].tiles["i"] > 1]
    assert multi and all(a.cost.time > 0 for a in multi)  # ranked beside the one-row schedule


def test_a_matmul_fed_by_a_norm_gets_2d_tiles():
    program = _rms_matmul().with_extents({"i": 4096, "d": 8192, "e": 8192})
    best = compile_program(program, Options(device=H100, library_gemm=False)).best  # (generated kernels)
    mm = [s for s in best.schedules if s.group > 1]
    assert mm and mm[0].tiles["i"] >= 128 and mm[0].tiles["e"] >= 128
    assert all("2-D" in k or "resident" in k or "streamed" in k for k in best.kind.split("; "))
    # float32 operands: the vendor's SGEMM (0.87 of the FMA pipe) beats float32 tiles once the norm's
    # 1/rms, factored out of the sum by the e-graph, is written into the operand (session 67)
    lib = _best(program)
    assert "library GEMM" in lib.kind and any(b.endswith("_scaled") for b in lib.plan.buffers), lib.structure


def test_a_long_contraction_runs_as_a_k_loop_not_a_logits_buffer():
    """In bf16, as linear cross-entropy runs. (In float32 the products run on the FMA pipe and the
    cost model writes the 4 GB of logits with the vendor's SGEMM instead: 2.8 ms of HBM against ~50 ms
    of products saved by cuBLAS's rate over a generated IEEE dot.)"""
    best = _best(_logit_lse(dtype="bfloat16").with_extents({"t": 8192, "h": 4096, "v": 128256}))
    assert "sum_h" in best.plan.inline  # the logits are computed per tile, never written
    assert not any("v" in b.axes and "t" in b.axes for b in best.plan.buffers.values())
    assert "K-loop over h" in best.kind


def test_split_k_states_take_64_bit_offsets_only_when_their_chunks_pass_2_to_the_31():
    """A split-K state buffer has one slab per chunk: 2 chunks of 32×16384×128 fp32 states stay within
    int32 offsets (a CHUNK axis was sized 64 before, which made every kernel of attention's backward
    compute 64-bit addresses); 64 chunks of the same do not."""
    from neptune_eq import ir
    from neptune_eq.plan import BufferSpec, KernelPlan, Plan
    from neptune_eq.schedule import wide_index_needed

    axes = {"h": 32, "i": 16384, "d": 128}
    prog = ir.Program("p", axes, {"q": ir.TensorSpec("q", ("h", "i", "d"), "float16")},
                      [ir.Output("out0", ("h", "i", "d"), ir.Load("q", tuple(ir.Index(a) for a in axes)))])

    def plan(chunks: int) -> Plan:
        return Plan([KernelPlan("k0_partial", ("h", "i", "d"), chunks=chunks), KernelPlan("k1", ("h", "i", "d"))],
                    {"part_x": BufferSpec("part_x", (ir.CHUNK, "h", "i", "d"))}, {}, [], True)

    assert not wide_index_needed(prog, plan(2))
    assert wide_index_needed(prog, plan(64))


def test_attention_default_tiles_follow_the_main_pass_and_the_accumulators_a_row_carries():
    """Causal attention with head dim 128 (H100 measurements in bench/results/h100_2026-11-24/issue13):
    the forward carries one [rows, 128] output tile a row, 128 rows in 8 warps, and its rolling pass
    steps 128 keys at a time (three stages of them fit); the backward's dQ pass 128 rows in 8 warps
    too (its 64-key steps: 128 would not fit three stages), although a pass over e (D = Σ_e dO·O)
    reading dO and O runs first in its kernel; its
    dK/dV pass carries dK and dV (256 values a row), 64 rows in 4 warps, 2 stages."""
    from neptune_eq.frontend import capture
    from neptune_eq.grad import backward_program
    from neptune_eq.schedule import default_schedule

    def causal(q, k, v):
        L = q.shape[-2]
        keep = torch.arange(L)[:, None] >= torch.arange(L)[None]
        return torch.softmax((q @ k.transpose(-1, -2) * 128 ** -0.5).masked_fill(~keep, float("-inf")), -1) @ v

    xs = [torch.randn(1, 2, 256, 128, dtype=torch.float16) for _ in range(3)]
    prog = capture(causal, *xs).program
    fwd = compile_ir(prog).alternative
    (s,) = [default_schedule(k, prog, fwd.plan) for k in fwd.plan.kernels]
    assert (s.tiles["i"], s.tiles["j"], s.num_warps, s.num_stages) == (128, 128, 8, 3), s
    back = backward_program(prog, saved=True).program
    alts = compile_ir(back).alternatives
    fused = next(a for a in alts if len(a.plan.kernels) == 2 and "pass over e (sum_e); pass over j" in a.structure)
    dq, dkdv = fused.plan.kernels
    s = default_schedule(dq, back, fused.plan)
    assert (s.tiles["i"], s.tiles["j"], s.num_warps, s.num_stages) == (128, 64, 8, 3), s
    s = default_schedule(dkdv, back, fused.plan)
    assert (s.tiles["j"], s.num_warps, s.num_stages) == (64, 4, 2), s


def test_a_kernel_over_the_shared_memory_triton_finds_is_compiled_again_with_fewer_stages():
    """launch_fitting: Triton's OutOfResources for shared memory costs a stage (with a warning naming
    the kernel), down to one; any other failure, or one at a single stage, is raised as it is."""
    from triton.runtime.errors import OutOfResources

    from neptune_eq.ir import NeptuneWarning
    from neptune_eq.lower.launch import launch_fitting

    class Kernel:
        def __init__(self, fits_at: int, resource: str = "shared memory"):
            self.fits_at, self.resource, self.tried = fits_at, resource, []

        def __getitem__(self, grid):
            def launch(*args, num_stages, num_warps):
                self.tried.append(num_stages)
                if num_stages > self.fits_at:
                    raise OutOfResources(1000 * num_stages, 232448, self.resource)
                return ("compiled", num_stages)
            return launch

    k = Kernel(fits_at=2)
    with pytest.warns(NeptuneWarning) as said:
        assert launch_fitting(k, (1,), [], {"num_stages": 4, "num_warps": 8}, "nq_k0") == (("compiled", 2), 2)
    assert [str(w.message).split(":")[1] for w in said] == [" compiled again with 3", " compiled again with 2"]
    assert "nq_k0 needs 3000 bytes of shared memory at 3 pipeline stages" in str(said[1].message)
    assert k.tried == [4, 3, 2]
    with pytest.raises(OutOfResources), pytest.warns(NeptuneWarning, match="nq_k1"):
        launch_fitting(Kernel(fits_at=0), (1,), [], {"num_stages": 2, "num_warps": 4}, "nq_k1")
    with pytest.raises(OutOfResources, match="registers"):
        launch_fitting(Kernel(fits_at=1, resource="registers"), (1,), [], {"num_stages": 3, "num_warps": 4}, "k")


def test_a_rolling_pass_streaming_a_bias_tile_keeps_64_key_steps():
    """A bias tile added to the scores is no dot operand: it is held in registers, twice as many at
    128 keys a step (measured 0.498 against 0.482 ms on the H100), so that pass keeps 64-key steps;
    the same attention without it steps 128."""
    from neptune_eq.frontend import capture
    from neptune_eq.schedule import default_schedule

    def attention(q, k, v, bias):
        return torch.softmax(q @ k.transpose(-1, -2) * 64 ** -0.5 + bias, -1) @ v

    q, k, v = (torch.randn(1, 2, 512, 64, dtype=torch.float16) for _ in range(3))
    for bias, step in ((torch.randn(2, 512, 512, dtype=torch.float16), 64), (torch.zeros(()), 128)):
        prog = capture(attention, q, k, v, bias).program
        plan = compile_ir(prog).alternative.plan
        (s,) = [default_schedule(kp, prog, plan) for kp in plan.kernels]
        assert s.tiles["j"] == step, s


def test_the_cheapest_kind_of_every_kernel_is_combined():
    # kernels are priced one by one: the cheapest combination is each kernel's cheapest kind, and it
    # comes right after the default even where the product of kinds, in order, would reach it late
    from neptune_eq.space import Variant, _cheapest_combos

    options = [[Variant(f"k{j} kind{i}", None) for i in range(3)] for j in range(4)]
    prices = {(j, i): (1.0 if i == (j + 1) % 3 else 2.0 + i) for j in range(4) for i in range(3)}
    kernels = list(range(4))
    combos = _cheapest_combos(kernels, options, lambda k, v: prices[(k, int(v.kind[-1]))], limit=8)
    assert [v.kind for v in combos[0]] == [f"k{j} kind0" for j in range(4)]  # the default first
    assert [v.kind for v in combos[1]] == [f"k{j} kind{(j + 1) % 3}" for j in range(4)]
    assert len(combos) == len({tuple(v.kind for v in c) for c in combos}) <= 8
    # each further one changes a single kernel of the cheapest
    assert all(sum(a.kind != b.kind for a, b in zip(c, combos[1])) == 1 for c in combos[2:])


def test_a_backward_keeps_every_gemm_on_2d_tiles_at_h100_sizes():
    # RMSNorm → matmul's backward: a norm weight's gradient (a sum over rows into [d]) and the weight
    # matrix's (a GEMM) share the pass over rows; the plan that gives each its own kernel has a GEMM
    # first and one last, and only combining kinds by price keeps both on 2-D tiles
    from neptune_eq.grad import backward_program

    back = backward_program(_rms_matmul(4096, 8192, 8192).with_dtypes(
        {"x": "bfloat16", "w": "bfloat16", "W": "bfloat16"}), saved=True).program
    best = compile_program(back, Options(device=H100)).best
    gemms = [k for k, s in zip(best.plan.kernels, best.schedules) if len(k.grid) == 2 and k.passes()]
    # (on grouped 2-D tiles, or the vendor's GEMM: gemm_split can give the weight's product a kernel alone)
    assert gemms and all(s.group > 1 or s.library for k, s in zip(best.plan.kernels, best.schedules)
                         if k in gemms), best.kind
    # the [d] gradient is not recomputed in every column tile of a GEMM
    assert all(len(c.free) == len(k.grid) for k in gemms for p in k.passes() for c in p.comps), best.structure


def _column_sum(m=300, n=72):
    """Σ_i x[i, d]·g[i, d] into [d] (a norm weight's gradient): a loop down the columns of x."""
    P = ne.program("column_sum")
    i, d = P.axes(i=m, d=n)
    x, g = P.input("x", i, d), P.input("g", i, d)
    P.output("o", ne.sum(x * g, i), (d,))
    return P.build()


def test_a_column_sum_takes_whole_sectors_a_program():
    # one or two columns a program read 4-8 bytes of each 32-byte sector: priced, and at H100 sizes
    # the plan takes 64 columns a program
    best = compile_program(_column_sum(4096, 8192), Options(device=H100)).best
    assert "columns 64 × 64" in best.kind, best.kind
    prog = compile_ir(_column_sum())
    cols = _pick(prog, "columns")
    g = torch.Generator().manual_seed(0)
    x = {"x": torch.randn(300, 72, generator=g), "g": torch.randn(300, 72, generator=g)}
    ref = (x["x"].double() * x["g"].double()).sum(0)
    assert _rel(cols.run(x)["o"], ref) < 1e-6


def test_a_k_loop_takes_taller_row_tiles_where_l2_delivery_bounds_it():
    """A K-loop tile of m rows reads the streamed operand from L2 once per program: at linear
    cross-entropy's size the model takes 128 rows in three stages (64 × 256 in two measured 31.1 ms
    on an H200, 128 × 256 in three 13.4), and prices L2 delivery into that choice."""
    prog = compile_program(_logit_lse(t=8192, h=4096, v=128256, dtype="bfloat16"), Options(device=H100))
    alt = prog.alternatives[0]
    (ki,) = [i for i, s in enumerate(alt.schedules) if s.tiles.get("h", 4096) < 4096]
    s = alt.schedules[ki]
    assert s.tiles["t"] == 128 and s.num_stages >= 3, s
    from neptune_eq.extract.cost import plan_cost

    short = list(alt.schedules)
    short[ki] = replace(s.with_tiles(t=64), num_stages=2)
    slow = plan_cost(alt.plan, prog.program, short, H100).kernels[ki].time
    assert slow > 1.5 * alt.cost.kernels[ki].time


def test_an_epilogue_tile_shares_the_pipeline_buffers_shared_memory():
    """A GEMM that adds an fp32 accumulator tile in its epilogue (a chunked weight gradient) keeps
    three stages of 128 × 256 × 64 tiles (144 KiB): the epilogue's 128 KiB tile is live only after the
    loop, where Triton reuses the pipeline's shared memory."""
    from neptune_eq.shared_memory import SHARED_BUDGET, shared_bytes
    from neptune_eq.space import kernel_variants

    P = ne.program("acc_gemm")
    i, d, e = P.axes(i=512, d=1024, e=512)
    a, b = P.input("a", i, d, dtype="bfloat16"), P.input("b", d, e, dtype="bfloat16")
    acc = P.input("acc", i, e, dtype="float32")
    P.output("o", acc + ne.sum(a * b, d), (i, e))
    prog = compile_program(P.build(), Options(device=H100))
    alt = prog.alternatives[0]
    k = alt.plan.kernels[-1]
    variants = kernel_variants(k, alt.plan, prog.program, alt.schedules[-1])
    (v,) = [v for v in variants if v.kind.startswith("2-D 128×256")]
    assert v.schedule.num_stages == 3
    assert shared_bytes(k, prog.program, alt.plan, v.schedule) == 3 * (128 + 256) * 64 * 2 <= SHARED_BUDGET


def test_a_row_dot_is_no_tile_contraction():
    """Σ_d q[i, d]·k[j, d] is a matrix product (each factor misses one free axis): a tl.dot per tile,
    inlined where it is used in every plan. Σ_e dO[i, e]·O[i, e] has two free axes too, but each factor
    spans both: an elementwise product, which the plan space may also write once and read (attention's
    D), rather than recompute in every step of a loop over i."""
    from neptune_eq.extract.plans import _tile_contraction

    from neptune_eq import ir
    from neptune_eq.fusion.types import Binding

    def binding(free, axis, a, b):
        body = ir.Call("mul", (ir.Load("a", tuple(map(ir.Index, a))), ir.Load("b", tuple(map(ir.Index, b)))))
        return Binding("s", ir.Reduce("sum", axis, body), 0, free)

    assert _tile_contraction(binding(("h", "i", "j"), "d", ("h", "i", "d"), ("h", "j", "d")))
    assert not _tile_contraction(binding(("h", "i"), "e", ("h", "i", "e"), ("h", "i", "e")))
    assert not _tile_contraction(binding(("h", "i"), "e", ("h", "i", "e"), ("e",)))  # one factor short: a row dot


def test_a_group_sum_takes_one_group_per_program_and_sums_it_unmasked():
    """o[g, j, d] = Σ_h [h // 4 = g]·x[h, j, d] (grouped-query attention's dK summed over the query heads
    of each kv head): the groups share no loaded tile, so a program takes one g, and a loop tile that
    divides 4 leaves the group's tiles whole (no [g, h, d] masked block)."""
    P = ne.program("group_sum")
    h, g, j, d = P.axes(h=12, g=3, j=5, d=24)
    x = P.input("x", h, j, d)
    P.output("o", ne.sum(ne.where(ne.eq(h.index // 4, g.index), x, 0.0), h), (g, j, d))
    prog = compile_ir(P.build())
    streamed = next(i for i, a in enumerate(prog.alternatives) if a.kind == "streamed")
    (sched,) = prog.alternatives[streamed].schedules
    assert sched.tiles["g"] == 1 and 4 % sched.tiles["h"] == 0
    xs = torch.randn(12, 5, 24, generator=torch.Generator().manual_seed(3))
    for p in (prog, prog.pin(streamed)):
        torch.testing.assert_close(p.run({"x": xs})["o"], xs.view(3, 4, 5, 24).sum(1), rtol=1e-5, atol=1e-5)


def test_a_contraction_held_on_the_alus_keeps_a_block_that_does_not_spill():
    """A relative-position table's gradient along its diagonals gathers k and v rows per (entry f,
    query i) and contracts them over d on the ALUs ([f, i, d] factors: no tl.dot). Such a product is
    held to BLOCK_VALUES a program; at [f 128, i 64, d 64] (0.5 M values, Triton's limit is 2 M) it
    spilled in every program. Compile only, at the sweep's sizes (L 2048, d 64, 129 entries)."""
    from neptune_eq import ir
    from neptune_eq.block_bounds import BLOCK_VALUES
    from neptune_eq.contraction import is_product, opened
    from neptune_eq.frontend import capture
    from neptune_eq.grad import backward_program
    from neptune_eq.kernel_terms import kernel_exprs

    def rel_bias(q, k, v, table):
        i = torch.arange(q.shape[2])
        rel = (i[None, :] - i[:, None]).clamp(-64, 64) + 64
        return torch.softmax(q @ k.transpose(-1, -2) * 0.125 + table[:, rel], -1) @ v

    # (fp16, as such models train: in float32 every product runs on the FMA pipe and the top plans change)
    xs = [torch.randn(2, 4, 2048, 64).half() for _ in range(3)] + [torch.randn(4, 129).half()]
    back = backward_program(capture(rel_bias, *xs).program, saved=True).program
    comp = compile_ir(back, Options(max_plans=20))
    seen = 0
    for alt in comp.alternatives[:5]:
        for k, s in zip(alt.plan.kernels, alt.schedules):
            bodies = [r.body for e in kernel_exprs(k, alt.plan) for r in ir.walk(e)
                      if isinstance(r, ir.Reduce) and r.op == "sum" and is_product(r.body)]
            bodies += [c.core for p in k.passes() for c in p.comps if c.op == "sum" and is_product(c.core)]
            for body in bodies:
                tiled = [a for a in body.axes if s.tiles.get(a, 1) > 1]
                if any(sum(s.tiles.get(a, 1) > 1 for a in f.axes) >= 3 for f in opened(body).factors):
                    seen += 1
                    assert len(tiled) < 3 or math.prod(s.tiles[a] for a in tiled) <= BLOCK_VALUES, (k.name, s)
    assert seen, "no contraction on the ALUs: the diagonal's gradient changed form"


def test_a_kernel_without_dots_holds_its_loads_to_a_block_that_does_not_spill():
    """Group norm (32 groups of 8 channels over 64 × 64 pixels) ends in a pass over the 8 channels of a
    group and the map writing the output: three row axes (batch, pixel row and column) were held whole
    beside them, a [16, 16, 8, 16, 32] block of 1 M values in each of 16 programs (1.75 ms predicted,
    eager's kernel takes 63 µs). Without tensor-core products a load's block is held to BLOCK_VALUES,
    the axis read contiguously (the pixel column) shrinking last. Compile only."""
    import torch.nn.functional as F

    import neptune_eq
    from neptune_eq import ir
    from neptune_eq.block_bounds import BLOCK_VALUES
    from neptune_eq.kernel_terms import kernel_exprs

    x = torch.randn(16, 256, 64, 64, dtype=torch.bfloat16)
    w, b = torch.randn(256, dtype=torch.bfloat16), torch.randn(256, dtype=torch.bfloat16)
    comp = neptune_eq.compile(lambda x, w, b: F.group_norm(x, 32, w, b, eps=1e-5), x, w, b).program
    alt = comp.alternative
    column = comp.program.inputs["x"].axes[-1]
    for k, s in zip(alt.plan.kernels, alt.schedules):
        for ld in {n for e in kernel_exprs(k, alt.plan) for n in ir.walk(e) if isinstance(n, ir.Load)}:
            tiled = [a for a in ld.axes if s.tiles.get(a, 1) > 1]
            assert len(tiled) < 3 or math.prod(s.tiles[a] for a in tiled) <= BLOCK_VALUES, (k.name, s.tiles)
            if ld.tensor == "x" and len(tiled) >= 3:
                assert s.tiles[column] == 64, (k.name, s.tiles)


@pytest.mark.parametrize("name", ["normalize", "layer_norm", "softmax"])
def test_an_inline_reduction_over_a_grid_axis_sums_all_of_it(name):
    """Σ_i x[i, d]·rsqrt(Σ_d x[i, d]²) into [d] (a column sum of normalised rows): the inner Σ_d,
    computed inline, shares its axis with the kernel's grid, and a schedule of one d a program summed
    that one element (wrong by 10× and more, silently; RMSNorm → matmul's weight gradient when x needs
    none). Every offered schedule now holds such an axis whole in one program."""
    import torch.nn.functional as F

    import neptune_eq

    fn = {"normalize": lambda x: F.normalize(x, dim=-1).sum(0),
          "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)).mean(0),
          "softmax": lambda x: torch.softmax(x, -1).sum(0)}[name]
    x = torch.randn(37, 45)
    prog = neptune_eq.compile(fn, x)
    assert torch.allclose(prog(x).double(), fn(x.double()), atol=1e-5)
    compiled = prog.program  # (the CompiledProgram)
    for alt in compiled.alternatives:  # (what the cost model may pick)
        for k, s in zip(alt.plan.kernels, alt.schedules):
            assert sums_whole(k, alt.plan, compiled.program, s), (alt.structure, k.name, s)


def test_a_norm_weight_gradient_through_a_matmul_without_the_input_gradient():
    import torch.nn.functional as F

    import neptune_eq

    def fn(x, g, W):
        return F.rms_norm(x, (9,), g) @ W.t()

    x, g, W = torch.randn(4, 9), 1 + 0.1 * torch.randn(9), 0.3 * torch.randn(5, 9)
    prog = neptune_eq.compile(fn, x, g, W)
    a, b = g.clone().requires_grad_(), g.double().requires_grad_()
    c = torch.randn(4, 5, dtype=torch.float64)
    prog(x, a, W).backward(c.float())
    fn(x.double(), b, W.double()).backward(c)
    assert torch.allclose(a.grad.double(), b.grad, atol=1e-5), (a.grad, b.grad)


def _siglip(x, y, t, b):
    x, y = torch.nn.functional.normalize(x, dim=-1), torch.nn.functional.normalize(y, dim=-1)
    logits = t.exp() * (x @ y.T).float() + b
    i = torch.arange(x.shape[0])
    labels = 2 * (i[:, None] == i[None, :]).float() - 1
    return -torch.nn.functional.logsigmoid(labels * logits).sum() / x.shape[0]


def test_a_default_schedule_holds_an_inline_summed_grid_axis_whole_and_fits_shared_memory():
    """SigLIP's saved backward writes dx[i, d] beside the inline Σ_d x² of its normalisation: the default
    schedule K-looped d (the lowering refused to write the kernel: an internal error at 8192 × 768 on the
    H200), and held whole it asked for 262 KB of shared memory. d is not K-looped, and the default's
    free tiles shrink until it fits."""
    from neptune_eq.frontend import capture
    from neptune_eq.grad import backward_program
    from neptune_eq.shared_memory import SHARED_BUDGET, shared_bytes

    x, y = torch.randn(512, 384, dtype=torch.bfloat16), torch.randn(512, 384, dtype=torch.bfloat16)
    program = capture(_siglip, x, y, torch.tensor(2.3), torch.tensor(-10.0)).program
    comp = compile_ir(backward_program(program, ["x", "y", "t", "b"], saved=True).program, Options())
    _, kernels = comp.lowered("cuda")  # (raised before)
    for k, ks in zip(comp.plan.kernels, kernels):
        assert sums_whole(k, comp.plan, comp.program, ks.schedule)
        assert shared_bytes(k, comp.program, comp.plan, ks.schedule) <= SHARED_BUDGET


def test_a_gemm_whose_epilogue_spans_another_axis_keeps_its_block_on_chip():
    """A squeeze-excitation gate, x · σ(W₂ relu(W₁ mean(x))), writes x[b, h, id] times a [b, h] GEMM
    result: the GEMM schedule's 64 × 64 tile with a 128-wide id tile made 524288 values a program (4.5x
    eager on the H200, priced as if on chip). The model now counts the epilogue's block and the space
    offers small GEMM tiles with the other axes cut to fit."""
    import neptune_eq
    from neptune_eq.space import EPILOGUE_BLOCK

    def se(x, w1, b1, w2, b2):
        s = torch.sigmoid(torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x.mean((2, 3)), w1, b1)),
                                                     w2, b2))
        return x * s[:, :, None, None]

    xs = (torch.randn(64, 256, 56, 56, dtype=torch.bfloat16), torch.randn(16, 256, dtype=torch.bfloat16),
          torch.randn(16, dtype=torch.bfloat16), torch.randn(256, 16, dtype=torch.bfloat16),
          torch.randn(256, dtype=torch.bfloat16))
    comp = neptune_eq.compile(se, *xs, device=H100).program
    for k, s in zip(comp.plan.kernels, comp._schedules("cuda")):
        if k.epilogue:
            assert math.prod(s.tiles.get(a, 1) for a in k.grid) <= EPILOGUE_BLOCK, (k.name, s.tiles)


def _writes_logits(plan) -> bool:
    """Does a kernel of `plan` compute x·yᵀ as a GEMM of its own (grid i, j; a pass over d)?"""
    return any({"i", "j"} <= set(k.grid) and any(getattr(p, "axis", None) == "d" for p in k.phases)
               for k in plan.kernels)


def _siglip_core_backward(n: int, d: int):
    """The backward SigLIP trains with (neptune_eq.autograd): of its core, split at the normalised dot
    operands, for the core's inputs and the operands."""
    from neptune_eq.frontend import capture
    from neptune_eq.grad import backward_program
    from neptune_eq.grad_prologue import split_prologue

    x, y = torch.randn(n, d, dtype=torch.bfloat16), torch.randn(n, d, dtype=torch.bfloat16)
    program = capture(_siglip, x, y, torch.tensor(2.3), torch.tensor(-10.0)).program
    pro = split_prologue(program, ["x", "y", "t", "b"])
    wrt = [n for n in ("x", "y", "t", "b") if n in pro.core.inputs] + list(pro.operands)
    return compile_ir(backward_program(pro.core, wrt, saved=False).program, Options())


def test_every_inline_policy_gets_a_share_of_the_plan_space():
    """SigLIP's backward at 8192 × 768: the policies inlining Σ_d x·y (recomputed per tile, d held whole:
    a 32 × 1024 float32 accumulator a program, 10.2 ms on the H200 where torch.compile's fwd+bwd took 0.86)
    filled all 200 plans, and none wrote the logits once. Each policy now gets its share, and the model
    picks a plan that computes them as a GEMM of their own, then reads them in two GEMMs."""
    comp = _siglip_core_backward(8192, 768)
    assert _writes_logits(comp.plan), comp.alternative.structure
    assert any(a.plan.inline for a in comp.alternatives)  # (the inline plans are still there)


def test_a_backward_that_writes_the_logits_once_matches_float64():
    comp = _siglip_core_backward(96, 48)
    pick = next(a for a in comp.alternatives if _writes_logits(a.plan))
    assert comp.pin(pick.id).verify(seed=5).passed


def test_a_map_that_transposes_takes_square_tiles():
    """A map storing buf[e, i] from a[i, e] (a saved [i, e] statistic written as a GEMM's [e, i] operand)
    tiles both axes 64 × 64: a tile along the store's contiguous axis alone read one value of each
    sector of a (the cost model had priced it 1.5 GB of traffic for 0.24); a map reading along the
    store's own axis keeps MAP_BLOCK values of it."""
    from neptune_eq import ir
    from neptune_eq.plan import KernelPlan, Plan, StorePlan
    from neptune_eq.schedule import MAP_BLOCK, default_schedule

    prog = ir.Program("t", {"i": 4096, "e": 5632}, {"a": ir.TensorSpec("a", ("i", "e"))},
                      [ir.Output("o", ("i",), ir.Const(0.0))])
    for out_axes, want in ((("e", "i"), {"e": 64, "i": 64}), (("i", "e"), {"i": 1, "e": MAP_BLOCK})):
        k = KernelPlan("k0_operand", ("i", "e"), [],
                       [StorePlan("buf", out_axes, ir.Load("a", (ir.Index("i"), ir.Index("e"))), "bfloat16")])
        plan = Plan(kernels=[k], buffers={}, inline={}, groups=[], fused_kernels=True)
        assert default_schedule(k, prog, plan).tiles == want, out_axes
    # a map storing a scalar (an MoE router's balance loss beside its gradients): no axis to tile (it
    # raised IndexError in session 72's first version)
    k = KernelPlan("k1", (), [], [StorePlan("o", (), ir.Load("a", (ir.Const(0.0), ir.Const(0.0))))])
    plan = Plan(kernels=[k], buffers={}, inline={}, groups=[], fused_kernels=True)
    assert default_schedule(k, prog, plan).tiles == {}


def _linear_attention(q, k, v):
    """Linear attention with φ = elu + 1 over `.float()` operands (bench/sweep_eighth.py's row)."""
    fq, fk = torch.nn.functional.elu(q.float()) + 1.0, torch.nn.functional.elu(k.float()) + 1.0
    kv = torch.einsum("bhld,bhle->bhde", fk, v.float())
    z = 1.0 / (torch.einsum("bhld,bhd->bhl", fq, fk.sum(2)) + 1e-6)
    return (torch.einsum("bhld,bhde->bhle", fq, kv) * z[..., None]).to(q.dtype)


def test_a_float32_dot_of_computed_operands_counts_their_staged_tiles():
    """Linear attention's training computes Σⱼ φ(k)ⱼ,d · vⱼ,e in float32 (tf32x3): φ(k) is computed per
    step and the 16-bit v widened beside it, and Triton stages both tiles in shared memory, as big and
    small parts. Modelled as the 16-bit loads alone (131072 bytes at j 256), the kernel asked 262144 at
    one stage on the H100 and failed to launch; the model counts them now, and the loop tile shrinks."""
    from neptune_eq.frontend import capture
    from neptune_eq.shared_memory import SHARED_BUDGET, shared_bytes
    from neptune_eq.training import _derive

    q, k, v = (torch.empty(1, 2, 4096, 64, dtype=torch.float16).normal_() for _ in range(3))
    c = capture(_linear_attention, q, k, v)
    comp = compile_ir(_derive(c.program, list(c.program.inputs)).prologue[0].maps, Options(device=H100))
    alt = comp.alternative
    (kp, sched), = [(kp, s) for kp, s in zip(alt.plan.kernels, alt.schedules) if kp.passes()]
    assert sched.input_precision == "tf32x3"
    wide = sched.with_tiles(j=256)
    assert shared_bytes(kp, comp.program, alt.plan, wide) >= 262144 > SHARED_BUDGET
    assert shared_bytes(kp, comp.program, alt.plan, sched) <= SHARED_BUDGET


def test_a_float32_k_loop_of_loaded_operands_steps_at_most_64():
    """Σᵢ φ(q)ᵢ,d/zᵢ · dOᵢ,e (linear attention's training, both operands loaded: φ(q)/z written once)
    multiplies float32 tiles on the FMA pipe: at K 128 a step it took ~1.2 ms on the H100, at K 64
    ~0.25 (priced alike before, session 76). A K tile past FMA_K_LOADED is priced as spilling, and the
    plan's kernel steps 64."""
    from extract.onchip import fma_dots_fit
    from neptune_eq import ir
    from neptune_eq.contraction import opened
    from neptune_eq.frontend import capture
    from neptune_eq.lower.contract import float32_product
    from neptune_eq.schedule import FMA_K_LOADED
    from neptune_eq.training import _derive

    xs = [torch.empty(4, 16, 4096, 64, dtype=torch.float16).normal_() for _ in range(3)]
    c = capture(_linear_attention, *xs)
    comp = compile_ir(_derive(c.program, list(c.program.inputs)).saved.program, Options(device=H100))
    plan, program = comp.alternative.plan, comp.program
    loops = [(k, s, ps) for k, s in zip(plan.kernels, comp.alternative.schedules) for ps in k.passes()
             if s.input_precision == "ieee" and not s.library and len(ps.comps) == 1 and ps.comps[0].op == "sum"
             and all(isinstance(f, ir.Load) for f in opened(ps.comps[0].core).factors)
             and float32_product(ps.comps[0].core, ps.axis, {*k.grid, ps.axis}, plan, program)]
    assert loops
    for k, s, ps in loops:
        assert s.tiles[ps.axis] <= FMA_K_LOADED, s
        assert not fma_dots_fit(k, s.with_tiles(**{ps.axis: 2 * FMA_K_LOADED}), program, plan)


def test_a_combine_storing_over_axes_its_states_lack_tiles_them():
    """Linear attention's key gradient [b, h, j, d] is stored by the kernel folding split-K states over
    [b, h, d]: one key a program made 262144 programs of 64 values (223.6 µs on the H100, session 76).
    The combine now tiles j as a map would, up to MAP_BLOCK values a program."""
    from neptune_eq.frontend import capture
    from neptune_eq.plan import Combine
    from neptune_eq.schedule import MAP_BLOCK
    from neptune_eq.training import _derive

    xs = [torch.empty(4, 16, 4096, 64, dtype=torch.float16).normal_() for _ in range(3)]
    c = capture(_linear_attention, *xs)
    alt = compile_ir(_derive(c.program, list(c.program.inputs)).saved.program, Options(device=H100)).alternative
    combines = [(k, s) for k, s in zip(alt.plan.kernels, alt.schedules)
                if any(isinstance(ph, Combine) for ph in k.phases) and "j" in k.grid]
    assert combines
    for k, s in combines:
        assert s.tiles["j"] > 1 and math.prod(s.tiles.get(a, 1) for a in k.grid) <= MAP_BLOCK, s
