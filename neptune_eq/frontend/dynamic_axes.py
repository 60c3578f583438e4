"""Which dimensions of a captured function's arguments may change length between calls
(neptune_eq.compile(..., dynamic=...)): `resolve`.

A dimension is a program axis; the program must be the same at every length of it, up to that axis's
extent. That is tested, not assumed: fn is captured again (on fake tensors, milliseconds) with the
axis one length moved, and the two programs, their index checks, return structure and output shapes
are compared. A length the program computes with is `len(axis)` (a mean's divisor, a number fn
computed from its arguments' sizes: frontend/symsizes.py), the same at every length, as is a position
from the end (x[:, -1] reads len(axis) - 1) and an axis a constant shorter than it (logits[:, :-1],
padded to it: frontend/offsets.py); one used as a shape or an index otherwise (a slice to L // 2)
changes the program, and the axis stays specialised
(or, when the user named it, the compile is refused naming the difference), as does one fn's Python
tests (`if L > 1000:`) unless the test is proved for every length, and one the program holds as a
number not linear in it (the probe's one other length need not show it). Where fn's tests of its sizes
are unknown (it does not trace with symbolic sizes) every dimension stays specialised. Axes fn keeps
equal (torch.ones(L, L).tril() against scores [L, S]) move together as one group; a final capture
moves every group at once by different amounts. A size-1 dimension is no axis (it broadcasts).
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass, replace

import sympy
import torch

from .. import ir
from ..ir import NeptuneError
from .capture import ArgBinding, Captured, capture
from .checks import composed, length_bounds, length_symbol
from .offsets import Offset, pad, shorter
from .symsizes import proved, restricting, ties
from .tracing import no_warnings


class NotDynamic(NeptuneError):
    """A dimension named dynamic cannot be: the program depends on its length beyond its extent."""


def arg_axes(b: ArgBinding, program: ir.Program) -> tuple[str | None, ...] | None:
    """The program axis of each dimension of tensor argument `b` (None for a size-1 dimension, which
    is no axis), or None where the program reshapes the argument otherwise."""
    if not b.is_tensor or b.input is None:
        return None
    axes = program.inputs[b.input].axes
    if b.program_shape is None:
        return tuple(axes)
    kept = [k for k, n in enumerate(b.shape) if n != 1]
    if len(kept) != len(axes) or tuple(b.shape[k] for k in kept) != tuple(b.program_shape):
        return None
    out: list[str | None] = [None] * len(b.shape)
    for k, a in zip(kept, axes):
        out[k] = a
    return tuple(out)


@dataclass(frozen=True)
class Lengths:
    """The dynamic axes of a capture: `groups` of program axes that keep one length, `dims` the
    (argument, dimension, group) of every tensor argument dimension on them, `outputs` the (output,
    dimension, group, by) of fn's outputs' dimensions on them (the group's length less `by`), `static`
    why other candidates stay fixed."""

    groups: tuple[tuple[str, ...], ...]
    dims: tuple[tuple[int, int, int], ...]
    outputs: tuple[tuple[int, int, int, int], ...]
    static: tuple[tuple[str, str], ...] = ()
    offsets: tuple[Offset, ...] = ()  # axes a constant shorter than a dynamic one, padded to it (frontend/offsets.py)
    least: tuple[int, ...] = ()  # each group's least length served (2; more where an axis is shorter than it
    #                              or fn's tests of the length hold from a longer one on: _least_tested)

    @property
    def axes(self) -> frozenset[str]:
        return frozenset(a for g in self.groups for a in g)

    def of(self, args) -> tuple[int, ...] | None:
        """Each group's length in a call, or None where the call's dimensions of one group differ."""
        out: list[int | None] = [None] * len(self.groups)
        for pos, d, g in self.dims:
            n = args[pos].shape[d]
            if out[g] is None:
                out[g] = n
            elif out[g] != n:
                return None
        return tuple(out)


def resolve(c0: Captured, spec, example, stats=None) -> Lengths:
    """The dynamic axes of capture `c0` (of fn at `example`): `spec` True (every dimension that can
    be) or {argument index: [dimensions]} (each must be: NotDynamic otherwise). Each probe capture
    is counted in `stats.captures`. The program they are axes of is `pad(c0, offsets)`: an axis a
    constant shorter than a candidate (`logits[:, :-1]`) is padded to it, in every capture compared."""
    def probe(groups, only=None):
        if stats is not None:
            stats.captures += 1
        return _probe(c0, example, groups, maps, only, candidates, offsets)

    p0 = c0.program
    maps = {b.position: arg_axes(b, p0) for b in c0.args if b.is_tensor}
    named: dict[str, str] = {}  # axis → how the user named it
    if not (spec is True or isinstance(spec, dict)):
        raise NeptuneError(f"dynamic={spec!r}: expected True or a dict {{argument index: [dimensions]}}")
    if spec is True:  # every axis but the innermost dimension of a floating matrix (a head or model dimension;
        # an integer or boolean matrix's last dimension is its tokens': labels [B, L], a padding mask [B, S])
        inner = {axes[-1] for pos, axes in maps.items()
                 if axes is not None and len(axes) >= 2 and example[pos].is_floating_point()}
        for axes in maps.values():
            for a in axes or ():
                if a is not None and a not in inner:
                    named.setdefault(a, "")
    else:
        for pos, dims in dict(spec).items():
            b = c0.args[pos] if isinstance(pos, int) and 0 <= pos < len(c0.args) else None
            if b is None or not b.is_tensor:
                raise NeptuneError(f"dynamic={spec!r}: argument {pos!r} is not a tensor argument of the function")
            for d in dims:
                what = f"dimension {d} of argument '{b.parameter}'"
                if not -len(b.shape) <= d < len(b.shape):
                    raise NeptuneError(f"dynamic: {what} does not exist (shape {b.shape})")
                axes = maps.get(pos)
                a = axes[d] if axes is not None else None
                if a is None:
                    why = ("has length 1 in the example (a size-1 dimension broadcasts; give an example of length "
                           "≥ 2)" if b.shape[d] == 1 else "is reshaped with others inside the function")
                    raise NotDynamic(f"dynamic: {what} {why}")
                named.setdefault(a, what)
    candidates = set(named)
    offsets = _offsets(c0, maps, candidates)
    c0 = pad(c0, offsets)
    p0 = c0.program
    least_of = {a: 2 + max(o.by for o in offsets if o.source == a) for a in {o.source for o in offsets}}
    least = {s: least_of[maps[pos][d]] for (pos, d), s in c0.size_of.items()
             if maps.get(pos) is not None and d < len(maps[pos]) and maps[pos][d] in least_of}
    groups: list[tuple[str, ...]] = []
    static: list[tuple[str, str]] = []
    taken: set[str] = set()
    tested_least: dict[tuple[str, ...], int] = {}  # group → the least length its tests hold from, where more than 2
    for a in [a for a in p0.axes if a in named]:
        if a in taken:
            continue
        same = tuple(x for x in p0.axes if x not in taken and p0.axes[x] == p0.axes[a])
        for group in dict.fromkeys([(a,), same]):
            trial = least
            why = _tested(c0, maps, group, groups, least)
            m = _least_tested(c0, maps, group, groups, least) if why is not None else None
            if m is not None:  # (its tests hold from length m on: it serves lengths ≥ m, shorter ones compile)
                trial = least | {s: max(least.get(s, 2), m) for s in _symbols(c0, maps, group)}
                why = None
            why = (why or _unsourced(p0, [*groups, group])
                   or _unseen(c0, maps, group, _moved(c0, [*groups, group], len(groups))[group[0]])
                   or probe([*groups, group], only=len(groups)))
            if why is None:
                groups.append(group)
                taken.update(group)
                least = trial
                if m is not None:
                    tested_least[group] = m
                break
        if why is not None:
            if named[a]:
                raise NotDynamic(f"dynamic: {named[a]} (axis '{a}') cannot change length: {why}")
            static.append((a, why))
    if len(groups) > 1:
        why = probe(groups)
        if why is not None:
            raise NotDynamic(f"dynamic: axes {groups} cannot change length together: {why}")
    index = {a: g for g, group in enumerate(groups) for a in group}
    dims = tuple((pos, d, index[a]) for pos, axes in maps.items() for d, a in enumerate(axes or ()) if a in index)
    if groups and stats is not None:
        stats.captures += 1
    outs = _output_dims(c0, example, groups, maps, candidates, offsets) if groups else ()
    used = tuple(o for o in offsets if o.source in index)
    if any(index.get(o.axis) != index[o.source] for o in used):  # (the probes compared them moving together)
        raise NeptuneError(f"dynamic: a padded axis does not move with the length it is shorter than: {used}")
    return Lengths(tuple(groups), dims, outs, tuple(static), used,
                   tuple(max([tested_least.get(group, 2), *(least_of.get(a, 2) for a in group)]) for group in groups))


def _offsets(c: Captured, maps, candidates) -> tuple[Offset, ...]:
    """frontend/offsets.py's `shorter` axes of capture c (`maps`: each argument's axes)."""
    symbol_axes = {s: maps[pos][d] for (pos, d), s in c.size_of.items()
                   if maps.get(pos) is not None and d < len(maps[pos]) and maps[pos][d] is not None}
    return shorter(c, symbol_axes, candidates)


def _unseen(c0: Captured, maps, group: tuple[str, ...], moved: int) -> str | None:
    """A number fn computes from the length of `group` that the program holds as it is (not as
    len(axis)) and that is the same at the probe's length `moved`: the probe cannot show its part."""
    if c0.sizes is None:
        return None  # (_tested said so)
    symbols = set().union(*(ties(c0.sizes, s) for s in _symbols(c0, maps, group)))
    held = c0.sizes.unseen(symbols, moved)
    return (f"the function computes {held} from its length, a number the program holds that is the same at the "
            f"probe's length {moved} and changes at others" if held is not None else None)


def _unsourced(program: ir.Program, groups) -> str | None:
    """Why the kernels could not know the length of an axis of `groups` at a call: one no input reads
    (the key axis of `torch.arange(L)[:, None] - torch.arange(L)`, tied to the rows' only by their
    example's length) that the program loops or indexes over; None where each has an input's."""
    from ..lower.launch import length_sources

    try:
        length_sources(tie_lengths(program, groups).with_dynamic({a for g in groups for a in g}))
    except NeptuneError as e:
        return str(e)
    return None


def _symbols(c0: Captured, maps, axes) -> set:
    """The size symbols of the argument dimensions on `axes` (`maps`: each argument's axes)."""
    def axis(pos: int, d: int) -> str | None:
        dims = maps.get(pos)
        return dims[d] if dims is not None and d < len(dims) else None

    return {s for (pos, d), s in c0.size_of.items() if axis(pos, d) in axes}


def _tested(c0: Captured, maps, group: tuple[str, ...], dynamic, least=None) -> str | None:
    """How fn's Python tests the length of `group` (`if L > 1000:`): a test not proved to hold at every
    length ≥ 2 while the `dynamic` axes (those made so before it) move too, the rest at the example's
    lengths (frontend/symsizes.py), else None. So a test of several sizes is proved once with every
    one of them that ends dynamic moving (when the last of them is decided). Such a dimension
    stays specialised; so does every one where fn's tests of its sizes are unknown (fn does not trace
    with symbolic sizes, or that dimension has no symbol there): a probe at other lengths cannot show
    a branch the example's lengths do not take. `least`: size symbol → the least length it takes, where
    more than 2 (frontend/symsizes.py: restricting)."""
    if c0.sizes is None:
        return "the function does not trace with symbolic lengths, so the tests it makes of them are unknown"
    moving, together = [_symbols(c0, maps, g) for g in dynamic], _symbols(c0, maps, group)
    for pos, axes in maps.items():
        for d, a in enumerate(axes or ()):
            if a not in group:
                continue
            symbol = c0.size_of.get((pos, d))
            if symbol is None:
                return f"dimension {d} of argument {pos} has no symbol in the symbolic trace (its tests are unknown)"
            test = restricting(c0.sizes, symbol, moving, together=together, least=least)
            if test is not None and re.fullmatch(r"Eq\(n, -?\d+\)", test):  # (math.sqrt(L), int(L), L == 20)
                return f"the function specialises its length ({test}: math.sqrt, int() or float() of it, or a test)"
            if test is not None:
                return f"the function tests its length ({test}; not proved for every length ≥ 2)"
    return None


def _least_tested(c0: Captured, maps, group: tuple[str, ...], dynamic, least: dict) -> int | None:
    """The least length m ≤ the example's from which every test fn makes of the length of `group` is
    proved (`x[:, -4:]` tests n ≥ 4; `if L > 20:` tests n > 20 at an example of 37), or None where some
    test is not proved even from the example's length on (L == 20, L % 8 == 0, L < 4096). Proved,
    never sampled: the group then serves lengths ≥ m alone (a shorter call compiles its own, like
    length 1)."""
    symbols = _symbols(c0, maps, group)
    n = c0.program.axes[group[0]]

    def holds(m: int) -> bool:
        return _tested(c0, maps, group, dynamic, least | dict.fromkeys(symbols, m)) is None

    if not symbols or n <= 2 or not holds(n):
        return None
    lo, hi = 2, n  # (holds(hi); a test not proved from 2 on: not holds(lo))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid, hi)
    return hi


def _moved(c0: Captured, groups, only: int | None = None) -> dict[str, int]:
    """New extents for a probe: group g (or only group `only`) moves by 3 + 2g, clear of every other extent."""
    taken = set(c0.program.axes.values())
    out: dict[str, int] = {}
    for g, group in enumerate(groups):
        if only is not None and g != only:
            continue
        n = c0.program.axes[group[0]] + 3 + 2 * g
        while n in taken:
            n += 1
        taken.add(n)
        out.update({a: n for a in group})
    return out


def _probe_args(c0: Captured, example, maps, moved: dict[str, int]) -> list:
    args = list(example)
    for pos, axes in maps.items():
        if axes is None or not any(a in moved for a in axes):
            continue
        x = example[pos]
        shape = [moved.get(a, n) if a is not None else n for a, n in zip(axes, x.shape)]
        args[pos] = torch.empty(shape, dtype=x.dtype, device=x.device)  # values are never read: traced fake
    return args


def _probe(c0: Captured, example, groups, maps, only: int | None = None, candidates=(), offsets=()) -> str | None:
    """Why fn's program is not the same with `groups` moved (None: it is)."""
    moved = _moved(c0, groups, only)
    try:
        with _quiet():
            c1 = capture(c0.fn, *_probe_args(c0, example, maps, moved), name=c0.program.name, merge=False,
                         symbolic_lengths=True)
    except NeptuneError as e:
        return f"the function does not trace at other lengths of it ({str(e).splitlines()[0]})"
    return _difference(c0, pad(c1, _offsets(c1, maps, candidates)), moved, maps, groups, offsets)


@contextlib.contextmanager
def _quiet():
    """A probe that fails to trace is an answer, not an error to log (fake tensors log their own); what
    torch warns of at the probe's lengths (mse_loss's "target size that is different to the input size",
    where the probe moved one input's batch and not another's) is not the user's to read."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with no_warnings():
            yield
    finally:
        log.setLevel(level)


def _readable(line: str) -> str:
    """A line of exact program text with its hexadecimal floats written as decimals."""
    return re.sub(r"-?0x[0-9a-f.]+p[+-]\d+", lambda m: f"{float.fromhex(m.group(0)):g}", line)


def proved_checks(c0: Captured, groups) -> set[int]:
    """The index checks of c0 whose index is of axes alone (x[arange(L)], cross-entropy against
    arange(N)) proved in range at every length ≥ 2 of each of `groups`, the indexed dimension's
    length moving with its axis's group and the other axes at their extents: they need not run."""
    sets = [{length_symbol(a) for a in group} for group in groups]
    moving = set().union(*sets)
    fixed = {length_symbol(a): n for a, n in c0.program.axes.items() if length_symbol(a) not in moving}
    out = set()
    for k, c in enumerate(c0.index_checks):
        b = length_bounds(c.index)
        if b is None:
            continue
        along = c.along if c0.program.axes.get(c.along) == c.size else None
        size = length_symbol(along) if along is not None else sympy.Integer(c.size)
        if proved(b[0] >= (-size if c.wraps else 0), sets, fixed) and proved(b[1] <= size - 1, sets, fixed):
            out.add(k)
    return out


def _difference(c0: Captured, c1: Captured, moved: dict[str, int], maps, groups, offsets=()) -> str | None:
    try:
        want = c0.program.with_extents(moved).text(exact=True).splitlines()
    except ir.ProgramError as e:  # another axis reads a tensor along it: they must move together
        return f"it is tied to another axis ({e})"
    got = c1.program.text(exact=True).splitlines()
    if want != got:
        k = next((k for k, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
        a = _readable(want[k]) if k < len(want) else "(nothing)"
        b = _readable(got[k]) if k < len(got) else "(nothing)"
        return f"the program depends on its length (at {_lengths(moved)} it reads `{b.strip()}` for `{a.strip()}`)"
    if {b.position: arg_axes(b, c1.program) for b in c1.args if b.is_tensor} != maps:
        return "the function reshapes an argument by its length"
    skip = proved_checks(c0, groups)  # (their sizes move with their axes)
    key0, key1 = ([(c.op, str(c.index), None if k in skip else c.size, c.wraps, c.ignore) for k, c in enumerate(cs)]
                  for cs in (c0.index_checks, c1.index_checks))
    # (a check with a program of its own is evaluated over each call's box; one of a whole input's values
    # read through an expression of the axes reads that whole input at these lengths only)
    if key0 != key1 or any(set(moved) & composed(c) for k, c in enumerate(c0.index_checks) if k not in skip):
        return "an index check depends on it (a gather or index along it)"
    if (c0.structure, c0.mutations, c0.output_dtypes) != (c1.structure, c1.mutations, c1.output_dtypes):
        return "what the function returns depends on it"
    # (an output dimension moves as an axis, or one padded to it, or not at all)
    now = {(c0.program.axes[a] - by, n - by) for a, n in moved.items()
           for by in {0} | {o.by for o in offsets if o.source == a}}
    if any(len(s0) != len(s1) or any(n0 != n1 and (n0, n1) not in now for n0, n1 in zip(s0, s1))
           for s0, s1 in zip(c0.output_shapes, c1.output_shapes)):
        return "an output's shape depends on it otherwise than as its length (a flatten of it)"
    if {n: t.shape for n, t in c0.constants.items()} != {n: t.shape for n, t in c1.constants.items()}:
        return "a tensor the function reads from its environment depends on it"
    return None


def _lengths(moved: dict[str, int]) -> str:
    return ", ".join(f"{a}={n}" for a, n in moved.items())


def _output_dims(c0: Captured, example, groups, maps, candidates=(), offsets=()) -> tuple[tuple[int, ...], ...]:
    """(output, dimension, group, by) of the output dimensions on a dynamic axis (`by` shorter than the
    group's length: an axis of `offsets`), from one more capture with every group moved (checked to be
    the same program by resolve)."""
    moved = _moved(c0, groups)
    with _quiet():
        c1 = capture(c0.fn, *_probe_args(c0, example, maps, moved), name=c0.program.name, merge=False,
                     symbolic_lengths=True)
    c1 = pad(c1, _offsets(c1, maps, candidates))
    shorter = [{0} | {o.by for o in offsets if o.source in g} for g in groups]  # (an axis padded to the group's)
    out = []
    for k, (s0, s1) in enumerate(zip(c0.output_shapes, c1.output_shapes)):
        for d, (n0, n1) in enumerate(zip(s0, s1)):
            if n0 == n1:
                continue
            hits = [(g, by) for g, group in enumerate(groups) for by in shorter[g]
                    if (c0.program.axes[group[0]] - by, moved[group[0]] - by) == (n0, n1)]
            if len(hits) != 1:
                raise NotDynamic(f"dynamic: dimension {d} of output {k} changes from {n0} to {n1} when the lengths "
                                 f"move to {_lengths(moved)}: it is not one of them (a flatten of a dynamic axis)")
            out.append((k, d, *hits[0]))
    return tuple(out)


def tie_lengths(program: ir.Program, groups) -> ir.Program:
    """`program` with the length of an axis no input has read as that of an axis of its group one has
    (x[0].expand_as(x).sum(0) sums over an axis of x's length that nothing reads: the kernels know x's)."""
    read = {a for s in program.inputs.values() for a in s.axes}
    tied = {}
    for group in groups:
        rep = next((a for a in group if a in read), None)
        if rep is not None:
            tied.update({ir.Length(a): ir.Length(rep) for a in group if a not in read})
    if not tied:
        return program
    outs = [ir.Output(o.name, o.axes, ir.substitute(o.expr, tied), o.dtype) for o in program.outputs]
    return replace(program, axes=dict(program.axes), inputs=dict(program.inputs), outputs=outs).validate()
