"""One-hot sums run as a scatter-add of rows, not as a contraction over the table.

The gradient of a gathered load onto its table (neptune_eq.grad_gather's one-hot form) is

    ∂w[j, d] = Σ_i [e(i) = j]·v(i, d)                      (an embedding's rows, CosFace's class centres)

Dense, it is a contraction over the points i for every row j: |i|·|j|·|d| terms, |i|·|d| of them
nonzero — CosFace's class-centre gradient (8192 points, 32768 rows, 512 wide) ran 19.2 ms of a 21.7 ms
step on an H100. `split` takes such terms out of a program's outputs:

    rows[i, d] = v(i, d)                                   an output over the points and the rest
    at[i]      = e(i) where 0 ≤ e(i) < |j| else |j|        the row each point adds into, as an output
    ∂w         = dense part + rows added at `at`           lower/scatter_rows.py, after the program's kernels

— taken where the rows are at most `ROWS_FACTOR` times the largest tensor the program reads or writes
(a score-sized value of attention's bucketed bias stays dense, on chip) and the table has `MIN_ROWS`
rows or more (below, the dense form's few compares per term cost less than writing and reading the
rows), unless a dense sum of the same output runs over the same points (the one-hot then merges into
its operand at no cost: linear cross-entropy's dW = Σ_i (p_ij − [t_i = j]·c_i)·h_id). Summed axes the
index does not read stay summed inside the rows (Σ_i Σ_k [c(i) = j]·v(i, k) is rows Σ_k v(i, k) at
c(i)). Terms that share their points and index share one scatter (their values summed first). A point
whose index falls outside the table adds to a spare row that is dropped, as it adds nothing in the
dense sum. Exact up to the order of the additions (float32, float64 in a float64 program: atomic
adds); under torch.use_deterministic_algorithms the scatter is index_put_'s sorted accumulate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from . import ir
from .grad_gather import substitute_free
from .ir import Call, Const, Index, Reduce
from .lower.scatter_rows import scatter_rows
from .masks import conjunction, conjuncts

# the table rows from which a one-hot sum leaves the program: the dense form costs ~3 ALU operations per
# row and term (compare, select, add), the scatter ~12 bytes per term (rows written, read, added): at the
# H100's ~20 float32 operations per HBM byte the two meet near 80 rows; below 64 the dense form stays
MIN_ROWS = 64
# the rows' size, against the largest tensor the program reads or writes, up to which they leave it: a
# skip-gram's negatives (32768 × 5 points of 300 values, 1.6× the table) do, a bucketed attention
# bias's score-sized rows (L²·heads, L/d times the queries' size) stay on chip in the dense form
ROWS_FACTOR = 4


@dataclass(frozen=True)
class Scatter:
    """Rows `values` (over `row_points` then `rest`) added into output rows `at` (over `points`): the
    linear row over the output's `targets` axes, |targets| for a point outside the table. Points the
    value does not vary over come last: consecutive points read one row."""

    values: str
    at: str
    points: tuple[str, ...]  # those the rows vary over first (`row_points`), then the rest
    row_points: tuple[str, ...]
    targets: tuple[str, ...]
    rest: tuple[str, ...]
    index: str  # the index expression, shown


@dataclass(frozen=True)
class Scattered:
    """An output of the original program: its `dense` part (an output of the split program in the wide
    float dtype, None where nothing is left) plus its scatters."""

    output: ir.Output
    dense: str | None
    scatters: tuple[Scatter, ...]


@dataclass(frozen=True)
class Split:
    program: ir.Program  # the original
    inner: ir.Program  # what the kernels compute
    outputs: tuple[Scattered, ...]

    def describe(self) -> str:
        return "; ".join(f"{o.output.name} += rows over ({', '.join(s.row_points)}) scattered to "
                         f"{'×'.join(s.targets)} at {s.index}"
                         + (f" for each {', '.join(a for a in s.points if a not in s.row_points)}"
                            if s.points != s.row_points else "") + " (scatter_rows)"
                         for o in self.outputs for s in o.scatters)

    def finish(self, res: dict[str, torch.Tensor], lengths: dict[str, int],
               dtypes: dict | None = None) -> dict[str, torch.Tensor]:
        """The original outputs from the split program's results `res` (lengths: the dynamic axes')."""
        out = {o.name: res[o.name] for o in self.program.outputs if o.name in res}
        for sc in self.outputs:
            o = sc.output
            shape = {a: lengths.get(a, self.program.axes[a]) for a in o.axes}
            total = res[sc.dense] if sc.dense is not None else None
            for s in sc.scatters:
                rest = tuple(shape[a] for a in s.rest)
                n, cols = math.prod(shape[a] for a in s.targets), math.prod(rest)
                rows, at = res[s.values].reshape(-1, cols).contiguous(), res[s.at].reshape(-1)
                acc = rows.new_zeros((n + 1, cols))
                scatter_rows(acc, at, rows, at.numel() // max(rows.shape[0], 1))
                laid = (*s.targets, *s.rest)
                part = acc[:n].view(*(shape[a] for a in s.targets), *rest).permute([laid.index(a) for a in o.axes])
                total = part if total is None else total + part
            want = (dtypes or {}).get(o.name) or getattr(torch, o.dtype or "float32")
            out[o.name] = total.to(want).contiguous()
        return out


def split(program: ir.Program) -> Split | None:
    """`program` with its outputs' one-hot sums taken out as the module says, or None where none is."""
    limit = max(math.prod(program.axes[a] for a in s.axes) for s in [*program.inputs.values(), *program.outputs])
    wide = "float64" if any(s.dtype == "float64" for s in program.inputs.values()) else "float32"
    taken = set(program.inputs) | {o.name for o in program.outputs}
    outputs, kept, extra = [], [], []
    for o in program.outputs:
        dense: list[ir.Node] = []
        groups: dict[tuple, list[ir.Node]] = {}
        for term in _terms(o.expr):
            got = _one_hot(term, o, program, limit)
            if got is None:
                dense.append(term)
            else:
                points, row_points, index, value = got
                groups.setdefault((points, row_points, index), []).append((value, term))
        # a dense sum over the same points takes the one-hot into its operand for free (extract/merge.py:
        # linear cross-entropy's dW = Σ_i (p_ij − [t_i = j]·c_i)·h_id, one GEMM): those terms stay
        summed = set().union(*(_summed(t) for t in dense)) if dense else set()
        for key in [k for k in groups if set(k[0]) <= summed]:
            dense += [term for _, term in groups.pop(key)]
        if not groups:
            kept.append(o)
            continue
        scatters = []
        for (points, row_points, index), values in groups.items():
            targets = tuple(a for a in o.axes if a in dict(index))
            rest = tuple(a for a in o.axes if a not in targets)
            name, at = _fresh(f"{o.name}_rows", taken), _fresh(f"{o.name}_at", taken)
            extra.append(ir.Output(name, (*row_points, *rest), _sum([v for v, _ in values]), wide))
            extra.append(ir.Output(at, points, _linear(dict(index), targets, program), "int64"))
            scatters.append(Scatter(name, at, points, row_points, targets, rest,
                                    ", ".join(f"{t} = {ir.show(e)}" for t, e in index)))
        dense_name = None
        if dense:
            dense_name = _fresh(f"{o.name}_dense", taken)
            kept.append(ir.Output(dense_name, o.axes, _sum(dense), wide))
        outputs.append(Scattered(o, dense_name, tuple(scatters)))
    if not outputs:
        return None
    inner = replace(program, name=f"{program.name}_rows", outputs=kept + extra).validate()
    return Split(program, inner, tuple(outputs))


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name


def _sum(terms: list[ir.Node]) -> ir.Node:
    out = terms[0]
    for t in terms[1:]:
        out = Call("add", (out, t))
    return out


def _terms(n: ir.Node) -> list[ir.Node]:
    """The summands of n: its additions and subtractions flattened (a subtracted one negated)."""
    if isinstance(n, Call) and n.op == "add":
        return _terms(n.args[0]) + _terms(n.args[1])
    if isinstance(n, Call) and n.op == "sub":
        return _terms(n.args[0]) + [Call("neg", (t,)) for t in _terms(n.args[1])]
    return [n]


def _one_hot(term: ir.Node, o: ir.Output, program: ir.Program, limit: int):
    """(points, row points, ((target axis, index), …), value) where `term` is c·Σ_points where(∧ eᵢ = tᵢ
    ∧ …, v, 0) with each index eᵢ over the points alone and tᵢ an axis of the output, the row points
    those v varies over (first among the points); else None."""
    scale: list[ir.Node] = []
    while isinstance(term, Call) and (term.op == "neg" or (
            term.op == "mul" and any(isinstance(a, Reduce) for a in term.args))):
        if term.op == "neg":
            scale.append(Const(-1.0))
            term = term.args[0]
        else:
            r, f = (term.args[0], term.args[1]) if isinstance(term.args[0], Reduce) else (term.args[1], term.args[0])
            scale.append(f)
            term = r
    points: list[str] = []
    while isinstance(term, Reduce) and term.op == "sum":
        points.append(term.axis)
        term = term.body
    if not points or len(set(points)) != len(points) or set(points) & set(o.axes):
        return None
    if not (isinstance(term, Call) and term.op == "where" and term.args[2] == Const(0.0)):
        return None
    index, others = [], []
    for c in conjuncts(term.args[0]):
        hit = _target(c, o.axes, set(points))
        if hit is not None and hit[0] not in dict(index):
            index.append(hit)
        else:
            others.append(c)
    if not index:
        return None
    targets = dict(index)
    if math.prod(program.axes[t] for t in targets) < MIN_ROWS:
        return None
    value = term.args[1]
    if others:
        value = Call("where", (conjunction(others), value, Const(0.0)))
    # the summed axes no index reads sum inside the value (Σ_i Σ_k [c(i) = j]·v = Σ_i [c(i) = j]·Σ_k v)
    read = set().union(*(e.axes for _, e in index))
    for a in reversed([p for p in points if p not in read]):
        value = Reduce("sum", a, value)
    points = [p for p in points if p in read]
    if scale and any(set(f.axes) & set(points) for f in scale):
        return None  # (a factor of the points outside their sum: not a scaled one-hot sum)
    for f in scale:
        value = Call("mul", (value, f))
    for t, e in index:
        value = substitute_free(value, t, e)  # (where eᵢ = tᵢ, tᵢ reads as eᵢ)
    if value.axes - set(points) - (set(o.axes) - set(targets)):
        return None
    rest = [a for a in o.axes if a not in targets]
    rows = [p for p in points if p in value.axes]  # (a point axis the value is free of: rows repeat along it)
    if math.prod(program.axes[a] for a in [*rows, *rest]) > ROWS_FACTOR * limit:
        return None  # (rows far larger than any tensor the program moves: the dense form stays on chip)
    return ((*rows, *(p for p in points if p not in rows)), tuple(rows),
            tuple(sorted(index, key=lambda te: o.axes.index(te[0]))), value)


def _summed(term: ir.Node) -> set[str]:
    """The axes summed at the top of a term (under negations and factors)."""
    while isinstance(term, Call) and term.op in ("neg", "mul", "div"):
        term = next((a for a in term.args if isinstance(a, Reduce)), term.args[0])
    out = set()
    while isinstance(term, Reduce) and term.op == "sum":
        out.add(term.axis)
        term = term.body
    return out


def _target(c: ir.Node, axes: tuple[str, ...], points: set[str]) -> tuple[str, ir.Node] | None:
    """(t, e) where c is e = t (or t = e), t an output axis and e an expression of the points alone."""
    if not (isinstance(c, Call) and c.op == "eq"):
        return None
    for t, e in (c.args, c.args[::-1]):
        if isinstance(t, Index) and t.axis in axes and e.axes and e.axes <= points:
            return t.axis, e
    return None


def _length(program: ir.Program, a: str) -> ir.Node:
    return ir.Length(a) if a in program.dynamic else Const(float(program.axes[a]))


def _linear(index: dict[str, ir.Node], targets: tuple[str, ...], program: ir.Program) -> ir.Node:
    """The row-major row of the targets' indices, the table's size where any is outside its axis."""
    lin, ok, size = None, None, None
    for t in targets:
        e, n = index[t], _length(program, t)
        inside = Call("and", (Call("ge", (e, Const(0.0))), Call("lt", (e, n))))
        ok = inside if ok is None else Call("and", (ok, inside))
        lin = e if lin is None else Call("add", (Call("mul", (lin, n)), e))
        size = n if size is None else Call("mul", (size, n))
    return Call("where", (ok, lin, size))


class ScatterRun:
    """A compiled split program (`inner`, whose attributes it answers) and the split that finishes its
    outputs; `extra_s` prices the scatters: their rows read and the table written, read and added."""

    def __init__(self, split: Split, inner):
        self.split, self.inner = split, inner

    def __getattr__(self, name: str):
        if name in ("split", "inner"):  # (not yet set: a copy or an unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def extra_s(self) -> float:
        dev, prog = self.inner.compilation.device, self.split.inner
        shapes = {o.name: prog.output_shape(o) for o in prog.outputs}
        nbytes = 0.0
        for sc in self.split.outputs:
            table = math.prod(self.split.program.output_shape(sc.output))
            nbytes += sum(math.prod(shapes[s.values]) * 8 + table * 12 for s in sc.scatters)
        return nbytes / dev.hbm_bytes_per_s + dev.launch_s * sum(2 * len(sc.scatters) + 1 for sc in self.split.outputs)


def compiled(program: ir.Program, compile_fn):
    """`compile_fn(program)`, or a ScatterRun of its split where it has one-hot sums to take out."""
    s = split(program)
    return compile_fn(program) if s is None else ScatterRun(s, compile_fn(s.inner))
