"""Range checks of the index tensors a program gathers with, run on every call.

Eager PyTorch raises for an index out of range: `F.cross_entropy(logits, target)` with a target
outside [0, C) other than ignore_index, gather / index_select / embedding with an index outside
[0, n), advanced indexing `x[t]` with t outside [-n, n) (negative values count from the end).
A fused kernel cannot raise, so the translator records an `IndexCheck` for every index expression
it cannot prove in range (numeric.bounds bounds it over the axes' extents and the inputs' dtypes) and
the compiled function checks them before the kernels run:

    CPU    the values are compared on the host; IndexOutOfRange names the op, the user's line and
           the first offending value
    CUDA   torch._assert_async: no host synchronisation per call; a bad index stops the process
           with a device-side assertion, as eager's CUDA kernels do
    traced (torch.compile) torch._assert_async on every device: a host test of the values would
           be a data-dependent branch, which dynamo cannot put in a graph (fullgraph=True failed)

An index computed from axes alone (x[arange(n) - 1]) is checked once, at capture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import sympy
import torch

from .. import ir
from ..ir import NeptuneError
from ..numeric import bounds
from ..reference import evaluate
from .exprs import arg_extreme_axis
from .source import CaptureError


class IndexOutOfRange(NeptuneError, IndexError):
    """An index tensor holds a value outside the indexed dimension (eager PyTorch raises there too)."""


@dataclass(frozen=True)
class IndexCheck:
    """`index` (an integer expression over program inputs and axes) must lie in [0, size), or in
    [-size, size) when negative values count from the end (`wraps`), or equal `ignore`."""

    op: str  # what the user called: "gather", "cross_entropy / nll_loss target", ...
    where: str | None  # the user's `file.py:12: code`
    index: ir.Node
    size: int
    wraps: bool = False
    ignore: int | None = None
    program: ir.Program | None = None  # evaluates `index` where it is not a whole input tensor
    along: str | None = None  # the program axis of the indexed dimension, where it is one
    # message() without a value, written at construction: a traced call asserts with it, and dynamo
    # (dynamic=True) reads the int fields as symbolic lengths, which it cannot format
    traced_message: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "traced_message", _literal_safe(self.message()))

    @property
    def valid(self) -> str:
        lo = -self.size if self.wraps else 0
        rng = f"[{lo}, {self.size})"
        return rng if self.ignore is None else f"{rng} or ignore_index {self.ignore}"

    def message(self, value: int | None = None, *, located: bool = True) -> str:
        got = "" if value is None else f"index {value} is out of range: "
        where = f" at {self.where}" if self.where and located else ""
        return f"{self.op}: {got}valid indices are {self.valid}{where}"

    def values(self, inputs: dict[str, torch.Tensor], at: dict | None = None) -> torch.Tensor:
        """The index values this call reads (all of them, in any order); `at` the lengths of a dynamic
        call's axes (the index is evaluated over the call's box, not the capture's)."""
        if self.program is None:
            return inputs[self.index.tensor]
        program = self.program
        if at:
            axes = {a: at.get(a, n) for a, n in program.axes.items()}
            program = ir.Program(program.name, axes, dict(program.inputs), [])
        return evaluate(program, {n: inputs[n] for n in program.inputs}, nodes=[self.index])["0"]

    def elements(self, inputs: dict[str, torch.Tensor], at: dict | None = None) -> int:
        """How many index values the check evaluates (over the index's axes; `at`: a dynamic call's lengths)."""
        if self.program is None:
            return inputs[self.index.tensor].numel()
        return math.prod((at or {}).get(a, self.program.axes[a])
                         for a in {n.axis for n in ir.walk(self.index) if isinstance(n, ir.Index)})

    def reads(self) -> set[str]:
        """The inputs whose values the check reads."""
        return {self.index.tensor} if self.program is None else set(self.program.inputs)

    def in_range(self, v: torch.Tensor) -> torch.Tensor:
        ok = (v >= (-self.size if self.wraps else 0)) & (v < self.size)
        return ok | (v == self.ignore) if self.ignore is not None else ok

    def run(self, inputs: dict[str, torch.Tensor], at: dict | None = None) -> None:
        v = self.values(inputs, at)
        ok = self.in_range(v)
        if v.is_cuda or torch.compiler.is_compiling():  # (traced: a host test of the values cannot be)
            torch._assert_async(ok.all(), self.traced_message)
        elif not bool(ok.all()):
            raise IndexOutOfRange(self.message(int(v[~ok].flatten()[0])))


def _literal_safe(message: str) -> str:
    """`message` without the characters that break the string literal inductor writes it into (its C++
    and Triton asserts do not escape them: a user's line holding a quote failed to compile)."""
    return "".join("'" if c == '"' else "/" if c == "\\" else c for c in message if c.isprintable())


def run_checks(checks: tuple[IndexCheck, ...], inputs: dict[str, torch.Tensor], at: dict | None = None) -> None:
    """Raise IndexOutOfRange (CPU) or assert on the device (CUDA) for the first failing check (`at`: the
    lengths of a dynamic call's axes)."""
    for c in checks:
        c.run(inputs, at)


def refuse_reduced_index(op: str, index: ir.Node) -> None:
    """A gather's index computed by a reduction (h[arange(b), mask.sum(1) - 1], last-token pooling)
    would read its tensor at a value the kernels cannot compute first: refused, naming the reduction —
    unless it is an argmax or argmin, always in range, which the gather reads as a one-hot selection
    (ops_index._substitute_axes)."""
    found = next((n for n in ir.walk(index) if isinstance(n, ir.Reduce)), None)
    if found is not None and arg_extreme_axis(index) is None:
        raise CaptureError(f"{op} at an index computed by a reduction ({ir.show(found)}) is not supported; "
                           "compute the index outside the compiled function and pass it in")


def analyse(check: IndexCheck, extents: dict[str, int], dtypes: dict[str, str]) -> tuple[bool, bool]:
    """(whether `check` must run on every call, whether its index may be negative). Interval
    bounds decide where they can; an index that reads no tensor is otherwise evaluated now,
    exactly: out of range, it is a CaptureError (eager raises on every call)."""
    lo, hi = bounds(check.index, extents, dtypes)
    if lo >= (-check.size if check.wraps else 0) and hi < check.size:
        return False, lo < 0
    if any(isinstance(n, ir.Load) for n in ir.walk(check.index)):
        return True, lo < 0
    program = ir.Program("index", {a: extents[a] for a in check.index.axes | _lengths_read(check.index)}, {}, [])
    v = evaluate(program, {}, nodes=[check.index])["0"]
    ok = check.in_range(v)
    if not bool(ok.all()):
        raise CaptureError(check.message(int(v[~ok].flatten()[0]), located=False), check.where)
    return False, bool((v < 0).any())


def _lengths_read(index: ir.Node) -> set[str]:
    """The axes whose length `index` reads (len(axis): `(arange(L) + 1) % L`), which its evaluation
    needs though it varies over none of them."""
    return {n.axis for n in ir.walk(index) if isinstance(n, ir.Length)}


def holds_at_every_length(check: IndexCheck, extents: dict[str, int], dtypes: dict[str, str]) -> bool:
    """Do the interval bounds prove `check` in range with every axis its index reads at any length
    (its dimension's size as captured)? A dynamic capture's check proved at the example's lengths
    alone (x[arange(L) + 5] of 30 rows, at L = 20) must run: the dynamic axes keep it static there."""
    if not check.index.axes:
        return True
    lo, hi = bounds(check.index, {a: (_ANY_LENGTH if a in check.index.axes else n) for a, n in extents.items()},
                    dtypes)
    return lo >= (-check.size if check.wraps else 0) and hi < check.size


_ANY_LENGTH = 1 << 30  # the length an axis is bounded at to prove a check for every length


def length_bounds(n: ir.Node):
    """[lo, hi] of an index of axes alone as sympy expressions in the axes' lengths (`len_<axis>`), or
    None for a form this does not follow (a load, a product of two axes): x[arange(L)]'s index is
    in [0, len_i - 1], which is within a dimension whose length moves with L (`along`)."""
    if isinstance(n, ir.Const):
        return (sympy.Integer(int(n.value)),) * 2 if math.isfinite(n.value) and float(n.value).is_integer() else None
    if isinstance(n, ir.Index):
        return sympy.Integer(0), length_symbol(n.axis) - 1
    if isinstance(n, ir.Length):
        return (length_symbol(n.axis),) * 2
    if not isinstance(n, ir.Call):
        return None
    if n.op == "where":
        a, b = length_bounds(n.args[1]), length_bounds(n.args[2])
        ok = a is not None and b is not None and not any(isinstance(m, ir.Load) for m in ir.walk(n.args[0]))
        return (sympy.Min(a[0], b[0]), sympy.Max(a[1], b[1])) if ok else None
    args = [length_bounds(a) for a in n.args]
    if any(a is None for a in args):
        return None
    if n.op == "add":
        return args[0][0] + args[1][0], args[0][1] + args[1][1]
    if n.op == "sub":
        return args[0][0] - args[1][1], args[0][1] - args[1][0]
    if n.op == "neg":
        return -args[0][1], -args[0][0]
    if n.op in ("max2", "min2"):
        f = sympy.Max if n.op == "max2" else sympy.Min
        return f(args[0][0], args[1][0]), f(args[0][1], args[1][1])
    if n.op == "mul":
        (a, b), (c, d) = args
        if a == b and a.is_number:  # (a constant factor)
            return (a * c, a * d) if a >= 0 else (a * d, a * c)
        if c == d and c.is_number:
            return (c * a, c * b) if c >= 0 else (c * b, c * a)
    return None


def length_symbol(axis: str):
    return sympy.Symbol(f"len_{axis}", integer=True, positive=True)


def index_program(index: ir.Node, program_axes: dict[str, int], specs: dict[str, ir.TensorSpec]) -> ir.Program | None:
    """None where the values of `index` are those of a whole input tensor: read at distinct axes,
    or at any index that reaches every element of it (`reads_whole`: a paged cache's
    `block_table[b, j // P]`, checked as the table, not as one gathered value per key); else a
    program holding the axes and inputs `index` reads, to evaluate it."""
    if (isinstance(index, ir.Load) and all(isinstance(e, ir.Index) for e in index.index)
            and len({e.axis for e in index.index}) == len(index.index)):
        return None
    if isinstance(index, ir.Load) and reads_whole(index, program_axes, specs[index.tensor]):
        return None
    loads = {n.tensor for n in ir.walk(index) if isinstance(n, ir.Load)}
    return ir.Program("index", dict(program_axes), {n: specs[n] for n in loads}, [])


MAX_COVER_CHECK = 1 << 24  # index values evaluated at capture to prove a read reaches a whole tensor


def reads_whole(load: ir.Load, program_axes: dict[str, int], spec: ir.TensorSpec) -> bool:
    """Does `load` read every element of its tensor over the program's axes (so a range check of
    the tensor's own values checks exactly the values the program reads, as eager's gather does)?
    Each dimension's index reads no tensor and depends on at most one axis, a different one per
    dimension, and takes every value of [0, size) over that axis's extent, evaluated here (so it
    holds at these extents only: a dynamic axis it depends on stays static, see frontend/dynamic)."""
    seen: set[str] = set()
    for e, a in zip(load.index, spec.axes):
        nodes = list(ir.walk(e))
        used = {n.axis for n in nodes if isinstance(n, ir.Index)}
        if any(isinstance(n, ir.Load) for n in nodes) or len(used) > 1 or used & seen:
            return False
        seen |= used
        if any(program_axes[u] > MAX_COVER_CHECK for u in used):
            return False
        program = ir.Program("index", {u: program_axes[u] for u in used | _lengths_read(e)}, {}, [])
        values = evaluate(program, {}, nodes=[e])["0"].flatten().to(torch.float64)  # (the evaluator's dtype)
        if not torch.equal(torch.unique(values), torch.arange(program_axes[a], dtype=torch.float64)):
            return False
    return True


def composed(check: IndexCheck) -> set[str]:
    """The axes a check's index reads through an expression (not a bare axis): its values are its
    tensor's only at the extents it was captured at (`reads_whole`)."""
    if check.program is not None or not isinstance(check.index, ir.Load):
        return set()
    return {n.axis for e in check.index.index if not isinstance(e, ir.Index)
            for n in ir.walk(e) if isinstance(n, ir.Index)}
