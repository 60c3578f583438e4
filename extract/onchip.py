"""On-chip capacity of one kernel schedule: registers per thread, programs per SM, and the spill
factor a schedule that outgrows its registers is priced with (extract/cost.py).

An SM has 65536 32-bit registers; a thread may use at most 255 of them, and fewer when the program
has more threads (1024 threads: 64 each). A streamed kernel holds its biggest loop-tile block (the
value and a temporary) and its carried states. A resident kernel holds its row whole for every
pass, so what it keeps is what crosses a pass boundary: a loaded tile at its storage width (its
conversion to fp32 is cheap to redo, and ptxas does), a computed value at four bytes (softmax's
exp(x − m), kept from the sum for the normalised store). Measured on the H100 (2026-11-24,
bench/results/h100_2026-11-24/issue11/probe_resident_rows.json): a 64K fp16 row held by 32 warps
runs log-softmax at 88 % of a device copy (x kept: 2 bytes a value), softmax at 62 % (exp kept:
4 bytes a value, 34 registers spilled); at 32K at 98 % and 94 %.
"""

from __future__ import annotations

import math

from neptune_eq import ir
from neptune_eq.contraction import is_product, opened
from neptune_eq.kernel_terms import inner_axes, kernel_exprs
from neptune_eq.lower.contract import float32_product
from neptune_eq.plan import Combine, KernelPlan, Plan
from neptune_eq.schedule import FMA_FRESH, FMA_HELD, FMA_K, FMA_K_LOADED, KernelSchedule
from neptune_eq.space import gemm_axes

REGISTERS_PER_SM = 65536
MAX_THREAD_REGISTERS = 255
BASE_REGISTERS = 32  # addresses, indices, loop state: what a thread holds beside its tiles
SHARED_PER_SM = 228 * 1024


def thread_registers(num_warps: int) -> int:
    """The most registers a thread may hold without spilling, at one program per SM."""
    return min(MAX_THREAD_REGISTERS, REGISTERS_PER_SM // (32 * num_warps))


def _dot_tiles(c, ps, sched: KernelSchedule, tiled, inner) -> list[int] | None:
    """The three tiles of comp `c` of pass `ps` when it is a tile dot (a sum of a product over three
    tiled axes of 16 or more: operands staged through shared memory, its accumulator the state), else None."""
    t = [sched.tiles.get(a, 1) for a in sorted(set(c.core.axes) & ({*tiled, ps.axis} | inner))]
    return t if c.op == "sum" and is_product(c.core) and len(t) == 3 and min(t) >= 16 else None


def tile_elements(k: KernelPlan, sched: KernelSchedule, program: ir.Program, plan: Plan) -> float:
    """Values a program holds at once: the largest loop-tile block and its carried states."""
    tiled = [a for a in k.grid if sched.tiles.get(a, 1) > 1]
    inner = inner_axes(k, plan)
    biggest, states = 1.0, 0.0
    for ps in k.passes():
        block = 1.0 if ps.comps else math.prod(sched.tiles.get(a, 1) for a in {*tiled, ps.axis})
        for c in ps.comps:
            t = _dot_tiles(c, ps, sched, tiled, inner)
            if t is not None:  # (the accumulator is the state)
                size = max(t[0] * t[1], t[1] * t[2], t[0] * t[2]) / 2
            else:
                size = math.prod(sched.tiles.get(a, 1) for a in set(c.core.axes) & ({*tiled, ps.axis} | inner))
            block = max(block, size)
            states += math.prod(sched.tiles.get(a, 1) for a in c.free if a in tiled)
        biggest = max(biggest, block)
    held = {a for ph in k.phases for c in (ph.source if isinstance(ph, Combine) else ph).comps
            for a in c.free if a in tiled}  # (a split-K combine's states are its source pass's)
    for st in k.epilogue:  # a store after the loops over a tiled axis no state has: its own block (SE's
        # x·gate[b, h] over [b, h, id] after the j-GEMM: 64 × 64 × 128 values a program, unpriced, 4.5x eager)
        axes = set(st.expr.axes) & set(tiled)
        if axes - held:
            biggest = max(biggest, math.prod(sched.tiles.get(a, 1) for a in axes))
    return 2 * biggest + states


def _pass_exprs(ps) -> list[ir.Node]:
    out: list[ir.Node] = []
    for c in ps.comps:
        out += [c.core, *(e for e in (c.mask, c.corr) if e is not None), *(h for _, h in c.affine)]
    return out + [st.expr for st in ps.stores]


def resident_live_bytes(k: KernelPlan, program: ir.Program, plan: Plan) -> float:
    """Bytes per index of the resident axis a resident kernel holds at once: the row tiles one pass
    loads, or what crosses a pass boundary (each value computed before it and used after it, taken
    whole where a later pass reuses it, as the lowering's memo does), whichever is most. A load
    counts at its storage width, anything else at four bytes."""
    passes = k.passes()
    if not passes:
        return 0.0
    axis = passes[0].axis

    def one_tile(n: ir.Node, new: ir.Node) -> ir.Node:
        # over one tile a running state's current value is its final one: the lowering binds both
        # to one value, so what a rolling pass computes from it a later pass finds computed
        if isinstance(new, ir.StateRef) and new.kind is ir.RefKind.CURRENT:
            return ir.StateRef(ir.RefKind.FINAL, new.name, new.ref_axes)
        return new

    exprs = [[ir.rebuild(e, one_tile) for e in _pass_exprs(ps)] for ps in passes]

    def width(n: ir.Node) -> float:
        return ir.DTYPE_BYTES[plan.loaded_dtype(program, n.tensor)] if isinstance(n, ir.Load) else 4.0

    # each pass loads its whole row tile at once
    peak = max(sum(width(n) for n in {id(n): n for e in es for n in ir.walk(e)
                                      if isinstance(n, ir.Load) and axis in n.axes}.values())
               for es in exprs)
    before: set[int] = set()  # the row values computed by the passes before boundary b
    for b in range(1, len(passes)):
        before |= {id(n) for e in exprs[b - 1] for n in ir.walk(e) if axis in n.axes}
        kept: dict[int, ir.Node] = {}
        stack = [e for es in exprs[b:] for e in es]
        while stack:
            n = stack.pop()
            if axis not in n.axes or id(n) in kept:
                continue
            if id(n) in before:
                kept[id(n)] = n
            else:
                stack.extend(n.children())
        peak = max(peak, sum(width(n) for n in kept.values()))
    return peak


def registers(k: KernelPlan, sched: KernelSchedule, program: ir.Program, plan: Plan) -> float:
    """Registers per thread the schedule asks for."""
    threads = 32 * sched.num_warps
    if sched.resident:
        row = math.prod(sched.tiles.get(a, 1) for a in {*k.grid, *(p.axis for p in k.passes())})
        return BASE_REGISTERS + resident_live_bytes(k, program, plan) / 4 * row / threads
    return BASE_REGISTERS + tile_elements(k, sched, program, plan) / threads


# the spill factor of a schedule whose float32 IEEE products break schedule.FMA_* (ptxas's bounds)
FMA_SPILL = 4.0

# Tensor-core accumulators past what a thread holds spill inside the K-loop: every step reloads them.
# Measured on the H100 (2026-12-07, bench/probe_sweep_kernels.py --variants, SwiGLU's x·W1 and x·W3
# sharing one pass, 4096 × 2048 → 5632 bf16, 8 warps): two 128 × 128 fp32 accumulators (128
# registers a thread) 459.5 µs against 360 predicted; two 128 × 256 (256 a thread) 2840 µs against
# 366.9 — 7.7x (ptxas: 255 registers, wgmma serialised, C7511; at 128 × 128: 181, no spill). One
# 128 × 256 accumulator (128 a thread) is the usual GEMM tile and runs at speed. The bound sits between
# the measured points; a K-loop's tile inside a fused loop is not counted (CosFace's dW kernel, 128 + 64
# a thread, spills; attention's dK/dV kernel, 128 + 64 too, does not — ptxas, session 71).
ACC_REGISTERS = 192  # accumulator registers a thread keeps beside addresses and operand fragments
ACC_SPILL = 7.7  # the slowdown measured at ACC_MEASURED registers of accumulators a thread
ACC_MEASURED = 256


def accumulator_registers(k: KernelPlan, sched: KernelSchedule, program: ir.Program, plan: Plan) -> float:
    """Registers a thread holds for the kernel's tensor-core dot accumulators (sums of a product over
    three tiled axes of 16 or more, each carried over its pass): the states that live through the K-loop."""
    if sched.library or sched.resident:
        return 0.0
    tiled = {a for a in k.grid if sched.tiles.get(a, 1) > 1}
    inner = inner_axes(k, plan)
    acc = sum(math.prod(sched.tiles.get(a, 1) for a in c.free if a in tiled)
              for ps in k.passes() for c in ps.comps if _dot_tiles(c, ps, sched, tiled, inner) is not None)
    return acc / (32 * sched.num_warps)


def mma_spill(k: KernelPlan, sched: KernelSchedule, program: ir.Program, plan: Plan) -> float:
    """The factor a kernel's tensor-core time is priced at: 1, or the measured slowdown (in proportion
    to the accumulators held) where they outgrow ACC_REGISTERS."""
    acc = accumulator_registers(k, sched, program, plan)
    return 1.0 if acc <= ACC_REGISTERS else ACC_SPILL * acc / ACC_MEASURED


def fma_dots_fit(k: KernelPlan, sched: KernelSchedule, program: ir.Program, plan: Plan) -> bool:
    """Do the kernel's float32 IEEE products keep within the bounds above (True where it has none)?"""
    if sched.input_precision != "ieee" or sched.library:  # (the vendor's GEMM is not Triton's)
        return True
    threads = 32 * sched.num_warps
    tiles = sched.tiles
    axes = {*k.grid, *(p.axis for p in k.passes()), *inner_axes(k, plan)}
    blocked = {a for a in axes if tiles.get(a, 1) > 1}
    fresh = held = 0.0
    for ps in k.passes():
        for c in ps.comps:
            if c.op == "sum" and is_product(c.core) and len((c.core.axes | {ps.axis}) & blocked) == 3 \
                    and float32_product(c.core, ps.axis, axes, plan, program):
                held += math.prod(tiles.get(a, 1) for a in c.free if a in blocked) / threads
                computed = any(not isinstance(f, ir.Load | ir.Const) for f in opened(c.core).factors)
                if tiles.get(ps.axis, 1) > (FMA_K if computed else FMA_K_LOADED):
                    return False
    used = {n.name for e in kernel_exprs(k, plan) for n in e.refs if n.kind is ir.RefKind.INLINE}
    for name in used:
        t = plan.inline.get(name)
        if isinstance(t, ir.Reduce) and t.op == "sum" and is_product(t.body) \
                and len((t.body.axes | {t.axis}) & (blocked | {t.axis})) >= 3 \
                and float32_product(t.body, t.axis, axes, plan, program):
            fresh = max(fresh, math.prod(tiles.get(a, 1) for a in t.axes if a in blocked) / threads)
    return fresh <= FMA_FRESH and fresh + held <= FMA_HELD


def on_chip(k: KernelPlan, sched: KernelSchedule, program: ir.Program, plan: Plan,
            uses_tensor_cores: bool, float32_tiles: bool = True) -> tuple[int, float]:
    """(programs resident per SM, spill factor): registers bound the programs an SM holds, dot
    operands staged in shared memory once per pipeline stage bound them too. Past its registers
    (thread_registers) a thread spills to local memory, priced as proportionally slower memory and
    ALU work. `float32_tiles`: False where the kernel multiplies no float32 tiles (space.ieee_tiled),
    whatever the schedule (the FMA bounds are then not looked at)."""
    threads = 32 * sched.num_warps
    regs = registers(k, sched, program, plan)
    limit = thread_registers(sched.num_warps)
    spill = max(1.0, regs / limit, 1.0 if not float32_tiles or fma_dots_fit(k, sched, program, plan) else FMA_SPILL)
    smem = 0.0
    if uses_tensor_cores:
        g = gemm_axes(k, program)
        if g is not None:
            m, n, kk = (sched.tiles.get(a, 1) for a in g)
            smem = sched.num_stages * (m * kk + kk * n) * 2
    occ = min(REGISTERS_PER_SM // int(min(regs, limit) * threads) or 1, 2048 // threads, 32)
    if smem:
        occ = min(occ, max(1, int(SHARED_PER_SM // smem)))
    return max(1, occ), spill
