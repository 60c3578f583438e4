"""The repair of a selection of a running max's attaining elements: argmax in the max's own pass.

A reduction over the elements that attain a max of the same pass,

    t = ⊕ⱼ g(xⱼ = M, j)                 argmax: M = maxⱼ xⱼ,  t = minⱼ where(xⱼ = M ∨ xⱼ ≠ xⱼ, j, n)
                                        the count of its ties: t = Σⱼ where(xⱼ = M, 1, 0)

depends on the final M. Rolled with the running max, M = old before a tile and cur after it, every
element already in t has x ≤ old ≤ cur (the max is over the same values, under the same mask), so

    [x = cur] = [x = old] ∧ [old = cur]      for each element t holds (x ≤ old)

and t's elements, at the new running max, are t's own where the max did not move, and t's elements
with the test false where it did — a value the later elements absorb: the element attaining the final
max comes at or after the last move, and it is selected. The repair is therefore

    t ← t ⊗' h,   h = where(unchanged, 1, 0) (⊗' = ·, a sum: t resets to 0)
                      where(unchanged, 0, ±∞) (⊗' = +, a min / max: t resets to its identity)
    unchanged = (old = cur) ∨ (old ≠ old ∧ cur ≠ cur)     (a NaN max stays NaN: it never moves again)

no quotient of the e-graph holds it (the quotient is not free of j: it needs the invariant x ≤ old,
which holds for the elements in the state only), so it is derived here, from the invariant, for the
bodies the invariant covers; the plans that take it are checked against float64 like any other. The
compared value is computed once per tile and both reductions read it: the comparison is exact
(extract/exact_tests.py lets such a plan compute the value inline).
"""

from __future__ import annotations

from neptune_eq import ir
from neptune_eq.ops import MONOIDS, OPS

from .types import CorrectionResult


def selection_reset(core: ir.Node, op: str, axis: str, mask: ir.Node,
                    producers: dict[str, tuple[str, ir.Node, ir.Node, bool]],
                    extent: ir.Node) -> CorrectionResult | None:
    """The reset repair of `core` (a component's body over `axis`, under `mask`, reduced by `op`) over
    its running producers (name → (their op, core, mask, whether they roll themselves)), or None where
    the module's conditions do not hold. `extent`: the axis' length (a constant or len(axis))."""
    if len(producers) != 1 or op not in MONOIDS:
        return None
    (name, (p_op, p_core, p_mask, p_rolls)), = producers.items()
    if p_op not in ("max", "min") or p_rolls:
        return None
    # the values the max is over: its core under its mask (an element of t outside that mask need not be
    # below the max), or its whole body, the identity outside the mask, under any mask of t's
    whole = isinstance(p_mask, ir.Const) and p_mask.value != 0.0
    values = {ir.Call("where", (p_mask, p_core, ir.Const(MONOIDS[p_op].identity)))}
    if whole or p_mask == mask:
        values.add(p_core)
    cur = old = None
    atoms: set[ir.Node] = set()
    compared: set[ir.Node] = set()
    for n in ir.walk(core):
        if isinstance(n, ir.StateRef) and n.name == name and n.kind in ir.RUNNING:
            cur = n if n.kind is ir.RefKind.CURRENT else cur
            old = n if n.kind is ir.RefKind.OLD else old
        if isinstance(n, ir.Call) and n.op == "eq" and any(
                isinstance(a, ir.StateRef) and a.name == name and a.kind is ir.RefKind.CURRENT for a in n.args):
            hit = {a for a in n.args if a in values}
            if not hit:
                return None  # (compared with another value)
            atoms.add(n)
            compared |= hit
    if cur is None or old is not None or len(compared) != 1:
        return None
    (x,) = compared
    # (where the max moved, old is finite: no NaN was seen)
    gone = ir.substitute(core, {a: ir.Const(0.0) for a in atoms} | {ir.Call("ne", (x, x)): ir.Const(0.0)})
    if any(n == cur for n in ir.walk(gone)):
        return None  # (the running max read otherwise than tested against)
    reset = _fold(gone)
    if not _selects_safely(core, op, axis) or not _absorbed(reset, core, op, axis, extent):
        return None
    before = ir.StateRef(ir.RefKind.OLD, cur.name, cur.ref_axes)
    unchanged = ir.Call("or", (ir.Call("eq", (before, cur)),
                               ir.Call("and", (ir.Call("ne", (before, before)), ir.Call("ne", (cur, cur))))))
    if op == "sum":
        h, dist, inverse, ann = ir.Call("where", (unchanged, ir.Const(1.0), ir.Const(0.0))), "mul", "div", 0.0
    else:
        ident = MONOIDS[op].identity
        h, dist, inverse, ann = ir.Call("where", (unchanged, ir.Const(0.0), ir.Const(ident))), "add", "sub", ident
    return CorrectionResult(h, dist, inverse, "any", ann, h, kind="reset",
                            reason=f"{ir.show(x)[:80]} = {cur.kind.value}:{name} ⇒ x = old ∧ old = cur for the "
                                   f"elements held (x {'≤' if p_op == 'max' else '≥'} old:{name})")


def _selects_safely(core: ir.Node, op: str, axis: str) -> bool:
    """Is the selected value one the restart cannot turn into NaN? A min's or max's restart adds ±∞ to
    its state (a state at ∓∞ would become NaN): the index along the axis (argmax, argmin); a sum's
    restart multiplies it by 0 (an infinite state would): a finite constant (the count of ties)."""
    if not isinstance(core, ir.Call):
        return False
    if op == "sum" and OPS[core.op].predicate:
        return True  # (a test summed as 0 or 1)
    if core.op != "where":
        return False
    chosen = core.args[1]
    if op == "sum":
        return _finite_constant(chosen)
    return chosen == ir.Index(axis)


def _finite_constant(n: ir.Node) -> bool:
    """A finite constant, possibly converted (`float(1)`: a test counted as a float)."""
    while isinstance(n, ir.Call) and len(n.args) == 1 and n.op in ("float", "neg"):
        n = n.args[0]
    return isinstance(n, ir.Const) and abs(n.value) != float("inf") and n.value == n.value


def _absorbed(reset: ir.Node, core: ir.Node, op: str, axis: str, extent: ir.Node) -> bool:
    """Does the value of a held element after a move (`reset`) leave the final result alone? The
    monoid's identity always does; a min over where(x = M, j, c) with c ≥ the axis' length does too
    (the attaining element, selected later, gives an index below c), and a max with c ≤ 0."""
    if isinstance(reset, ir.Const) and reset.value == MONOIDS[op].identity:
        return True
    if op == "sum" or not isinstance(core, ir.Call) or core.op != "where" or core.args[2] != reset:
        return False
    if core.args[1] != ir.Index(axis):
        return False
    if op == "min":
        return reset == extent or (isinstance(reset, ir.Const) and isinstance(extent, ir.Const)
                                   and reset.value >= extent.value)
    return isinstance(reset, ir.Const) and reset.value <= 0


def _fold(n: ir.Node) -> ir.Node:
    """Constant conditions folded: and / or / not of 0 and 1, and where of a constant condition."""
    if not isinstance(n, ir.Call):
        return n
    args = tuple(_fold(a) for a in n.args)
    consts = [a.value if isinstance(a, ir.Const) else None for a in args]
    if n.op == "or" and (0.0 in consts):
        return args[1] if consts[0] == 0.0 else args[0]
    if n.op == "and" and (0.0 in consts):
        return ir.Const(0.0)
    if n.op == "not" and consts[0] is not None:
        return ir.Const(float(consts[0] == 0.0))
    if n.op == "where" and consts[0] is not None:
        return args[1] if consts[0] != 0.0 else args[2]
    return ir.Call(n.op, args)
