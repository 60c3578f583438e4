"""A matrix product with work fused into its epilogue, split so the product alone runs as the vendor's GEMM.

A kernel whose one pass is a plain product (lower/library.library_gemm's conditions) but whose epilogue
computes more than that sum — linear cross-entropy's input gradient

    dH[i, d] = Σⱼ p[i, j]·W[j, d] + c[i]·W[t[i], d]        (the one-hot term of the target, a gather)

— cannot run as cuBLAS: the library call stores the sum and nothing else. Here that is a plan rewrite
into two kernels over the same grid:

    gemm_dH[i, d] = Σⱼ p[i, j]·W[j, d]                       the product alone, float32, a library GEMM
    dH[i, d]      = gemm_dH[i, d] + c[i]·W[t[i], d]          a map kernel: the epilogue, reading it

A factor of the product that does not vary along its contraction (a mean's 1/n read from a buffer,
a row's scale) moves to the epilogue, Σⱼ a·b·s = s·Σⱼ a·b: the product keeps its two operands. A pass
carrying other sums beside the product over a smaller grid (a loss's Σᵢ beside the weight gradient's
Σᵢ pᵢⱼ·hᵢd, computed again in every [j, d] program) gives them a kernel of their own over their grid.
The sum is accumulated in float32 and stored unrounded, and the epilogue computes the same expression
from it (up to the reassociation's rounding). The float32 buffer costs a write and a read of the grid
(268 MB for 8192 × 4096, ~0.1 ms on an H100) against a GEMM of a 128256-long contraction generated
(16.0 ms priced) or run by cuBLAS (11.8); the cost model ranks the plans. Offered only where the
vendor's GEMM is (Options.library_gemm): a generated product and a map would only add the buffer.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from neptune_eq import ir
from neptune_eq.contraction import opened
from neptune_eq.lower.library import library_gemm
from neptune_eq.plan import BufferSpec, KernelPlan, Pass, Plan, StorePlan


def split_gemm_epilogues(plan: Plan, program: ir.Program) -> Plan | None:
    """`plan` with every kernel that is a plain product but for its epilogue (or for smaller sums sharing
    its pass) split as the module says; None where no kernel splits (nothing copied: every plan the
    space enumerates is offered to it)."""
    kernels: list[KernelPlan] = []
    buffers: dict[str, BufferSpec] = {}
    notes = []
    for k in plan.kernels:
        got = _split(k, plan, program)
        if got is None:
            kernels.append(k)
            continue
        kernels += got[0]
        buffers.update(got[1])
        notes.append(got[2])
    if not notes:
        return None
    return copy.deepcopy(replace(plan, kernels=kernels, buffers={**plan.buffers, **buffers},
                                 derivation=[*plan.derivation, *notes], cost=None))


def _split(k: KernelPlan, plan: Plan, program: ir.Program
           ) -> tuple[list[KernelPlan], dict[str, BufferSpec], str] | None:
    """The kernels `k` splits into — [the product's (a library GEMM's kernel), the other sums' pass
    (where `k` carried some), the epilogue's map (where there is more to store than the sum)] — the
    float32 buffer between the product and the map (where there is one), and the derivation's note.
    None where `k` is no such kernel, or a library GEMM already. `plan` is not modified."""
    if k.chunks != 1 or len(k.phases) != 1 or not isinstance(k.phases[0], Pass) or not k.epilogue:
        return None
    ps = k.phases[0]
    if ps.split != 1 or ps.stores or library_gemm(k, plan, program) is not None:
        return None
    grid = set(k.grid)
    if any(c.producers or c.corr is not None or c.affine for c in ps.comps):
        return None  # (a rolling pass: its sums repair each other)
    products = [(c, f) for c in ps.comps if set(c.free) == grid and (f := _factors(c, ps.axis)) is not None]
    if len(products) != 1:
        return None
    c, (varying, hoisted) = products[0]
    others = [o for o in ps.comps if o is not c]
    small = {frozenset(o.free) for o in others}
    if len(small) > 1 or any(not set(o.free) < grid for o in others):
        return None  # (the other sums over one smaller grid, a kernel of their own)
    final = c.ref(ir.RefKind.FINAL)
    mine = [st for st in k.epilogue if set(st.axes) == grid]
    theirs = [st for st in k.epilogue if st not in mine]
    if not mine or (theirs and not others) or any(set(st.axes) != set(next(iter(small))) for st in theirs):
        return None
    names = {o.name for o in others}
    if any(n.name in names for st in mine for n in ir.walk(st.expr) if isinstance(n, ir.StateRef)) or any(
            n.name == c.name for st in theirs for n in ir.walk(st.expr) if isinstance(n, ir.StateRef)):
        return None  # (the product's stores read the other sums, or theirs the product)
    product = Pass(ps.axis, [replace(c, core=ir.Call("mul", tuple(varying)))], rules=ps.rules)
    rest = [KernelPlan(f"{k.name}_sums", tuple(a for a in k.grid if a in next(iter(small))),
                       [Pass(ps.axis, others, rules=ps.rules)], theirs)] if others else []
    alone = f", its pass's other sums {', '.join(sorted(names))} in a kernel of their own" if others else ""
    direct = KernelPlan(k.name, k.grid, [product], mine)
    if not hoisted and len(mine) == 1 and library_gemm(direct, plan, program) is not None:
        return [direct, *rest], {}, (f"gemm_split: {c.name} = Σ_{ps.axis} {ir.show(c.core)} runs alone "
                                    f"(a library GEMM's kernel){alone}")
    name = f"gemm_{c.name}"
    if name in plan.buffers:
        return None
    axes = tuple(a for a in program.axes if a in grid)
    buffer = {name: BufferSpec(name, axes, "float32")}
    gemm = KernelPlan(k.name, k.grid, [product], [StorePlan(name, axes, final, "float32")])
    load = ir.Load(name, tuple(ir.Index(a) for a in axes))
    for f in hoisted:
        load = ir.Call("mul", (load, f))
    stores = [StorePlan(st.target, st.axes, ir.substitute(st.expr, {final: load}), st.dtype) for st in mine]
    if library_gemm(gemm, replace(plan, buffers={**plan.buffers, **buffer}), program) is None or any(
            isinstance(n, ir.StateRef) for st in stores for n in ir.walk(st.expr)):
        return None  # (no vendor GEMM; or the epilogue reads the pass's state otherwise than as its final value)
    note = (f"gemm_split: {c.name} = Σ_{ps.axis} {ir.show(c.core)} runs alone (a library GEMM's kernel) into "
            f"float32 {name}; {', '.join(st.target for st in stores)} computed from it by a map kernel{alone}")
    return [gemm, *rest, KernelPlan(f"{k.name}_epilogue", k.grid, [], stores)], buffer, note


def _factors(c, axis: str) -> tuple[list[ir.Node], list[ir.Node]] | None:
    """(the two factors varying along `axis`, the rest) of the plain sum `c` of a product; None otherwise."""
    if c.op != "sum" or c.mask is not None or c.integer:
        return None
    body = opened(c.core)
    if body.conditions:
        return None
    varying = [f for f in body.factors if axis in f.axes]
    return (varying, [f for f in body.factors if axis not in f.axes]) if len(varying) == 2 else None

