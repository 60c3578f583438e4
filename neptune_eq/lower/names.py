"""The identifiers a program's own names become in generated Triton source, and the check that no
two of them meet.

An axis x becomes t_x, offs_x, n_x, BLOCK_x, ... (always behind a prefix, so never `pid`, `CHUNKS`
or a temporary); a tensor q becomes q_ptr, q_s0, q_s1, ... and q_desc<n>; `_ident` maps characters
an identifier cannot hold to `_`. Two different names can still meet there: axes `a.b` and `a_b`,
a tensor `n` and an axis `ptr` (both give `n_ptr`), an input named like an intermediate buffer
(`buf_sum_j`) or a carried state (`st_max_j_ptr` is the pointer of `st_max_j` and the state of a
max over an axis `j_ptr`). Such a program is refused with a ProgramError naming both, before anything is
compiled, rather than lowered to source in which one silently stands for the other.
"""

from __future__ import annotations

import re

from ..ir import Program, ProgramError
from ..ops import MONOIDS
from .values import _ident

# prefixes of the identifiers derived from an axis (lower/triton.py, passes.py, memory.py)
AXIS_PREFIXES = ("t", "offs", "start", "n", "BLOCK", "ntiles", "per", "c_lo", "c_hi", "lo", "hi", "flo", "fhi")
_DESCRIPTOR = re.compile(r"(.+)_desc\d*")  # a tensor's descriptor temporaries: q_desc3


def check_names(program: Program) -> None:
    """ProgramError if two names of `program` would become one identifier in its kernels."""
    owner: dict[str, str] = {}

    def claim(ident: str, what: str) -> None:
        other = owner.setdefault(ident, what)
        if other != what:
            raise ProgramError(f"{what} and {other} of program '{program.name}' would both be written "
                               f"'{ident}' in the generated kernels; rename one of them")

    tensors = {**{s.name: len(s.axes) for s in program.inputs.values()},
               **{o.name: len(o.axes) for o in program.outputs}}
    derived = {name: (f"{_ident(name)}_ptr", *(f"{_ident(name)}_s{k}" for k in range(rank)))
               for name, rank in tensors.items()}
    for name, idents in derived.items():
        for ident in (*idents, f"{_ident(name)}_desc"):  # (the stem of its descriptors q_desc<n>)
            claim(ident, f"tensor '{name}'")
    for axis in program.axes:
        for p in AXIS_PREFIXES:
            ident = f"{p}_{_ident(axis)}"
            claim(ident, f"axis '{axis}'")
            if m := _DESCRIPTOR.fullmatch(ident):
                claim(m.group(1) + "_desc", f"axis '{axis}'")
    # intermediate buffers are named buf_<r> and part_<r>, state variables st_<r>, for a reduction r =
    # <op>_<axis>[n]: a tensor named so would be read or written in its place
    ops = "|".join(map(re.escape, MONOIDS))
    buffer = re.compile(rf"(buf|part)_({ops})_({'|'.join(map(re.escape, program.axes))})\d*")
    state = re.compile(rf"st_({ops})_({'|'.join(re.escape(_ident(a)) for a in program.axes)})\d*")
    for name, idents in derived.items():
        clash = name if buffer.fullmatch(name) else next((i for i in idents if state.fullmatch(i)), None)
        if clash is not None:
            raise ProgramError(f"tensor '{name}' of program '{program.name}' is named like a value of the generated "
                               f"kernels ('{clash}': an intermediate buffer buf_/part_<op>_<axis> or a carried "
                               "state st_<op>_<axis>); rename it")
