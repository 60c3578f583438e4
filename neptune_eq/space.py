"""The schedule space: the ways one kernel plan can run. Each is a KernelSchedule of a named kind;
the cost model prices every (plan, schedule) pair and the explorer lists them side by side.

Kinds, per kernel (which apply follows from the kernel's passes, loads and extents, never from
what the program is called):

    streamed   the loop axis in tiles; query-like axes tiled (attention), others one per program
    rows       several rows of a batch-like axis per program, for rows too narrow to fill one
    resident   the loop axis held whole on chip: every pass of the kernel runs on one tile, so a
               row is read once however many passes use it (softmax: max, sum and store)
    2-D        a contraction over the loop axis into two large grid axes (a norm feeding a matmul,
               attention's P·V): 2-D output tiles, the loop pipelined over K tiles, programs grouped
               so that the ones running together share operand tiles in L2
    kloop      an inline contraction over a long axis runs as a nested K-loop where it is used
               (the hidden axis of linear cross-entropy inside the pass over the vocabulary)

A kernel whose loop a table worked out per call would bound (a mask comparing input values:
lower/databounds.py) is also offered each of its schedules with every tile visited instead
(KernelSchedule.data_bounds=False): the table costs the call its work whatever the data, and pays
only where the data leave tiles out (packed documents), not for a one-hot count over random ids.

Tile sizes, warps and stages within a kind are then the autotuner's (tune.py).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from . import ir
from .block_bounds import next_pow2
from .kernel_terms import inner_axes, kernel_exprs, loop_loads
from .lower.contract import float32_products
from .lower.library import library_gemm
from .plan import Combine, KernelPlan, Plan
from .schedule import FMA_FRESH, FMA_K, KernelSchedule, row_axes, sums_whole
from .shared_memory import SHARED_BUDGET, shared_bytes

# the most elements of one loop tile a program keeps on chip: 64K 16-bit values are half the
# registers of an SM (32 warps); whether a row of a given kernel fits is the cost model's
# (extract/onchip.py: what it keeps across its passes, and at what width)
RESIDENT_MAX = 65536
# the widest streamed loop tile of a kernel without tensor cores: 16 values a thread of 32 warps
WIDE_TILE = 16384
# an inline contraction over an axis longer than this runs as a K-loop (a whole tile would spill)
WHOLE_INNER_MAX = 256
KLOOP_TILE = 64
# (128 × 128 in four stages: linear cross-entropy's dW over a chunk of 2048 tokens ran 4.32 ms against
# 5.05 in three and 7.88 in two, H200, bench/probe_dw_stages.py)
GEMM_TILES = ((128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4),
              (64, 64, 64, 4, 3))
GEMM_GROUP = 8
# GEMM tiles for a kernel whose epilogue also spans other tiled grid axes, and the block they may make
EPILOGUE_GEMM_TILES = ((16, 16, 16, 4, 2), (32, 32, 32, 4, 2), (16, 64, 16, 4, 2))
EPILOGUE_BLOCK = 8192  # values a 4-warp program's epilogue block holds: 64 a thread
COLUMNS = 64  # a column-reading program's rows and loop tile: 64 fp32 values are 8 memory sectors


@dataclass(frozen=True)
class Variant:
    kind: str  # what the explorer shows, e.g. "2-D 128×128, K-tile 64, grouped 8"
    schedule: KernelSchedule


def gemm_axes(k: KernelPlan, program: ir.Program) -> tuple[str, str, str] | None:
    """(m, n, k) when a pass of `k` is a contraction over its loop axis k into two grid axes m and n
    of at least 16 (a GEMM whose A operand is [m, k] and B operand [k, n]), else None."""
    for ps in k.passes():
        if ps.split > 1:  # (allowing it: correct, but the model then moved attention with a bias tensor
            continue      # to a split-K 2-D plan, unmeasured; session 33)
        for c in ps.comps:
            if c.op != "sum":
                continue
            loads = [n for n in c.core.loads if ps.axis in n.axes]
            grid = [a for a in k.grid if program.axes[a] >= 16 and a in c.core.axes]
            for m in grid:
                for n in grid:
                    if m != n and any(m in ld.axes and n not in ld.axes for ld in loads) and any(
                            n in ld.axes and m not in ld.axes for ld in loads):
                        return m, n, ps.axis
    return None


def gemm_tiles(program: ir.Program, axes: tuple[str, str, str], tiles: tuple[int, int, int]) -> dict[str, int]:
    """The tiles (m, n, k) of a GEMM schedule, each cut to its axis (a power of two, at least 16)."""
    return {a: min(t, max(16, next_pow2(program.axes[a]))) for a, t in zip(axes, tiles)}


def _resident_axis(k: KernelPlan, plan: Plan, program: ir.Program) -> str | None:
    """The one loop axis of a kernel whose passes could all run on one tile of it."""
    passes = k.passes()
    if not passes or any(isinstance(ph, Combine) for ph in k.phases) or any(p.split > 1 for p in passes):
        return None
    axes = {p.axis for p in passes}
    if len(axes) != 1 or inner_axes(k, plan):
        return None
    axis = axes.pop()
    return axis if next_pow2(program.axes[axis]) <= RESIDENT_MAX else None


def _batch_rows(k: KernelPlan, program: ir.Program, base: KernelSchedule) -> str | None:
    """A grid axis run one index per program that could take several per program (the rows of a
    row-wise reduction): the last such axis with more than one index."""
    cands = [a for a in k.grid if base.tiles.get(a, 1) == 1 and program.axes[a] > 1 and a not in base.steps]
    return cands[-1] if cands else None


def _column_reads(k: KernelPlan, plan: Plan, rows: str) -> bool:
    """Does a loop of `k` stream a tensor whose contiguous (last) axis is `rows`, the grid axis a
    program takes one index of by default?"""
    loops = {p.axis for p in k.passes()}
    return any(isinstance(ld.index[-1], ir.Index) and ld.index[-1].axis == rows and ld.axes & loops
               for ld in loop_loads(k, plan))


def _warps(elements: int) -> int:
    """Warps for a tile of `elements` values: about 32 per thread, 4 to 32 warps."""
    w = 4
    while w < 32 and elements // (32 * w) > 32:
        w *= 2
    return w


def kernel_variants(k: KernelPlan, plan: Plan, program: ir.Program, base: KernelSchedule,
                    precisions: tuple[str, ...] = ("ieee",)) -> list[Variant]:
    """The schedules kernel `k` may run with, the default (`base`, with long inline contractions as
    K-loops) first; a schedule whose tiles overflow shared memory runs with fewer pipeline stages,
    or is not offered if even two do not fit (the default is always kept). A kernel multiplying
    float32 values in tiles gets each of its schedules at every float32 product precision of
    `precisions` (Options.float32_products)."""
    out = []
    for n, v in enumerate(_kernel_variants(k, plan, program, base)):
        s = v.schedule
        while s.num_stages > 2 and shared_bytes(k, program, plan, s) > SHARED_BUDGET:
            s = replace(s, num_stages=s.num_stages - 1)
        if n == 0 and not s.resident:  # (a resident row's tile is the row)
            s = _fit_shared(k, plan, program, s)
        if n == 0 and plan.folded and not sums_whole(k, plan, program, s):
            # a folded kernel's default may cut the row it sums (LayerNorm's backward: d in 256-wide tiles
            # beside 64 rows): its default is then one row a step, held whole
            v = next(iter(_whole_rows(k, plan, program, base)), v)
            s = v.schedule
        if n and not sums_whole(k, plan, program, s):
            continue
        if n == 0 or s.resident or shared_bytes(k, program, plan, s) <= SHARED_BUDGET:
            out.append(Variant(v.kind, s))
    from .lower.databounds import kernel_data_bounds

    if kernel_data_bounds(k, plan, program)[1]:
        out += [Variant(f"{v.kind}, every tile", replace(v.schedule, data_bounds=False)) for v in out]
    return _with_precisions(k, plan, program, out, precisions)


PRECISION_LABELS = {"ieee": "IEEE", "tf32": "TF32", "tf32x3": "TF32×3"}


def _with_precisions(k: KernelPlan, plan: Plan, program: ir.Program, out: list[Variant],
                     precisions: tuple[str, ...]) -> list[Variant]:
    """`out` at each float32 product precision of `precisions` where `k` multiplies float32 tiles
    (lower/contract.float32_products): IEEE on the FMA pipe (the schedules' default, torch's float32
    matmul precision), TF32×3 on the tensor cores (each operand split into a TF32 value and its
    TF32 remainder, three products: about float32's accuracy, how SDPA's float32 kernel multiplies),
    TF32 (10 bits of mantissa: only where the user allows it). The cost model ranks them."""
    if not ieee_tiled(k, plan, program):
        return out
    fixed = [v for v in out if v.schedule.library]  # (the vendor's GEMM follows torch's own setting)
    gen = [v for v in out if not v.schedule.library]
    ieee = gen + fma_tiles(k, plan, program, gen)
    return [Variant(v.kind if p == "ieee" else f"{v.kind}, {PRECISION_LABELS[p]} products",
                    replace(v.schedule, input_precision=p)) for p in precisions
            for v in (ieee if p == "ieee" else gen)] + fixed


def ieee_tiled(k: KernelPlan, plan: Plan, program: ir.Program) -> bool:
    """Does `k` multiply float32 tiles (not on the 16-bit tensor cores)?"""
    axes = {*k.grid, *(p.axis for p in k.passes()), *inner_axes(k, plan)}
    return float32_products(_products(k, plan), axes, plan, program)


def fma_tiles(k: KernelPlan, plan: Plan, program: ir.Program, out: list[Variant]) -> list[Variant]:
    """Streamed schedules whose float32 IEEE products fit the registers ptxas gives them
    (schedule.FMA_*): loop tiles of FMA_K or half, as many rows as leave FMA_FRESH scores a thread.
    (fp32 attention's 128 × 64 tiles in 8 warps spilled 7 KB a thread and ran 300 ms against SDPA's 6.)"""
    rows = [a for a in row_axes(k, program, plan) if out and out[0].schedule.tiles.get(a, 1) > 1
            and a not in out[0].schedule.steps][:1]
    loops = [p.axis for p in k.passes()]
    if not rows or not loops or not inner_axes(k, plan):
        return []
    fitted = []
    for v in out:
        t = v.schedule.tiles
        if not v.kind.startswith("streamed") or t.get(rows[0], 1) <= 1:
            continue
        for lt, warps in ((FMA_K, 4), (FMA_K, 8), (FMA_K // 2, 4), (FMA_K // 2, 8)):
            # (smaller tiles only: the block caps of the default hold)
            r = min(FMA_FRESH * 32 * warps // lt, t[rows[0]])
            s = replace(v.schedule.with_tiles(**{rows[0]: r}, **{a: min(lt, t.get(a, lt)) for a in loops}),
                        num_warps=warps, num_stages=2)
            if s.key() not in {f.schedule.key() for f in fitted} and s.key() != v.schedule.key():
                fitted.append(Variant(f"{v.kind}, FMA tiles {r}×{min(lt, t.get(loops[0], lt))}", s))
    return fitted


def _products(k: KernelPlan, plan: Plan) -> list[ir.Node]:
    """Every expression of `k`, a pass's sums as reductions over its axis (so that a pass's own
    contraction, attention's P·V, is seen as one)."""
    sums = [ir.Reduce("sum", p.axis, c.core) for p in k.passes() for c in p.comps if c.op == "sum"]
    return kernel_exprs(k, plan) + sums


def _epilogue_fit(base: KernelSchedule, extra: list[str], gemm_block: int) -> dict[str, int]:
    """The `extra` grid axes' tiles halved, largest first (not under 16), until the epilogue's block
    (the GEMM tile times theirs) holds EPILOGUE_BLOCK values or fewer."""
    tiles = {a: base.tiles[a] for a in extra}
    while gemm_block * math.prod(tiles.values()) > EPILOGUE_BLOCK:
        a = max(tiles, key=tiles.get)
        if tiles[a] <= 16:
            break
        tiles[a] //= 2
    return tiles


def _fit_shared(k: KernelPlan, plan: Plan, program: ir.Program, s: KernelSchedule) -> KernelSchedule:
    """The default schedule with its largest tile that is free to shrink (not held whole for an inline
    reduction, not stepped, above 16) halved until its shared memory fits: the default is kept, and
    kept it must run (SigLIP's saved backward held d = 768 whole in 1024-wide tiles beside 64 rows:
    262 KB, which no launch on Hopper accepts)."""
    whole = inner_axes(k, plan)
    while shared_bytes(k, program, plan, s) > SHARED_BUDGET:
        free = [a for a, t in s.tiles.items() if t > 16 and a not in whole and a not in s.steps]
        if not free:
            break
        a = max(free, key=lambda a: s.tiles[a])
        s = s.with_tiles(**{a: s.tiles[a] // 2})
    return s


def _kernel_variants(k: KernelPlan, plan: Plan, program: ir.Program, base: KernelSchedule) -> list[Variant]:
    out = _kinds(k, plan, program, base)
    contiguous = {ld.index[-1].axis for ld in loop_loads(k, plan) if isinstance(ld.index[-1], ir.Index)}
    held = {a: 1 for a in k.grid if base.tiles.get(a, 1) > 1 and a not in base.steps and a not in contiguous}
    if held and k.passes() and not inner_axes(k, plan) and gemm_axes(k, program) is None:
        # a loop without tensor cores: a grid axis held whole to share a small tensor's loads among its rows
        # (group norm's batch, beside its per-channel weights) also runs one index a program: more
        # programs, each streaming its own row (not an axis the loop reads contiguously: a program
        # would read narrower rows)
        out += [Variant(f"{v.kind}, {'/'.join(held)} apart", v.schedule)
                for v in _kinds(k, plan, program, base.with_tiles(**held))]
    return out


def _kinds(k: KernelPlan, plan: Plan, program: ir.Program, base: KernelSchedule) -> list[Variant]:
    base = _with_kloops(k, plan, program, base)
    out = [Variant("streamed" + _kloop_label(k, plan, program, base), base)]
    loops = [p.axis for p in k.passes()]
    if _kloop_label(k, plan, program, base) and loops:
        # a K-loop per loop tile is a GEMM per tile: wider loop tiles feed the tensor cores better, and
        # taller row tiles read the streamed operand from L2 fewer times (each program reads all of it);
        # three stages keep two K steps in flight (H200, linear cross-entropy's logits K-loop at 64 ×
        # 256 × 64: 31.1 ms with two stages, 17.4 with three; 128 rows 13.4)
        rows = [a for a in k.grid if 1 < base.tiles.get(a, 1) < 128 and a not in base.steps
                and program.axes[a] >= 128]
        for rt in (None, *rows[:1]):
            for lt in (128, 256):
                if lt > base.tiles.get(loops[0], 1) and program.axes[loops[0]] >= lt:
                    s = replace(base.with_tiles(**{a: lt for a in loops}, **({rt: 128} if rt else {})),
                                num_warps=8, num_stages=max(3, base.num_stages))
                    label = f"streamed {lt}" + (" × 128 rows" if rt else "")
                    out.append(Variant(label + _kloop_label(k, plan, program, s), s))
    g = gemm_axes(k, program)
    if g is not None:
        m, n, kk = g
        seen = set()
        # other tiled grid axes (the spatial axis an SE gate's product broadcasts over) multiply the
        # epilogue's block: GEMM tiles small enough to keep it on chip, those axes cut to fit
        held = {a for ps in k.passes() for c in ps.comps for a in c.free}
        extra = [a for a in k.grid if a not in g and a not in held and base.tiles.get(a, 1) > 1]
        for bm, bn, bk, warps, stages in GEMM_TILES + (EPILOGUE_GEMM_TILES if extra else ()):
            tiles = gemm_tiles(program, g, (bm, bn, bk))
            if extra and (bm, bn, bk, warps, stages) in EPILOGUE_GEMM_TILES:
                tiles |= _epilogue_fit(base, extra, tiles[m] * tiles[n])
            key = tuple(tiles.values())
            if key in seen:
                continue
            seen.add(key)
            s = replace(base.with_tiles(**tiles), num_warps=warps, num_stages=stages, group=GEMM_GROUP)
            out.append(Variant(f"2-D {tiles[m]}×{tiles[n]}, K-tile {tiles[kk]}, grouped {GEMM_GROUP}", s))
        if library_gemm(k, plan, program) is not None:  # nothing fused into the product: the vendor's GEMM
            s = replace(base.with_tiles(**gemm_tiles(program, g, GEMM_TILES[1][:3])), library=True)
            out.append(Variant("library GEMM (torch.matmul)", s))
        return out
    axis = _resident_axis(k, plan, program)
    rows = _batch_rows(k, program, base)
    if any(t > 1 for a, t in base.tiles.items() if a in k.grid):
        # rows of a kernel that already tiles a grid axis (attention's value dimension) would make
        # 3-D blocks (rows × keys × values) that are no tensor-core tile: not offered
        axis = rows = None
    if axis is not None:
        n = next_pow2(program.axes[axis])
        rs = [1]
        if rows is not None:
            r = 1
            while r * 2 * n <= 4096 and r * 2 <= next_pow2(program.axes[rows]):
                r *= 2
            rs = sorted({1, r, min(r * 2, max(1, RESIDENT_MAX // n))})
        for r in rs:
            if r * n > RESIDENT_MAX or (r > 1 and rows is None):
                continue
            tiles = {axis: n, **({rows: r} if rows is not None else {})}
            s = replace(base.with_tiles(**tiles), num_warps=_warps(r * n), num_stages=1, resident=True)
            out.append(Variant(f"resident {r} row{'s' if r > 1 else ''} × {n}", s))
    loops = {p.axis for p in k.passes()}
    if rows is not None and loops and not inner_axes(k, plan):
        n = min(next_pow2(max(program.axes[a] for a in loops)), 1024)
        r = max(2, 4096 // n)
        if r <= next_pow2(program.axes[rows]):
            s = replace(base.with_tiles(**{rows: r}, **{a: n for a in loops}), num_warps=_warps(r * n))
            out.append(Variant(f"rows {r} × {n}", s))
        if _column_reads(k, plan, rows):
            # the rows are the contiguous axis of what the loop streams (a sum over the rows of x[i, d]
            # into [d]: a norm weight's or a bias's gradient): a program takes enough of them for whole
            # memory sectors, the loop a short tile — or a tall one: each loop step waits on a reduction
            # across the warps, so a long column (softmax over a middle axis, 4096 rows) is a chain of
            # fewer, larger steps at 4 × 64 rows
            r = min(COLUMNS, next_pow2(program.axes[rows]))
            n = max(program.axes[a] for a in loops)
            for lt, warps in ((COLUMNS, 4), (4 * COLUMNS, 8)):
                if lt == COLUMNS or n >= 2 * lt:
                    s = replace(base.with_tiles(**{rows: r}, **{a: lt for a in loops}), num_warps=warps,
                                num_stages=3)
                    out.append(Variant(f"columns {r} × {lt}", s))
    out += _whole_rows(k, plan, program, base)
    if not inner_axes(k, plan) and loops and all(program.axes[a] >= 8192 for a in loops):
        s = replace(base.with_tiles(**{a: 2048 for a in loops}), num_warps=8)
        out.append(Variant("streamed 2048", s))
        if all(base.tiles.get(a, 1) == 1 for a in k.grid):
            # rows too long to hold: the widest tile up to 16384 that leaves two or more a row, 16
            # values a thread. Few programs per SM, each with much in flight: the rows a later pass
            # reads again (kept in L2, lower/eviction.py) stay there (softmax of 4096 × 65536 fp16
            # rows, H100, bench/probe_persistent_rows.py: tiles of 4096 in 8 warps 511 µs, 8192 in 16
            # 422, 16384 in 32 369, a copy 359; the widest tile was never slower at 16K-256K rows)
            lt = min(WIDE_TILE, next_pow2(min(program.axes[a] for a in loops) // 2 + 1) // 2)
            if lt > 2048:
                s = replace(base.with_tiles(**{a: lt for a in loops}), num_warps=lt // 512)
                out.append(Variant(f"streamed {lt}", s))
    return out


def _whole_rows(k: KernelPlan, plan: Plan, program: ir.Program, base: KernelSchedule) -> list[Variant]:
    """A pass over rows i whose grid axis d is held whole for an inline row reduction over it (Σ_d of a
    row, then per-element stores and column sums: a norm's backward folded into one kernel,
    extract/fold_rows.py): a few rows a step, each row whole, no tensor cores. The default takes 16 rows
    of a tile contraction's minimum: [16, 4096] blocks in 4 warps."""
    whole = inner_axes(k, plan) & set(k.grid)
    loops = {p.axis for p in k.passes()}
    if not plan.folded or not whole or len(loops) != 1 or any(isinstance(ph, Combine) for ph in k.phases):
        return []
    loop = next(iter(loops))
    used = {n.name for e in k.exprs() for n in e.refs if n.kind is ir.RefKind.INLINE and n.name in plan.inline}
    if any(plan.inline[u].axes - loops - (set(k.grid) - whole) for u in used):
        return []  # (an inline value with a free axis held whole too is a tile contraction, a dot)
    n = math.prod(next_pow2(program.axes[a]) for a in whole)
    # (a row value may sum another axis than the grid's, d2 beside d: a copy of d kept apart for a second
    # read of the row, fuzzer seed 3330; it keeps the base schedule's tile, held whole too)
    other = {a: t for a, t in base.tiles.items() if a in inner_axes(k, plan) - set(k.grid)}
    n = max(n, math.prod(other.values(), start=1))
    out = []
    for r in (1, 2, 4):
        if r * n <= 16384 and r <= next_pow2(program.axes[loop]):
            tiles = other | {a: 1 for a in k.grid} | {a: next_pow2(program.axes[a]) for a in whole} | {loop: r}
            s = replace(base, tiles=tiles, steps={}, num_warps=_warps(r * n), num_stages=2)
            out.append(Variant(f"whole rows {r} × {n}", s))
    return out


def _cheapest_combos(kernels: list[KernelPlan], options: list[list[Variant]], price, limit: int) -> list[tuple]:
    """The default combination (each kernel's first kind), the cheapest, then the cheapest one with a
    single kernel changed, in order of total price; at most `limit`, no repeats."""
    costs = [[price(k, v) for v in vs] for k, vs in zip(kernels, options)]
    best = tuple(min(range(len(vs)), key=lambda i, c=c: c[i]) for vs, c in zip(options, costs))
    picks = [tuple(0 for _ in options), best]
    swaps = sorted((costs[j][i] - costs[j][best[j]], j, i) for j in range(len(options))
                    for i in range(len(options[j])) if i != best[j])
    picks += [(*best[:j], i, *best[j + 1:]) for _, j, i in swaps]
    out, seen = [], set()
    for p in picks:
        if p not in seen and len(out) < limit:
            seen.add(p)
            out.append(tuple(vs[i] for vs, i in zip(options, p)))
    return out


def _with_kloops(k: KernelPlan, plan: Plan, program: ir.Program, s: KernelSchedule) -> KernelSchedule:
    # (not an axis of the grid too: an inline reduction over a grid axis sums it where a program holds it
    # whole, sums_whole; SigLIP's saved backward, dx[i, d] beside Σ_d x², had K-looped d and could not be
    # written: an internal error at 8192 × 768)
    inner = inner_axes(k, plan)
    long = {a: KLOOP_TILE for a in inner - set(k.grid) if program.axes[a] > WHOLE_INNER_MAX}
    return s.with_tiles(**long) if long else s


def _kloop_label(k: KernelPlan, plan: Plan, program: ir.Program, s: KernelSchedule) -> str:
    loops = sorted(a for a in inner_axes(k, plan) if s.tiles.get(a, program.axes[a]) < program.axes[a])
    return "".join(f", K-loop over {a}" for a in loops)


def plan_variants(plan: Plan, program: ir.Program, bases: list[KernelSchedule], pick,
                  limit: int = 8, price=None, library: bool = True,
                  precisions: tuple[str, ...] = ("ieee",)) -> list[tuple[str, list[KernelSchedule]]]:
    """(label, schedules) per way to run `plan`: per kernel the best schedule of each kind by
    `pick(kernel, variants)` (the cheapest), kinds combined across kernels (the default first, at
    most `limit`). With `price(kernel, variant)` (seconds), the combinations after the default are
    the cheapest one and those that change one kernel of it, cheapest first: a kernel's time does not
    depend on the others' schedules, so the product's first few (which vary the last kernels only)
    could miss the best kind of the first. A split-K combine kernel follows the tiles of the partial
    kernel before it. `library`: False leaves out the vendor's GEMM (every kernel generated);
    `precisions`: the float32 product precisions a generated kernel may use (Options.float32_products)."""
    options: list[list[Variant]] = []
    for k, base in zip(plan.kernels, bases):
        if any(isinstance(ph, Combine) for ph in k.phases):
            options.append([Variant("combine", base)])
            continue
        kinds: dict[str, list[Variant]] = {}
        for v in kernel_variants(k, plan, program, base, precisions):
            if v.schedule.library and not library:
                continue
            kinds.setdefault(v.kind.split(" ", 1)[0], []).append(v)
        options.append([pick(k, vs) for vs in kinds.values()])
    combos = (itertools.islice(itertools.product(*options), limit) if price is None
              else _cheapest_combos(plan.kernels, options, price, limit))
    out = []
    for combo in combos:
        scheds: list[KernelSchedule] = []
        for k, v in zip(plan.kernels, combo):
            s = v.schedule
            if v.kind == "combine" and scheds:
                prev = scheds[-1]
                # (a row the partial kernel held whole for an inline sum over it, extract/fold_rows.py,
                # in column tiles: one program would combine every chunk of the whole row)
                # (unless the combine kernel sums that axis itself: a pass fused after the combine)
                whole = inner_axes(plan.kernels[len(scheds) - 1], plan) - inner_axes(k, plan) if plan.folded else set()
                s = replace(s.with_tiles(**{a: COLUMNS if a in whole and prev.tiles[a] > COLUMNS else prev.tiles[a]
                                            for a in k.grid if a in prev.tiles}),
                            steps={a: n for a, n in prev.steps.items() if a in k.grid})
            scheds.append(s)
        out.append(("; ".join(v.kind for v in combo if v.kind != "combine"), scheds))
    return out
