"""How a kernel plan runs: tile sizes per axis, warps and pipeline stages (the algorithm is in the plan).

Roles of axes in a kernel:
    batch   grid axis with tile 1 (a scalar index per program), e.g. batch and head
    row     grid axis tiled by a block (a vector dimension), e.g. the query axis
    loop    the axis a pass iterates over in tiles, e.g. the key axis
    inner   the axis of an inline contraction, held whole in one tile, e.g. the head dimension
A grid axis is a row axis when some tensor read in the kernel does not have it (so a tile of it
shares the other tensors' loads, like queries sharing keys); otherwise it is a batch axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from . import ir
from .block_bounds import (
    BLOCK_VALUES,
    MAX_BLOCK_VALUES,
    bound_blocks,
    cap_blocks,
    next_pow2,
    one_group_per_program,
    short_pass_rows,
)
from .contraction import is_product, opened
from .numeric import held_dtypes
from .plan import Combine, KernelPlan, Pass, Plan

# Float32 IEEE products run on the FMA pipe with both operands in registers, unrolled over the tile's
# K by Triton: ptxas's registers then follow none of extract/onchip.py's per-value rules. Fitted to
# ptxas -v of Triton 3.6 for sm_90 over 23 IEEE schedules of one kernel (fp32 attention's rolling pass:
# rows 16-128, keys 16-64, 2-16 warps, session 66, bench/probe_fp32_fused.py): of the 12 where each thread
# holds at most FMA_FRESH values of a fresh product (the scores), at most FMA_HELD of fresh and
# accumulated products together, and a computed operand (the probabilities) spans at most FMA_K of the
# contraction, 11 kept every value in registers and one took 8 bytes of stack; 10 of the 11 past a bound
# spilled (344-12424 bytes of stack).
FMA_FRESH = 8
FMA_HELD = 72
FMA_K = 32
# Both operands loaded (a K-loop of data), the products unrolled over the tile's K still outgrow the
# registers past 64: linear attention's training, Σᵢ φ(q)/z · dO per (batch, head), 64 × 64 tiles in
# 4 warps, K 128 took ~1.2 ms and K 64 ~0.25 (H100, session 76, bench/probe_ieee_kloop.py; priced alike
# at 174 µs before).
FMA_K_LOADED = 64


@dataclass(frozen=True)
class KernelSchedule:
    tiles: dict[str, int] = field(default_factory=dict)  # axis → block size (1 = scalar)
    num_warps: int = 4
    num_stages: int = 2
    input_precision: str = "ieee"  # for fp32 tl.dot: "ieee" | "tf32" | "tf32x3"
    fast_math: bool = False  # tanh.approx etc. on CUDA
    tma: bool = False  # input tiles through tensor descriptors (Hopper's bulk tensor copies)
    # unmasked loops as tl.range(..., warp_specialize=True) on CUDA. Opt-in, never a tuning candidate:
    # on an H100 with triton 3.6 it measured 2-4 % slower for attention, and NaN with 4 warps
    warp_specialize: bool = False
    steps: dict[str, int] = field(default_factory=dict)  # axis → rows per program when less than its tile
    # element offsets in 64 bits: a tensor spans more than 2^31 elements (its extents, or the strides
    # of a view); int32 offsets would wrap (see wide_index_needed)
    wide_index: bool = False
    # program order: the two tiled grid axes run in groups of `group` tiles of the first, so the
    # programs running together share operand tiles in L2 (a GEMM's A rows and B columns)
    group: int = 1
    # the loop axis is held whole on chip: every pass of the kernel runs on one tile, loaded once
    resident: bool = False
    # loops masked by comparisons of input values are bounded by a table the launcher works out on every
    # call (lower/databounds.py); False: every tile is visited and the mask evaluated per element — no
    # per-call work, and the launches bind to addresses. (Bounds a program works out itself are kept.)
    data_bounds: bool = True
    # the kernel is a plain matrix product run by the vendor's GEMM (cuBLAS through torch.matmul) instead
    # of generated Triton; its tiles then only describe it to the cost model (lower/library.py)
    library: bool = False

    def with_tiles(self, **tiles: int) -> KernelSchedule:
        return replace(self, tiles={**self.tiles, **tiles})

    def step(self, axis: str) -> int:
        """Programs advance along `axis` by this many indices (the tile may be padded beyond it)."""
        return self.steps.get(axis, self.tiles.get(axis, 1))

    def key(self) -> tuple:
        return (tuple(sorted(self.tiles.items())), self.num_warps, self.num_stages, self.input_precision,
                self.fast_math, tuple(sorted(self.steps.items())), self.tma, self.warp_specialize, self.wide_index,
                self.group, self.resident, self.data_bounds, self.library)


def kernel_exprs(k: KernelPlan, plan: Plan, phases=None) -> list[ir.Node]:
    """Every expression kernel `k` evaluates (or, given `phases`, those phases alone): computations,
    masks, stores, the epilogue's stores, and the inlined values they refer to."""
    exprs = []
    for ph in k.phases if phases is None else phases:
        src = ph.source if isinstance(ph, Combine) else ph
        for c in src.comps:
            exprs += [c.core] + ([c.mask] if c.mask is not None else [])
        if isinstance(ph, Pass):
            exprs += [s.expr for s in ph.stores]
    if phases is None:
        exprs += [s.expr for s in k.epilogue]
    return with_inlined(exprs, plan)


def with_inlined(exprs: list[ir.Node], plan: Plan) -> list[ir.Node]:
    """`exprs` and the inlined values they refer to (transitively)."""
    exprs = list(exprs)
    for e in exprs:
        for n in e.refs:
            if n.kind is ir.RefKind.INLINE and n.name in plan.inline:
                exprs.append(plan.inline[n.name])
    return exprs


def loads_in(k: KernelPlan, plan: Plan) -> list[ir.Load]:
    return [n for e in kernel_exprs(k, plan) for n in e.loads]


def loop_loads(k: KernelPlan, plan: Plan, program: ir.Program | None = None) -> list[ir.Load]:
    """The loads of `k` that vary over one of its loop axes (the tensors streamed by its passes); given
    `program`, over its longest loop axis alone (the main pass: attention's backward streams keys for
    dQ after a pass over the head dimension that reads dO and O for D, which says nothing of its rows)."""
    loop_axes = {p.axis for p in k.passes()}
    if program is not None and loop_axes:
        longest = max(program.axes[a] for a in loop_axes)
        loop_axes = {a for a in loop_axes if program.axes[a] == longest}
    return [ld for ld in loads_in(k, plan) if ld.axes & loop_axes]


def inner_axes(k: KernelPlan, plan: Plan) -> set[str]:
    """Axes of the inline contractions the kernel uses. (A split-K combine folds its pass's chunk states
    with their corrections: the inline values of the pass's cores were summed by the partial kernel.
    Counted, they held a combine's row whole, one program for the weight gradient of a 4096-wide
    RMSNorm folded into its row pass, extract/fold_rows.py.)"""
    exprs = kernel_exprs(k, plan, [ph for ph in k.phases if not isinstance(ph, Combine)])
    exprs += [s.expr for s in k.epilogue]
    for ph in k.phases:
        if isinstance(ph, Combine):
            exprs += [e for c in ph.source.comps for e in (c.corr, *(h for _, h in c.affine)) if e is not None]
    used = {n.name for e in with_inlined(exprs, plan) for n in e.refs
            if n.kind is ir.RefKind.INLINE and n.name in plan.inline}
    return {a for name in used for a in plan.inline[name].reduced_axes}


def sums_whole(k: KernelPlan, plan: Plan, program: ir.Program, sched: KernelSchedule) -> bool:
    """Does every program of `k` under `sched` hold whole each grid axis an inline reduction sums
    (Σ_i x[i, d]·rsqrt(Σ_d x[i, d]²) into [d])? The reduction sums the axis where the tile holds it."""
    return all(min(sched.tiles.get(a, 1), sched.step(a)) >= program.axes[a]
               for a in inner_axes(k, plan) & set(k.grid))


def grouped_axes(k: KernelPlan, program: ir.Program, plan: Plan) -> dict[str, int]:
    """Grid axes that the tensors read in loops see only as `a // G` (grouped-query heads): G rows of
    `a` share one slice of those tensors, so a program can take a group of G rows (loading the
    shared slice once)."""
    groups: dict[str, set[int]] = {}
    plain: set[str] = set()
    for ld in loop_loads(k, plan, program):
        for e in ld.index:
            got = ir.grouped_index(e)
            if got is not None and got[1] > 1:
                groups.setdefault(got[0], set()).add(got[1])
            else:
                plain |= e.axes
    return {a: g.pop() for a, g in groups.items() if len(g) == 1 and a not in plain and a in k.grid}


def row_axes(k: KernelPlan, program: ir.Program, plan: Plan) -> list[str]:
    """Grid axes worth a vector tile, the query-like ones first, longest first: axes that no tensor read
    in a loop has (queries share every key tile; the query heads of a kv group, regrouped for training,
    share them too but are few: the queries are the tile), then axes some such tensor lacks (the value
    dimension)."""
    loads = loop_loads(k, plan, program)
    axes = [a for a in k.grid if program.axes[a] > 1]
    primary = sorted((a for a in axes if loads and all(a not in ld.axes for ld in loads)),
                     key=lambda a: -program.axes[a])
    secondary = [a for a in axes if a not in primary and any(a not in ld.axes for ld in loads)]
    return primary + secondary


def default_schedule(k: KernelPlan, program: ir.Program, plan: Plan) -> KernelSchedule:
    if not k.phases and k.epilogue and not inner_axes(k, plan):
        return _map_schedule(k, program)
    tiles: dict[str, int] = {a: 1 for a in k.grid}
    steps: dict[str, int] = {}
    rows = row_axes(k, program, plan)
    has_dot = bool(inner_axes(k, plan))
    loads = loop_loads(k, plan, program)
    primary = [a for a in rows if all(a not in ld.axes for ld in loads)]
    tensors = {ld.tensor: ld for ld in loads}.values()  # each streamed tensor once
    grouped = {a: g for a, g in grouped_axes(k, program, plan).items() if g > 1 and program.axes[a] % g == 0}
    if not primary and has_dot and not grouped:
        # a query axis that one streamed tensor also has (a bias over (heads, queries, keys)): most
        # of the streamed tensors lack it, so a tile of it still shares their loads
        primary = [a for a in rows if program.axes[a] >= 16
                   and 2 * sum(a not in ld.axes for ld in tensors) > len(tensors)][:1]
    if primary:
        tiles[primary[0]] = min(128, max(16 if has_dot else 1, next_pow2(program.axes[primary[0]])))
    else:
        # no query-like axis (decode): stack a group of grouped-query heads as the rows, so the
        # key/value tile of their shared head is loaded once (padded to 16 rows for tl.dot); this
        # before a value dimension that a page table's load lacks looks query-like
        for a, g in grouped.items():
            steps[a] = g
            tiles[a] = max(16 if has_dot else 1, next_pow2(g))
            primary = [a]
            break
        if not primary and has_dot:
            # a single query row (decode): pad one head's row to a 16-row tile so the products
            # run on tensor cores; the key/value tiles of that head are loaded once
            inner = inner_axes(k, plan)  # (an axis an inline reduction sums is held whole: no step)
            for a in k.grid:
                if a not in inner and program.axes[a] > 1 and all(
                        any(isinstance(e, ir.Index) and e.axis == a for e in ld.index) for ld in loads):
                    steps[a] = 1
                    tiles[a] = 16
                    primary = [a]
                    break
    # a further row axis (e.g. the value dimension of attention) is held whole when it is small
    # (not a batch axis only some small tensor lacks: a bias shared by the batch; a vector along the
    # loop axis alone, LayerNorm's γ and β, is broadcast to every row and does not count)
    # — in a tensor-core kernel by count and by size: RoPE's cos and sin [keys, d] beside K and V [batch,
    # heads, keys, d] are half the streamed tensors but a sliver of their bytes; holding the batch and
    # heads whole for them made the scores a 5-D block on the ALUs, not a dot (1.86 s against 0.2 ms on
    # the H100). (Without a dot a row held whole shares a small row's loads: decode's scores beside V.)
    loop_axes = {p.axis for p in k.passes()}
    wide = [ld for ld in tensors if ld.axes - loop_axes]
    size = {ld: math.prod(program.axes[a] for a in ld.axes) for ld in wide}
    for a in rows:
        if a not in primary and tiles[a] == 1 and 2 * sum(a not in ld.axes for ld in wide) >= len(wide) > 0 \
                and (not has_dot or 2 * sum(size[ld] for ld in wide if a not in ld.axes) >= sum(size.values())):
            n = program.axes[a]
            tiles[a] = next_pow2(n) if n <= 256 else 64
    for p in k.passes():  # (16 at least for a tl.dot; without one, a short axis is not padded: the 4
        n = program.axes[p.axis]  # query heads of a kv group summed in 16-wide masked tiles)
        if p.axis not in tiles:
            tiles[p.axis] = min(64 if has_dot else 256, max(16 if has_dot else 1, next_pow2(n)))
    for a in sorted(inner_axes(k, plan), key=list(program.axes).index):
        tiles[a] = max(16, next_pow2(program.axes[a]))
    if not has_dot:
        one_group_per_program(tiles, k)
        bound_blocks(tiles, k)
        short_pass_rows(tiles, k, program)
    stages = 3 if has_dot else 2
    if has_dot and primary and tiles[primary[0]] > 64 and not steps:
        # the fp32 accumulator tiles a row carries (a row's scalars, softmax's max and sum, aside): past
        # 128 values (dK and dV of head dim 128 together) 64 rows in 4 warps, two stages, not 128 rows
        # in 8 warps, three stages (12.3 against 15.6 ms on attention's dK/dV pass on the H100; three
        # stages at 64 rows: 22 ms); the forward's one [rows, 128] output tile keeps 128 rows (5.2 ms
        # against 6.3 at 64 rows, causal L = 16384)
        p0 = primary[0]
        carried = sum(math.prod(tiles.get(a, 1) for a in c.free if a != p0)
                      for ps in k.passes() for c in ps.comps if p0 in c.free and len(c.free) > 1
                      and any(tiles.get(a, 1) > 1 for a in c.free if a != p0))
        if carried > 128:
            tiles[p0], stages = 64, 2
    for a in inner_axes(k, plan) & set(k.grid):  # (an inline reduction over a grid axis: held whole)
        steps.pop(a, None)
    sched = KernelSchedule(tiles, num_warps=4, num_stages=stages, steps=steps)
    if has_dot:
        sched = fit_shared(sched, k, program, plan, primary)
        sched = _wide_rolling_steps(sched, k, program, plan, primary)
    capped = cap_blocks(sched.tiles, kernel_exprs(k, plan), k, inner_axes(k, plan), set(sched.steps),
                        16 if has_dot else 1, MAX_BLOCK_VALUES if has_dot else BLOCK_VALUES)
    sched = sched if capped == sched.tiles else replace(sched, tiles=capped)
    # 8 warps for 128 rows of tensor-core tiles, 4 for fewer (8 warps over 64 rows measured 2.6× slower
    # on attention's dQ pass, bench/results/h100_2026-11-24/issue13/bwd_variants*.json)
    big = max((sched.tiles.get(a, 1) for a in primary), default=1)
    return replace(sched, num_warps=8) if has_dot and big >= 128 else sched


MAP_BLOCK = 4096  # elements a program of a map kernel writes: 32 a thread of 4 warps, in vectors of 8


def _map_schedule(k: KernelPlan, program: ir.Program) -> KernelSchedule:
    """A kernel of elementwise outputs alone (RoPE's rotated q and k written for the training core): tiles
    of its stored tensor's last axes, innermost first, up to MAP_BLOCK elements, rather than one element
    a program (16.8 M programs for a [4, 16, 2048, 128] map)."""
    tiles = {a: 1 for a in k.grid}
    room = MAP_BLOCK
    out = k.epilogue[0].axes
    across = _transposed_read(k, program, out[-1]) if out else None
    if across is not None:
        # a read whose contiguous axis is another (a [i, e] statistic written as an [e, i] GEMM operand):
        # square tiles of both, whole sectors read and written, where a tile along the store's axis alone
        # read one value of each 32-byte sector (SwiGLU's saved pre-activations: 1.5 GB for 0.23)
        side = min(TRANSPOSE_TILE, next_pow2(program.axes[out[-1]]), next_pow2(program.axes[across]))
        tiles[out[-1]] = tiles[across] = side
        return KernelSchedule(tiles, num_warps=4, num_stages=1)
    tiles.update(_grown(program, [a for a in reversed(out)], set(tiles), room))
    return KernelSchedule(tiles, num_warps=4, num_stages=1)


def _grown(program: ir.Program, axes: list[str], allowed: set[str], room: int) -> dict[str, int]:
    """Tiles for `axes` in order, each its extent (to a power of two) or what is left of `room` values a
    program, stopping at the first axis not `allowed` or when fewer than two values are left."""
    out = {}
    for a in axes:
        if a not in allowed or room < 2:
            break
        out[a] = min(next_pow2(program.axes[a]), room)
        room //= out[a]
    return out


TRANSPOSE_TILE = 64  # 64 × 64 elements: MAP_BLOCK in a square


def _transposed_read(k: KernelPlan, program: ir.Program, inner: str) -> str | None:
    """A grid axis other than `inner` (the stored tensor's contiguous axis) that some load of the map
    reads as its own contiguous axis, over more than a sector's values; None if every load agrees."""
    for st in k.epilogue:
        for n in ir.walk(st.expr):
            if (isinstance(n, ir.Load) and n.index and isinstance(n.index[-1], ir.Index)
                    and (a := n.index[-1].axis) != inner and a in k.grid and program.axes[a] >= 16
                    and any(isinstance(e, ir.Index) and e.axis == inner for e in n.index)):
                return a
    return None


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


def _wide_rolling_steps(sched: KernelSchedule, k: KernelPlan, program: ir.Program, plan: Plan,
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


INT32_MAX = 2**31 - 1


def wide_index_needed(program: ir.Program, plan: Plan) -> bool:
    """Do contiguous tensors of this program's extents need 64-bit element offsets (or loop
    counters: the last tile of an axis near 2^31 steps past int32)? Strided views are checked again
    at launch (lower/launch.py)."""
    sizes = [math.prod(program.axes[a] for a in t.axes) for t in program.inputs.values()]
    sizes += [math.prod(program.axes[a] for a in o.axes) for o in program.outputs]
    chunks = max((k.chunks for k in plan.kernels), default=1)  # the extent of a split-K state's CHUNK axis
    sizes += [math.prod(chunks if a is ir.CHUNK else program.axes[a] for a in b.axes) for b in plan.buffers.values()]
    return max(sizes, default=0) > INT32_MAX or max(program.axes.values(), default=0) + 1024 > INT32_MAX


def plan_schedules(plan: Plan, program: ir.Program) -> list[KernelSchedule]:
    """Default schedules for every kernel of a plan. A split-K combine kernel tiles its grid like the
    partial kernel whose states it folds (it has no loads of its own to infer row axes from)."""
    out: list[KernelSchedule] = []
    wide = wide_index_needed(program, plan)
    for k in plan.kernels:
        s = replace(default_schedule(k, program, plan), wide_index=wide)
        if out and any(isinstance(ph, Combine) for ph in k.phases):
            prev = out[-1]
            s = replace(s.with_tiles(**{a: prev.tiles[a] for a in k.grid if a in prev.tiles}),
                        steps={a: v for a, v in prev.steps.items() if a in k.grid})
            s = _combine_store_tiles(k, program, s, set(prev.tiles))
        out.append(s)
    return out


def _combine_store_tiles(k: KernelPlan, program: ir.Program, s: KernelSchedule, partial: set[str]) -> KernelSchedule:
    """A combine kernel storing over axes its partial states lack (linear attention's key gradient
    [b, h, j, d] from states over [b, h, d]) tiles them too, innermost of the store first, up to
    MAP_BLOCK values a program: one key a program had made 262144 programs of 64 values, 223.6 µs on the
    H100 (session 76) for what one pass of 32 MiB moves; the chunks' states are folded again per program,
    a few loads from L2."""
    room = MAP_BLOCK // max(1, math.prod(s.tiles.get(a, 1) for a in k.grid))
    axes = list(dict.fromkeys(a for st in k.epilogue for a in reversed(st.axes)
                              if a in k.grid and a not in partial and s.tiles.get(a, 1) == 1))
    grow = _grown(program, axes, set(axes), room)
    return s.with_tiles(**grow) if grow else s


def grouped_pair(k: KernelPlan, sched: KernelSchedule, heavy: set[str] = frozenset()) -> tuple[str, str] | None:
    """The two tiled grid axes whose programs run in groups (sched.group > 1), first the grouped one:
    None unless the kernel tiles exactly two grid axes and neither orders its programs by work."""
    if sched.group <= 1:
        return None
    tiled = [a for a in k.grid if sched.tiles.get(a, 1) > 1]
    if len(tiled) != 2 or set(tiled) & set(heavy):
        return None
    return tiled[0], tiled[1]
