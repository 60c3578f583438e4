"""Kernel plans: what each generated kernel computes, independent of tile sizes.

A Plan is a list of kernels run in order plus the intermediate buffers they exchange through HBM.
A kernel runs one program per tile of its grid axes and, inside, a sequence of phases:

    Pass     a loop over one axis carrying reduction states (the fused components), optionally
             storing per-element outputs along the way (a map pass stores and carries nothing)
    Combine  (split-K) folds the per-chunk states written by a partial kernel, using the same
             corrections as the rolling update

followed by an epilogue that stores outputs and buffers over the grid axes. Expressions are IR
nodes over loads, indices and references to reductions (ir.StateRef, printed kind:name): fin:x
(final value of x), val:x (an inline value, e.g. a contraction over a small axis computed per
tile), cur:x / old:x (running values).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import ir
from .numeric import INT_IDENTITY
from .ops import MONOIDS, OPS


@dataclass
class CompPlan:
    """A carried reduction: name = op_axis(where(mask, core, identity)), repaired by `corr`."""

    name: str
    op: str
    free: tuple[str, ...]
    mask: ir.Node | None
    core: ir.Node
    producers: tuple[str, ...] = ()
    corr: ir.Node | None = None  # over the producers' old and current values
    dist: str | None = None  # the op applying corr: "mul" (sum) or "add" (max/min)
    guard: bool = False  # corr is replaced by the annihilator while a max/min producer is still its identity
    annihilator: float = 0.0
    integer: bool = False  # an integer reduction: exact, accumulated in int64 (neptune_eq.numeric)
    # an affine repair (fusion/affine.py): t ← Σ (coefficient · old state of the named component), the
    # named components being sums of the same pass (a count among them); replaces corr/dist
    affine: tuple[tuple[str, ir.Node], ...] = ()

    @property
    def identity(self) -> float | int:
        return INT_IDENTITY[self.op] if self.integer else MONOIDS[self.op].identity

    def ref(self, kind: ir.RefKind) -> ir.StateRef:
        """This reduction's final or running value, as expressions refer to it."""
        return ir.StateRef(kind, self.name, self.free)


@dataclass
class StorePlan:
    target: str  # output or buffer name
    axes: tuple[ir.Axis, ...]
    expr: ir.Node
    dtype: str = "float32"


@dataclass
class Pass:
    axis: str
    comps: list[CompPlan] = field(default_factory=list)
    stores: list[StorePlan] = field(default_factory=list)  # per-tile stores (map over the axis)
    split: int = 1  # >1: this kernel runs chunk `pid_chunk` of `split`
    rules: tuple[str, ...] = ()  # fusion rules that produced this pass

    @property
    def kind(self) -> str:
        if not self.comps:
            return "map"
        return "rolling" if any(c.producers for c in self.comps) else "pass"


@dataclass
class Combine:
    """Fold `chunks` partial states of `source` (read from buffers part:<name>)."""

    source: Pass
    chunks: int


Phase = Pass | Combine


@dataclass
class KernelPlan:
    name: str
    grid: tuple[str, ...]
    phases: list[Phase] = field(default_factory=list)
    epilogue: list[StorePlan] = field(default_factory=list)
    chunks: int = 1  # partial kernels of split-K have an extra grid dimension of this size

    def passes(self) -> list[Pass]:
        return [p for p in self.phases if isinstance(p, Pass)]

    def exprs(self):
        """Every expression the kernel computes or stores: its components' cores, masks and repairs (a
        Combine's through its source pass), its passes' stores and its epilogue."""
        for ph in self.phases:
            src = ph.source if isinstance(ph, Combine) else ph
            for c in src.comps:
                yield from (e for e in (c.core, c.mask, c.corr) if e is not None)
            if isinstance(ph, Pass):
                yield from (st.expr for st in ph.stores)
        yield from (st.expr for st in self.epilogue)

    def substitute(self, mapping: dict[ir.Node, ir.Node]) -> None:
        """Replace, in place, every occurrence of the keys (by value) with their values in what the
        kernel's passes compute (their components' cores, masks and repairs) and store, and in its
        epilogue (a Combine folds its source pass's states as they are)."""
        def sub(e):
            return ir.substitute(e, mapping) if e is not None else None

        for ps in self.passes():
            for c in ps.comps:
                c.core, c.mask, c.corr = sub(c.core), sub(c.mask), sub(c.corr)
            for st in ps.stores:
                st.expr = sub(st.expr)
        for st in self.epilogue:
            st.expr = sub(st.expr)


# A plan buffer's rows (its last axis) are allocated padded to a multiple of the largest tile of at
# most ROW_PAD elements any of the plan's kernels takes along that axis (lower/buffers.Buffers.row_tile):
# such a tile lies inside the allocation, so where its lanes are independent (a grid axis) it is read
# and written unmasked, and stays contiguous (a tail clamped or masked at a runtime length is not: a
# GEMM operand read so ran 10× slower). A row that is a tile multiple is not padded.
ROW_PAD = 256


@dataclass(frozen=True)
class BufferSpec:
    """An intermediate the plan writes and reads (rows padded to ROW_PAD elements)."""

    name: str
    axes: tuple[ir.Axis, ...]  # split-K partial states start with ir.CHUNK (the chunk they are of)
    dtype: str = "float32"
    operand: bool = False  # a computed GEMM operand written once (extract/materialise.py), not a reduction


@dataclass
class Plan:
    kernels: list[KernelPlan]
    buffers: dict[str, BufferSpec]
    inline: dict[str, ir.Node]  # x → the term its inline value (val:x) is computed from per element
    groups: list[tuple[str, tuple[str, ...], int]]  # (axis, components, split) per loop group
    fused_kernels: bool
    derivation: list[str] = field(default_factory=list)
    cost: object | None = None  # extract.cost.Cost
    folded: bool = False  # a row kernel rides another kernel's pass over its rows (extract/fold_rows.py)

    def loaded_dtype(self, program: ir.Program, tensor: str) -> str:
        """The storage dtype of a tensor a kernel loads: a program input or a plan buffer."""
        spec = program.inputs.get(tensor)
        return spec.dtype if spec is not None else self.buffers[tensor].dtype

    def show(self) -> str:
        """The plan as loop IR: kernels, grids, passes with their carried state, stores."""
        out = []
        for name, term in sorted(self.inline.items()):
            out.append(f"inline {name} = {ir.show(term)}")
        for name, buf in self.buffers.items():
            out.append(f"buffer {name}[{', '.join(map(str, buf.axes))}]: {buf.dtype}")
        for k in self.kernels:
            chunk = f" × {k.chunks} chunks" if k.chunks > 1 else ""
            out.append(f"kernel {k.name} over ({', '.join(k.grid)}){chunk}:")
            for ph in k.phases:
                if isinstance(ph, Combine):
                    out.append(f"  combine {ph.chunks} chunk states of ({', '.join(c.name for c in ph.source.comps)})")
                    continue
                split = f", chunk pid_chunk of {ph.split}" if ph.split > 1 else ""
                out.append(f"  {ph.kind} pass over {ph.axis}{split}:")
                for c in ph.comps:
                    body = ir.show(c.core)
                    if c.mask is not None:
                        body = f"where({ir.show(c.mask)}, {body}, {c.identity:g})"
                    line = f"    {c.name} = {c.op}_{ph.axis} {body}"
                    if c.corr is not None:
                        line += f"   [repair: {c.name} {OPS[c.dist].infix} {ir.show(c.corr)}]"
                    if c.affine:
                        line += "   [repair: " + " + ".join(f"{ir.show(h)}·{k}" for k, h in c.affine) + "]"
                    out.append(line)
                for st in ph.stores:
                    out.append(f"    store {st.target}[{', '.join(map(str, st.axes))}] = {ir.show(st.expr)}")
            for st in k.epilogue:
                out.append(f"  store {st.target}[{', '.join(map(str, st.axes))}] = {ir.show(st.expr)}")
        return "\n".join(out)

    def structure(self) -> str:
        """One line: e.g. '1 kernel, rolling over j (max_j, sum_j, sum_j2)'."""
        out = []
        for k in self.kernels:
            for ph in k.phases:
                if isinstance(ph, Pass):
                    written = [st.target for st in ph.stores if getattr(self.buffers.get(st.target), "operand", False)]
                    names = ", ".join(c.name for c in ph.comps) or ", ".join(f"operand {t}" for t in written) or "map"
                    desc = f"{ph.kind} over {ph.axis} ({names})"
                    if ph.split > 1:
                        desc += f" split-K {ph.split}"
                    out.append(desc)
            if not k.passes():  # (a kernel of its own writing a GEMM operand: a map of every element)
                written = [st.target for st in k.epilogue if getattr(self.buffers.get(st.target), "operand", False)]
                if written:
                    out.append("map (" + ", ".join(f"operand {t}" for t in written) + ")")
        n = len(self.kernels)
        return f"{n} kernel{'s' if n != 1 else ''}, " + "; ".join(out)
