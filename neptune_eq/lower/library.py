"""A kernel that is a plain matrix product run by the vendor's GEMM (cuBLAS through torch) instead of
generated Triton.

A kernel qualifies when nothing is fused into its product: one pass over a contraction axis k carrying
one unmasked, unrepaired sum of two operands of one dtype (16-bit or float32) read as they are stored
(inputs or the plan's buffers, every index a plain axis), and an epilogue that stores that sum (or a
constant times it: addmm's alpha), and only it, over the grid. Such a kernel is what a plan leaves after
writing a computed operand once (a norm's rows before the matmul, extract/materialise.py) and what a
backward's weight and input gradients often are. The vendor's GEMM runs it faster than a generated one
can (H100, 2026-11-24: torch.mm 700 µs against 790-850 for Triton 3.6's best tiles at 4096 × 8192 × 8192
bf16, bench/results/h100_2026-11-24/issue11/probe_gemm_materialised.json): clustered tiles,
warp-specialised pipelines. It is a schedule kind the cost model ranks like the others (space.py,
extract/cost.py), never a rewrite of what is computed: the sum is accumulated in float32 and rounded
once to the stored dtype, as the generated kernel does (unless torch's cuBLAS settings allow
reduced-precision reductions: torch.backends.cuda.matmul's allow_bf16_reduced_precision_reduction and
allow_fp16_reduced_precision_reduction, on by default).
"""

from __future__ import annotations

import functools
import math
import string
from dataclasses import dataclass

import torch

from .. import ir
from ..contraction import opened
from ..plan import KernelPlan, Pass, Plan
from .values import KernelSource, TensorArg

# float32 runs at torch's matmul precision (torch.backends.cuda.matmul.fp32_precision: IEEE unless the
# user allows TF32, when eager's own product of the same tensors is TF32 too)
GEMM_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class LibraryGemm:
    """out[out_axes] = Σ_k a[a_axes] · b[b_axes]: each tensor's dimensions named by the axes they index."""

    a: str
    a_axes: tuple[str, ...]
    b: str
    b_axes: tuple[str, ...]
    out: str
    out_axes: tuple[str, ...]
    k: str
    dtype: str  # of both operands, and of the stored sum unless out_dtype says otherwise
    alpha: float = 1.0  # the stored value is alpha · the sum (a constant of the epilogue: a loss's 1/n, a scale)
    out_dtype: str | None = None  # float32 for a sum of 16-bit operands kept unrounded (None: `dtype`)

    @property
    def stored(self) -> str:
        return self.out_dtype or self.dtype

    def describe(self) -> str:
        def ref(t, axes):
            return f"{t}[{', '.join(axes)}]"
        scale = "" if self.alpha == 1.0 else f"{self.alpha:g} · "
        return (f"{ref(self.out, self.out_axes)} = {scale}Σ_{self.k} {ref(self.a, self.a_axes)} · "
                f"{ref(self.b, self.b_axes)}")

    @functools.cached_property
    def einsum(self) -> str:
        letters = dict(zip(sorted({*self.a_axes, *self.b_axes}), string.ascii_letters))
        return "{},{}->{}".format(*("".join(letters[x] for x in axes) for axes in (self.a_axes, self.b_axes,
                                                                                     self.out_axes)))

    @functools.cached_property
    def mm(self) -> tuple[bool, list[int], list[int]] | None:
        """(b first, the permutation of the first operand, of the second) that view the product as
        out = x @ y with batch dimensions first, where the axes line up as one row axis, one column axis
        and batch axes in the output's order, a's or b's rows first (a weight's gradient Σ_i dy[i, e]·x[i, d]
        into [d, e] is x viewed [d, i] times dy); else None (einsum, then a copy). Worked out once."""
        batch = tuple(x for x in self.out_axes if x in self.a_axes and x in self.b_axes)
        for swapped, p_axes, q_axes in ((False, self.a_axes, self.b_axes), (True, self.b_axes, self.a_axes)):
            rows = [x for x in p_axes if x not in q_axes]
            cols = [x for x in q_axes if x not in p_axes]
            if len(rows) == 1 and len(cols) == 1 and self.out_axes == (*batch, rows[0], cols[0]):
                return (swapped, [p_axes.index(x) for x in (*batch, rows[0], self.k)],
                        [q_axes.index(x) for x in (*batch, self.k, cols[0])])
        return None


def _plain_axes(n: ir.Node) -> tuple[str, ...] | None:
    """The axes a load indexes, one per dimension in order, where each index is a plain axis and no
    axis repeats (a gather, a shifted or a diagonal read is no GEMM operand)."""
    if not isinstance(n, ir.Load) or not all(isinstance(i, ir.Index) and isinstance(i.axis, str) for i in n.index):
        return None
    axes = tuple(i.axis for i in n.index)
    return axes if len(set(axes)) == len(axes) else None


def library_gemm(k: KernelPlan, plan: Plan, program: ir.Program) -> LibraryGemm | None:
    """The plain matrix product kernel `k` computes, or None where anything else is fused into it."""
    if k.chunks != 1 or len(k.phases) != 1 or not isinstance(k.phases[0], Pass) or len(k.epilogue) != 1:
        return None
    ps: Pass = k.phases[0]
    if ps.split != 1 or ps.stores or len(ps.comps) != 1:
        return None
    c = ps.comps[0]
    if (c.op != "sum" or c.mask is not None or c.corr is not None or c.affine or c.producers or c.integer):
        return None
    body = opened(c.core)
    if body.conditions or len(body.factors) != 2:
        return None
    (a, a_axes), (b, b_axes) = ((f, _plain_axes(f)) for f in body.factors)
    if a_axes is None or b_axes is None or ps.axis not in a_axes or ps.axis not in b_axes:
        return None
    dtypes = {plan.loaded_dtype(program, t.tensor) for t in (a, b)}
    if len(dtypes) != 1 or not dtypes <= set(GEMM_DTYPES):
        return None
    st = k.epilogue[0]
    out_axes = tuple(st.axes)
    alpha = _scale_of(st.expr, c.ref(ir.RefKind.FINAL))
    if alpha is None or not all(isinstance(x, str) for x in out_axes):
        return None
    # (an fp32 store keeps the unrounded sum, a float32 buffer of 16-bit logits: cuBLAS's float32 output,
    # aten's mm / bmm / addmm with out_dtype; the dtype rule is lower/memory.py's store's)
    stored = plan.buffers[st.target].dtype if st.target in plan.buffers else st.dtype
    wide = stored == "float32" and not dtypes <= {"float32"}
    if stored not in dtypes and not wide:
        return None
    grid = set(out_axes)
    if grid != {*a_axes, *b_axes} - {ps.axis} or set(k.grid) != grid or set(c.free) != grid:
        return None
    g = LibraryGemm(a.tensor, a_axes, b.tensor, b_axes, st.target, out_axes, ps.axis, dtypes.pop(), alpha,
                    "float32" if wide else None)
    if (alpha != 1.0 or wide) and (g.mm is None or len(out_axes) > 3):
        return None  # (a scaled or float32 product runs as one addmm / baddbmm: one rounding, as generated)
    return g


def _scale_of(expr: ir.Node, final: ir.Node) -> float | None:
    """alpha where `expr` is alpha · final (final itself: 1), for a finite, nonzero constant alpha;
    else None."""
    if expr == final:
        return 1.0
    if isinstance(expr, ir.Call) and expr.op == "mul" and len(expr.args) == 2 and final in expr.args:
        c = expr.args[1] if expr.args[0] == final else expr.args[0]
        if isinstance(c, ir.Const) and isinstance(c.value, float | int) and not isinstance(c.value, bool) \
                and math.isfinite(c.value) and c.value != 0:
            return float(c.value)
    return None


def run_gemm(g: LibraryGemm, tensors: dict[str, torch.Tensor]) -> None:
    """Compute `g` into tensors[g.out] (each tensor laid out as its axes say; any strides)."""
    a, b, out = tensors[g.a], tensors[g.b], tensors[g.out]
    # (empty axes: torch returns zeros of the right shape; the generated kernel stores the monoid's identity)
    mm = _as_mm(g, a, b, out)
    if mm is not None and g.out_dtype is not None:
        _wide(*mm, g.alpha)
        return
    if mm is not None and g.alpha != 1.0:  # o = alpha · x @ y, scaled in the GEMM's float32 epilogue
        x, y, o = mm
        # (beta = 0: o's prior contents are ignored, NaN included)
        (o.addmm_ if x.dim() == 2 else o.baddbmm_)(x, y, beta=0, alpha=g.alpha)
        return
    if mm is not None:
        x, y, o = mm
        if o.is_contiguous() and o.dtype == x.dtype:
            torch.matmul(x, y, out=o)
        else:
            o.copy_(torch.matmul(x, y))
        return
    out.copy_(torch.einsum(g.einsum, a, b))


def _wide(x: torch.Tensor, y: torch.Tensor, o: torch.Tensor, alpha: float) -> None:
    """o (float32) = alpha · x @ y of 16-bit x, y accumulated in float32 and rounded once: cuBLAS's float32
    output on CUDA. On the CPU (no such kernel) the operands are widened first: a product of two 16-bit
    values is exact in float32, so only the order of the float32 additions differs."""
    if not x.is_cuda:
        o.copy_(torch.matmul(x.float(), y.float()) * alpha if alpha != 1.0 else torch.matmul(x.float(), y.float()))
        return
    op = torch.ops.aten.addmm if x.dim() == 2 else torch.ops.aten.baddbmm
    if o.is_contiguous():
        op.dtype_out(o, x, y, torch.float32, beta=0, alpha=alpha, out=o)
    else:
        o.copy_(op.dtype(o, x, y, torch.float32, beta=0, alpha=alpha))


def _as_mm(g: LibraryGemm, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor):
    """(x, y, o), views with o = x @ y (LibraryGemm.mm), or None."""
    if g.mm is None:
        return None
    swapped, px, py = g.mm
    x, y = (b, a) if swapped else (a, b)
    return x.permute(px), y.permute(py), out


def library_kernel(plan: Plan, k: KernelPlan, program: ir.Program, sched, fn_name: str) -> KernelSource:
    """Kernel `k` as a library GEMM: its source a comment saying what runs (no Triton function)."""
    g = library_gemm(k, plan, program)
    if g is None:
        raise ir.NeptuneError(f"kernel {k.name}: its schedule runs it as a library GEMM, but it is no plain "
                              "matrix product (internal: space.py offers that kind only where library_gemm holds)")
    outputs = {o.name for o in program.outputs}
    tensors = [TensorArg(t, axes, dt, "output" if t in outputs else "buffer" if t in plan.buffers else "input")
               for t, axes, dt in ((g.a, g.a_axes, g.dtype), (g.b, g.b_axes, g.dtype), (g.out, g.out_axes, g.stored))]
    src = f"# {fn_name}: library GEMM (torch.matmul: cuBLAS on CUDA), {g.describe()}\n"
    return KernelSource(fn_name, src, tensors, [], [], 1, {}, sched,
                        buffers_read=frozenset(t for t in (g.a, g.b) if t in plan.buffers),
                        buffers_written=frozenset({g.out} & plan.buffers.keys()), library=g)

