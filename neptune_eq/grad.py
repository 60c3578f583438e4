"""Reverse-mode differentiation of a reduction program: the backward is another reduction program.

`backward_program(p)` reads p's inputs and one cotangent per floating output (`grad_<output>`, the
output's shape) and writes the gradient of each floating input (`grad_<input>`, the input's shape).
It is plain IR, so it goes through the same pipeline as any program: saturation, fusion with
synthesized corrections, split-K, the cost model, lowering. Nothing here knows attention or
softmax; the forward's reductions are recomputed where the backward reads them.

Adjoints are propagated over the expression DAG in reverse topological order; a node's adjoint
varies over (at most) the node's own axes, a contribution that varies over more is summed over the
extra axes. Local derivatives, one per operator:

    a + b, a − b      ḡ, ±ḡ                 max2 / min2    ḡ to the larger / smaller (halved on a tie)
    a·b               ḡ·b, ḡ·a              where(c, a, b) where(c, ḡ, 0), where(c, 0, ḡ); c none
    a / b             ḡ/b, −ḡ·(a/b)/b       exp, exp2       ḡ·eᵃ, ḡ·2ᵃ·ln 2
    log, log2         ḡ/a, ḡ/(a·ln 2)       tanh            ḡ·(1 − tanh²a)
    sin, cos          ḡ·cos a, −ḡ·sin a
    sqrt, rsqrt       ḡ/(2√a), −ḡ·a^{-3/2}/2  abs           ḡ·sign(a)
    Σ_d body          ḡ to every element    max_d / min_d  ḡ shared by the elements equal to it (torch's amax;
                                                           a row holding NaN: NaN, as torch's amax gives)

A max or min the outputs are invariant to — the shift of a softmax, a log-sum-exp, attention —
has adjoint 0: it is dropped rather than computed as a sum that cancels (and its ties counted).
Invariance is proved or tested, not assumed: proved by how each node moves with the shift
(grad_shift), else the program is evaluated in float64 at small extents with the
reduction moved by random per-row amounts (shift_invariant); `x − max x` is not invariant and gets
its adjoint. Comparisons, predicates and integer casts carry no gradient. A gathered input's
gradient is a shift back where the gather is a clamped shift (a slice, torch.cat, rotate-half), else a
one-hot sum over the gather (x[i, t[i]] → [v == t[i]]·ḡ[i]: cross-entropy); neptune_eq.grad_gather.
An input read with one axis twice (a diagonal) and floor division or modulo of a value that depends on
a floating input are refused with NoBackward naming them.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace

from . import ir
from .grad_delta import eliminate_deltas, unclamp_guarded
from .grad_gather import NO_GRAD, NoBackward, _c, _call, fresh_axis, grad_name, load_grad, substitute_free, sum_over
from .grad_invariance import shift_invariant
from .grad_math import OPS as MATH_OPS
from .grad_math import local_math
from .grad_saved import Saved, hoist, save
from .ir import Call, Const, Index, Load, NeptuneError, Reduce
from .numeric import shifted_exp_sum
from .ops import ROUNDINGS


def _zero_keeps(g: ir.Node, c: ir.Node) -> ir.Node:
    """c, or 0 where the cotangent g is 0: a value the forward guarded (where(l == 0, 0, x/l)) passes
    back a zero cotangent, which must stay 0 through 1/l = ∞ (0·∞ is NaN), as a symbolic zero would."""
    return _call("where", _call("eq", g, _c(0.0)), _c(0.0), c)


def _never_zero(b: ir.Node) -> bool:
    """b is Σⱼ e^{a − maxⱼ a} with the plain shift: ≥ 1 or NaN, never 0 (numeric.shifted_exp_sum), so
    a quotient by it needs no zero-keeping guard: where b is NaN the forward is NaN and the gradient
    NaN, as torch's autograd gives. (torch's guarded shift makes b = 0 on a row of −∞: it keeps it.)"""
    return shifted_exp_sum(b) == "plain"


def _shifted_by_row_max(x: ir.Node) -> bool:
    """x is a − m with m a's row max (plain, or torch's guard against a row of −∞), or that max plus
    the log of a sum of shifted exponentials (≥ 0): eˣ ≤ 1 (or NaN), never ∞, so its derivative needs
    no zero-keeping guard (softmax's and attention's exponentials: no select in their backward loops)."""
    if not (isinstance(x, Call) and x.op == "sub"):
        return False
    a, shift = x.args
    terms = shift.args if isinstance(shift, Call) and shift.op == "add" else (shift,)

    def row_max(t: ir.Node) -> bool:
        if isinstance(t, Call) and t.op == "where" and len(t.args) == 3:  # (m = −∞ ? c : m)
            t = t.args[2]
        return isinstance(t, Reduce) and t.op == "max" and t.body == a

    def log_of_shifted_sum(t: ir.Node) -> bool:
        if isinstance(t, Call) and t.op == "where" and len(t.args) == 3:  # (S = 0 ? ∞ : log S)
            t = t.args[2]
        return isinstance(t, Call) and t.op == "log" and shifted_exp_sum(t.args[0]) is not None

    return row_max(terms[0]) and all(log_of_shifted_sum(t) for t in terms[1:]) and len(terms) <= 2


def _zero_guard(g: ir.Node, b: ir.Node) -> tuple[ir.Node, ir.Node] | None:
    """(b == 0, g′) when g is where(b == 0, 0, g′): the forward's guard of x/b against an empty row."""
    if isinstance(g, Call) and g.op == "where" and g.args[1] == _c(0.0):
        c = g.args[0]
        if isinstance(c, Call) and c.op == "eq" and c.args == (b, _c(0.0)):
            return c, g.args[2]
    return None


def _local(n: Call, g: ir.Node) -> list[ir.Node | None]:
    """∂n/∂argₖ · g for each argument (None: no gradient flows to it)."""
    a = n.args
    op = n.op
    if op in NO_GRAD:
        return [None] * len(a)
    if op == "add":
        return [g, g]
    if op == "sub":
        return [g, _call("neg", g)]
    if op == "neg":
        return [_call("neg", g)]
    if op == "mul":
        return [_call("mul", g, a[1]), _call("mul", g, a[0])]
    if op == "div":  # (a zero cotangent contributes 0, also where b = 0: a guarded a/b's masked rows)
        if isinstance(a[1], Const) and a[1].value != 0 and math.isfinite(a[1].value):  # a/c: no 1/0 to guard
            return [_call("div", g, a[1]), _call("neg", _call("div", _call("mul", g, n), a[1]))]
        if _never_zero(a[1]):  # b ≥ 1 or NaN: 0/b is 0 wherever the forward is a number
            return [_call("div", g, a[1]), _call("neg", _call("div", _call("mul", g, n), a[1]))]
        guard = _zero_guard(g, a[1])
        if guard is not None:  # g = where(b == 0, 0, g′): 0 there, g′/b elsewhere (b ≠ 0)
            c, g = guard
            return [_call("where", c, _c(0.0), _call("div", g, a[1])),
                    _call("where", c, _c(0.0), _call("neg", _call("div", _call("mul", g, n), a[1])))]
        return [_zero_keeps(g, _call("div", g, a[1])),
                _zero_keeps(g, _call("neg", _call("div", _call("mul", g, n), a[1])))]
    if op in ("exp", "exp2"):  # (a zero cotangent stays 0 where eˣ overflows: σ(x) = 1/(1 + e⁻ˣ) at x = −100)
        c = _call("mul", g, n if op == "exp" else _call("mul", n, _c(math.log(2.0))))
        return [c if _shifted_by_row_max(a[0]) else _zero_keeps(g, c)]
    if op == "log":
        return [_call("div", g, a[0]) if _never_zero(a[0]) else _zero_keeps(g, _call("div", g, a[0]))]
    if op == "log1p":
        return [_zero_keeps(g, _call("div", g, _call("add", _c(1.0), a[0])))]
    if op == "expm1":  # d/dx (eˣ − 1) = eˣ
        return [_call("mul", g, _call("exp", a[0]))]
    if op == "erf":  # d/dx erf(x) = (2/√π)·e^(−x²)
        return [_call("mul", g, _call("mul", _c(2.0 / math.sqrt(math.pi)),
                                      _call("exp", _call("neg", _call("mul", a[0], a[0])))))]
    if op == "log2":
        return [_zero_keeps(g, _call("div", g, _call("mul", a[0], _c(math.log(2.0)))))]
    if op == "sin":
        return [_call("mul", g, _call("cos", a[0]))]
    if op == "cos":
        return [_call("neg", _call("mul", g, _call("sin", a[0])))]
    if op == "tanh":
        return [_call("mul", g, _call("sub", _c(1.0), _call("mul", n, n)))]
    if op == "sqrt":  # (a zero cotangent stays 0 at √0: a norm's guarded zero row)
        return [_zero_keeps(g, _call("div", _call("mul", g, _c(0.5)), n))]
    if op == "rsqrt":
        return [_call("mul", _call("mul", g, _c(-0.5)), _call("mul", n, _call("mul", n, n)))]
    if op in ROUNDINGS.values():  # torch's cast backward: the cotangent converted to the value's dtype
        return [_call(op, g)]
    if op in ("floor", "ceil", "trunc", "rint"):  # integral values: torch's derivative is 0, not none
        return [_c(0.0)]
    if op == "abs":
        return [_call("where", _call("gt", a[0], _c(0.0)), g,
                      _call("where", _call("lt", a[0], _c(0.0)), _call("neg", g), _c(0.0)))]
    if op in ("max2", "min2"):
        # torch.maximum / minimum: a tie shares g evenly, a constant's half dropped (a clamp, which passes
        # g at its bound, is captured as selects; the decompositions of smooth functions, log σ(x) =
        # min(x, 0) − log1p(e^−|x|), then get their derivative at 0 with |x|'s 0 there)
        win = "gt" if op == "max2" else "lt"
        half = _call("mul", g, _c(0.5))

        def share(x, y):
            return _call("where", _call(win, x, y), g, _call("where", _call("eq", x, y), half, _c(0.0)))
        return [share(a[0], a[1]), share(a[1], a[0])]
    if op == "where":
        return [None, _call("where", a[0], g, _c(0.0)), _call("where", a[0], _c(0.0), g)]
    if op in MATH_OPS:
        return local_math(n, g, _zero_keeps)
    raise NoBackward(f"no derivative of '{op}' ({ir.show(n)}) is derived")


@dataclass(frozen=True)
class Backward:
    """A derived backward: `program` reads the forward's inputs and `cotangents[output]` (the upstream
    gradient of each floating output) and writes `grads[input]` for each input differentiated."""

    program: ir.Program
    cotangents: dict[str, str]  # forward output → backward input
    grads: dict[str, str]  # forward input → backward output
    saved: Saved | None = None  # what the forward saves for it (None: it reads the inputs alone)


def backward_program(program: ir.Program, wrt: list[str] | None = None, *, saved: bool = False) -> Backward:
    """The program computing the gradients of `program`'s floating inputs (or those in `wrt`) from
    its inputs and one cotangent per floating output (see the module docstring); with `saved`, also
    from the forward's outputs and row statistics (neptune_eq.grad_saved)."""
    if saved:
        program = replace(program, outputs=[replace(o, expr=hoist(o.expr)) for o in program.outputs])
    floats = [n for n, s in program.inputs.items() if s.dtype in ir.FLOAT_DTYPES]
    wrt = [n for n in (wrt if wrt is not None else floats) if n in floats]
    if not wrt:
        raise NoBackward(f"{program.name}: no floating input to differentiate")
    order = list(program.axes)
    taken = set(program.inputs) | {o.name for o in program.outputs}
    inputs = dict(program.inputs)
    contribs: dict[ir.Node, list[ir.Node]] = {}
    wanted = set(wrt)

    def add(node: ir.Node, c: ir.Node, over: frozenset[str] = frozenset()) -> None:
        # c is node's share of the adjoint of a parent over axes `over`: every element of the parent
        # reads node, so the axes node lacks are summed — by a reduction where c varies along them, by
        # the extent where it does not (Σ_d (x[i, d] − lse[i]) under a uniform cotangent: n_d times)
        # (a gathered input's element keeps them: load_grad sums them outside its adjoint, so a
        # relative-position table's gradient reads dS of every batch in its diagonal's tiles, not
        # Σ_b dS recomputed per (i, j) element with the batch held as a padded ALU axis)
        summed = c.axes - node.axes
        if summed and not _gathered(node, wanted):
            c = sum_over(c, summed, order)
        for a in sorted(over - summed - node.axes, key=order.index):  # (a dynamic axis: its length, len(a))
            c = _call("mul", c, ir.Length(a) if a in program.dynamic else _c(program.axes[a]))
        contribs.setdefault(node, []).append(c)

    cotangents: dict[str, str] = {}
    for o in program.outputs:
        if (o.dtype or "float32") not in ir.FLOAT_DTYPES:
            continue
        name = cotangents[o.name] = grad_name(o.name, taken)
        taken.add(name)
        inputs[name] = ir.TensorSpec(name, o.axes, o.dtype or "float32")
        add(o.expr, Load(name, tuple(Index(a) for a in o.axes)))

    topo = list(dict.fromkeys(n for o in program.outputs for n in ir.walk(o.expr)))  # children first
    reads: set[ir.Node] = set()  # the nodes whose value depends on an input differentiated
    for n in topo:
        if (isinstance(n, Load) and n.tensor in wanted) or any(c in reads for c in n.children()):
            reads.add(n)
    grads: dict[str, list[ir.Node]] = {}
    for n in reversed(topo):
        parts = contribs.pop(n, None)
        if not parts:
            continue
        if _gathered(n, wanted):  # (parts over different axes: each summed by load_grad on its own)
            grads.setdefault(n.tensor, []).extend((n, p) for p in parts)
            continue
        g = parts[0]
        for p in parts[1:]:
            g = _call("add", g, p)
        if isinstance(n, Load):
            if n.tensor in wanted:
                grads.setdefault(n.tensor, []).append((n, g))
        elif isinstance(n, Call):
            if n.op in ("floordiv", "mod"):
                if n in reads:
                    raise NoBackward(f"{program.name}: no gradient through '{n.op}' ({ir.show(n)})")
                continue
            for arg, c in zip(n.args, _local(n, g)):
                if c is not None and arg in reads:
                    add(arg, c, n.axes)
        elif isinstance(n, Reduce):
            if n.body not in reads:
                continue
            if n.op == "sum":
                add(n.body, g)
            elif shift_invariant(program, n):  # a shift the outputs do not see: its adjoint is 0
                continue
            else:  # max/min: shared by the elements that attain it
                body, axes = _same_op_chain(n)
                if body not in reads:
                    continue
                # (where the body holds a reduction, its plan writes it once and the max is the backward's
                # own, computed from it: the elements attaining it are found exactly — extract/exact_tests.py,
                # grad_saved.save; recomputed in other tiles and orders, it had rounded otherwise and the
                # gradient of a max over attention's features was silently dropped)
                hit = _call("eq", body, n)
                count = _call("where", hit, _c(1.0), _c(0.0))
                for a in reversed(axes):
                    count = Reduce("sum", a, count)
                # the others get 0/count: 0, or NaN where no element attains the max (a NaN in the row:
                # NaN == NaN is false), torch's (g/count)·mask = ∞·0 = NaN; per row, not per element
                add(body, _call("where", hit, _call("div", g, count), _call("div", _c(0.0), count)))
    outputs, names, fresh, copies = [], {}, {}, dict(program.same_length)
    for name in wrt:
        spec = program.inputs[name]
        parts = _adjoints(program, grads.get(name, []), fresh)
        expr: ir.Node = _c(0.0)
        axes = spec.axes
        if parts:
            expr, axes = parts[0]
            for p, frm in parts[1:]:
                expr = _call("add", expr, _rename(program, name, p, frm, axes, fresh, copies))
            if program.dynamic & (set(axes) ^ set(spec.axes)) and len(axes) == len(spec.axes):
                # (over the input's own axes where it can be: a dynamic axis only loads read, x[b, j] of a
                # padded x[:, :-1], has no length at the call where the backward does not read x there)
                with contextlib.suppress(NoBackward):
                    expr, axes = _rename(program, name, expr, axes, spec.axes, fresh, copies), spec.axes
        out = names[name] = grad_name(name, taken)
        taken.add(out)
        outputs.append(ir.Output(out, axes, expr, spec.dtype))
    kept = None
    if saved:
        exprs, more, kept = save(program, [o.expr for o in outputs], taken, {**program.axes, **fresh})
        outputs = [replace(o, expr=e) for o, e in zip(outputs, exprs)]
        inputs.update(more)
    extents = {**program.axes, **fresh}  # (eliminate_deltas adds the fresh axes it binds)
    dims = {n: tuple(extents[a] for a in s.axes) for n, s in inputs.items()}
    dynamic = program.dynamic | set(copies)
    outputs = [replace(o, expr=eliminate_deltas(o.expr, extents, dynamic, copies)) for o in outputs]
    outputs = [replace(o, expr=unclamp_guarded(o.expr, extents, dims)) for o in outputs]
    # (a dynamic forward's backward takes the same lengths: every axis it adds is a static one's copy,
    # or a dynamic one's, with its length: `copies`)
    dynamic = program.dynamic | set(copies)
    back = ir.Program(f"{program.name}_backward", extents, inputs, outputs, dynamic, copies).validate()
    if back.dynamic:
        from .lower.launch import length_sources

        try:  # (an axis every read of which was renamed away, its copies' too: log_softmax over keys of
            length_sources(back)  # x @ x.mT beside a mean over queries)
        except NeptuneError as e:
            raise NoBackward(f"{program.name}: {e} (in the backward)") from None
    return Backward(back, cotangents, names, kept)


def _adjoints(program: ir.Program, reads: list[tuple[Load, ir.Node]], fresh: dict[str, int]
              ) -> list[tuple[ir.Node, tuple[str, ...]]]:
    """The adjoints (value, axes) of one input's loads n with cotangents g: over the digit axes of a split
    position where every load splits it alike (the gradient is then reshaped to the input), else over
    the input's own axes (their sum renames one load's axes to another's: one layout for all)."""
    trial = dict(fresh)
    parts = [load_grad(program, n, g, trial) for n, g in reads]
    if len({axes for _, axes in parts}) <= 1 or all(len(axes) == len(program.inputs[n.tensor].axes)
                                                    for (n, _), (_, axes) in zip(reads, parts)):
        fresh.update(trial)
        return parts
    return [load_grad(program, n, g) for n, g in reads]


def _gathered(n: ir.Node, wanted: set[str]) -> bool:
    """Is n an element of a differentiated input read at an index expression (a gather)?"""
    return isinstance(n, Load) and n.tensor in wanted and any(not isinstance(e, Index) for e in n.index)


def _same_op_chain(r: Reduce) -> tuple[ir.Node, list[str]]:
    """A max of maxes (amax over dimensions that are not adjacent: max_b(max_d(e))) as one max over
    all their axes: (e, [b, d]). Its ties are counted over every axis at once, as torch's amax shares
    the gradient among all the elements attaining it; the inner maxes, exact selections of e, need no
    adjoint of their own."""
    axes, body = [r.axis], r.body
    while isinstance(body, Reduce) and body.op == r.op:
        axes.append(body.axis)
        body = body.body
    return body, axes


def _rename(program: ir.Program, name: str, expr: ir.Node, frm: tuple[str, ...], to: tuple[str, ...],
            fresh: dict[str, int], copies: dict[str, str]) -> ir.Node:
    """`expr` over axes `frm` read as over `to` (one input loaded with different axes: RoPE's cos[i, d]
    beside q and cos[j, d] beside k). A reduction over an axis the renaming touches is first renamed to
    a fresh axis of the same extent (added to `fresh`): Σ_i … inside the contribution over j, d. A
    fresh copy of a dynamic axis has its length (recorded in `copies`: the z-loss's Σ_i beside a shifted
    cross-entropy's contribution over j, of one dynamic logits tensor)."""
    renames = {a: b for a, b in zip(frm, to) if a != b}
    clash = set(renames) | set(renames.values())
    if (expr.axes - set(renames)) & set(renames.values()):
        raise NoBackward(f"{program.name}: the gradients of the loads of '{name}' over {frm} and {to} cannot "
                         "be summed without renaming an axis their expressions use")
    dynamic = program.dynamic | set(copies)
    for c, root in copies.items():  # (j read as i has i's length, and so has a copy of j: Σ_j2 of an earlier sum)
        if root in renames and renames[root] in program.dynamic:
            copies[c] = renames[root]

    def alpha(old, new):
        # one fresh name per axis: a reduction nested in another over the same axis binds its own
        # occurrences, so renaming inner first and outer after captures nothing
        if isinstance(new, Reduce) and new.axis in clash:
            extents = {**program.axes, **fresh}
            ax = fresh_axis(new.axis, extents, dynamic, copies, _next_name(new.axis), f"{new.axis}2",
                            frozenset(program.axes), of=renames.get(new.axis))  # (j read as i: i's length)
            fresh[ax] = extents[ax]
            return Reduce(new.op, ax, substitute_free(new.body, new.axis, Index(ax)))
        return new

    expr = ir.rebuild(expr, alpha)
    return ir.substitute(expr, {Index(a): Index(b) for a, b in renames.items()})


def _next_name(axis: str):
    """The fresh names of `axis` after `{axis}2`: {axis}3, {axis}4, … ("e1"+"2" = "e"+"12" is tried
    after, where it holds another extent)."""
    def step(name: str) -> str:
        return f"{axis}{int(name[len(axis):]) + 1}"
    return step
