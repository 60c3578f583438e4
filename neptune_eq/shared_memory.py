"""Shared memory a kernel's schedule asks for (the model Triton 3.6's allocator was measured against),
and the schedule changes that fit it: fewer stages, smaller tiles, or wider rolling steps where they fit."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from . import ir
from .contraction import is_product, opened
from .kernel_terms import inner_axes, kernel_exprs, with_inlined
from .numeric import held_dtypes
from .plan import KernelPlan, Pass, Plan

if TYPE_CHECKING:
    from .schedule import KernelSchedule


# Hopper's 227 KiB (232448 bytes) of shared memory per block. shared_bytes below is what Triton 3.6
# reports a kernel requires, exactly for the dot tiles, over for 1-D streams, on attention's forward and
# backward kernels over a grid of tiles and 1-4 stages (bench/results/h100_2026-11-25/shared_memory.json,
# bench/results/h100_2026-11-27/session38/shared_calibration.txt: Triton 3.6 on the host). The budget had
# kept 3 KiB for its error: the packed-documents forward (a doc id row streamed beside K and V) then missed
# 128-key steps by 2 KiB (estimated 233472 bytes, 231424 required). A kernel that still asks for more is
# launched again with fewer stages (lower/launch.py)
SHARED_BUDGET = 227 * 1024


def shared_bytes(k: KernelPlan, program: ir.Program, plan: Plan, sched: KernelSchedule) -> int:
    """Shared memory the kernel's tiles take: the 2-D tiles (dot operands) a pass streams over its axis,
    once per pipeline stage, and every tile held across iterations (loaded outside a loop) once. The
    passes of a kernel run one after another, so their pipelines' buffers are counted for the largest
    pass alone (Triton's allocator reuses shared memory across loops)."""
    def size(ld: ir.Load) -> int:
        if sum(sched.tiles.get(a, 1) > 1 for a in ld.axes) > 2:
            return 0  # (a 3-D block is no tensor-core operand: it lives in registers)
        return ir.DTYPE_BYTES.get(plan.loaded_dtype(program, ld.tensor), 4) * math.prod(
            sched.tiles.get(a, 1) for a in ld.axes)

    held: dict[tuple, int] = {}  # loaded before the loops: a 1-D row of values is held in registers
    streamed = [0]
    loops = {p.axis for p in k.passes()}
    for ph in k.phases:
        axis = ph.axis if isinstance(ph, Pass) else None
        # a pass whose axis fits one tile runs once: nothing to pipeline
        stages = 1 if axis is not None and program.axes[axis] <= sched.tiles.get(axis, 1) else sched.num_stages
        seen = set()
        total = 0
        exprs = kernel_exprs(k, plan, [ph])
        # a computed dot operand built before the loops (RoPE's rotated query tile) is held as its one
        # 16-bit tile; the tiles it was computed from are not (they counted 3× and halved the key step)
        built = {f: _operand_bytes(f, program, plan) * math.prod(sched.tiles.get(a, 1) for a in f.axes)
                 for f in _dot_operands(exprs)
                 if not isinstance(f, ir.Load) and not f.axes & loops and not ir.reads_state(f)
                 and sum(sched.tiles.get(a, 1) > 1 for a in f.axes) == 2}
        held.update({("operand", f): b for f, b in built.items()})
        if built:
            exprs = [ir.substitute(e, dict.fromkeys(built, ir.Const(0.0))) for e in exprs]
        for ld in (n for e in exprs for n in e.loads):
            key = (ld.tensor, tuple(sorted(ld.axes)))
            if axis is not None and axis in ld.axes:
                if key not in seen:
                    seen.add(key)
                    total += size(ld) * stages
            elif sum(sched.tiles.get(a, 1) > 1 for a in ld.axes) >= 2:
                held[key] = size(ld)
        if isinstance(ph, Pass):
            total += _widened_operands(k, ph, program, plan, sched)
        streamed.append(total)
    # the epilogue's tiles (a chunked sum's fp32 accumulator, read once after the loop) are live only
    # once the loops' pipeline buffers are not: Triton's allocator gives them the same shared memory
    after = {}
    for ld in (n for e in with_inlined([st.expr for st in k.epilogue], plan) for n in ir.walk(e)
               if isinstance(n, ir.Load)):
        key = (ld.tensor, tuple(sorted(ld.axes)))
        if key not in held:
            after[key] = size(ld)
    return sum(held.values()) + max(max(streamed), sum(after.values()))


def _widened_operands(k: KernelPlan, ps: Pass, program: ir.Program, plan: Plan, sched: KernelSchedule) -> int:
    """Shared memory the float32 tile dots of pass `ps` take for the operands they compute or widen per
    step (linear attention's elu'd keys, and its 16-bit values beside them): Triton stages each such
    tile in shared memory at 4 bytes, twice for tf32x3 (its big and small parts), once whatever the
    pipeline depth. (Not counted, the key-value pass of linear attention's training asked 262144 bytes
    at one stage where 131072 were modelled: a failed launch on the H100, session 75's code.) A loaded
    float32 operand is the pipelined load shared_bytes counts already; a dot on the 16-bit tensor
    cores is as before (its computed side rounded to 16 bits, as attention's probabilities)."""
    from .contraction import gemm_sides
    from .lower.contract import float32_product

    axes = {*k.grid, *(p.axis for p in k.passes()), *inner_axes(k, plan)}
    parts = 2 if sched.input_precision == "tf32x3" else 1
    out, seen = 0, set()
    for c in ps.comps:
        if c.op != "sum" or not is_product(c.core) or not float32_product(c.core, ps.axis, axes, plan, program):
            continue
        sides = gemm_sides(c.core, ps.axis, axes, program.axes, conditions=True)
        for side, tile in ((sides.left, (sides.m, ps.axis)), (sides.right, (ps.axis, sides.n))):
            loaded = len(side) == 1 and isinstance(side[0], ir.Load)
            if (loaded and ir.DTYPE_BYTES.get(plan.loaded_dtype(program, side[0].tensor), 4) == 4) or side in seen:
                continue
            seen.add(side)
            out += 4 * math.prod(sched.tiles.get(a, 1) for a in tile) * parts
    return out


def _dot_operands(exprs: list[ir.Node]) -> set[ir.Node]:
    """The factors of the product bodies of the sums in `exprs` (the operands of their tile dots)."""
    return {f for e in exprs if e.reduced_axes for n in ir.walk(e) if isinstance(n, ir.Reduce) and n.op == "sum"
            and is_product(n.body) for f in opened(n.body).factors}


def _operand_bytes(f: ir.Node, program: ir.Program, plan: Plan) -> int:
    """Bytes an element of computed operand f takes for the dot: 2 where every float it loads is 16-bit
    (lower/contract.py rounds it to that dtype), else 4."""
    dts = held_dtypes(f, lambda t: plan.loaded_dtype(program, t))
    return 2 if dts and dts <= {"float16", "bfloat16"} else 4


def fit_shared(sched: KernelSchedule, k: KernelPlan, program: ir.Program, plan: Plan,
               rows: list[str]) -> KernelSchedule:
    """`sched` with fewer pipeline stages, then smaller row and loop tiles, until its tiles fit in
    SHARED_BUDGET (a backward pass streaming three head-dim-128 tiles per step needs it)."""
    loops = [p.axis for p in k.passes()]
    while shared_bytes(k, program, plan, sched) > SHARED_BUDGET:
        if sched.num_stages > 2:
            sched = replace(sched, num_stages=sched.num_stages - 1)
            continue
        big = [a for a in rows if sched.tiles.get(a, 1) > 64 and sched.steps.get(a) is None]
        if big:
            sched = sched.with_tiles(**{big[0]: sched.tiles[big[0]] // 2})
            continue
        long = [a for a in loops if sched.tiles.get(a, 1) > 32]
        if not long:
            break
        sched = sched.with_tiles(**{a: sched.tiles[a] // 2 for a in long})
    return sched


def wide_rolling_steps(sched: KernelSchedule, k: KernelPlan, program: ir.Program, plan: Plan,
                        rows: list[str]) -> KernelSchedule:
    """128-wide steps for the rolling passes of a kernel with 128-row tiles, where three pipeline
    stages of them still fit and every 2-D tile the pass streams is a tensor-core operand: each step
    of a rolling pass repairs its states (rescales the row's accumulators by the new maximum)
    besides its dots, and a wider step pays that once per 128 keys. H100, attention forwards
    (bench/results/h100_2026-11-25/forward_steps*.json), 128 against 64 keys a step: at L = 16384,
    d 128, causal 4.69 against 5.29 ms, alibi 5.45 / 6.31, gqa 9.13 / 10.37, global 9.17 / 9.14;
    bench/beyond's causal GQA 1.29 / 1.45, causal d 64 0.268 / 0.292; with a bias tile added to the
    scores (held in registers: twice the registers at 128 keys) 0.498 / 0.482, so such a pass keeps
    64. A plain K-loop has no repair and keeps 64 too."""
    if not rows or sched.tiles.get(rows[0], 1) < 128 or sched.num_stages < 3 or sched.steps:
        return sched
    wide = {p.axis: 128 for p in k.passes() if p.kind == "rolling" and sched.tiles.get(p.axis) == 64
            and program.axes[p.axis] > 64 and not _streams_register_tiles(k, plan, p, sched.tiles)}
    if not wide:
        return sched
    widened = sched.with_tiles(**wide)
    return widened if shared_bytes(k, program, plan, widened) <= SHARED_BUDGET else sched


def _streams_register_tiles(k: KernelPlan, plan: Plan, ps: Pass, tiles: dict[str, int]) -> bool:
    """Does pass `ps` load, each step, a 2-D tile that no contraction reads as an operand (a bias
    added to attention's scores)? Such a tile lives in registers, not in the dots' shared memory."""
    def bare(f: ir.Node) -> ir.Node:
        while isinstance(f, ir.Call) and len(f.args) == 1:
            f = f.args[0]
        return f

    exprs = kernel_exprs(k, plan, [ps])
    bodies = [c.core for c in ps.comps if c.op == "sum" and is_product(c.core)]
    bodies += [n.body for e in exprs for n in ir.walk(e)
               if isinstance(n, ir.Reduce) and n.op == "sum" and is_product(n.body)]
    operands = {bare(f) for b in bodies for f in opened(b).factors}
    return any(isinstance(n, ir.Load) and ps.axis in n.axes and n not in operands
               and sum(tiles.get(a, 1) > 1 for a in n.axes) >= 2 for e in exprs for n in ir.walk(e))

