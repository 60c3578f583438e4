"""Materialised operands: a contraction's computed operand written once, then read as data.

A sum Σ_k A[m, k]·B[k, n] into two grid axes of one kernel (a GEMM) whose A is computed
(LayerNorm's (x − μ)·rstd·γ + β) recomputes A for every tile of n: each element n/BN times, in
registers, between the load and the tensor cores. Written once to a buffer A[m, k] by a map pass
over k (in the kernel that computes μ and rstd when it runs over m, else in a kernel of its own) or
from the epilogue of a kernel with one program per tile of A (the GEMM whose result A reads),
A costs one write and one read more, and the GEMM reads both operands as data. Plans with and
without it are both offered; the cost model chooses (`extract/cost.py`).

A condition of the body goes with the operand whose axes it is over and is stored with it:
where(c, A, 0) is written, so a masked-out lane of the buffer holds 0, never the inf or NaN a
computed lane may hold (lower/contract.py takes loaded operands as finite). A condition over the
output alone stays on the result; one over the axes of an operand that is not written stays in the
body. A comp's mask counts as conditions; its affine conjuncts (loop bounds) also stay on the sum.
"""

from __future__ import annotations

from neptune_eq import ir
from neptune_eq.contraction import gemm_sides, masked_body, opened, plain_input, product_of
from neptune_eq.masks import affine, conjunction, conjuncts
from neptune_eq.numeric import compute_dtype, held_dtypes, held_wide
from neptune_eq.plan import BufferSpec, Combine, KernelPlan, Pass, StorePlan


def _operand_dtype(other, program: ir.Program, factors) -> str | None:
    """The dtype the dot takes a computed operand in when the other operand is one input: in 16 bits
    the lowering casts it to that input's dtype, so a buffer of that dtype holds exactly what the dot
    would have read; beside a float32 input both are float32 in registers, as a float32 buffer read
    as data is (CLIP's loss of `.float()` features: its logits' gradient written once, then two
    GEMMs). None otherwise (a float32 dot of two computed operands runs at the schedule's precision,
    which a float32 buffer read as data would not keep; a float64 program computes in float64). An
    operand `factors` torch holds in float32 beside a 16-bit input (numeric.held_wide) is float32."""
    if len(other) == 1 and plain_input(other[0], program.inputs):
        dt = program.inputs[other[0].tensor].dtype
        if dt in ("float16", "bfloat16") and held_wide(factors) and compute_dtype(program) == "float32":
            return "float32"
        if dt in ("float16", "bfloat16") or (dt == "float32" and compute_dtype(program) == "float32"):
            return dt
    return None


def materialise_operands(kernels: list[KernelPlan], program: ir.Program,
                         owner: dict[str, int], epilogues: bool = False,
                         row_factors: bool = False) -> dict[str, BufferSpec] | None:
    """Rewrite `kernels` in place so that every computed GEMM operand is stored once and loaded by
    the contraction; the buffers added, or None when there is no such operand (or it cannot be placed
    before its GEMM). `owner`: reduction name → the kernel that finalises it (kept up to date as
    kernels are inserted). An operand that reads a GEMM's result is stored by that GEMM's epilogue;
    one that reads no reduction by a map pass, or with `epilogues` by the epilogue of an earlier
    kernel over its axes (both are offered: a GEMM's epilogue writing RMSNorm's x̂ made it choose
    128×128 tiles and run 0.3 ms slower on the H200, where linear CE's one-hot written by a map pass
    is a kernel of strided stores). `row_factors`: a factor of the product that reads a reduction's final
    value over the operand's own rows (RMSNorm's 1/rms, F.normalize's 1/‖x‖) is written with the operand
    too, rather than applied after the dot: the GEMM is then a plain product the vendor's GEMM may run
    (lower/library.py), and the operand holds what torch's normalised tensor holds; None when no such
    factor exists (the plan would be the one without it)."""
    added: dict[str, BufferSpec] = {}
    scaled = False
    ki = 0
    while ki < len(kernels):
        k = kernels[ki]
        if any(isinstance(ph, Combine) for ph in k.phases):
            ki += 1
            continue
        for ps in (p for p in k.passes() if p.split == 1):
            for c in ps.comps:
                if c.op != "sum" or c.producers:
                    continue
                body = masked_body(c.core, c.mask)
                moved, moved_c, store = _epilogue_row_factors(kernels, k, c, ps.axis) if row_factors else ([], [], None)
                sides = gemm_sides(product_of([body, *moved], moved_c) if moved else body, ps.axis, k.grid,
                                   program.axes, conditions=True)
                if sides is None:
                    continue
                operands, kept, changed = [], [], False
                post, post_conds = list(sides.post), list(sides.post_conds)
                for factors, conds, other, row, is_left in (
                        (list(sides.left), sides.left_conds, sides.right, sides.m, True),
                        (list(sides.right), sides.right_conds, sides.left, sides.n, False)):
                    dtype = _operand_dtype(other, program, factors) or _elementwise_dtype(
                        [*sides.left, *sides.right], program, ps.axis)
                    loaded = len(factors) == 1 and not conds and plain_input(factors[0], program.inputs)
                    if loaded or dtype is None:
                        operands += factors
                        kept += conds
                        continue
                    # factors and conditions free of the contraction over this operand's own axes (a
                    # row scale, a scalar's guard) are written with it, once per element, rather than
                    # applied to every K step's dot tile (where they keep the accumulation off the
                    # tensor cores' own accumulator): dH = P·W of linear CE scaled each step's
                    # 128×256 tile by g/n and ran at 250 TF/s (H200)
                    own = set().union(*(f.axes for f in factors), *(q.axes for q in conds))
                    fold = [f for f in post if f.axes <= own and not ir.reads_state(f)]
                    rows_folded = any(any(f is g for g in moved) for f in factors)
                    fold_c = [q for q in post_conds if q.axes <= own and not ir.reads_state(q)]
                    post = [f for f in post if not any(f is g for g in fold)]
                    post_conds = [q for q in post_conds if not any(q is g for g in fold_c)]
                    spec = _place(kernels, ki, ps.axis, row, is_left, product_of([*factors, *fold], [*conds, *fold_c]),
                                  program, owner, dtype, f"mat_{c.name}_{row}" + ("_scaled" if rows_folded else ""),
                                  added, epilogues)
                    if spec is None:
                        return None
                    ki = next(i for i, x in enumerate(kernels) if x is k)
                    added[spec.name] = spec
                    operands.append(ir.Load(spec.name, tuple(ir.Index(a) for a in spec.axes)))
                    changed = True
                kept += post_conds
                if moved and not any(f is g for f in [*operands, *post, *kept] for g in [*moved, *moved_c]):
                    scaled = True  # (every moved factor and condition was written with its operand)
                    st = k.epilogue[store]
                    parts = opened(st.expr)
                    k.epilogue[store] = StorePlan(st.target, st.axes, product_of(
                        [f for f in parts.factors if not any(f is g for g in moved)],
                        [q for q in parts.conditions if not any(q is g for g in moved_c)]), st.dtype)
                elif moved:
                    return None  # (a moved factor left unwritten: this variant's plan is not built)
                if changed:
                    # what was not written stays a condition of the sum; the affine conjuncts of its
                    # mask stay too, also where written: they bound the tiles the loop visits
                    c.core = product_of([*operands, *post])
                    c.mask = conjunction([*(m for m in (conjuncts(c.mask) if c.mask is not None else ())
                                            if affine(m) is not None and m not in kept), *kept])
        ki += 1
    return None if row_factors and not scaled else added


def _epilogue_row_factors(kernels: list[KernelPlan], k: KernelPlan, c, kk: str
                          ) -> tuple[list[ir.Node], list[ir.Node], int | None]:
    """The factors and conditions of the one epilogue store of `k` that reads sum `c` — r·Σₖ A·B, with r
    over the rows of one operand (RMSNorm's 1/rms factored out of the sum by the e-graph; attention's
    1/l, under softmax's guard of a row with no key, where(l = 0, 0, ·)) — that may be written into that
    operand instead (r·Σₖ A·B = Σₖ (r·A)·B; a condition on the row selects the operand's row: the loaded
    operand taken as finite, README), and that store's index; ([], [], None) when `c` is read anywhere
    else in the plan, or not as a factor of a product, or some condition or no factor qualifies: each
    reads no reduction but final values free of `kk`, and is over some axis but not `kk`."""
    ref = c.ref(ir.RefKind.FINAL)
    none: tuple = ([], [], None)
    uses = [(kernel, e) for kernel in kernels for e in kernel.exprs() if any(n == ref for n in ir.walk(e))]
    if len(uses) != 1 or uses[0][0] is not k:
        return none
    store = next((i for i, st in enumerate(k.epilogue) if st.expr is uses[0][1]), None)
    if store is None:
        return none
    parts = opened(k.epilogue[store].expr)
    if sum(f == ref for f in parts.factors) != 1:
        return none

    def movable(f: ir.Node) -> bool:
        return bool(f.axes) and kk not in f.axes and not any(  # (and never the sum itself: exp(S)·S)
            isinstance(n, ir.Reduce) or (isinstance(n, ir.StateRef) and (
                n.kind is not ir.RefKind.FINAL or kk in n.axes or n.name == c.name))
            for n in ir.walk(f))

    moved = [f for f in parts.factors if f != ref and movable(f)]
    if not moved or not all(movable(q) for q in parts.conditions):
        return none
    return moved, list(parts.conditions), store


def materialise_inline(kernels: list[KernelPlan], inline: dict[str, ir.Node], program: ir.Program,
                       owner: dict[str, int]) -> dict[str, BufferSpec]:
    """Rewrite `inline` (name → term computed per tile where used) so that a contraction's computed
    operand that the programs of a kernel each recompute is stored once, by a map pass before them,
    and loaded as data; the buffers added. An operand that reads a reduction's value stays.

    Σ_d A[i, d]·B[j, d] computed per tile inside a loop over j of a kernel with a program per tile of
    i reads B once per program: a computed B (RoPE's k·cos + rotate_half(k)·sin, gathered at shifted
    columns) is recomputed n_i / BLOCK_i times — 15× the kernel's time on the H100 at L 2048. Its
    own row axis must be one the kernel loops over or tiles, the other row a grid axis: the side whose
    rows are the program's own (the query tile) is computed once per program and stays."""
    added: dict[str, BufferSpec] = {}
    readers = _inline_readers(kernels, inline)
    for name, term in list(inline.items()):
        if not (isinstance(term, ir.Reduce) and term.op == "sum"):
            continue
        users = [ki for ki, names in enumerate(readers) if name in names]
        if not users:
            continue
        k = kernels[users[0]]
        axes = (*k.grid, *(p.axis for p in k.passes()))
        sides = gemm_sides(term.body, term.axis, axes, program.axes, conditions=True)
        if sides is None:
            continue
        new = {True: (list(sides.left), list(sides.left_conds)), False: (list(sides.right), list(sides.right_conds))}
        changed = False
        for factors, conds, other, row, far, is_left in (
                (sides.left, sides.left_conds, sides.right, sides.m, sides.n, True),
                (sides.right, sides.right_conds, sides.left, sides.n, sides.m, False)):
            value = product_of(list(factors), conds)
            loaded = len(factors) == 1 and not conds and plain_input(factors[0], program.inputs)
            recomputed = any(far in kernels[ki].grid for ki in users)
            dtype = _operand_dtype(other, program, factors) or _elementwise_dtype([*sides.left, *sides.right],
                                                                                 program)
            if loaded or not recomputed or dtype is None or ir.reads_state(value):
                continue
            spec = _place(kernels, users[0], term.axis, row, True, value, program, owner, dtype,
                          f"mat_{name}_{row}", added)
            users = [ki for ki, names in enumerate(_inline_readers(kernels, inline)) if name in names]
            added[spec.name] = spec
            new[is_left] = ([ir.Load(spec.name, tuple(ir.Index(a) for a in spec.axes))], [])
            changed = True
        if changed:
            inline[name] = ir.Reduce("sum", term.axis, product_of(
                [*new[True][0], *new[False][0], *sides.post], [*new[True][1], *new[False][1], *sides.post_conds]))
            readers = _inline_readers(kernels, inline)
    return added


def _inline_readers(kernels: list[KernelPlan], inline: dict[str, ir.Node]) -> list[set[str]]:
    """For each kernel, the inline terms it computes: those its expressions name, and theirs in turn."""
    def named(e: ir.Node) -> set[str]:
        return {n.name for n in ir.walk(e) if isinstance(n, ir.StateRef) and n.kind is ir.RefKind.INLINE}

    direct = {name: named(term) for name, term in inline.items()}
    closed: dict[str, set[str]] = {}

    def closure(name: str) -> set[str]:
        if name not in closed:
            closed[name] = {name}  # (a cycle stops here)
            for m in direct.get(name, ()):
                closed[name] |= closure(m)
        return closed[name]

    out = []
    for k in kernels:
        names: set[str] = set()
        for e in k.exprs():
            for m in named(e):
                names |= closure(m)
        out.append(names)
    return out


def _elementwise_dtype(factors, program: ir.Program, k: str | None = None) -> str | None:
    """The one 16-bit dtype of every floating input the factors load: the dtype lower/contract.py
    (`data_dtype`) rounds two such computed operands to before the tensor cores. They may read no
    reduction, or, given the contraction axis k, final statistics free of k (row factors: F.normalize(q)'s
    norm). A buffer of that dtype then holds what the dot would have read: both sides written once turn
    F.normalize(q) @ F.normalize(keys)ᵀ into a GEMM of two fp16 tensors, as torch runs it (0.55 ms
    against torch.compile's 0.28 on the H100 as one generated kernel dividing by the norms, session 65)."""
    def row_factor(n: ir.Node) -> bool:
        return k is not None and n.kind is ir.RefKind.FINAL and not n.running and k not in n.axes

    for f in factors:
        for n in ir.walk(f):
            if isinstance(n, ir.Reduce) or (isinstance(n, ir.Load) and n.tensor not in program.inputs):
                return None
            if isinstance(n, ir.StateRef) and not row_factor(n):
                return None
    dtypes = set().union(*(held_dtypes(f, lambda t: program.inputs[t].dtype) for f in factors))
    return dtypes.pop() if len(dtypes) == 1 and dtypes <= {"float16", "bfloat16"} else None


def _place(kernels: list[KernelPlan], ki: int, kk: str, row: str, is_left: bool, expr: ir.Node,
           program: ir.Program, owner: dict[str, int], dtype: str, name: str,
           placed: dict[str, BufferSpec], epilogues: bool = False) -> BufferSpec | None:
    """Store `expr` (the operand's value) into buffer `name` from a map pass over `kk` in a kernel
    before kernel `ki` (an earlier kernel over the same rows that loops over `kk`, else one inserted
    for it, or the epilogue of a kernel with a program per tile of it); None when it cannot run
    before the GEMM. An operand already `placed` with the same value, in either layout, is read from
    its buffer (dH = P·W and dW = Pᵀ·h write P once)."""
    refs = [n for n in ir.walk(expr) if isinstance(n, ir.StateRef)]
    # (a reduction computed by a pass of its own: a final state, or a value the plan does not inline)
    if any(r.kind not in (ir.RefKind.FINAL, ir.RefKind.INLINE) or r.name not in owner for r in refs):
        return None
    first = max((owner[r.name] for r in refs), default=0)
    if refs and first >= ki:
        return None  # the operand needs a value the GEMM's own kernel computes
    rows = tuple(a for a in program.axes if a in expr.axes and a != kk)
    # A[m, k] with k contiguous, B[k, n] with n contiguous: the layouts tl.dot's operands load best
    buf_axes = (*rows, kk) if is_left else (*[a for a in rows if a != row], kk, row)
    value = _as_final(expr)
    for spec in placed.values():
        # (in either layout: a tile dot reads a 16-bit operand transposed as well)
        if set(spec.axes) == set(buf_axes) and spec.dtype == dtype and _stored(kernels, spec.name) == value:
            return spec
    spec = BufferSpec(name, buf_axes, dtype, operand=True)
    # a kernel with one program per tile of the operand's elements — the one that finalises what it
    # reads (the logits GEMM for P = e^(z − m)), or with `epilogues` any before the GEMM if it reads
    # no reduction (a one-hot) — stores it from its epilogue; a reduction's own value is not written
    for j in ([first] if refs else range(ki - 1, -1, -1) if epilogues else ()):
        host = kernels[j]
        if (set(host.grid) == set(buf_axes) and host.chunks == 1
                and not any(isinstance(ph, Combine) for ph in host.phases)):
            host.epilogue.append(StorePlan(name, buf_axes, value, spec.dtype))
            return spec
    store = StorePlan(name, buf_axes, expr, spec.dtype)
    for j in range(ki - 1, first - 1, -1):
        host = kernels[j]
        if (set(host.grid) == set(rows) and kk not in host.grid and host.chunks == 1
                and any(p.axis == kk for p in host.passes())):
            host.phases.append(Pass(kk, [], [store]))
            return spec
    # a kernel of its own maps every element in a program per tile of all the operand's axes: looping
    # over kk inside one program per row left a narrow operand with few programs (an MoE router's
    # dlogits[i, e], 64 experts, 65536 tokens: 64 programs reading strided columns, 514.7 µs on the
    # H100 against a copy's ~20)
    grid = tuple(a for a in program.axes if a in buf_axes)
    kernels.insert(ki, KernelPlan(f"k{len(kernels)}_operand", grid, [], [StorePlan(name, buf_axes, value, spec.dtype)]))
    for r, at in owner.items():
        if at >= ki:
            owner[r] = at + 1
    return spec


def _stored(kernels: list[KernelPlan], name: str) -> ir.Node | None:
    """The value a map pass or an epilogue of `kernels` stores into buffer `name` (its references to
    reductions taken as final values)."""
    for k in kernels:
        for st in [*(st for p in k.passes() for st in p.stores), *k.epilogue]:
            if st.target == name:
                return _as_final(st.expr)
    return None


def _as_final(expr: ir.Node) -> ir.Node:
    """`expr` with its references to reductions' values taken as their final states (what the
    epilogue of the kernel computing them reads)."""
    refs = {r: ir.StateRef(ir.RefKind.FINAL, r.name, r.ref_axes) for r in ir.walk(expr)
            if isinstance(r, ir.StateRef) and r.kind is ir.RefKind.INLINE}
    return ir.substitute(expr, refs) if refs else expr
