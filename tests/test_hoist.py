"""Work that does not vary along a loop, done once: a loop's data conjunct applied after it
(extract/hoist.py, Σⱼ where(c ∧ m, x, 0) = where(c, Σⱼ where(m, x, 0), 0)), a loop-invariant term priced
once by the extractor (exp2 with its scale folded), a repeated conjunct tested once; and the interpreter's
select for a per-program flag combined with a tile mask. Plans run in the interpreter on ragged sizes
against float64, with NaN in the rows a condition drops (they still give the identity)."""

import math

import torch

from neptune_eq import dsl as ne
from neptune_eq import ir
from neptune_eq.masks import conjuncts
from neptune_eq.runtime import compile_ir


def _row_guarded(m=37, n=45, op="sum"):
    """o[i] = ⊕ⱼ where(keep[i] != 0 & j <= i, x[i, j], e): a row test and a causal mask."""
    P = ne.program(f"row_guarded_{op}")
    i, j = P.axes(i=m, j=n)
    x, keep = P.input("x", i, j), P.input("keep", i)
    red, ident = (ne.sum, 0.0) if op == "sum" else (ne.max, -math.inf)
    P.output("o", red(ne.where((keep != 0.0) & (j.index <= i.index), x, ident), j), (i,))
    return P.build()


def _inputs(program, seed=0):
    gen = torch.Generator().manual_seed(seed)
    m, n = program.axes["i"], program.axes["j"]
    x = torch.randn(m, n, generator=gen)
    keep = (torch.rand(m, generator=gen) > 0.3).float()
    x[keep == 0] = float("nan")  # what a dropped row computes must not reach its result
    return {"x": x, "keep": keep}


def _reference(x, op):
    v, keep = x["x"].double(), x["keep"].double()
    m, n = v.shape
    causal = torch.arange(n)[None, :] <= torch.arange(m)[:, None]
    ok = causal & (keep[:, None] != 0)
    if op == "sum":
        return torch.where(ok, v, 0.0).sum(1)
    return torch.where(ok, v, -math.inf).amax(1)


def _loop_masks(prog):
    return [c.mask for k in prog.plan.kernels for p in k.passes() for c in p.comps]


def test_row_condition_leaves_the_loop_and_the_result_is_exact():
    for op in ("sum", "max"):
        prog = compile_ir(_row_guarded(op=op))
        assert any(line.startswith("hoist_condition") for line in prog.plan.derivation), prog.explain()
        for mask in _loop_masks(prog):  # the causal conjunct stays (it bounds the tiles), the row test left
            assert mask is not None and all(not any(isinstance(n, ir.Load) for n in ir.walk(cj))
                                            for cj in conjuncts(mask)), ir.show(mask)
        store = " ".join(ir.show(st.expr) for k in prog.plan.kernels for st in k.epilogue)
        assert "keep" in store, store
        x = _inputs(prog.program)
        got = prog.run(x)["o"].double()
        ref = _reference(x, op)
        assert torch.equal(torch.isinf(got), torch.isinf(ref)) and not torch.isnan(got).any(), (got, ref)
        fin = torch.isfinite(ref)
        assert torch.allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-5)


def test_condition_read_by_a_later_loop_stays_inside():
    """s[i] = Σⱼ where(keep[i] != 0 & j <= i, x, 0) read inside a second loop over j, o[i] = Σⱼ max(x, s): moving
    the select after the first loop would put it inside the second one's elements; it stays in the loop."""
    P = ne.program("row_guarded_twice")
    i, j = P.axes(i=33, j=40)
    x, keep = P.input("x", i, j), P.input("keep", i)
    s = ne.sum(ne.where((keep != 0.0) & (j.index <= i.index), x, 0.0), j)
    P.output("o", ne.sum(ne.maximum(x, s), j), (i,))
    prog = compile_ir(P.build())
    firsts = [c for k in prog.plan.kernels for p in k.passes() for c in p.comps if c.name == "sum_j"]
    readers = [k for k in prog.plan.kernels for p in k.passes() for c in p.comps
               if any(isinstance(n, ir.StateRef) and n.name == "sum_j" for n in ir.walk(c.core))]
    assert readers and firsts, prog.plan.show()
    assert all(c.mask is not None and "keep" in ir.show(c.mask) for c in firsts), prog.plan.show()
    x_in = _inputs(prog.program)
    x_in["x"] = torch.nan_to_num(x_in["x"])
    v, keep = x_in["x"].double(), x_in["keep"].double()
    causal = torch.arange(v.shape[1])[None, :] <= torch.arange(v.shape[0])[:, None]
    ref = torch.maximum(v, torch.where((keep[:, None] != 0) & causal, v, 0.0).sum(1, keepdim=True)).sum(1)
    assert torch.allclose(prog.run(x_in)["o"].double(), ref, rtol=1e-4, atol=1e-4)


def test_loop_invariant_term_is_priced_once_per_row():
    """Σⱼ exp(−x²·c − r[i]²) over a loop-long j (an exponent known ≤ 0: no max shift): written
    exp2(−x²·(c·log₂e) − r²·log₂e) it saves exp's multiply per element at the price of one per row —
    outside the loop, where the extractor now prices r²·log₂e (it priced it per element, a tie, and
    kept exp)."""
    P = ne.program("shifted_exp_sum")
    i, j = P.axes(i=5, j=300)
    x, r = P.input("x", i, j), P.input("r", i)
    P.output("o", ne.sum(ne.exp(-(x * x) * 0.5 - r * r), j), (i,))
    prog = compile_ir(P.build())
    cores = [ir.show(c.core) for k in prog.plan.kernels for p in k.passes() for c in p.comps]
    assert cores and all("exp2(" in c and "exp(" not in c for c in cores), cores
    gen = torch.Generator().manual_seed(0)
    xs = {"x": torch.randn(5, 300, generator=gen), "r": torch.randn(5, generator=gen)}
    ref = torch.exp(-xs["x"].double() ** 2 * 0.5 - xs["r"].double()[:, None] ** 2).sum(1)
    assert torch.allclose(prog.run(xs)["o"].double(), ref, rtol=1e-5)


def test_row_flag_or_tile_mask_in_the_interpreter():
    """A data flag of one value per program (one row per program) combined with a tile mask by ∨: Triton's
    interpreter cannot `|` them (it cannot `&` them either: the hoist tests above), so the lowering
    selects there. o[i] = Σⱼ where(all[i] != 0 | j <= i, x, 0)."""
    P = ne.program("row_or_causal")
    i, j = P.axes(i=19, j=23)
    x, flag = P.input("x", i, j), P.input("all", i)
    P.output("o", ne.sum(ne.where((flag != 0.0) | (j.index <= i.index), x, 0.0), j), (i,))
    prog = compile_ir(P.build())
    gen = torch.Generator().manual_seed(0)
    xs = {"x": torch.randn(19, 23, generator=gen), "all": (torch.rand(19, generator=gen) > 0.5).float()}
    causal = torch.arange(23)[None, :] <= torch.arange(19)[:, None]
    ref = torch.where((xs["all"][:, None] != 0) | causal, xs["x"].double(), 0.0).sum(1)
    assert torch.allclose(prog.run(xs)["o"].double(), ref, rtol=1e-5, atol=1e-6)


def test_repeated_conjunct_is_tested_once():
    """where(j ≤ i ∧ x > 0 ∧ j ≤ i, …): a mask a derivation repeats (the forward's mask and the backward's
    where) is one conjunct in the loop; the result is unchanged."""
    P = ne.program("repeated_mask")
    i, j = P.axes(i=21, j=29)
    x = P.input("x", i, j)
    causal = j.index <= i.index
    P.output("o", ne.sum(ne.where(causal & (x > 0.0) & causal, x, 0.0), j), (i,))
    prog = compile_ir(P.build())
    for mask in _loop_masks(prog):
        cjs = conjuncts(mask)
        assert len(cjs) == len(set(cjs)), ir.show(mask)
    gen = torch.Generator().manual_seed(0)
    xs = {"x": torch.randn(21, 29, generator=gen)}
    v = xs["x"].double()
    ok = (torch.arange(29)[None, :] <= torch.arange(21)[:, None]) & (v > 0)
    assert torch.allclose(prog.run(xs)["o"].double(), torch.where(ok, v, 0.0).sum(1), rtol=1e-5, atol=1e-6)
