"""The numerical test that a reduction is a shift the outputs do not see, for what grad_shift's proof
cannot class: the program is evaluated in float64 with the reduction moved by random per-row amounts,
at its own extents when small, else at small extents with its index masks drawn at random (a mask
that pins its axes keeps them at full length). grad.backward_program drops the adjoint of a reduction
that passes."""

from __future__ import annotations

import math
from dataclasses import replace

from . import ir
from .grad_gather import NO_GRAD, _call, grad_name
from .grad_shift import proves_shift_invariant
from .ir import Call, Const, Index, Load, NeptuneError, Reduce

_WHOLE = 2**20  # a program of at most this many points is tested at its own extents
# the draws (scale, offset of N(0, 1)) the outputs are compared at: a branch on the data must be taken both
# ways in some draw — min_d(w).clamp(min=-0.5) over 9 values of N(0, 1) kept every row clamped in both of
# two such draws, the min's shift was never seen and its gradient dropped (fuzz --big seed 60)
_DRAWS = ((1.0, 0.0), (1.0, 0.0), (0.1, 0.0), (2.0, 1.0), (2.0, -1.0))


def shift_invariant(program: ir.Program, r: Reduce, seed: int = 0, extent: int = 6) -> bool:
    """The outputs do not change when `r` moves by any amount per element of its free axes: ∂out/∂r = 0
    everywhere, so r's adjoint can be dropped. Proved by classing the outputs' nodes
    (grad_shift.proves_shift_invariant), or else tested on random float64 values (five draws, large
    shifts ~ N(0, 9)) of the program at its own extents when it is small, else at extents ≤ `extent`
    with its masks of indices drawn at random (`j < 10` would never be false at 6, hiding a branch that
    does read r; a random mask shows every branch) — but only where no other index is combined with a
    constant (a head group `h // 8`, a shifted gather), whose axes keep their extents; the other axes
    go down to 3, then 2, where that is still too large (causal GQA at 4 × 32 heads). False when it
    cannot be tested. The draws vary in scale and offset (_DRAWS), so that a data-dependent branch (a clamp
    at −0.5) is taken both ways."""
    import torch

    from .reference import evaluate, random_inputs

    if proves_shift_invariant([o.expr for o in program.outputs], r):
        return True
    if math.prod(program.axes.values()) <= _WHOLE:
        p = program
    else:
        program, r = _masks_as_inputs(program, r)
        pinned = pinned_axes(program)
        shrunk = ({a: n if a in pinned else min(n, e) for a, n in program.axes.items()} for e in (extent, 3, 2))
        small = next((s for s in shrunk if math.prod(s.values()) <= _WHOLE), None)
        if small is None:
            return False
        try:
            p = program.with_extents(small)
        except NeptuneError:
            return False
    free = tuple(a for a in p.axes if a in r.axes)
    name = grad_name("shift", set(p.inputs))
    moved = _call("add", r, Load(name, tuple(Index(a) for a in free)))
    outs = [ir.Output(o.name, o.axes, _moved_where_differentiable(o.expr, r, moved), "float64") for o in p.outputs]
    q = ir.Program(p.name, dict(p.axes), {**p.inputs, name: ir.TensorSpec(name, free, "float64")}, outs)
    floats = {n: "float64" for n, s in p.inputs.items() if s.dtype in ir.FLOAT_DTYPES}
    for k, (scale, offset) in enumerate(_DRAWS):
        xs = random_inputs(p, seed=seed + k, dtypes=floats, scale=scale, offset=offset)
        gen = torch.Generator().manual_seed(seed + 100 + k)
        shift = 3.0 * torch.randn(tuple(p.axes[a] for a in free), generator=gen, dtype=torch.float64)
        try:
            want, got = evaluate(p, xs), evaluate(q, {**xs, name: shift})
        except Exception:
            return False
        for o in p.outputs:
            a, b = want[o.name].double(), got[o.name].double()
            fin = torch.isfinite(a)
            if not torch.equal(fin, torch.isfinite(b)):
                return False
            scale = max(1.0, a[fin].abs().max().item()) if fin.any() else 1.0
            if not torch.allclose(a[fin], b[fin], rtol=1e-9, atol=1e-9 * scale):
                return False
    return True


def _moved_where_differentiable(e: ir.Node, r: ir.Node, moved: ir.Node) -> ir.Node:
    """`e` with `r` replaced by `moved` where a gradient reaches it: not inside a comparison (a step,
    derivative 0), a detach or a bool's cast (NO_GRAD), nor a load's index. Its adjoint is the sum over
    those paths alone, so the outputs' invariance along them is what drops it: a top-1 gate
    `logits == logits.amax(-1)` beside the softmax shifted by the same max had made the max look seen,
    and the training was refused."""
    memo: dict[int, ir.Node] = {}

    def go(n: ir.Node) -> ir.Node:
        if n == r:
            return moved
        got = memo.get(id(n))
        if got is not None:
            return got
        if isinstance(n, Call) and n.op not in NO_GRAD:
            out = Call(n.op, tuple(go(a) for a in n.args))
        elif isinstance(n, Reduce):
            out = Reduce(n.op, n.axis, go(n.body))
        else:  # (a comparison, a detach, a load, a leaf)
            out = n
        memo[id(n)] = out
        return out

    return go(e)


def _masks_as_inputs(program: ir.Program, r: Reduce) -> tuple[ir.Program, Reduce]:
    """`program` with each predicate of indices alone (`j <= i & i − j < 4096`) read from a boolean
    input over its axes, and `r` as it reads then. Drawn at random, the masks select every combination
    of branches the constants could, at extents where the constants no longer fit (a 4096-wide window
    at 6 keys): invariance under random masks is tested at small extents where the program's own mask
    would pin its axes at full length."""
    masks: dict[ir.Node, ir.Node] = {}
    taken, seen = set(program.inputs), set()
    stack = [o.expr for o in program.outputs]  # (iterative, like ir.walk: programs may be deep)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if isinstance(n, Call) and n.op in NO_GRAD and n.op != "float" and _index_only(n):
            name = grad_name("mask", taken)  # a maximal predicate: its own parts are not visited
            taken.add(name)
            masks[n] = Load(name, tuple(Index(a) for a in program.axes if a in n.axes))
        else:
            stack.extend(n.children())
    if not masks:
        return program, r
    specs = {m.tensor: ir.TensorSpec(m.tensor, tuple(i.axis for i in m.index), "bool") for m in masks.values()}
    outs = [replace(o, expr=ir.substitute(o.expr, masks)) for o in program.outputs]
    q = ir.Program(program.name, dict(program.axes), {**program.inputs, **specs}, outs)
    return q, ir.substitute(r, masks)


def pinned_axes(program: ir.Program) -> set[str]:
    """The axes a test at smaller extents must keep at their own: those an operation combines with a
    constant (a mask `j < 10`, a window `i − j <= 128`, a head group `h // 8`: what it selects depends
    on the extents), and the axes of a tensor read at an index computed from indices (k[h // 8] reads
    every kv head). An index read from data (`W[target[i]]`, `k[table[b, j // P]]`) pins nothing by
    itself: random_inputs draws such values across the indexed axis at any extent (what computes the
    data's own index, `j // P`, is pinned where it is read). A constant that only fills a masked
    position (`where(i >= j, s, -inf)`) or scales a value is not such a combination."""
    pinned: set[str] = set()
    for o in program.outputs:
        for n in ir.walk(o.expr):
            if (isinstance(n, Call) and n.op != "where" and any(isinstance(a, Const) for a in n.args)
                    and any(map(_index_only, n.args))):
                pinned |= {m.axis for m in ir.walk(n) if isinstance(m, Index)}
            if isinstance(n, Load) and n.tensor in program.inputs:
                for ax, e in zip(program.inputs[n.tensor].axes, n.index):
                    if not isinstance(e, Index) and not any(isinstance(m, Load) for m in ir.walk(e)):
                        pinned |= {ax} | {m.axis for m in ir.walk(e) if isinstance(m, Index)}
    return pinned


def _index_only(n: ir.Node) -> bool:
    """n is a function of axis indices alone (`i - j`, `j`), not of any element loaded."""
    nodes = list(ir.walk(n))
    return any(isinstance(m, Index) for m in nodes) and not any(isinstance(m, (Load, Reduce)) for m in nodes)
