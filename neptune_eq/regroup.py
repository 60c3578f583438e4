"""Grouped-query heads as two axes, for training: a program whose axis a (the query head h) is read whole
by some tensors and as a // G by others (k[h // G], v[h // G] of grouped-query attention) is rewritten
over the group s = a // G and the member t = a mod G, a = s·G + t:

    q[b, h, i, d]        →  q[b, s, t, i, d]     (a view of the same tensor: the head dim unflattened)
    k[b, h // G, j, d]   →  k[b, s, j, d]        (a gather no more)
    out[b, h, i, e]      →  out[b, s, t, i, e]

Nothing is computed differently; what changes is the gradient. Of k read at h // G, it is a sum over the
query heads of a group: derived on the original program it is the one-hot Σ_h [h // G == s]·Ḡ(h), a
pass reading every query head's gradient once per kv head (G× the bytes: 217 µs of a 1.13 ms training
step at 32/8 heads, L 2048, on the H100). Over (s, t) it is Σ_t Σ_i …, a plain reduction over the
member axis, and every term of the backward (dO·O's row sum D, the saved log-sum-exp) stays indexed
as in the forward, so it is shared between the gradients. The training op views its tensors through
`Regroup.split` / `merge` at the boundary (a view, no copy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ir
from .ir import Call, Const, Index, Load, Reduce


@dataclass(frozen=True)
class Regroup:
    """Axis `axis` (extent G·n) of the original program is (`group`, `member`) = (n, G) here; `dims`:
    the position of `axis` in each input or output tensor that has it (the dim split in two)."""

    axis: str
    group: str
    member: str
    size: int
    dims: dict[str, int]

    def split(self, name: str, x: torch.Tensor) -> torch.Tensor:
        p = self.dims.get(name)
        return x if p is None else x.unflatten(p, (x.shape[p] // self.size, self.size))

    def merge(self, name: str, y: torch.Tensor) -> torch.Tensor:
        p = self.dims.get(name)
        return y if p is None or y.dim() <= p + 1 else y.flatten(p, p + 1)


def _candidates(program: ir.Program) -> dict[tuple[str, int], set[str]]:
    """(a, G) → the input axes read at a // G, for every grouped load entry whose axis has n_a / G positions."""
    found: dict[tuple[str, int], set[str]] = {}
    for o in program.outputs:
        for n in ir.walk(o.expr):
            if not isinstance(n, Load):
                continue
            for e, s in zip(n.index, program.inputs[n.tensor].axes):
                got = ir.grouped_index(e)
                if got is not None and got[1] > 1 and program.axes[got[0]] == got[1] * program.axes[s]:
                    found.setdefault(got, set()).add(s)
    return found


def regroup(program: ir.Program) -> tuple[ir.Program, Regroup] | None:
    """`program` over (group, member) axes in place of its grouped axis (module docstring), or None where
    it has none, or where the axis is dynamic, reduced over, or read in another way than whole (a load's
    index entry a over an input axis a) or as a // G over group axes used nowhere else (no output's or
    reduction's axis)."""
    found = _candidates(program)
    if len(found) != 1:
        return None
    (a, G), groups = next(iter(found.items()))
    if a in program.dynamic or groups & program.dynamic:
        return None
    s = min(groups, key=list(program.axes).index)
    nodes = {n for o in program.outputs for n in ir.walk(o.expr)}
    # a group axis used on its own (an output's axis, a reduction's) would be conflated with the group s
    if any(isinstance(n, Reduce) and n.axis in ({a} | groups) for n in nodes) or any(
            g in o.axes for o in program.outputs for g in groups):
        return None
    loads = [n for n in nodes if isinstance(n, Load)]
    for ld in loads:
        for e, ax in zip(ld.index, program.inputs[ld.tensor].axes):
            whole, grouped = e == Index(a), ir.grouped_index(e) == (a, G)
            if (whole and ax != a) or (grouped and ax not in groups) or (
                    not whole and not grouped and a in e.axes):
                return None
    t = next(f"{a}{k}" for k in range(1, len(program.axes) + 2) if f"{a}{k}" not in program.axes)
    axes: dict[str, int] = {}
    for ax, n in program.axes.items():
        if ax == a:
            axes[s], axes[t] = n // G, G
        elif ax not in groups:
            axes[ax] = n
    at = Call("add", (Call("mul", (Index(s), Const(float(G)))), Index(t)))

    def spec_axes(names: tuple[str, ...]) -> tuple[str, ...]:
        out: list[str] = []
        for ax in names:
            out += [s, t] if ax == a else [s] if ax in groups else [ax]
        return out

    def fn(old, new):
        if isinstance(old, Load):
            index: list[ir.Node] = []
            for e_old, e_new in zip(old.index, new.index):
                index += ([Index(s), Index(t)] if e_old == Index(a) else [Index(s)]
                          if ir.grouped_index(e_old) == (a, G) else [e_new])
            return Load(old.tensor, tuple(index))
        return at if new == Index(a) else Index(s) if isinstance(new, Index) and new.axis in groups else new

    memo: dict = {}
    dims = {n: spec.axes.index(a) for n, spec in program.inputs.items() if a in spec.axes}
    dims |= {o.name: o.axes.index(a) for o in program.outputs if a in o.axes}
    inputs = {n: ir.TensorSpec(n, tuple(spec_axes(spec.axes)), spec.dtype, spec.holds if spec.holds is None
                               else ir.rebuild(spec.holds, fn, {}))
              for n, spec in program.inputs.items()}
    outputs = [ir.Output(o.name, tuple(spec_axes(o.axes)), ir.rebuild(o.expr, fn, memo), o.dtype)
               for o in program.outputs]
    try:
        out = ir.Program(program.name, axes, inputs, outputs, dynamic=program.dynamic,
                         same_length=program.copies_within(axes)).validate()
    except ir.ProgramError:
        return None
    return out, Regroup(a, s, t, G, dims)
