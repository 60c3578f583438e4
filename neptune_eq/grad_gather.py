"""The adjoint of a gathered load: the gradient of x[e(idx)] with respect to x, as a value over x's positions.

A load x[e] spreads its cotangent g back onto the positions it read: ∂x[s] = Σ_{points p} [e(p) == s]·g(p).
Two forms are derived:

    shifted   e(a) = clamp(a + c, lo, hi) of one axis a (a slice, torch.cat / rotate-half, a shifted
              window): the map is a shift on the points it does not clamp, so the sum has at most one
              term there, g(s − c); the points clamped onto lo or hi add Σ over them at s = lo, s = hi,
              dropped where g is 0 on all of them (the unselected branch of a cat). Work: one read of g
              per position, not a one-hot over the axis. Also with an offset o of other axes,
              clamp(a + c + o, lo, hi) (a relative position j − i): g(s − c − o), summed over o's axes.
    split     e = Σ_k m_k·t_k, t_k an axis a_k or a_k // d_k, the digits of a row-major position (m_0 = 1,
              m_{k+1} = m_k·|t_k|, Σ covering x's dimension): a view splitting the dimension (group
              norm's channel h·8 + j, a merged axis h·32768 + jid, a weight read at h·8 + jid // 4096).
              The position s is the digits (t_0 … t_K) laid out row-major, so the gradient is g over the
              digit axes themselves, reshaped to x's dimension: no sum for a_k, and for a_k // d_k one
              over the d_k members of a block (a_k = q·d_k + r, q the digit, r summed). Work: g once.
              (A lone block index, grouped-query attention's k[h // G], is regroup.py's: its heads of a
              group are held in one program there.)
    one-hot   any other integer expression (x[i, t[i]], an embedding lookup ids[t]): the one-hot test
              [e(p) == s]·g(p), summed over the axes the gather varies over and x is not indexed by.

A form that would need an axis twice (x[i, i], a shift whose target axis its cotangent also varies
along) raises NoBackward naming the load.
"""

from __future__ import annotations

import math

from . import ir
from .index_shift import Shift, clamped_shift, offset_shift
from .ir import Call, Const, Index, Load, NeptuneError, Reduce

# the operators no gradient flows through (predicates, casts of bools, detach)
NO_GRAD = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not", "float", "stopgrad"})


def grad_name(name: str, taken) -> str:
    """`grad_<name>`, made unique among `taken`."""
    out, k = f"grad_{name}", 1
    while out in taken:
        k += 1
        out = f"grad_{name}{k}"
    return out


class NoBackward(NeptuneError):
    """A call that would need gradients the compiler does not derive; the message names the cause
    (`cause`: that alone, without what it means for the call)."""

    def __init__(self, message: str, cause: str | None = None):
        super().__init__(message)
        self.cause = cause or message


def _c(v: float) -> Const:
    return Const(float(v))


def _call(op: str, *args: ir.Node) -> Call:
    return Call(op, tuple(args))


def sum_over(expr: ir.Node, axes, order) -> ir.Node:
    for a in sorted(axes, key=order.index, reverse=True):
        expr = Reduce("sum", a, expr)
    return expr


def substitute_free(expr: ir.Node, axis: str, value: ir.Node) -> ir.Node:
    """expr with its free occurrences of `axis` read at `value` (a reduction over `axis` binds its own)."""
    key = Index(axis)

    def fn(old, new):
        if isinstance(old, Reduce) and old.axis == axis:
            return old
        return value if old == key else new

    return ir.rebuild(expr, fn)


_INDEX_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
              "neg": lambda a: -a, "min2": min, "max2": max, "lt": lambda a, b: a < b,
              "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
              "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "and": lambda a, b: a and b,
              "or": lambda a, b: a or b, "not": lambda a: not a}


def _value_at(n: ir.Node, axis: str, p: int):
    """The index-only expression n at `axis` = p, or None where it reads anything else."""
    if isinstance(n, Const):
        return n.value
    if isinstance(n, Index):
        return p if n.axis == axis else None
    if isinstance(n, Call) and n.op in _INDEX_OPS:
        args = [_value_at(a, axis, p) for a in n.args]
        return None if any(v is None for v in args) else _INDEX_OPS[n.op](*args)
    return None


def zero_on(g: ir.Node, axis: str, points: list[int]) -> bool:
    """g is 0 at every index of `axis` in `points` (whatever the other axes): proved from its
    structure — a where whose predicate of `axis` alone selects a zero branch there, products with a
    zero factor, sums and negations of zeros. False where it cannot tell."""
    if not points:
        return True
    if isinstance(g, Const):
        return g.value == 0.0
    if not isinstance(g, Call):
        return False
    if g.op == "neg":
        return zero_on(g.args[0], axis, points)
    if g.op in ("add", "sub"):
        return all(zero_on(a, axis, points) for a in g.args)
    if g.op == "mul":
        return any(zero_on(a, axis, points) for a in g.args)
    if g.op == "where":
        cond, yes, no = g.args
        picks = [_value_at(cond, axis, p) for p in points]
        if any(v is None for v in picks):
            return zero_on(yes, axis, points) and zero_on(no, axis, points)
        return (zero_on(yes, axis, [p for p, v in zip(points, picks) if v])
                and zero_on(no, axis, [p for p, v in zip(points, picks) if not v]))
    return False


def _shift_adjoint(program: ir.Program, g: ir.Node, sh: Shift, s: str) -> ir.Node | None:
    """Σ_a [clamp(a + c, lo, hi) == s]·g(a) over x's axis s, or None where the form does not apply."""
    a, c = sh.axis, sh.c
    if a in program.dynamic or s in program.dynamic:
        return None
    bound = {m.axis for m in ir.walk(g) if isinstance(m, Reduce)}
    if s != a and (s in g.axes or s in bound):
        return None
    n_a, n_x = program.axes[a], program.axes[s]
    terms: list[ir.Node] = []
    lo2, hi2 = max(sh.lo, c, 0), min(sh.hi, n_a - 1 + c, n_x - 1)  # the positions a shift reaches unclamped
    if lo2 <= hi2:
        at: ir.Node = _call("add", Index(s), _c(-c)) if (c or s != a) else Index(a)
        if c > 0:
            at = _call("max2", at, _c(0))
        if n_x - 1 - c > n_a - 1:
            at = _call("min2", at, _c(n_a - 1))
        body = substitute_free(g, a, at) if at != Index(a) else g
        conds = ([_call("ge", Index(s), _c(lo2))] if lo2 > 0 else []) + (
            [_call("le", Index(s), _c(hi2))] if hi2 < n_x - 1 else [])
        for cond in conds:
            body = _call("where", cond, body, _c(0.0))
        terms.append(body)
    for edge, beyond in ((sh.hi, "gt"), (sh.lo, "lt")):
        if not math.isfinite(edge):
            continue
        points = [p for p in range(n_a) if (p + c > edge if beyond == "gt" else p + c < edge)]
        if zero_on(g, a, points):
            continue
        if not 0 <= edge <= n_x - 1:
            return None
        clamped = Reduce("sum", a, _call("where", _call(beyond, Index(a), _c(edge - c)), g, _c(0.0)))
        terms.append(_call("where", _call("eq", Index(s), _c(edge)), clamped, _c(0.0)))
    if not terms:
        return _c(0.0)
    out = terms[0]
    for t in terms[1:]:
        out = _call("add", out, t)
    return out


def _offset_adjoint(program: ir.Program, g: ir.Node, sh: Shift, o: ir.Node, s: str,
                    fresh: dict[str, int] | None) -> tuple[ir.Node, list[tuple[int, ir.Node]]] | None:
    """Σ_a [clamp(a + c + o, lo, hi) == s]·g(a), o an index expression of other axes (a relative
    position j − i), as (g read at a = s − c − o where that is an index of a and s is reached
    unclamped, [(edge, the sum over the points clamped onto it)] for edge = lo, hi). The one-hot form
    would sum g over every a for every s (a T5 bias table of 129 entries: 129 times attention's
    backward). The caller sums each part over the other axes on its own: a clamped sum does not
    depend on s, and summed inside the diagonal's sum it would be recomputed for every s."""
    a, c = sh.axis, sh.c
    if {a, s, *o.axes} & set(program.dynamic):
        return None
    bound = {m.axis for m in ir.walk(g) if isinstance(m, Reduce)}
    if s == a or s in g.axes or s in bound or s in o.axes:
        return None
    if bound & o.axes:  # g read at a = s − c − o: a reduction of g over an axis of o would capture it
        if fresh is None:
            return None
        extents = {**program.axes, **fresh}
        g = rebound(g, a, frozenset(bound & o.axes), extents, program.dynamic)  # (no dynamic axis here: above)
        fresh.update({x: n for x, n in extents.items() if x not in program.axes})
    n_a, n_x = program.axes[a], program.axes[s]
    raw = _call("sub", _call("add", Index(s), _c(-c)), o)  # s − c − o
    at = _call("min2", _call("max2", raw, _c(0)), _c(n_a - 1))
    conds = [_call("ge", raw, _c(0)), _call("le", raw, _c(n_a - 1))]
    conds += ([_call("ge", Index(s), _c(sh.lo))] if sh.lo > 0 else []) + (
        [_call("le", Index(s), _c(sh.hi))] if sh.hi < n_x - 1 else [])
    body = substitute_free(g, a, at)
    for cond in conds:
        body = _call("where", cond, body, _c(0.0))
    edges: list[tuple[int, ir.Node]] = []
    shifted = _call("add", _call("add", Index(a), _c(c)), o)  # a + c + o
    for edge, beyond in ((sh.hi, "gt"), (sh.lo, "lt")):
        if not math.isfinite(edge):
            continue
        if not 0 <= edge <= n_x - 1:
            return None
        edges.append((int(edge), Reduce("sum", a, _call("where", _call(beyond, shifted, _c(edge)), g, _c(0.0)))))
    return body, edges


def rebound(body: ir.Node, k: str, axes: frozenset[str], extents: dict[str, int],
            dynamic: frozenset[str], copies: dict[str, str] | None = None) -> ir.Node:
    """`body` with each reduction over one of `axes` that reads `k` made over a fresh axis of its extent
    (added to `extents`), so that k read at an expression of `axes` is not captured there: the adjoint
    of x[i, e] read at x's own d holds Σ_d x[i, d]·w[d, e], and e = d must not read w[d, d]; a softmax
    row's Σ_d in the cotangent of a relative-position bias t[i − d + L − 1], read at i = f − L + 1 + d,
    had summed x[f − L + 1 + d, d] over its own d (silently wrong table gradients until session 55).
    A fresh copy of a dynamic axis is recorded in `copies` (fresh_axis)."""
    def alpha(old, new):
        if not (isinstance(new, Reduce) and new.axis in axes and k in old.axes):
            return new
        ax = fresh_axis(new.axis, extents, dynamic, copies, lambda a: f"{a}_", f"{new.axis}2")
        return Reduce(new.op, ax, substitute_free(new.body, new.axis, Index(ax)))

    return ir.rebuild(body, alpha)


def fresh_axis(axis: str, extents: dict[str, int], dynamic: frozenset[str], copies: dict[str, str] | None,
               step, name: str, avoid: frozenset[str] = frozenset(), of: str | None = None) -> str:
    """A name for a fresh copy of `axis` (tried from `name` on by `step`), added to `extents`. A copy
    of a dynamic axis has its length at every call: it is recorded in `copies` (fresh → the dynamic
    axis itself; the backward program's same_length), and its name is one `extents` does not hold (a
    static axis of the same extent is not that length). Without `copies` (a caller that cannot carry
    one) it is refused: a copy would hold the bucket's bound, not the call's length. A name in `avoid`
    is never taken. `of`: an axis of the same length to record instead (one the axis is renamed to)."""
    n = extents[axis]
    root = (copies or {}).get(axis, axis)
    if axis in dynamic or root != axis:
        if of is not None and of != axis:
            if of not in dynamic:
                raise NoBackward(f"a copy of the dynamic axis '{axis}' would take the length of static '{of}'")
            root = (copies or {}).get(of, of)
        if copies is None:
            raise NoBackward(f"renaming the reduction over '{axis}' apart would copy a dynamic axis")
        while name in avoid or (name in extents and copies.get(name) != root):
            name = step(name)
        copies[name] = root
    else:
        while name in avoid or extents.get(name, n) != n or name in (copies or {}) or name in dynamic:
            name = step(name)
    extents[name] = n
    return name


def _digits(e: ir.Node, program: ir.Program, n_x: int) -> list[tuple[str, int]] | None:
    """[(a_k, d_k)] most significant first where e = Σ_k m_k·(a_k // d_k) is a row-major position over
    exactly [0, n_x) (d_k = 1: a plain axis), else None."""
    terms: dict[tuple[str, int], int] = {}

    def linear(x: ir.Node, scale: int) -> bool:
        if isinstance(x, Index) and isinstance(x.axis, str):
            terms[(x.axis, 1)] = terms.get((x.axis, 1), 0) + scale
            return True
        if isinstance(x, Const):
            return x.value == 0
        if isinstance(x, Call) and x.op == "add":
            return all(linear(a, scale) for a in x.args)
        if isinstance(x, Call) and x.op == "mul":
            for k, y in (x.args, x.args[::-1]):
                if isinstance(k, Const) and k.value == int(k.value) and k.value > 0:
                    return linear(y, scale * int(k.value))
        if isinstance(x, Call) and x.op == "floordiv" and isinstance(x.args[0], Index) and isinstance(
                x.args[1], Const) and x.args[1].value == int(x.args[1].value) > 1:
            key = (x.args[0].axis, int(x.args[1].value))
            terms[key] = terms.get(key, 0) + scale
            return True
        return False

    if not linear(e, 1) or len({a for a, _ in terms}) != len(terms) or set(program.dynamic) & {a for a, _ in terms}:
        return None
    at = 1
    for (a, d), m in sorted(terms.items(), key=lambda t: t[1]):
        if m != at or program.axes[a] % d:
            return None
        at *= program.axes[a] // d
    return sorted(terms, key=terms.get, reverse=True) if at == n_x else None


def _split_adjoint(program: ir.Program, n: Load, g: ir.Node, fresh: dict[str, int]
                   ) -> tuple[ir.Node, tuple[str, ...]] | None:
    """The adjoint of n over its digit axes where every gathered position of n is split into digits
    (see `_digits`), else None. A digit a // d is a fresh axis q of |a|/d, its block's members r
    (another fresh axis of d) summed: g read at a = q·d + r."""
    spec = program.inputs[n.tensor]
    split = [(e, None if isinstance(e, Index) else _digits(e, program, program.axes[s]))
             for e, s in zip(n.index, spec.axes)]
    if any(d is None or all(div > 1 for _, div in d) for e, d in split if not isinstance(e, Index)):
        return None  # (a lone block index, grouped-query heads' k[h // g], is regroup.py's to hold whole)
    used = [a for e, d in split for a in ([e.axis] if d is None else [x for x, _ in d])]
    if len(set(used)) != len(used):
        return None
    axes: list[str] = []
    for e, digits in split:
        for a, d in [(e.axis, 1)] if digits is None else digits:
            if d > 1:  # a = q·d + r: the digit q an output axis, r summed
                q, r = (_fresh_axis(f"{a}_{part}", program, fresh, size)
                        for part, size in (("q", program.axes[a] // d), ("r", d)))
                g = substitute_free(g, a, _call("add", _call("mul", Index(q), _c(d)), Index(r)))
                a = q
            axes.append(a)
    return sum_over(g, g.axes - set(axes), [*program.axes, *fresh]), tuple(axes)


def _fresh_axis(name: str, program: ir.Program, fresh: dict[str, int], n: int) -> str:
    while name in program.axes or fresh.get(name, n) != n:
        name += "_"
    fresh[name] = n
    return name


def load_grad(program: ir.Program, n: Load, g: ir.Node, fresh: dict[str, int] | None = None
              ) -> tuple[ir.Node, tuple[str, ...]]:
    """The adjoint g of the element n = x[idx] as a value over axes naming x's positions: the load's
    own axis where a position is indexed by one (no renaming: the forward's subterms stay shared), the
    digits of a split position (more axes than x has dimensions: its gradient is reshaped), x's axis
    where it is gathered otherwise (see the module docstring for the forms). New axes go in `fresh`."""
    spec = program.inputs[n.tensor]
    plain = [i.axis for i in n.index if isinstance(i, Index)]
    gathered = [(e, s) for e, s in zip(n.index, spec.axes) if not isinstance(e, Index)]
    if len(set(plain)) != len(plain):
        raise NoBackward(f"{program.name}: the gradient of {ir.show(n)} (an axis read twice) is not derived yet")
    axes = tuple(i.axis if isinstance(i, Index) else s for i, s in zip(n.index, spec.axes))
    if not gathered:
        return g, axes
    if fresh is not None and (split := _split_adjoint(program, n, g, fresh)) is not None:
        return split
    order = list(program.axes)
    if len(set(axes)) == len(axes):
        shifts = [(clamped_shift(e), s) for e, s in gathered]
        if all(sh is not None and sh.axis not in plain for sh, _ in shifts) and (
                len({sh.axis for sh, _ in shifts}) == len(shifts)):
            val: ir.Node | None = g
            for sh, s in shifts:
                val = _shift_adjoint(program, val, sh, s)
                if val is None:
                    break
            if val is not None:
                return sum_over(val, val.axes - set(axes), order), axes
        if len(gathered) == 1 and shifts[0][0] is None and (found := offset_shift(gathered[0][0])) is not None:
            sh, o = found
            parts = _offset_adjoint(program, g, sh, o, gathered[0][1], fresh) if sh.axis not in plain else None
            if parts is not None:
                body, edges = parts
                out = sum_over(body, body.axes - set(axes), order)
                for edge, clamped in edges:
                    total = sum_over(clamped, clamped.axes - set(axes), order)
                    at_edge = _call("eq", Index(gathered[0][1]), _c(edge))
                    out = _call("add", out, _call("where", at_edge, total, _c(0.0)))
                return out, axes
    at = set().union(*(e.axes for e, _ in gathered))
    targets = {s for _, s in gathered}
    if set(g.axes) & targets and not at & targets:  # (x[:, :1] * x: the cotangent varies along an axis
        # named as x's gathered dimension, which the index does not read: summed out before the test)
        g = sum_over(g, set(g.axes) - set(plain) - at, order)
    free = set(g.axes) | at
    if free & targets and fresh is not None and len(set(axes)) == len(axes):
        # x[t[i]] read where i also names x's gathered dimension (cross-entropy of y @ y.mT: the logits'
        # row axis is y's): the position goes on a fresh copy of that axis, i summed over as any other
        rename = {s: _fresh_axis(f"{s}_at", program, fresh, program.axes[s]) for s in targets & free}
        gathered = [(e, rename.get(s, s)) for e, s in gathered]
        axes = tuple(rename.get(a, a) if a not in plain else a for a in axes)
        targets = {s for _, s in gathered}
        order = [*order, *fresh]
    if len(set(axes)) != len(axes) or free & targets:
        raise NoBackward(f"{program.name}: the gradient of the gathered {ir.show(n)} would reuse an axis of "
                         "its expression for the gathered position")
    cond = None
    for e, s in gathered:
        test = _call("eq", e, Index(s))
        cond = test if cond is None else _call("and", cond, test)
    val = _call("where", cond, g, _c(0.0))
    return sum_over(val, free - set(plain), order), axes
