"""Training split at a dot's computed operand: attention on rotated (RoPE) or normalised (QK-norm) q and k
trains as torch does.

A contraction Σ_d A[i, d]·B[j, d] whose operand B is computed from inputs — reading one at clamped,
shifted positions (B = k·cos + rotate_half(k)·sin) or through a reduction (B = k·rsqrt(mean_d k²)·w) —
has a gradient that, derived in one program, reads Ḡ[j, d] = Σ_i dS[i, j]·A[i, d] at d ± 64 (the IR reads
a reduction's value at its own indices only, so each shift is a reduction of its own: three accumulators
per gradient, 115 ms on the H100 where torch.compile took 1.3) or recomputes the row statistic in every
gradient kernel (73 ms against 1.5). Split at the operand, the program is

    maps   r = B(k, cos, sin)               a map (or a row norm) with its own backward
    core   the forward with B read as an input r: plain attention, with FlashAttention's backward

and the chain rule runs core's backward (→ ∂r) then maps' (∂r → ∂k), gradients of an input that both
read summed. r is stored in the one floating dtype of the data it is computed from: as torch holds it,
and as the forward's dot rounds it, so the core computes what the forward did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import ir
from .contraction import gemm_sides, is_product, product_of
from .index_shift import clamped_shift
from .numeric import held_dtypes


@dataclass(frozen=True)
class Prologue:
    """`core`: the forward with each split operand read as an input (name → the expression it holds);
    `maps`: the program computing those inputs (one output each) from the forward's inputs."""

    core: ir.Program
    maps: ir.Program
    operands: dict[str, ir.Node]


def _gathers(f: ir.Node, wrt: set[str]) -> bool:
    """Does `f` read an input of `wrt` at a clamped shift of an axis (a slice, a cat, rotate-half), its
    other indices axes or groups of one (the kv head h // G)?"""
    def shifted(e: ir.Node) -> bool:
        return not isinstance(e, ir.Index) and clamped_shift(e) is not None

    return any(isinstance(n, ir.Load) and n.tensor in wrt and any(shifted(e) for e in n.index)
               and all(shifted(e) or ir.grouped_index(e) is not None for e in n.index) for n in ir.walk(f))


def _dtype(f: ir.Node, program: ir.Program) -> str | None:
    """The one floating dtype torch holds `f` in (what the dot rounds it to): its loads', float32 for an
    operand the frontend marks so (numeric.held_dtypes); None if mixed."""
    dts = held_dtypes(f, lambda t: program.inputs[t].dtype)
    return dts.pop() if len(dts) == 1 else None


def _layout(f: ir.Node, axes: dict[str, int]) -> tuple[str, ...]:
    """The axis order of the tensor holding `f`: that of a tensor it reads whole (k[b, h, j, d] for the
    rotated k: its head dimension contiguous, as the dot loads it best), else the program's."""
    for n in ir.walk(f):
        if isinstance(n, ir.Load) and all(isinstance(e, ir.Index) for e in n.index) \
                and {e.axis for e in n.index} == set(f.axes) and len(n.index) == len(f.axes):
            return tuple(e.axis for e in n.index)
    return tuple(a for a in axes if a in f.axes)


def _coarsened(f: ir.Node, program: ir.Program, axes: dict[str, int]) -> tuple[ir.Node, dict[ir.Node, str]]:
    """`f` over the group axis of each axis it reads only as a // G (grouped-query attention's kv head
    h // G): that index becomes a fresh axis of extent n_a / G, added to `axes`, so the operand is
    stored once per group, as k is (stored per query head, its gradient would sum the group at a
    shifted position, which is not derived). Returns f and {a // G: the fresh axis}."""
    groups: dict[ir.Node, str] = {}
    for n in ir.walk(f):
        got = ir.grouped_index(n) if isinstance(n, ir.Call) else None
        if got is None or got[1] == 1 or n in groups or program.axes[got[0]] % got[1] or got[0] in program.dynamic:
            continue
        a, g = got
        rest = ir.substitute(f, {n: ir.Const(0.0)})
        if any(isinstance(m, ir.Index) and m.axis == a for m in ir.walk(rest)):
            continue  # a read elsewhere whole: the operand varies along it
        name = next(f"{a}{k}" for k in range(1, len(axes) + 2) if f"{a}{k}" not in axes)
        axes[name] = program.axes[a] // g
        groups[n] = name
    if groups:
        f = ir.substitute(f, {n: ir.Index(name) for n, name in groups.items()})
    return f, groups


def _worth_splitting(f: ir.Node, program: ir.Program, want: set[str]) -> bool:
    """Is operand `f` computed (not one load), free of loop state, of one floating dtype, and either a
    gather of a differentiated input at clamped shifts or a normalisation of one (a reduction inside:
    QK-norm's k·rsqrt(mean_d k²)·w, whose gradient inline recomputes the row statistic in every
    gradient kernel, 73 ms against torch.compile's 1.5 on the H100)?"""
    if isinstance(f, ir.Load) or not f.axes or _dtype(f, program) is None:
        return False
    if ir.reads_state(f):
        return False
    nodes = list(ir.walk(f))
    reads = any(isinstance(m, ir.Load) and m.tensor in want for m in nodes)
    # no larger than a tensor it reads (stored per kv head where it reads one): attention's P =
    # softmax(q·kᵀ) is an operand of P·V computed through reductions too, and written out it would be
    # the [i, j] matrix fusion exists to avoid
    axes = dict(program.axes)
    size = math.prod(axes[a] for a in _coarsened(f, program, axes)[0].axes)
    if size > max(math.prod(program.axes[a] for a in program.inputs[m.tensor].axes)
                  for m in nodes if isinstance(m, ir.Load)):
        return False
    return _gathers(f, want) or (reads and any(isinstance(m, ir.Reduce) for m in nodes))


def split_prologue(program: ir.Program, wrt: list[str]) -> Prologue | None:
    """The program split at its gathered or normalised dot operands (see the module docstring), None if
    it has none. An operand is one side of a sum's product body split as a tile GEMM's (every factor
    over the contraction and one free axis, with those over the contraction alone), unconditioned."""
    want = set(wrt)
    found: dict[ir.Node, str] = {}
    sums: dict[ir.Reduce, tuple] = {}
    taken = set(program.inputs) | {o.name for o in program.outputs}
    big = dict.fromkeys(program.axes, 1 << 30)  # (the split is algebra: any extent may be a tile's)
    for out in program.outputs:
        for n in ir.walk(out.expr):
            if not (isinstance(n, ir.Reduce) and n.op == "sum" and is_product(n.body)) or n in sums:
                continue
            sides = gemm_sides(n.body, n.axis, tuple(a for a in program.axes if a in n.body.axes and a != n.axis),
                               big, conditions=True)
            if sides is None or sides.left_conds or sides.right_conds:
                continue
            ops = [product_of(list(fs)) for fs in (sides.left, sides.right)]
            if not any(_worth_splitting(f, program, want) for f in ops):
                continue
            for f in ops:
                if _worth_splitting(f, program, want) and f not in found:
                    found[f] = next(f"operand{k}" for k in range(len(taken) + 1) if f"operand{k}" not in taken)
                    taken.add(found[f])
            sums[n] = (sides, ops)
    if not found:
        return None
    axes = dict(program.axes)
    operands, loads, axes_of = {}, {}, {}
    for f, name in found.items():
        stored, groups = _coarsened(f, program, axes)
        operands[name] = stored
        axes_of[name] = _layout(stored, axes)
        back = {ir.Index(a): g for g, a in groups.items()}  # (the core reads the group's row at a // G)
        loads[f] = ir.Load(name, tuple(back.get(ir.Index(a), ir.Index(a)) for a in axes_of[name]))
    rebuilt = {}
    for n, (sides, ops) in sums.items():
        left, right = ([loads[f]] if f in loads else list(fs) for f, fs in zip(ops, (sides.left, sides.right)))
        rebuilt[n] = ir.Reduce(n.op, n.axis, product_of([*left, *right, *sides.post], sides.post_conds))
    outputs = [replace(o, expr=ir.substitute(o.expr, rebuilt)) for o in program.outputs]
    read = {n.tensor for o in outputs for n in ir.walk(o.expr) if isinstance(n, ir.Load)}
    inputs = {n: s for n, s in program.inputs.items() if n in read}
    inputs |= {name: ir.TensorSpec(name, axes_of[name], _dtype(f, program)) for name, f in operands.items()}
    core_axes = {a: v for a, v in axes.items() if a in program.axes or any(a in s.axes for s in inputs.values())}
    core = replace(program, name=f"{program.name}_core", axes=core_axes, inputs=inputs, outputs=outputs)
    used = {n.tensor for f in operands.values() for n in ir.walk(f) if isinstance(n, ir.Load)}
    maps_axes = {a for name in operands for a in axes_of[name]} | {a for n in used for a in program.inputs[n].axes}
    maps = ir.Program(f"{program.name}_operands", {a: v for a, v in axes.items() if a in maps_axes},
                      {n: s for n, s in program.inputs.items() if n in used},
                      [ir.Output(name, axes_of[name], f, _dtype(f, program)) for name, f in operands.items()],
                      program.dynamic & maps_axes)
    return Prologue(core.validate(), maps.validate(), operands)
