"""Training split at a dot's gathered operand: attention on rotated q and k (RoPE) trains as torch does.

A contraction Σ_d A[i, d]·B[j, d] whose operand B is an elementwise function of inputs that reads one
of them at clamped, shifted positions (B = k·cos + rotate_half(k)·sin) has the gradient
∂k[s] = cos[s]·Ḡ[s] + the shift back of sin·Ḡ, where Ḡ[j, d] = Σ_i dS[i, j]·A[i, d] is a reduction.
Derived in one program, Ḡ read at d ± 64 is a reduction of its own per shift (the IR reads a
reduction's value at its own indices only): three accumulators per gradient, 115 ms on the H100
where torch.compile took 1.3. Split at the operand, the program is

    maps   r = B(k, cos, sin)               an elementwise map with its own (shift-back) gradient
    core   the forward with B read as an input r: plain attention, with FlashAttention's backward

and the chain rule runs core's backward (→ ∂r) then maps' (∂r → ∂k), gradients of an input that both
read summed. r is stored in the dtype the tensor cores read B in (the one 16-bit dtype of the data it
is computed from, rounded as the forward's dot rounds it), so the core computes what the forward did.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import ir
from .contraction import is_product, opened
from .index_shift import clamped_shift


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
    """The one floating dtype of the inputs `f` loads (what the dot rounds it to), None if mixed."""
    dts = {program.inputs[n.tensor].dtype for n in ir.walk(f) if isinstance(n, ir.Load)}
    dts &= set(ir.FLOAT_DTYPES)
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
        if got is None or got[1] == 1 or n in groups or program.axes[got[0]] % got[1]:
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


def split_prologue(program: ir.Program, wrt: list[str]) -> Prologue | None:
    """The program split at its gathered dot operands (see the module docstring), None if it has none.
    An operand qualifies when it is a factor of a sum's product body, reads no reduction, and gathers
    an input whose gradient is required at clamped shifts."""
    want = set(wrt)
    found: dict[ir.Node, str] = {}
    taken = set(program.inputs) | {o.name for o in program.outputs}
    for out in program.outputs:
        for n in ir.walk(out.expr):
            if not (isinstance(n, ir.Reduce) and n.op == "sum" and is_product(n.body)):
                continue
            for f in opened(n.body).factors:
                if (f in found or isinstance(f, ir.Load) or not f.axes or _dtype(f, program) is None
                        or any(isinstance(m, ir.Reduce | ir.StateRef) for m in ir.walk(f)) or not _gathers(f, want)):
                    continue
                name = next(f"rot{k}" for k in range(len(taken) + 1) if f"rot{k}" not in taken)
                taken.add(name)
                found[f] = name
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
    outputs = [replace(o, expr=ir.substitute(o.expr, loads)) for o in program.outputs]
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
