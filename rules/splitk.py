"""Split-K: any fused pass over an axis may be cut into chunks that run in parallel.

A loop's state is a tuple monoid (the components with their corrections), so the chunks' states
combine associatively: (r₁,t₁) ⊙ (r₂,t₂) = (r₁⊗r₂, t₁⊗'h(r₁→r) ⊕ t₂⊗'h(r₂→r)). Which chunk counts
are offered per axis is data (split_factor facts written by the pipeline from its options); which
one is used is the cost model's choice.
"""

from __future__ import annotations

from egglog import String, eq, i64, rule, ruleset, union, var, vars_

from neptune_eq.terms import Comps, Loop, Term, get, split_factor

t = var("t", Term)
L = var("L", Loop)
cs = var("cs", Comps)
ax, name = vars_("ax name", String)
n = var("n", i64)

SPLITK = ruleset(
    # get(loop over j, c) → get(loop over j in n chunks, c)
    rule(eq(t).to(get(L, name)), eq(L).to(Loop(ax, cs)), split_factor(ax, n)).then(
        union(t).with_(get(L.split(n), name))
    ),
    name="split_k",
)
