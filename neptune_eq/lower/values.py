"""What the Triton writer works with: typed values (a code string, the axes it is a block over, its
kind), the tensors and launch facts of a generated kernel, and how numbers are written into source."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .. import ir
from ..ops import OPS
from ..schedule import KernelSchedule

_TL_DTYPE = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16", "int32": "tl.int32",
             "int64": "tl.int64", "bool": "tl.int1", "float64": "tl.float64",
             "uint8": "tl.uint8", "int8": "tl.int8", "int16": "tl.int16"}


@dataclass
class Val:
    code: str
    dims: tuple[str, ...]
    kind: str  # "f" float32, "i" integer, "b" boolean, or a native load dtype ("float16", ...)

    @property
    def native(self) -> bool:
        return self.kind not in ("f", "i", "b")


@dataclass
class TensorArg:
    name: str
    axes: tuple[str, ...]
    dtype: str
    role: str  # "input" | "output" | "buffer"


@dataclass
class KernelSource:
    """Generated code for one kernel and what the launcher needs to call it."""

    name: str
    source: str  # the @triton.jit function
    tensors: list[TensorArg]
    extents: list[str]  # axes passed as n_<axis>
    grid: list[tuple[str, int]]  # (axis, step) in pid decomposition order (last fastest)
    chunks: int
    constexprs: dict[str, int]
    schedule: KernelSchedule
    # tensors read through tensor descriptors → the dimensions (index positions) each descriptor spans
    descriptors: dict[str, tuple[int, ...]] = field(default_factory=dict)
    buffers_read: frozenset[str] = frozenset()  # intermediate buffers an earlier kernel wrote
    buffers_written: frozenset[str] = frozenset()
    # launched as a programmatic dependent launch (CUDA): starts while the kernel before it drains
    # and waits (gdc_wait) for that kernel's results before its first instruction
    pdl: bool = False
    # loop bounds worked out per call from the inputs' values (lower/databounds.py: DataBound)
    data_bounds: tuple = ()
    # run by the vendor's GEMM (lower/library.py: LibraryGemm), not generated: `source` is a comment
    library: object | None = None
    # compiled without contracting a multiply and an add into an FMA: it writes out a short reduction
    # whose bits other kernels must reproduce (numeric.written_out), or compares a computed value with a
    # state, or computes such a state (lower/exact.py)
    exact_arith: bool = False


def _int_const(n: ir.Node) -> int | None:
    if isinstance(n, ir.Const) and math.isfinite(n.value) and float(n.value).is_integer() and abs(n.value) < 2**63:
        return int(n.value)
    return None


_LITERALS = {"POS_INF": math.inf, "NEG_INF": -math.inf, "True": 1.0, "False": 0.0}


def _literal(code: str) -> float | None:
    """The value of `code` where it is a number written into the source (not a tensor), else None."""
    if code in _LITERALS:
        return _LITERALS[code]
    try:
        return float(code)
    except ValueError:
        return None


def _folded(n: ir.Call) -> ir.Const:
    """A call on constants, evaluated at code generation (float64, like the reference)."""
    import numpy as np

    return ir.Const(float(np.asarray(OPS[n.op].numpy(*(np.float64(a.value) for a in n.args)), dtype=float)))


def _fmt_num(v: float | int) -> str:
    """A float literal, or an integer one for integer values (int64 identities)."""
    return str(v) if isinstance(v, int) else _fmt_float(v)


def _fmt_float(v: float) -> str:
    if math.isinf(v):
        return "POS_INF" if v > 0 else "NEG_INF"
    if math.isnan(v):
        return "_nan()"
    return repr(float(v))


def _ident(name: str) -> str:
    out = "".join(ch if ch.isalnum() else "_" for ch in name)
    return out if out[:1].isalpha() else "v_" + out


@dataclass
class _Scope:
    memo: dict = field(default_factory=dict)
    variant: set = field(default_factory=set)  # state references (ir.StateRef) that vary in this scope
    axis: ir.Axis | None = None  # loop axis of this scope (ir.CHUNK for split-K's combine)
    lines: list | None = None  # where code computed at this scope's level goes (None: the current lines)
    depth: int = 0


def block_shape(dims) -> str:
    """`[BLOCK_a, BLOCK_b]`: the shape of a block over axes `dims`."""
    return "[" + ", ".join(f"BLOCK_{_ident(a)}" for a in dims) + "]"


_ASSIGNED = re.compile(r"^\s*(?:for\s+)?(\w+(?:\s*,\s*\w+)*)\s*(?:[-+*/]?=(?!=)|in\b)")
_BROADCAST = re.compile(r"\b(\w+)\[((?:None|:)(?:, (?:None|:))*)\]")


def hoist_broadcasts(outer: list[str], depth: int, body: list[str], fresh) -> tuple[list[str], list[str]]:
    """A loop body's broadcasts of values computed before the loop (`t[:, None]` of a hoisted row) as
    names bound before it: (the bindings, the body using them). Triton 3.6's layout pass merged one such
    broadcast with the same one in a sibling loop, inside the other loop's region ("operand does not
    dominate this use": a folded norm backward's three loops, edge and interior tiles, on the H100).
    Only names bound at the loop's own level (`depth`, not inside an earlier loop) and not assigned by the
    body are hoisted. `fresh()` gives a new name."""
    def assigned(lines: list[str]) -> set[str]:
        return {n.strip() for line in lines if (m := _ASSIGNED.match(line)) for n in m.group(1).split(",")}

    before = assigned([line for line in outer if len(line) - len(line.lstrip()) <= 4 * depth])
    inside = assigned(body)
    names: dict[tuple[str, str], str] = {}

    def sub(m: re.Match) -> str:
        key = (m.group(1), m.group(2))
        if key[0] not in before or key[0] in inside:
            return m.group(0)
        if key not in names:
            names[key] = fresh()
        return names[key]

    body = [_BROADCAST.sub(sub, line) for line in body]
    return [f"{v} = {n}[{i}]" for (n, i), v in names.items()], body
