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
from .kernel_terms import inner_axes, kernel_exprs, loop_loads
from .plan import Combine, KernelPlan, Plan
from .shared_memory import fit_shared, wide_rolling_steps

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
        sched = wide_rolling_steps(sched, k, program, plan, primary)
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
