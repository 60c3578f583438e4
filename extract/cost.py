"""Analytic GPU cost model: predicted time of a plan on a device spec.

Per kernel it counts, from the plan's own expressions and the schedule's tiles: programs and waves,
loop iterations (tiles skipped by affine masks are not counted; a K-loop counts every step),
tensor-core FLOPs of the dots, FMA-pipe and special-function operations per element, bytes loaded
and stored, and HBM bytes from the L2 working set of each wave of concurrent programs
(traffic.py). Registers and shared memory bound the programs per SM and price spills (onchip.py);
small output tiles starve the tensor cores (_mma_efficiency); a program streams about its bytes in
flight per memory latency. Time is the slowest unit plus a fraction of the others, divided by how
well the programs fill the SMs, plus the launch. Every term is kept so the explorer can show why a
plan wins. docs/SCHEDULES.md describes the model and its out-of-sample check.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from neptune_eq import ir
from neptune_eq.contraction import gemm_sides, is_product, masked_body, opened, plain_input
from neptune_eq.device import DeviceSpec
from neptune_eq.kernel_terms import inner_axes
from neptune_eq.lower.combine import combine_unroll, plain_states
from neptune_eq.lower.contract import tensor_core_dot
from neptune_eq.lower.eviction import reread
from neptune_eq.masks import affine_part
from neptune_eq.numeric import compute_dtype
from neptune_eq.ops import OPS
from neptune_eq.plan import Combine, KernelPlan, Pass, Plan
from neptune_eq.schedule import KernelSchedule
from neptune_eq.space import gemm_axes, ieee_tiled

from .library_cost import library_cost
from .onchip import mma_spill, on_chip
from .prices import Cost, KernelCost
from .traffic import footprint, hbm_reads, l2_time

_BYTES = ir.DTYPE_BYTES


class _Counter:
    """Counts work per program of one kernel, from the same expressions the lowering emits."""

    def __init__(self, plan: Plan, k: KernelPlan, program: ir.Program, sched: KernelSchedule):
        self.plan, self.k, self.program, self.tiles, self.sched = plan, k, program, sched.tiles, sched
        self.block_axes = {a for a in k.grid if self.tiles.get(a, 1) > 1} | inner_axes(k, plan)
        # inline contractions longer than their tile: K-loops, run once per use
        self.ksteps = {a: math.ceil(program.axes[a] / self.tiles[a]) for a in inner_axes(k, plan)
                       if self.tiles.get(a, program.axes[a]) < program.axes[a]}
        self.bytes_loaded = 0.0
        self.loaded: dict[str, float] = {}  # tensor → bytes per program
        self.sectors: dict[str, float] = {}  # tensor → bytes moved per byte used (strided reads)
        self.alu = self.sfu = self.tc = 0.0
        self.ieee = 0.0  # products of float32 IEEE dots, on the FMA pipe (DeviceSpec.fma_dot_efficiency)
        # tensor-core FLOPs of float32 dots in TF32 by (precision, B stored K-major) (DeviceSpec.tf32_efficiency)
        self.tf32: dict[tuple[str, bool], float] = {}

    def dot_products(self, body: ir.Node, axis: str, products: float) -> None:
        """Count a tile contraction's products where the lowering runs them (_dot_precision)."""
        axes = (*self.k.grid, *(p.axis for p in self.k.passes()))  # (an inline one's rows may be a loop's)
        precision = _dot_precision(body, axis, axes, self.program, self.plan, self.sched)
        if precision == "ieee":
            self.ieee += products
        elif precision == "16-bit":
            self.tc += 2.0 * products
        else:  # the tensor cores, at half the 16-bit rate in tf32 (three tf32 products in tf32x3)
            key = (precision, _k_major_b(body, axis, axes, self.program))
            self.tf32[key] = self.tf32.get(key, 0.0) + 2.0 * products * {"tf32": 2.0, "tf32x3": 6.0}[precision]

    def sector_waste(self, n: ir.Load, loop: str | None, dt: str) -> float:
        """Bytes moved per byte used by load `n`: a tile whose rows are a short run of the tensor's
        contiguous axis (one or two columns of x[i, d] a program) still moves a 32-byte memory sector
        per row (the norm weight's gradient read two 4-byte columns a program: 0.33 ms for 256 MB)."""
        last = n.index[-1] if n.index else None
        if not isinstance(last, ir.Index):
            return 1.0
        run = self.tiles.get(last.axis, 1) if (last.axis in self.block_axes or last.axis == loop) else 1
        if self.load_size(n, loop) <= run:
            return 1.0  # one run: a row vector, or a single value
        return max(1.0, _SECTOR / (run * _BYTES[dt]))

    def size(self, axes, loop: str | None, moved: bool = False) -> float:
        """Elements of a block over `axes`; `moved`: those a masked load moves (a tile wider than its
        axis, a row of 2304 held in 4096 lanes, reads the row)."""
        s = 1.0
        for a in axes:
            if a in self.block_axes or a == loop:
                t = self.tiles.get(a, 1)
                s *= min(t, self.program.axes.get(a, t)) if moved else t
        return s

    def load_size(self, n: ir.Load, loop: str | None, moved: bool = False) -> float:
        """Elements a program loads for `n` (`moved`: as size). In a loop, an index that is one value
        for the whole padded row tile (a single row, or a // G over a group of G rows) reads one slice."""
        in_loop = loop is not None and loop in n.axes
        axes: set[str] = set()
        for e in n.index:
            got = ir.grouped_index(e) if in_loop else None
            step = self.sched.steps.get(got[0]) if got else None
            if step and got[1] % step == 0:
                continue
            axes |= e.axes
        return self.size(axes, loop, moved)

    def dot(self, n: ir.Node, loop: str | None) -> bool:
        """A sum the lowering emits as tl.dot: a product over its axis and two more tiled ones (a row
        dot such as Σ_e dO[i, e]·O[i, e] is an elementwise product and a tl.sum: ALU work)."""
        tiled = self.block_axes | {loop}
        return (isinstance(n, ir.Reduce) and n.op == "sum" and is_product(n.body) and n.axis in tiled
                and len(n.body.axes & tiled) == 3)

    def count(self, exprs: list[ir.Node], loop: str | None, reps: float, seen: set, kloop: bool = False) -> None:
        for e in exprs:
            for n in ir.walk(e) if e.reduced_axes else ():  # a contraction lowered to tl.dot: tensor-core work
                if self.dot(n, loop):
                    seen.update(opened(n.body).structure)
            for n in ir.walk(e):
                if n in seen:
                    continue
                seen.add(n)
                if isinstance(n, ir.StateRef) and n.kind is ir.RefKind.INLINE and n.name in self.plan.inline:
                    term = self.plan.inline[n.name]
                    steps = self.ksteps.get(term.axis, 1) if isinstance(term, ir.Reduce) else 1
                    self.count([term], loop, reps * steps, seen, kloop or steps > 1)
                elif isinstance(n, ir.Load):
                    dt = self.plan.loaded_dtype(self.program, n.tensor)
                    # invariant loads are hoisted; inside a K-loop every step loads its tile
                    r = reps if loop is None or loop in n.axes or (kloop and n.axes & set(self.ksteps)) else 1.0
                    b = self.load_size(n, loop, moved=True) * _BYTES[dt] * r
                    self.bytes_loaded += b
                    self.loaded[n.tensor] = self.loaded.get(n.tensor, 0.0) + b
                    waste = self.sector_waste(n, loop, dt)
                    self.sectors[n.tensor] = max(self.sectors.get(n.tensor, 1.0), waste)
                elif isinstance(n, ir.Reduce):
                    body = self.size(n.body.axes, loop)
                    if self.dot(n, loop):
                        self.dot_products(n.body, n.axis, body * reps)
                    else:
                        self.alu += body * reps
                elif isinstance(n, ir.Call):
                    op = OPS[n.op]
                    el = self.size(n.axes, loop) * reps
                    if op.unit == "sfu":
                        self.sfu += el * op.weight
                        if n.op in ("exp", "log"):
                            self.alu += el
                    else:
                        self.alu += el * op.weight


def _pass_tiles(ps: Pass, k: KernelPlan, program: ir.Program, tiles: dict[str, int]) -> float:
    """Average number of loop tiles per program, skipping tiles every mask rules out."""
    n = program.axes[ps.axis]
    T = tiles.get(ps.axis, 1)
    total = math.ceil(n / T)
    if not ps.comps:
        return total
    cons_all = []
    for c in ps.comps:
        cons = affine_part(c.mask) if c.mask is not None and not (isinstance(c.mask, ir.Const) and c.mask.value) else []
        cons_all.append(cons)
    rows = [a for a in k.grid if tiles.get(a, 1) > 1 and any(a in dict(x.coef) for cs in cons_all for x in cs)]
    if len(rows) != 1 or any(not cs for cs in cons_all):
        return total
    r = rows[0]
    key = tuple(tuple((tuple(sorted(a.coef)), a.const) for a in cs) for cs in cons_all)
    return _live_tiles(key, r, program.axes[r], tiles[r], ps.axis, n, T)


@functools.lru_cache(maxsize=4096)
def _live_tiles(cons: tuple, r: str, m: int, R: int, axis: str, n: int, T: int) -> float:
    """Live (row tile, loop tile) pairs per row tile: a pair is live when, for some component, every
    affine constraint Σ coef·x + const ≤ 0 can hold somewhere in the pair's box (its minimum over the
    box is ≤ 0; axes other than the row and the loop axis are taken at 0). Counted in blocks of row
    tiles, so memory stays bounded at any length."""
    nr, nt = math.ceil(m / R), math.ceil(n / T)
    if nr * nt > 1 << 26:
        return nt  # beyond 64M pairs the count costs more than it could save: every tile
    j_lo = np.arange(nt, dtype=np.int64)[None, :] * T
    j_hi = np.minimum(n, j_lo + T) - 1
    step = max(1, (1 << 20) // nt)
    count = 0
    for first in range(0, nr, step):
        i_lo = np.arange(first, min(nr, first + step), dtype=np.int64)[:, None] * R
        i_hi = np.minimum(m, i_lo + R) - 1
        live = np.zeros((i_lo.shape[0], nt), dtype=bool)
        for cs in cons:
            ok = np.ones_like(live)
            for coef, const in cs:
                mn = np.full((1, 1), const, dtype=np.int64)
                for x, v in coef:
                    if x == r:
                        mn = mn + v * (i_lo if v > 0 else i_hi)
                    elif x == axis:
                        mn = mn + v * (j_lo if v > 0 else j_hi)
                ok &= mn <= 0
            live |= ok
        count += int(live.sum())
    return count / nr


def kernel_cost(plan: Plan, k: KernelPlan, program: ir.Program, sched: KernelSchedule,
                dev: DeviceSpec, memo: dict | None = None) -> KernelCost:
    """`memo` (one dict per plan, while the plan is not changed): what does not depend on the schedule,
    computed once for all the schedules of a kernel priced against each other."""
    if sched.library:
        return library_cost(plan, k, program, sched, dev)
    tiles = sched.tiles
    programs = k.chunks
    for a in k.grid:
        programs *= math.ceil(program.axes[a] / sched.step(a))
    c = _Counter(plan, k, program, sched)
    iters_total = 0.0
    steps_chain = 0.0  # a program's loop tiles, each weighted by its dependent latencies (in memory latencies)
    shared: set = set()
    loop_iters: dict[str, float] = dict(c.ksteps)
    serial = False  # a dot operand is computed in registers each K step
    in_memory = program.inputs.keys() | plan.buffers.keys()  # what a dot operand may load as it is
    for ph in k.phases:
        if isinstance(ph, Combine):
            for comp in ph.source.comps:
                el = c.size(comp.free, None)
                c.bytes_loaded += el * 4 * ph.chunks
                c.loaded["part_" + comp.name] = el * 4 * ph.chunks
                c.alu += el * 8 * ph.chunks
                c.sfu += el * 2 * ph.chunks
            # a loop over the chunk states, each step waiting about a memory latency on its loads
            steps_chain += ph.chunks / combine_unroll(ph.chunks, plain_states(ph.source))
            continue
        iters = 1.0 if sched.resident else _pass_tiles(ph, k, program, tiles) / max(1, ph.split)
        iters_total += iters
        loop_iters[ph.axis] = max(loop_iters.get(ph.axis, 1.0), iters)
        per_iter: list[ir.Node] = []
        hoisted: list[ir.Node] = []
        across_warps = 0  # the tile's reductions of states that are not tensor-core accumulations
        for comp in ph.comps:
            core = comp.core
            el = c.size(core.axes | {ph.axis}, ph.axis) * iters
            dims = [a for a in core.axes | {ph.axis} if a in c.block_axes or a == ph.axis]
            dot = comp.op == "sum" and is_product(core) and len(dims) == 3
            across_warps += not dot
            repaired = comp.corr is not None or bool(comp.affine)
            if dot:
                c.dot_products(core, ph.axis, el)  # a tile contraction: tl.dot
                exprs = [*opened(core).factors, *opened(core).conditions]
                bare = not opened(core).conditions
                sides = None if repaired else gemm_sides(core if bare else masked_body(core, comp.mask), ph.axis,
                                                         k.grid, program.axes, conditions=not bare)
                for side, conds in (((sides.left, sides.left_conds), (sides.right, sides.right_conds))
                                    if sides else ()):
                    computed = len(side) != 1 or not plain_input(side[0], in_memory)
                    # (a lone load, even at a computed index such as a grouped head, is no arithmetic)
                    tile = (len(side) != 1 or bool(conds) or not isinstance(side[0], ir.Load)) and any(
                        _loads_tile(f, ph.axis, c.block_axes) for f in (*side, *conds))
                    # a computed operand (LayerNorm's normalised rows, a per-column scale) goes
                    # shared memory → registers → arithmetic → registers → shared memory inside
                    # each K step, in the warps that issue the MMAs: that round trip and its
                    # arithmetic add to the tensor-core time instead of overlapping it. (An operand
                    # from registers under conditions — attention's P under its mask — is priced as
                    # the tensor cores' alone, as measured.)
                    if (bare and computed) or (tile and (computed or conds)):
                        trip = _LOADED_OPERAND_TRIP if tile else _OPERAND_TRIP
                        c.alu += c.size(set().union(*(f.axes for f in (*side, *conds))), ph.axis) * iters * trip
                        serial = True
            else:
                c.alu += el  # the tile reduction
                exprs = [core]
            if repaired or not dot:  # (a dot accumulates into its state in place)
                # state update: a multiplicative repair is 3 ops per state, an affine one 3 per term
                terms = max(1, len(comp.affine))
                c.alu += c.size(comp.free, None) * iters * (3 * terms if repaired else 1)
            for e in [*exprs, comp.mask, comp.corr, *(h for _, h in comp.affine)]:
                if e is None:
                    continue
                (per_iter if (ph.axis in e.axes or _has_state(e)) else hoisted).append(e)
        per_iter += [st.expr for st in ph.stores]
        reduce = across_warps * dev.reduce_latency_s / dev.mem_latency_s
        # (a resident row is loaded once: its passes wait on their reductions alone)
        steps_chain += reduce if sched.resident else iters * max(1.0, reduce)
        seen = shared if sched.resident else set()  # a resident row's loads and values serve every pass
        c.count(hoisted, None, 1.0, seen)
        c.count(per_iter, ph.axis, iters, seen if sched.resident else set(seen))
    stored = 0.0
    for st in k.epilogue:
        c.count([st.expr], None, 1.0, set())
    out_bytes = {}
    for ph in k.phases:
        if isinstance(ph, Pass):
            for st in ph.stores:
                out_bytes[st.target] = footprint(program, plan, st.target, st.axes, k)
    # what a pass writes streams through L2 while the wave still reads; an epilogue writes after the
    # loop, when its own reads are done (a GEMM that also writes x̂ from its epilogue was priced as
    # thrashing L2 at 128×256 tiles and took 128×128: 1.10 ms where 128×256 ran 0.84 on the H100)
    streamed_out = sum(out_bytes.values())
    for st in k.epilogue:
        out_bytes[st.target] = footprint(program, plan, st.target, st.axes, k)
    stored = sum(out_bytes.values())
    requested = c.bytes_loaded * programs
    c.tc += sum(flops / dev.tf32_efficiency(*key) for key, flops in c.tf32.items())
    f32 = None if memo is None else memo.get(("float32 tiles", k.name))
    if f32 is None:  # (whatever the schedule: once per kernel of a plan)
        f32 = ieee_tiled(k, plan, program)
        if memo is not None:
            memo["float32 tiles", k.name] = f32
    occ, spill = on_chip(k, sched, program, plan, bool(c.tc), f32)
    slots = dev.sms * occ
    again = None if memo is None else memo.get(("reread", k.name))
    if again is None:
        again = frozenset(reread(k, plan))
        if memo is not None:
            memo["reread", k.name] = again
    kept = frozenset() if sched.resident else again  # (lower/eviction.py keeps them in L2)
    hbm = hbm_reads(c.loaded, program, plan, k, sched, programs, slots, dev, loop_iters,
                     streamed_out / max(1, programs), c.sectors, kept) + stored
    t_mem = hbm / dev.hbm_bytes_per_s
    t_tc = c.tc * programs / (dev.tensor_flops * _mma_efficiency(k, sched, program, plan))
    if t_tc:
        t_tc *= mma_spill(k, sched, program, plan)
    c.alu += c.ieee / dev.fma_dot_efficiency  # (an IEEE dot's products: one FMA each)
    t_alu = c.alu * programs / dev.fma_per_s * spill
    t_sfu = c.sfu * programs / dev.sfu_per_s
    if serial:
        t_tc, t_alu = t_tc + t_alu, 0.0
    waves = math.ceil(programs / slots)
    # compute units: a program occupies its share of an SM; the last wave may be partly empty
    active = min(programs, slots)
    # a program alone on an SM runs at the SM's full rate; past one program per SM, waves quantise
    eff = programs / (waves * slots) if programs >= slots else min(programs, dev.sms) / dev.sms
    t_compute = [t / eff for t in (t_tc, t_alu, t_sfu)]
    # memory: each program keeps about a loop tile's loads per pipeline stage in flight (Little's
    # law: rate = bytes in flight / latency); the programs running together pull at most that each
    per_iter = c.bytes_loaded / max(1.0, iters_total)
    in_flight = per_iter * max(2, sched.num_stages) if iters_total > 1 else c.bytes_loaded
    rate = max(in_flight / dev.mem_latency_s, dev.sm_stream_bytes_per_s)
    bw = min(dev.hbm_bytes_per_s, active * rate)
    t_mem_eff = hbm / bw * (waves * active / programs if programs > slots else 1.0) * spill
    if _scalar_row(k, sched, program):
        t_mem_eff *= dev.scalar_row_slowdown  # (its accesses along the row scalar: DeviceSpec)
    terms = [t_mem_eff, *t_compute]
    t_l2 = l2_time(requested, c.bytes_loaded, c.ksteps, sched, iters_total, active, dev)
    if memo is None:
        depth, own, per_call = _data_bounded_chain(k, program, plan)
    else:
        if ("chain", k.name) not in memo:
            memo["chain", k.name] = _data_bounded_chain(k, program, plan)
        depth, own, per_call = memo["chain", k.name]
    per_call = per_call and sched.data_bounds  # (a schedule visiting every tile works out no table)
    chain = depth if own or per_call else 0
    if chain:
        # a loop bounded by the inputs' values (lower/databounds.py): the lengths are data, unknown
        # here. Priced under the prior that they spread evenly over [0, bound]: half the work on
        # average, but the kernel lasts as long as its longest program streaming its whole range,
        # each tile waiting on `chain` dependent loads (a page table, then the page), which
        # software pipelining cannot overlap (one in `stages` where the addresses are plain)
        terms = [t * _DATA_LENGTH_PRIOR for t in terms]
        t_l2 *= _DATA_LENGTH_PRIOR
        per_tile = dev.mem_latency_s * (chain if chain > 1 else 1 / max(2, sched.num_stages))
        terms.append(iters_total * per_tile)
    dominant = max(terms)
    # a resident program alone on its SM has no loop to pipeline and no other program to switch to:
    # its loads, its arithmetic and its stores follow one another
    overlap = 1.0 if sched.resident and occ == 1 else dev.overlap
    # L2 → SM delivery bounds the kernel when it takes longer than every unit (the others then overlap it)
    time = max(dominant, t_l2) + overlap * (sum(terms) - dominant)
    # a program's loop is a chain: each tile's update waits on the state of the one before — on its
    # loads (about one memory latency, whatever the tile's size) or on its reductions across warps
    # (a shared-memory exchange between barriers each), whichever is longer; the programs resident
    # together overlap their chains, a wave after another does not. It bounds kernels of small tiles
    # and many steps (H100, bench/sweep_unseen.py: cross-entropy over 50257 words split 16 ways into
    # 12 tiles of 256, 62 waves: 865 µs where its bytes take 275; 64 programs of 256 tiles down the
    # rows of 65536 × 1024 columns: 300 µs) — not attention or a GEMM, whose tiles take longer than
    # that on the tensor cores
    work = time
    t_chain = waves * (steps_chain + sched.resident) * dev.mem_latency_s
    time = max(time, t_chain) + dev.launch_s + (dev.data_bound_call_s if per_call else 0.0)
    latency = hbm / bw
    return KernelCost(k.name, programs, iters_total, hbm, requested + stored, c.tc * programs, c.alu * programs,
                      c.sfu * programs, t_mem, t_tc, t_alu, t_sfu, eff, latency, time, t_l2, t_chain, work)


# operations per element of a computed dot operand beside its arithmetic: a load from shared
# memory, two conversions and a store back (a bf16 scaled-operand GEMM measured 20 % slower than
# the plain one on the H100, bench/results/h100_2026-11-24/issue11/probe_gemm_operand.txt)
_OPERAND_TRIP = 4
# ... where the operand is computed from a 2-D tile loaded each K step (softmax probabilities from a
# float32 logits buffer, normalised rows from x) rather than from values already in registers (the
# scores of an inline dot): that tile cannot go from its asynchronous copy to the tensor cores.
# Measured on an H200 (2026-11-26, bench/results/h200_2026-11-26): linear cross-entropy's dH with
# P = e^(logits − m)·[t ≠ −100] recomputed per output tile ran 18.8 ms where 4 priced it at 5.0
# (the fit is ~88); its plan with P written once ran 1.6× faster. 32 ranks that plan first
# while keeping attention's backward, whose operands come from registers, at 4.
_LOADED_OPERAND_TRIP = 32
_DATA_LENGTH_PRIOR = 0.5  # the mean of lengths spread evenly over [0, bound], as a fraction of it
_SECTOR = 32  # bytes: the unit of a DRAM / L2 access


def _scalar_row(k: KernelPlan, sched: KernelSchedule, program: ir.Program) -> bool:
    """Does `k` hold a row whole (resident) over a dynamic axis that some tensor it reads or writes is
    contiguous along (its last index)? That tile's mask, by a length no constexpr, proves no alignment:
    its accesses run scalar (DeviceSpec.scalar_row_slowdown). Attention's keys held whole are no such
    row: their tiles are contiguous along the head dimension."""
    if not sched.resident:
        return False
    rows = {p.axis for p in k.passes()} & program.dynamic
    if not rows:
        return False
    stores = [st for p in k.passes() for st in p.stores] + list(k.epilogue)
    return any(st.axes and st.axes[-1] in rows for st in stores) or any(
        isinstance(n, ir.Load) and n.index and isinstance(n.index[-1], ir.Index) and n.index[-1].axis in rows
        for e in k.exprs() for n in ir.walk(e))


def _loads_tile(n: ir.Node, axis: str, block: set[str]) -> bool:
    """Does `n` read a 2-D tile over loop `axis` and a `block` axis of the program itself (not a row
    vector, nor inside a contraction it contains, whose result is in registers)?"""
    if isinstance(n, ir.Load):
        return axis in n.axes and bool(n.axes & block - {axis})
    return not isinstance(n, ir.Reduce) and any(_loads_tile(c, axis, block) for c in n.children())


def _data_bounded_chain(k: KernelPlan, program: ir.Program, plan: Plan) -> tuple[int, bool, bool]:
    """(chain, own, per_call) of kernel `k`, whatever its schedule: the longest chain of dependent loads
    its loop tiles read (1: plain addresses; 2: an address read from a page table; 0 where no loop is
    bounded by data) and lower/databounds.kernel_data_bounds's two answers."""
    from neptune_eq.kernel_terms import loop_loads
    from neptune_eq.lower.databounds import kernel_data_bounds

    own, per_call = kernel_data_bounds(k, plan, program)
    if not (own or per_call):
        return 0, False, False

    def depth(n: ir.Node) -> int:
        inner = [depth(m) for e in n.index for m in ir.walk(e) if isinstance(m, ir.Load)]
        return 1 + max(inner, default=0)

    return max((depth(ld) for ld in loop_loads(k, plan)), default=1), own, per_call


def _mma_efficiency(k: KernelPlan, sched: KernelSchedule, program: ir.Program, plan: Plan) -> float:
    """Fraction of the tensor-core rate an output tile of m × n sustains: each k-step reads
    (m + n)·k operand values from shared memory for m·n·k products, so small tiles starve the
    tensor cores on operand bandwidth (m·n / (m + n) ≥ 48 keeps them busy)."""
    g = gemm_axes(k, program)
    if g is not None:
        m, n = sched.tiles.get(g[0], 1), sched.tiles.get(g[1], 1)
    else:
        tiled = sorted((sched.tiles.get(a, 1) for a in k.grid if sched.tiles.get(a, 1) > 1), reverse=True)
        loops = [sched.tiles.get(p.axis, 1) for p in k.passes()]
        m = tiled[0] if tiled else 16
        n = max(loops, default=16)
    return min(1.0, max(0.1, m * n / (m + n) / 48))


def _dot_precision(core: ir.Node, k: str, grid, program: ir.Program, plan: Plan, sched: KernelSchedule) -> str:
    """How the lowering multiplies a tile contraction: "16-bit" on the tensor cores, or, for float32
    operands (lower/contract.tensor_core_dot), at the schedule's input precision: "ieee" on the FMA
    pipe (torch's default float32 matmul precision, and ours), "tf32" / "tf32x3" on the tensor cores.
    A float32 dot had been priced at the 16-bit tensor-core rate: CLIP's loss of `.float()` features
    recomputed its 8192² logits in four IEEE GEMMs and ran 124.9 ms against torch.compile's 6.7 (H100,
    session 64), and the cosine-retrieval plan dividing by q's running norm (an fp32 dot of 16-bit
    data) ran 213.6 ms against 0.29."""
    sides = gemm_sides(core, k, grid, program.axes)
    left, right = (list(sides.left), list(sides.right)) if sides is not None else (list(opened(core).factors), [])
    if tensor_core_dot(left, right, k, plan, program):
        return "16-bit"
    return "ieee" if compute_dtype(program) == "float64" else sched.input_precision


def _k_major_b(core: ir.Node, k: str, grid, program: ir.Program) -> bool:
    """Is the B operand [k, n] of the tile contraction Σ_k core one input load with k its contiguous
    axis (attention's Kᵀ; V[j, e] under P·V is not, nor is a computed operand)?"""
    sides = gemm_sides(core, k, grid, program.axes, conditions=True)
    if sides is None or len(sides.right) != 1 or not isinstance(sides.right[0], ir.Load):
        return False
    last = sides.right[0].index[-1] if sides.right[0].index else None
    return isinstance(last, ir.Index) and last.axis == k


def _has_state(e: ir.Node) -> bool:
    return any(isinstance(n, ir.StateRef) and n.running for n in ir.walk(e))


def plan_cost(plan: Plan, program: ir.Program, schedules: list[KernelSchedule], dev: DeviceSpec) -> Cost:
    return Cost([kernel_cost(plan, k, program, s, dev) for k, s in zip(plan.kernels, schedules)])


def priced_at(program: ir.Program) -> ir.Program:
    """The program the cost model prices plans at. A dynamic axis holds its bucket's bound B and
    serves every length in (B/2, B] (frontend/buckets.py): its plan is priced at three quarters
    of B, the mean of those lengths, not at the largest (a decode bucketed at 4096 and called at
    3000 took split-K 8 where 3000 itself takes 4: 1.28× the kernel time, H100). The schedules
    are still fitted at B, every length of the bucket must run them."""
    if not program.dynamic:
        return program
    return program.with_extents({a: max(2, 3 * program.axes[a] // 4) for a in program.dynamic})
