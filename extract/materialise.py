"""Materialised operands: a contraction's computed operand written once, then read as data.

A sum Σ_k A[m, k]·B[k, n] into two grid axes of one kernel (a GEMM) whose A is computed
(LayerNorm's (x − μ)·rstd·γ + β) recomputes A for every tile of n: each element n/BN times, in
registers, between the load and the tensor cores. Written once to a buffer A[m, k] by a map pass
over k (in the kernel that computes μ and rstd when it runs over m, else in a kernel of its own),
A costs one write and one read more, and the GEMM reads both operands as data. Plans with and
without it are both offered; the cost model chooses (`extract/cost.py`).

Only contractions with no mask and no zero-branch condition are materialised: a masked-out lane of
a computed operand may hold inf or NaN, which a loaded operand must not (lower/contract.py).
"""

from __future__ import annotations

from neptune_eq import ir
from neptune_eq.contraction import gemm_sides, plain_input
from neptune_eq.plan import BufferSpec, Combine, KernelPlan, Pass, StorePlan


def _product(factors: list[ir.Node]) -> ir.Node:
    out = factors[0]
    for f in factors[1:]:
        out = ir.Call("mul", (out, f))
    return out


def _operand_dtype(other, program: ir.Program) -> str | None:
    """The dtype the tensor cores take a computed operand in when the other operand is one input in
    16 bits: the lowering casts it to that input's dtype, so a buffer of that dtype holds exactly
    what the dot would have read. None otherwise (a float32 dot of two computed operands runs at the
    schedule's precision, which a float32 buffer read as data would not keep)."""
    if len(other) == 1 and plain_input(other[0], program.inputs):
        dt = program.inputs[other[0].tensor].dtype
        if dt in ("float16", "bfloat16"):
            return dt
    return None


def materialise_operands(kernels: list[KernelPlan], program: ir.Program,
                         owner: dict[str, int]) -> dict[str, BufferSpec] | None:
    """Rewrite `kernels` in place so that every computed GEMM operand is stored by a map pass and
    loaded by the contraction; the buffers added, or None when there is no such operand (or it
    cannot be placed before its GEMM). `owner`: reduction name → the kernel that finalises it
    (kept up to date as kernels are inserted)."""
    added: dict[str, BufferSpec] = {}
    ki = 0
    while ki < len(kernels):
        k = kernels[ki]
        if any(isinstance(ph, Combine) for ph in k.phases):
            ki += 1
            continue
        for ps in (p for p in k.passes() if p.split == 1):
            for c in ps.comps:
                if c.op != "sum" or c.mask is not None or c.producers:
                    continue
                sides = gemm_sides(c.core, ps.axis, k.grid, program.axes)
                if sides is None:
                    continue
                m, n, left, right, post = sides.m, sides.n, sides.left, sides.right, sides.post
                operands, changed = [], False
                for factors, other, row, is_left in ((list(left), right, m, True), (list(right), left, n, False)):
                    dtype = _operand_dtype(other, program)
                    if (len(factors) == 1 and plain_input(factors[0], program.inputs)) or dtype is None:
                        operands += factors
                        continue
                    spec = _place(kernels, ki, ps.axis, row, is_left, factors, program, owner, dtype,
                                  f"mat_{c.name}_{row}")
                    if spec is None:
                        return None
                    ki = next(i for i, x in enumerate(kernels) if x is k)
                    added[spec.name] = spec
                    operands.append(ir.Load(spec.name, tuple(ir.Index(a) for a in spec.axes)))
                    changed = True
                if changed:
                    c.core = _product([*operands, *post])
        ki += 1
    return added or None


def _place(kernels: list[KernelPlan], ki: int, kk: str, row: str, is_left: bool, factors: list[ir.Node],
           program: ir.Program, owner: dict[str, int], dtype: str, name: str) -> BufferSpec | None:
    """Store the product of `factors` into buffer `name` from a map pass over `kk` in a kernel before
    kernel `ki` (an earlier kernel over the same rows that loops over `kk`, else one inserted for it);
    None when it cannot run before the GEMM."""
    expr = _product(factors)
    refs = [n for n in ir.walk(expr) if isinstance(n, ir.StateRef)]
    if any(r.kind is not ir.RefKind.FINAL or r.name not in owner for r in refs):
        return None
    first = max((owner[r.name] for r in refs), default=0)
    if refs and first >= ki:
        return None  # the operand needs a value the GEMM's own kernel computes
    axes = set().union(*(f.axes for f in factors))
    rows = tuple(a for a in program.axes if a in axes and a != kk)
    # A[m, k] with k contiguous, B[k, n] with n contiguous: the layouts tl.dot's operands load best
    buf_axes = (*rows, kk) if is_left else (*[a for a in rows if a != row], kk, row)
    spec = BufferSpec(name, buf_axes, dtype, operand=True)
    store = StorePlan(name, buf_axes, expr, spec.dtype)
    for j in range(ki - 1, first - 1, -1):
        host = kernels[j]
        if (set(host.grid) == set(rows) and kk not in host.grid and host.chunks == 1
                and any(p.axis == kk for p in host.passes())):
            host.phases.append(Pass(kk, [], [store]))
            return spec
    kernels.insert(ki, KernelPlan(f"k{len(kernels)}_operand", rows, [Pass(kk, [], [store])]))
    for r, at in owner.items():
        if at >= ki:
            owner[r] = at + 1
    return spec
