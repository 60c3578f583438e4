"""Split-K's combine phase: the chunk states a split pass wrote (part_<name>), folded into one state per
row with the pass's own corrections, several chunks a loop step."""

from __future__ import annotations

from .. import ir
from ..ops import MONOIDS, OPS
from ..plan import Combine, Pass
from .kernel import KernelWriter
from .passes import FINAL, _corrected, _moved, _state, _state_dims, _state_init
from .values import Val, _ident, _Scope

# chunk states a combine step folds: their loads are independent, so a step waits about one memory
# latency for all of them, where one chunk a step waited that long for each (RMSNorm's weight
# gradient, 128 chunks of 8192 columns in 64-column programs: 77 µs, H100, 2026-12-06)
COMBINE_UNROLL = 8
# ... where every state folds by its monoid alone (a column sum: one add a chunk, no correction): a
# step's loads cost a register each per column tile, so a step takes four times as many (a folded
# norm backward fills the machine with 128 to 256 chunks of rows: 16 to 32 steps of eight)
PLAIN_COMBINE_UNROLL = 32


def combine_unroll(chunks: int, plain: bool = False) -> int:
    """Chunk states folded per step of a combine loop: the largest power of two up to COMBINE_UNROLL
    (PLAIN_COMBINE_UNROLL for states folded without corrections, `plain`) that divides `chunks`
    (CHUNKS is a constexpr: no step runs past the last chunk)."""
    u = PLAIN_COMBINE_UNROLL if plain else COMBINE_UNROLL
    while chunks % u:
        u //= 2
    return u


def plain_states(ps: Pass) -> bool:
    """Does every state of pass `ps` combine by its monoid alone (no correction, no affine terms)?"""
    return all(not c.affine and not (c.producers and c.corr is not None) for c in ps.comps)


def _combine_phase(w: KernelWriter, cb: Combine) -> None:
    """Fold the chunk states of a split pass: (r,t) ⊙ (r_c,t_c) with the pass's own corrections,
    `combine_unroll` chunks a loop step (each chunk's loads first, then its fold into the state)."""
    ps = cb.source
    names = {c.name: f"st_{_ident(c.name)}" for c in ps.comps}
    for c in ps.comps:
        w.emit(f"{names[c.name]} = {_state_init(w, c)}")
    outer_lines, outer_depth = w.lines, w.depth
    body: list[str] = []
    w.hoist_lines, w.hoist_depth = outer_lines, outer_depth
    w.lines, w.depth = body, outer_depth + 1
    unroll = combine_unroll(cb.chunks, plain_states(ps))
    for u in range(unroll):
        w.emit(f"pid_chunk = chunk0 + {u}")
        scope = _Scope(axis=ir.CHUNK, variant={c.ref(k) for c in ps.comps for k in ir.RUNNING}, lines=body,
                       depth=outer_depth + 1)
        w.scopes.append(scope)
        _fold_chunk(w, ps, names)
        w.scopes.pop()
    w.lines, w.depth = outer_lines, outer_depth
    w.emit(f"for chunk0 in range(0, CHUNKS, {unroll}):")
    w.lines.extend(body)
    for c in ps.comps:
        w.scopes[0].memo[c.ref(FINAL)] = _state(w, c, names[c.name])


def _fold_chunk(w: KernelWriter, ps: Pass, names: dict[str, str]) -> None:
    """The states `names` of pass `ps` folded with chunk pid_chunk's (read from part_<name>)."""
    parts: dict[str, Val] = {}
    for c in ps.comps:
        ld = ir.Load(f"part_{c.name}", (ir.Index(ir.CHUNK), *(ir.Index(a) for a in c.free)))
        v = w.load(ld)
        parts[c.name] = v if c.integer else w.f32(v)
    new: dict[str, Val] = {}
    for c in ps.comps:
        old = _state(w, c, names[c.name])
        comb = MONOIDS[c.op].combine
        if c.affine:
            states = {x.name: _state(w, x, names[x.name]) for x in ps.comps}
            a = _moved(w, ps, c, states, new)
            b = _moved(w, ps, c, parts, new)
        elif c.producers and c.corr is not None:
            olds = {p: Val(names[p], _state_dims(w, next(x for x in ps.comps if x.name == p)), "f")
                    for p in c.producers}
            a = _corrected(w, ps, c, old, olds, new)
            b = _corrected(w, ps, c, parts[c.name], {p: parts[p] for p in c.producers}, new)
        else:
            a, b = old, parts[c.name]
        codes, dims = w.align([a, b])
        nv = w.bind(OPS[comb].triton.format(*codes), dims, "f", "n")
        new[c.name] = nv
    for c in ps.comps:
        w.emit(f"{names[c.name]} = {new[c.name].code}")
