"""Bounds on a kernel's blocks: how many values one program's elementwise block may hold, and the
tile choices that follow from what a pass selects (one group of a grouped sum per program, rows of
short passes stacked). Used by schedule.default_schedule on the tiles it proposes."""

from __future__ import annotations

import math

from . import ir
from .contraction import is_product, opened
from .masks import conjuncts
from .plan import KernelPlan


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


# values of one elementwise block a program of 4 warps holds without spilling (128 a thread)
BLOCK_VALUES = 16384


def group_selections(k: KernelPlan) -> dict[str, tuple[str, int]]:
    """Grid axis b → (pass axis a, G) where a pass's mask selects a // G = b: each b sums its own
    group of G elements of a (grouped-query attention's Σ_h [h // G = h0]·dK_h for kv head h0)."""
    found: dict[str, tuple[str, int]] = {}
    for p in k.passes():
        for c in p.comps:
            for cj in conjuncts(c.mask) if c.mask is not None else []:
                if isinstance(cj, ir.Call) and cj.op == "eq":
                    for x, y in (cj.args, cj.args[::-1]):
                        g = ir.grouped_index(x)
                        if g and g[0] == p.axis and g[1] > 1 and isinstance(y, ir.Index) and y.axis in k.grid:
                            found[y.axis] = (p.axis, g[1])
    return found


def one_group_per_program(tiles: dict[str, int], k: KernelPlan) -> None:
    """Rows that select disjoint groups of the loop (a // G = b) share no loaded tile: a program takes one
    b, and loop tiles that divide G, so its data bounds (lower/databounds.py) leave whole tiles, summed
    unmasked. A tile of 8 kv heads summed [8, 16, 128] masked blocks: 1.9 ms for 0.55 GB on the H100
    (session 36, gqa_pf's backward at L = 16384)."""
    for b, (a, g) in group_selections(k).items():
        tiles[b] = 1
        tiles[a] = min(tiles.get(a, 1), g & -g)  # the largest power of two dividing G


SHORT_PASS = 16  # a pass over at most this many elements, in one tile, is short
SHORT_PASS_BLOCK = 2048  # values a program of short passes reads per block


def short_pass_rows(tiles: dict[str, int], k: KernelPlan, program: ir.Program) -> None:
    """A kernel whose passes are each one short tile (the member axis of regrouped grouped-query heads:
    dK summed over the 4 query heads of a group) reads a few hundred values per program: it takes rows
    of its last one-per-program grid axis until a block holds SHORT_PASS_BLOCK values. GQA's group sum
    of dK and dV (32/8 heads, L 2048, d 128: [4, 128] fp32 blocks in 32768 programs) ran 172 µs, with 4
    key rows per program 52 (16 or 64 rows: the same; H100, bench/probe_group_sum.py)."""
    passes = list(k.passes())
    if not passes or any(program.axes[p.axis] > SHORT_PASS or tiles.get(p.axis, 1) < program.axes[p.axis]
                         for p in passes):
        return
    pinned = group_selections(k)  # (a program takes one group: one_group_per_program)
    rows = [a for a in k.grid if tiles.get(a, 1) == 1 and program.axes[a] > 1 and a not in pinned]
    if not rows:
        return
    width = max((math.prod(tiles.get(a, 1) for a in c.core.axes | {p.axis}) for p in passes for c in p.comps),
                default=1)
    r = 1
    while r * 2 * width <= SHORT_PASS_BLOCK and r * 2 <= next_pow2(program.axes[rows[-1]]):
        r *= 2
    tiles[rows[-1]] = r


def bound_blocks(tiles: dict[str, int], k: KernelPlan) -> None:
    """Halve the loop tile of a pass whose elementwise block (its values and their mask) spans three
    or more tiled axes until the block holds at most BLOCK_VALUES values (down to 16). A grouped-query
    gradient's group sum Σ_h [h // 8 = h0]·dK_h over an [8 groups, 64 heads, 128] block spilled: 57 ms
    for 1.1 GB of reads on the H100; over [8, 16, 128] blocks 3.2 ms
    (bench/results/h100_2026-11-25/gqa_kernels.txt), 1.9 ms once its partials were laid out with
    the key axis first (extract/plans._buffer_layout; kernels_s30_gqa.txt)."""
    for p in k.passes():
        for c in p.comps:
            if c.op == "sum" and is_product(c.core) and sum(tiles.get(a, 1) > 1 for a in c.core.axes | {p.axis}) == 3:
                continue  # a tile contraction over the pass axis: a tl.dot, its product never held
            mask = c.mask.axes if c.mask is not None else set()
            axes = [a for a in c.core.axes | mask | {p.axis} if tiles.get(a, 1) > 1]
            while len(axes) >= 3 and math.prod(tiles[a] for a in axes) > BLOCK_VALUES and tiles[p.axis] > 16:
                tiles[p.axis] //= 2


# the most values one elementwise block spanning three or more tiled axes may hold: Triton refuses a
# tensor past 2^20 values (the interpreter does not). In a kernel with tensor-core products only blocks
# past it change: a tighter cap there (2^14, 2^18) moved plans the cost model had chosen and the GPU had
# measured (decode's 64-key split-K step, the regrouped GQA backward's group sum), since a capped block
# prices lower than the spilling one it was
MAX_BLOCK_VALUES = 2**20


def cap_blocks(tiles: dict[str, int], exprs: list[ir.Node], k: KernelPlan, inner: set[str], stepped: set[str],
               floor: int, limit: int = MAX_BLOCK_VALUES) -> dict[str, int]:
    """Halve the largest grid or loop tile under any load or operation of the kernel whose block spans
    three or more tiled axes until it holds at most `limit` values (by default MAX_BLOCK_VALUES,
    Triton's limit). A
    relative-position table's gradient gathers k rows per (f, i) pair ([f, i, heads, d]: 8.4 M values)
    and multiplies dO and V rows of several heads ([i, j, heads, e]: 4.2 M), a compile error on the GPU
    (the interpreter has no limit). The product of a tile contraction whose factors are 2-D tiles is a
    tl.dot, never held, and is not counted; a contraction's product held on the ALUs (a factor of three
    tiled axes: the table's gradient along diagonals, k gathered per (f, i)) is held to BLOCK_VALUES,
    what a program keeps without spilling ([f 128, i 64, d 64]: 0.5 M values a program). A factor is
    2-D across a stepped axis (its tile holds rows of one head, or of one group of heads sharing a kv
    head: decode's padded query row). Other blocks are held to `limit` (a kernel without tensor-core
    products passes BLOCK_VALUES: group norm's last pass held three row axes whole, [c 16, h 16, j 8,
    i 16, d 32], 1 M values in each of 16 programs). Axes contracted inside a tile (`inner`) and
    stepped axes stay whole; no tile goes below `floor`."""
    tiles = dict(tiles)

    def tiled(n: ir.Node) -> list[str]:  # (in the tiles' order, not the axis set's: ties alike in every process)
        return [a for a in tiles if a in n.axes and tiles[a] > 1]

    nodes = list(dict.fromkeys(n for e in exprs for n in ir.walk(e)))  # (in walk order: halvings too)
    sums = [r.body for r in nodes if isinstance(r, ir.Reduce) and r.op == "sum"]
    sums += [c.core for p in k.passes() for c in p.comps if c.op == "sum"]  # (a pass's sums: over its axis)
    dots: set[ir.Node] = set()
    alu: set[ir.Node] = set()  # the products of contractions held as blocks on the ALUs
    for body in sums:
        if is_product(body):
            op = opened(body)
            if all(len(set(tiled(f)) - stepped) <= 2 for f in op.factors):
                dots |= {body, *op.structure}
            else:
                alu |= {body, *op.structure}
    # the axes a load reads contiguously (its last index) shrink last: a block keeps whole sectors
    contiguous = {ld.index[-1].axis for ld in nodes if isinstance(ld, ir.Load) and ld.index
                  and isinstance(ld.index[-1], ir.Index)}
    for n in nodes:
        if n in dots or not isinstance(n, ir.Load | ir.Call):
            continue
        axes = tiled(n)
        cap = BLOCK_VALUES if n in alu else limit
        while len(axes) >= 3 and math.prod(tiles[a] for a in axes) > cap:
            free = [a for a in axes if a not in inner and a not in stepped and tiles[a] > floor]
            if not free:
                break
            tiles[max(free, key=lambda x: (x not in contiguous, tiles[x]))] //= 2
            axes = tiled(n)
    return tiles
