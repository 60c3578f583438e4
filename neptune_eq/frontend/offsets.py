"""Axes a constant shorter than a length (`logits[:, :-1]` against `labels[:, 1:]`), padded to it so that
they change length with it: `shorter`, `pad`.

A causal language model's loss compares the logits of positions 0..L-2 with the labels of positions
1..L-1: the program sums over an axis j of extent L - 1, which no argument has. A compile at one L
would hold L - 1 as j's extent, and the sequence dimension could not be dynamic. The symbolic trace
writes j's extent `s - k` (k > 0 a constant) for the size s of an argument dimension on axis a;
`pad` then gives j the extent of a and keeps the program's value at every length of a:

    Σ_j f(j)       →  Σ_j where(j < len(a) - k, f(j), 0)          (max: -inf, min: +inf beyond)
    x[…, j + 1]    →  x[…, min(max(j + 1, 0), len(dim) - 1)]      (the masked steps read in range)
    x[…, t[j]]     →  x[…, where(j < len(a) - k, t[j], 0)]          (a gather, and its range check, too)
    len(j)         →  len(a) - k                                   (a mean's divisor, var's n - 1)

An index that is j itself is left as it is: the IR's shape check then ties j to the dimension it
reads (one length). j then has a's extent, so it moves with a's group, and its length at a call is
a's, which the kernels read off that dimension. Where every read is shifted (`x[:, 1:].sum(1)` reads
only x[…, j + 1]), j is first renumbered from its least shift c (`Offset.start`): j' = j + c, over
c ≤ j' < len(a) - k + c, so that one read is j' itself. An output over j (never renumbered) is 0 at
the padded steps, and the call cuts it to j's length, len(a) - k (per-token log-probabilities of the
shifted labels: [B, L - 1]).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy

from .. import ir
from ..ops import MONOIDS
from .checks import index_program
from .exprs import call, const


@dataclass(frozen=True)
class Offset:
    """Program axis `axis` has extent len(`source`) - `by` at every length (by > 0); padded, it is
    renumbered from `start` (its least shift where an input is read at it: j + start)."""

    axis: str
    source: str
    by: int
    start: int = 0


def shorter(c, symbol_axes: dict, candidates) -> tuple[Offset, ...]:
    """The axes of capture `c` that the symbolic trace writes as a constant shorter than the length of
    an axis in `candidates` (`symbol_axes`: size symbol → the program axis of its argument dimension),
    which no input is declared over; each with the first such axis in program order."""
    p = c.program
    declared = {a for s in p.inputs.values() for a in s.axes}
    used = {a for o in p.outputs for a in o.axes}
    reduced: dict[str, set] = {}
    for o in p.outputs:
        for n in ir.walk(o.expr):
            if isinstance(n, ir.Reduce):
                reduced.setdefault(n.axis, set()).add(n.op)
    order = list(p.axes)
    out = []
    for j, exprs in c.extents.items():
        if j in declared or (j not in reduced and j not in used) or not reduced.get(j, set()) <= set(MONOIDS):
            continue
        found = set()
        for e in exprs:
            symbols = e.free_symbols if isinstance(e, sympy.Expr) else set()
            if len(symbols) != 1:
                break
            s = next(iter(symbols))
            k = -(e - s)
            a = symbol_axes.get(s)
            if not (k.is_Integer and k > 0) or a is None or p.axes[a] != p.axes[j] + int(k):
                break
            found.add((a, int(k)))
        else:
            sources = [a for a in order if a in {a for a, _ in found} and a in candidates]
            if sources and len({k for _, k in found}) == 1:
                # (an output over j is cut from its first step: never renumbered)
                out.append(Offset(j, sources[0], next(iter(found))[1], 0 if j in used else _least_shift(p, j)))
    return tuple(out)


def _least_shift(p: ir.Program, j: str) -> int:
    """The least c of the reads x[…, j + c] (c ≥ 0 a constant; 0 for x[…, j]) of program `p`, 0 if none."""
    shifts = {_shift(e, j) for o in p.outputs for n in ir.walk(o.expr) if isinstance(n, ir.Load) for e in n.index}
    shifts.discard(None)
    return int(min(shifts, default=0))


def _shift(e: ir.Node, j: str | None) -> float | None:
    """c where index `e` is j + c (c ≥ 0 a whole constant; `x[:, 1:][:, 1:]`'s j + 1 + 1 too), else None."""
    if isinstance(e, ir.Index):
        return 0 if e.axis == j else None
    if (isinstance(e, ir.Call) and e.op == "add" and isinstance(e.args[1], ir.Const) and e.args[1].value >= 0
            and e.args[1].value.is_integer() and (c := _shift(e.args[0], j)) is not None):
        return c + e.args[1].value
    return None


def _root(e: ir.Node) -> str | None:
    """The axis j of index `e` = j + c + … (constants added), else None."""
    while isinstance(e, ir.Call) and e.op == "add" and isinstance(e.args[1], ir.Const):
        e = e.args[0]
    return e.axis if isinstance(e, ir.Index) else None


def pad(c, offsets: tuple[Offset, ...]):
    """Capture `c` with each of `offsets`' axes at its source's extent, its reductions masked and its
    shifted reads clamped (module docstring); `c` itself where there are none."""
    if not offsets:
        return c
    p = c.program
    by = {o.axis: o for o in offsets}
    axes = {a: (p.axes[by[a].source] if a in by else n) for a, n in p.axes.items()}
    memo: dict = {}

    def go(n: ir.Node) -> ir.Node:
        hit = memo.get(n)
        if hit is not None:
            return hit
        if isinstance(n, ir.Reduce) and n.axis in by:
            out = ir.Reduce(n.op, n.axis, call("where", _inside(by[n.axis]), go(n.body),
                                               const(MONOIDS[n.op].identity)))
        elif isinstance(n, ir.Reduce):
            out = ir.Reduce(n.op, n.axis, go(n.body))
        elif isinstance(n, ir.Length) and n.axis in by:  # (a mean's divisor: the length j had, not a's)
            out = call("sub", ir.Length(by[n.axis].source), const(by[n.axis].by))
        elif (moved := _renumbered(n, by)) is not None:
            out = moved
        elif isinstance(n, ir.Load):
            out = ir.Load(n.tensor, tuple(_read(go(e), dim, by) for e, dim in zip(n.index, p.inputs[n.tensor].axes)))
        elif isinstance(n, ir.Call):
            out = ir.Call(n.op, tuple(go(a) for a in n.args))
        else:
            out = n
        memo[n] = out
        return out

    outputs = [ir.Output(o.name, o.axes, _masked(go(o.expr), [by[a] for a in o.axes if a in by]), o.dtype)
               for o in p.outputs]
    program = ir.Program(p.name, axes, dict(p.inputs), outputs, p.dynamic, p.copies_within(axes)).validate()
    checks = []
    for ch in c.index_checks:
        index = _gathered(go(ch.index), by)
        unchanged = index is ch.index and ch.program is None  # (a whole input's values)
        checks.append(ch if unchanged else replace(ch, index=index, program=index_program(index, axes, program.inputs)))
    return replace(c, program=program, index_checks=tuple(checks))


def _masked(e: ir.Node, offsets: list[Offset]) -> ir.Node:
    """An output's value, 0 at the padded steps of its axes (the call returns it cut to the axes'
    lengths: a gradient never reaches those steps, and their value is never a NaN it could carry)."""
    for o in offsets:
        e = call("where", _inside(o), e, const(0))
    return e


def _renumbered(n: ir.Node, by: dict) -> ir.Node | None:
    """j + c (or j) of a padded axis j, written of j' = j + start: j' + c - start; else None."""
    j = _root(n)
    c = _shift(n, j) if j in by else None
    return None if c is None else _plus(ir.Index(j), c - by[j].start)


def _plus(j: ir.Index, c: float) -> ir.Node:
    """j + c (j itself for c = 0)."""
    return j if c == 0 else call("add", j, const(c)) if c > 0 else call("sub", j, const(-c))


def _inside(o: Offset) -> ir.Node:
    """Is padded axis `o.axis` at a step the program had (start ≤ j' < len(source) - k + start)?"""
    below = call("lt", ir.Index(o.axis), call("sub", ir.Length(o.source), const(o.by - o.start)))
    return below if o.start == 0 else call("and", call("ge", ir.Index(o.axis), const(o.start)), below)


def _gathered(e: ir.Node, by: dict) -> ir.Node:
    """Index `e`, 0 at the padded steps where it reads a tensor's values: there it reads values the
    program did not (`labels[:, :-1]`'s last, out of range where eager never looked), which neither
    its range check nor the kernel's gather may read past."""
    axes = [a for a in by if a in e.axes]
    if not axes or not any(isinstance(n, ir.Load) for n in ir.walk(e)):
        return e
    inside = _inside(by[axes[0]])
    for a in axes[1:]:
        inside = call("and", inside, _inside(by[a]))
    return call("where", inside, e, const(0))


def _read(e: ir.Node, dim: str, by: dict) -> ir.Node:
    """Index `e` of a dimension on axis `dim`, in range at every step of the padded axes it reads
    (a gathered value: 0 at the steps masked, `_gathered`)."""
    e = _gathered(e, by)
    if isinstance(e, ir.Index) or not _steps(e, by):
        return e
    last = call("sub", ir.Length(dim), const(1))
    if (isinstance(e, ir.Call) and e.op == "add" and isinstance(e.args[0], ir.Index)
            and isinstance(e.args[1], ir.Const) and e.args[1].value >= 0):
        return call("min2", e, last)  # (j + k, k ≥ 0: never below 0)
    return call("min2", call("max2", e, const(0)), last)


def _steps(e: ir.Node, by: dict) -> bool:
    """Does index `e` vary with a padded axis itself (not only through a value it loads)?"""
    if isinstance(e, ir.Index):
        return e.axis in by
    return not isinstance(e, ir.Load) and any(_steps(a, by) for a in e.children())


__all__ = ["Offset", "pad", "shorter"]
