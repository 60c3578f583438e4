"""Checks of an enumerated plan against the program it came from, before it is priced or cached.

Loop bodies are checked against the IR they were encoded from (`differs`): the term the e-graph gives
for a component's body must take the body's values. In rare compiles (session 67: 6 in 168 runs of
tests/test_dynamic_training.py's first nine tests) the e-class looked up for a rolling cross-entropy's
body exp(x − m) held exp(m − m) or exp(−∞ − m) alone: the Term was right, its e-class was not. Root
cause (session 68): egglog 13.2 gave egglog-python's global lets `$__expr_2` and `$__expr_21` one
variable; terms are now written without those lets (neptune_eq/egg_write.py). The check stays as the
net for any other wrong lookup: such a loop is dropped, its reason said, never run.

A pass's carried reduction computes its binding's reduction: where the binding's body varies along
the reduced axis, the core the plan carries (or its mask) must too. A core that does not names a term
that stands for something else — once, in a rare compile (session 66, the collision above), a cross-entropy's
rolling sum read exp(−∞ − m) for exp(x[i, d] − m): the forward was −∞, and cached on disk.

A kernel reads a reduction's final value (fin:x) only after the phase computing it (`unready_state`):
a plan rewrite that slips (session 75: merge_sums moved a sum reading fin:sum_j7 into the pass
computing it, a KeyError at lowering for 167 of a layer norm backward's 1102 alternatives) drops that
plan, with its reason said, rather than failing the compile or reading a value not yet there.
"""

from __future__ import annotations

import numpy as np

from neptune_eq import ir
from neptune_eq.fusion.types import Binding
from neptune_eq.kernel_terms import with_inlined
from neptune_eq.plan import Combine, Plan

SAMPLES = 64


def lost_axis(plan: Plan, bindings: list[Binding]) -> str | None:
    """Why `plan` does not compute its bindings (a carried reduction whose core and mask are free of
    the axis its binding's body varies along), or None."""
    by_name = {b.name: b for b in bindings}
    for k in plan.kernels:
        for ps in k.passes():
            for comp in ps.comps:
                b = by_name.get(comp.name)
                if b is None or b.node.axis != ps.axis or ps.axis not in b.node.body.axes:
                    continue
                if ps.axis not in comp.core.axes and (comp.mask is None or ps.axis not in comp.mask.axes):
                    return (f"kernel {k.name}: {comp.name} = {comp.op}_{ps.axis} of a core free of {ps.axis} "
                            f"where the program's reduction varies along it")
    return None


def unready_state(plan: Plan) -> str | None:
    """Why `plan` reads a final value before its kernel computed it (in a pass carrying it or an earlier
    one, or in another kernel, whose values reach it as buffer loads), or None."""
    for k in plan.kernels:
        done: set[str] = set()
        for ph in k.phases:
            src = ph.source if isinstance(ph, Combine) else ph
            if not isinstance(ph, Combine):
                exprs = [e for c in src.comps for e in (c.core, c.mask, c.corr) if e is not None]
                exprs += [st.expr for st in src.stores]
                late = _finals(exprs, plan) - done
                if late:
                    return (f"kernel {k.name}: the pass over {src.axis} reads the final value of "
                            f"{', '.join(sorted(late))} before it is computed")
            done |= {c.name for c in src.comps}
        late = _finals([st.expr for st in k.epilogue], plan) - done
        if late:
            return (f"kernel {k.name}: its epilogue reads the final value of {', '.join(sorted(late))}, never "
                    "computed there")
    return None


def _finals(exprs, plan: Plan) -> set[str]:
    """The reductions whose final values `exprs` read, through the inline terms (val:x) too."""
    return {n.name for e in with_inlined(list(exprs), plan) for n in e.refs if n.kind is ir.RefKind.FINAL}


def differs(got: ir.Node, want: ir.Node, seed: int = 0) -> str | None:
    """Why `got` (the e-graph's term for a loop body) does not take `want`'s values (the body as encoded),
    or None: both evaluated at SAMPLES points of moderate leaf values (normals, indices 0…63), compared
    where `want` is finite; a tenth may differ by rounding (a rewrite valid over the reals may cancel
    differently). Terms reading leaves `want` does not (a held statistic) are not compared."""
    from neptune_eq.rules.soundness import eval_ir_sampled

    leaves = {ir.show(n): n for n in ir.walk(want) if isinstance(n, ir.Load | ir.StateRef | ir.Index | ir.Length)}
    if any(isinstance(n, ir.Reduce) for n in ir.walk(got)) or any(
            isinstance(n, ir.Load | ir.StateRef | ir.Index | ir.Length) and ir.show(n) not in leaves
            for n in ir.walk(got)):
        return None
    rng = np.random.default_rng(seed)
    env = {k: (rng.integers(0, 64, SAMPLES).astype(float) if isinstance(n, ir.Index)
               else rng.integers(2, 66, SAMPLES).astype(float) if isinstance(n, ir.Length)
               else rng.normal(0.0, 2.0, SAMPLES)) for k, n in leaves.items()}
    with np.errstate(all="ignore"):
        a = np.broadcast_to(eval_ir_sampled(got, env), (SAMPLES,))
        b = np.broadcast_to(eval_ir_sampled(want, env), (SAMPLES,))
    finite = np.isfinite(b)
    if finite.sum() < SAMPLES // 8:
        return None
    bad = finite & ~np.isclose(a, b, rtol=1e-6, atol=1e-9)
    if bad.sum() * 10 <= finite.sum():
        return None
    k = int(np.argmax(bad))
    return f"{ir.show(got)} is {a[k]:.6g} where {ir.show(want)} is {b[k]:.6g}"
