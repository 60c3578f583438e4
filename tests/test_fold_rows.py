"""A row kernel folded into the pass over the same rows (extract/fold_rows.py): a norm's backward —
dx from a row sum over d, dw a column sum over the rows — as one kernel that holds each row whole
and adds it into per-chunk partial column sums. Runs in the interpreter on sizes that are not tile
multiples; the cost model's choice at an H100 size (compile only)."""

import math

import torch

from neptune_eq import dsl as ne
from neptune_eq import ir
from neptune_eq.ir import Const, Index, Load, Reduce
from neptune_eq.pipeline import Options, compile_program
from neptune_eq.plan import Combine
from neptune_eq.runtime import compile_ir

FOLD = Options(fold_rows=True)


def _norm_backward(m: int, n: int, out_dtype: str = "float32", saved: bool = True):
    """RMSNorm's backward given the saved row statistic rs = Σ_d x² (Gemma's weight as 1 + w), or
    recomputing it (`saved=False`: the row kernel comes first, its Σ_d x² read by the column sum)."""
    P = ne.program("norm_backward")
    i, d = P.axes(i=m, d=n)
    x, w, g = P.input("x", i, d), P.input("w", d), P.input("g", i, d)
    rs = P.input("rs", i) if saved else ne.sum(x * x, d)
    r = ne.rsqrt(rs * (1.0 / n) + 1e-6)
    s = ne.sum(g * (w + 1.0) * x, d)
    P.output("dx", g * (w + 1.0) * r - s * r * r * r * (1.0 / n) * x, (i, d), dtype=out_dtype)
    P.output("dw", ne.sum(g * x * r, i), (d,))
    return P.build()


def _reference(xs: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    x, w, g = (xs[k].double() for k in ("x", "w", "g"))
    r = torch.rsqrt((x * x).sum(-1, keepdim=True) / n + 1e-6)
    s = (g * (w + 1) * x).sum(-1, keepdim=True)
    return {"dx": g * (w + 1) * r - s * r ** 3 / n * x, "dw": (g * x * r).sum(0)}


def _folded(prog) -> list[int]:
    return [a.id for a in prog.alternatives if a.plan.folded]


def test_folded_norm_backward_matches_float64_unsplit_split_and_rechunked():
    m, n = 300, 45  # 300 rows: split-K 2..16 with 16-row chunks, and 32 chunks from the fold
    prog = compile_ir(_norm_backward(m, n), Options(min_chunk=16, fold_rows=True))
    folded = _folded(prog)
    chunks = {a.id: a.plan.kernels[0].chunks for a in prog.alternatives if a.id in folded}
    assert {1, 32} <= set(chunks.values()), chunks
    g = torch.Generator().manual_seed(0)
    xs = {"x": torch.randn(m, n, generator=g), "w": torch.randn(n, generator=g) * 0.1,
          "g": torch.randn(m, n, generator=g)}
    xs["rs"] = (xs["x"].double() ** 2).sum(-1).float()
    want = _reference(xs, n)
    # one alternative per chunk count and schedule kind of the folded kernel (whole rows, streamed)
    picked = {(c, prog.alternatives[i].kind.split(" ")[0]): i for i, c in chunks.items()}
    assert {kind for _, kind in picked} >= {"whole", "streamed"}, picked
    for i in picked.values():
        alt = prog.alternatives[i]
        assert len(alt.plan.kernels) == (1 if alt.plan.kernels[0].chunks == 1 else 2), alt.structure
        got = prog.pin(i).run(xs)
        for k in ("dx", "dw"):
            err = float((got[k].double() - want[k]).norm() / want[k].norm())
            assert err < 1e-5, (alt.structure, k, err)


def test_the_cost_model_folds_a_wide_norm_backward_at_h100_size():
    """16384 rows of 2304: two kernels reading dy and x twice (the column sums, then the rows) against
    one reading them once in a chunk of rows a program; the fold is chosen, in more chunks than the
    split-K rule's 512-row ones."""
    c = compile_program(_norm_backward(16384, 2304, "bfloat16"), FOLD)
    best = c.alternatives[0]
    assert best.plan.folded and any(line.startswith("fold_rows") for line in best.plan.derivation), best.structure
    assert best.plan.kernels[0].chunks >= 64 and "whole rows" in best.kind, best.structure
    unfolded = next(a for a in c.alternatives if not a.plan.folded)
    assert best.cost.hbm_bytes < 0.7 * unfolded.cost.hbm_bytes
    # Options(fold_rows=False): no folded plan, no whole-rows schedule
    plain = compile_program(_norm_backward(16384, 2304, "bfloat16"), Options(fold_rows=False))
    assert not any(a.plan.folded or "whole rows" in a.kind for a in plain.alternatives)


def test_a_row_too_wide_to_hold_is_not_folded():
    c = compile_program(_norm_backward(4096, 16384), FOLD)
    assert not any(a.plan.folded for a in c.alternatives)


def _bias_act_backward(m: int, n: int):
    """The backward of tanh(x + b): a map (dx) and a column sum (db) of the same g = dy·(1 − tanh²)."""
    P = ne.program("bias_act_backward")
    i, d = P.axes(i=m, d=n)
    x, b, dy = P.input("x", i, d), P.input("b", d), P.input("dy", i, d)
    t = ne.tanh(x + b)
    P.output("dx", dy * (1.0 - t * t), (i, d))
    P.output("db", ne.sum(dy * (1.0 - t * t), i), (d,))
    return P.build()


def test_a_map_kernel_folds_into_the_column_sum_and_matches_float64():
    m, n = 300, 70
    prog = compile_ir(_bias_act_backward(m, n), Options(min_chunk=16, fold_rows=True))
    folded = _folded(prog)
    assert folded
    g = torch.Generator().manual_seed(1)
    xs = {"x": torch.randn(m, n, generator=g), "b": torch.randn(n, generator=g), "dy": torch.randn(m, n, generator=g)}
    gx = xs["dy"].double() * (1 - torch.tanh(xs["x"].double() + xs["b"].double()) ** 2)
    want = {"dx": gx, "db": gx.sum(0)}
    picked = {(prog.alternatives[i].plan.kernels[0].chunks, prog.alternatives[i].kind.split(" ")[0]): i
              for i in folded}
    # (unsplit, the map is a second pass of the column kernel: nothing to fold)
    runs = [picked[c, "columns"] for c in (2, 32) if (c, "columns") in picked]
    assert len(runs) == 2, picked
    for i in runs:
        got = prog.pin(i).run(xs)
        for k in ("dx", "db"):
            err = float((got[k].double() - want[k]).norm() / want[k].norm())
            assert err < 1e-5, (prog.alternatives[i].structure, k, err)
    c = compile_program(_bias_act_backward(16384, 4096), FOLD)
    assert c.alternatives[0].plan.folded, c.alternatives[0].structure


def test_a_row_kernel_before_the_column_sum_folds_with_its_statistic_inline():
    """Recomputed, Σ_d x² is a row kernel's result that the column sum reads from a buffer: folded, the
    column pass computes it per tile too, and the buffer is gone (the norm → matmul backward's map part:
    139 → 93 µs predicted at 4096 × 8192)."""
    m, n = 300, 45
    prog = compile_ir(_norm_backward(m, n, saved=False), Options(min_chunk=16, fold_rows=True))
    whole = [a for a in prog.alternatives if a.id in _folded(prog) and a.plan.kernels[0].chunks > 1
             and not any(p.axis == "d" for k in a.plan.kernels for p in k.passes())]
    assert whole
    assert not any(name.startswith("buf_") for name in whole[0].plan.buffers), whole[0].plan.show()
    g = torch.Generator().manual_seed(2)
    xs = {"x": torch.randn(m, n, generator=g), "w": torch.randn(n, generator=g) * 0.1,
          "g": torch.randn(m, n, generator=g)}
    want = _reference(xs, n)
    for alt in whole[:1]:
        got = prog.pin(alt.id).run(xs)
        for k in ("dx", "dw"):
            err = float((got[k].double() - want[k]).norm() / want[k].norm())
            assert err < 1e-5, (alt.structure, k, err)


def test_row_values_that_read_each_other_fold_and_match_float64():
    """LayerNorm's backward recomputing its statistics: the centred sum of squares reads the row's mean,
    and dx's row sums read both (each an inline value of the fold reading the others')."""
    m, n = 300, 45
    P = ne.program("layer_norm_backward")
    i, d = P.axes(i=m, d=n)
    x, w, g = P.input("x", i, d), P.input("w", d), P.input("g", i, d)
    mu = ne.sum(x, d) * (1.0 / n)
    rstd = ne.rsqrt(ne.sum((x - mu) * (x - mu), d) * (1.0 / n) + 1e-5)
    xh = (x - mu) * rstd
    s1, s2 = ne.sum(g * w, d) * (1.0 / n), ne.sum(g * w * xh, d) * (1.0 / n)
    P.output("dx", rstd * (g * w - s1 - xh * s2), (i, d))
    P.output("dw", ne.sum(g * xh, i), (d,))
    prog = compile_ir(P.build(), Options(min_chunk=16, fold_rows=True))
    whole = [a for a in prog.alternatives if a.id in _folded(prog) and a.plan.kernels[0].chunks > 1
             and not any(p.axis == "d" for k in a.plan.kernels for p in k.passes())]
    assert whole
    gen = torch.Generator().manual_seed(3)
    xs = {"x": torch.randn(m, n, generator=gen) + 3.0, "w": torch.randn(n, generator=gen),
          "g": torch.randn(m, n, generator=gen)}
    xd, wd = xs["x"].double().requires_grad_(), xs["w"].double().requires_grad_()
    torch.nn.functional.layer_norm(xd, (n,), wd, eps=1e-5).backward(xs["g"].double())
    got = prog.pin(whole[0].id).run(xs)
    for k, want in (("dx", xd.grad), ("dw", wd.grad)):
        err = float((got[k].double() - want).norm() / want.norm())
        assert err < 1e-5, (whole[0].structure, k, err)


def test_broadcasts_of_values_from_before_a_loop_are_bound_before_it():
    """Triton 3.6 (H100) merged `t12[:, None]` of two sibling loops inside one of them and refused the
    folded kernel; bound once before each loop it compiles. A name the body assigns (a carried state),
    or one bound inside an earlier loop, keeps its broadcast where it is."""
    from neptune_eq.lower.values import hoist_broadcasts

    outer = ["    t12 = (x11 + 1.0)", "    st = tl.zeros([BLOCK_d], tl.float32)", "    for start_i in range(0, 8, 4):",
             "        y9 = tl.load(p)"]
    body = ["        a = x1 * t12[:, None] + t12[:, None]", "        b = st[:, None] * y9[None, :]",
            "        st = st + a"]
    fresh = iter(f"b{k}" for k in range(10))
    defs, out = hoist_broadcasts(outer, 1, body, lambda: next(fresh))
    assert defs == ["b0 = t12[:, None]"]
    assert out == ["        a = x1 * b0 + b0", "        b = st[:, None] * y9[None, :]", "        st = st + a"]


def test_a_column_sum_over_part_of_the_rows_is_not_folded():
    """A mask on the column sum may bound the rows its pass visits (i < 100 of 300): the map's stores,
    riding that pass, would miss the rows past it. No fold is offered."""
    m, n = 300, 45
    P = ne.program("masked_bias_backward")
    i, d = P.axes(i=m, d=n)
    x, b, dy = P.input("x", i, d), P.input("b", d), P.input("dy", i, d)
    g = dy * (1.0 - ne.tanh(x + b) * ne.tanh(x + b))
    P.output("dx", g, (i, d))
    P.output("db", ne.sum(ne.where(i.index < 100, g, 0.0), i), (d,))
    prog = compile_ir(P.build(), Options(min_chunk=16, fold_rows=True))
    assert not _folded(prog)



def _rms_map_backward(m: int, n: int) -> ir.Program:
    """The map backward of F.rms_norm feeding a matmul, as the capture writes it: Σ_d x² inside the
    weight gradient's Σ_i, over the row's own axis d (the dsl would rename that inner d apart)."""
    x, g, w = Load("x", (Index("i"), Index("d"))), Load("g", (Index("i"), Index("d"))), Load("w", (Index("d"),))
    r = _call("rsqrt", _call("add", _call("mul", Reduce("sum", "d", _call("mul", x, x)), Const(1.0 / n)),
                             Const(1e-6)))
    s = Reduce("sum", "d", _call("mul", g, _call("mul", w, x)))
    dx = _call("sub", _call("mul", _call("mul", g, r), w),
               _call("mul", _call("mul", _call("mul", s, _call("mul", r, _call("mul", r, r))), Const(1.0 / n)), x))
    dw = Reduce("sum", "i", _call("mul", _call("mul", g, r), x))
    specs = {t: ir.TensorSpec(t, ax, "bfloat16") for t, ax in (("x", ("i", "d")), ("g", ("i", "d")), ("w", ("d",)))}
    return ir.Program("rms_map_backward", {"i": m, "d": n}, specs,
                      [ir.Output("dx", ("i", "d"), dx, "bfloat16"), ir.Output("dw", ("d",), dw, "bfloat16")]).validate()


def _call(op: str, *args: ir.Node) -> ir.Node:
    return ir.Call(op, args)


def test_a_folded_rows_combine_tiles_the_row_across_programs():
    """The folded kernel holds d whole for its Σ_d; its combine folds the chunks' column sums and sums no
    d: it runs in column tiles (until session 69 it inherited the whole 4096-wide row, one program
    reading every chunk: priced 20 to 55 µs at 32 to 128 chunks where 64 programs take a few)."""
    c = compile_program(_rms_map_backward(4096, 4096), FOLD)
    combines = [(alt, k, s) for alt in c.alternatives if alt.plan.folded
                for k, s in zip(alt.plan.kernels, alt.schedules) if any(isinstance(ph, Combine) for ph in k.phases)]
    assert combines
    for alt, k, s in combines:
        programs = math.prod(-(-c.program.axes[a] // s.tiles.get(a, 1)) for a in k.grid)
        assert programs >= 32, (alt.structure, k.grid, s.tiles)


def test_the_rms_map_backward_and_its_tiled_combine_match_float64():
    m, n = 300, 150  # the combine in column tiles of 64: three programs, the last one partial
    prog = compile_ir(_rms_map_backward(m, n), Options(min_chunk=16, fold_rows=True))
    g = torch.Generator().manual_seed(0)
    xs = {"x": torch.randn(m, n, generator=g).bfloat16(), "w": torch.randn(n, generator=g).bfloat16(),
          "g": torch.randn(m, n, generator=g).bfloat16()}
    x, w, gy = (xs[k].double() for k in ("x", "w", "g"))
    r = torch.rsqrt((x * x).sum(-1, keepdim=True) / n + 1e-6)
    s = (gy * w * x).sum(-1, keepdim=True)
    want = {"dx": gy * r * w - s * r ** 3 / n * x, "dw": (gy * r * x).sum(0)}
    split = [a.id for a in prog.alternatives if a.plan.folded and a.plan.kernels[0].chunks > 1]
    assert split and prog.alternatives[split[0]].schedules[1].tiles["d"] < n
    got = prog.pin(split[0]).run(xs)
    for k in ("dx", "dw"):
        err = float((got[k].double() - want[k]).norm() / want[k].norm())
        assert err < 1e-2, (prog.alternatives[split[0]].structure, k, err)
