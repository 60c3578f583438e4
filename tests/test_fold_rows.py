"""A row kernel folded into the pass over the same rows (extract/fold_rows.py): a norm's backward —
dx from a row sum over d, dw a column sum over the rows — as one kernel that holds each row whole
and adds it into per-chunk partial column sums. Runs in the interpreter on sizes that are not tile
multiples; the cost model's choice at an H100 size (compile only)."""

import torch

from neptune_eq import dsl as ne
from neptune_eq.pipeline import Options, compile_program
from neptune_eq.runtime import compile_ir


def _norm_backward(m: int, n: int, out_dtype: str = "float32"):
    """RMSNorm's backward given the saved row statistic rs = Σ_d x² (Gemma's weight as 1 + w)."""
    P = ne.program("norm_backward")
    i, d = P.axes(i=m, d=n)
    x, w, g, rs = P.input("x", i, d), P.input("w", d), P.input("g", i, d), P.input("rs", i)
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
    return [a.id for a in prog.alternatives if any(line.startswith("fold_rows") for line in a.plan.derivation)]


def test_folded_norm_backward_matches_float64_unsplit_split_and_rechunked():
    m, n = 300, 45  # 300 rows: split-K 2..16 with 16-row chunks, and 32 chunks from the fold
    prog = compile_ir(_norm_backward(m, n), Options(min_chunk=16))
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
    c = compile_program(_norm_backward(16384, 2304, "bfloat16"))
    best = c.alternatives[0]
    assert any(line.startswith("fold_rows") for line in best.plan.derivation), best.structure
    assert best.plan.kernels[0].chunks >= 64 and "whole rows" in best.kind, best.structure
    unfolded = next(a for a in c.alternatives if not any(ln.startswith("fold_rows") for ln in a.plan.derivation))
    assert best.cost.hbm_bytes < 0.7 * unfolded.cost.hbm_bytes


def test_a_row_too_wide_to_hold_is_not_folded():
    c = compile_program(_norm_backward(4096, 16384))
    assert not any(any(ln.startswith("fold_rows") for ln in a.plan.derivation) for a in c.alternatives)
