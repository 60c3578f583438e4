"""Terms written into an egglog e-graph without egglog-python's global lets.

`EGraph.register(term)` names the term, and every subterm it holds under two parents, by a global
let `$__expr_N`; `EGraph.let` names the subterms of its body the same way. egglog 13.2 names the
variables it flattens a command into after the global or function each holds plus a count, so a
global whose name is another's plus digits could be read as that other: `$__expr_2` (x[i, d]) read
as `$__expr_21` (cur:max_d) wrote exp(cur:max_d − m) for exp(x − m) into a cross-entropy's rolling
sum, about one compile in thirty, depending on how often `$__expr_2` had been used before (sessions
66–68; tests/test_egg_names.py reproduces the engine's behaviour). Here a term is written as the plain
expression it is: its shared subterms are the Encoder's lets (`nq_let{k}_`, ending in `_` as every
name this package gives the e-graph does: terms._egg_name), so no name is another's plus digits."""

from __future__ import annotations

from egglog import EGraph, bindings
from egglog.declarations import LetRefDecl, TypedExprDecl
from egglog.egraph_state import span
from egglog.runtime import RuntimeExpr


def write(egraph: EGraph, *items) -> None:
    """Register `items` in `egraph`: expressions (terms, relation facts) as plain expressions, actions
    (set_, union) as egglog-python writes them (their arguments are never let-bound)."""
    exprs = [x for x in items if isinstance(x, RuntimeExpr)]
    actions = [x for x in items if not isinstance(x, RuntimeExpr)]
    if exprs:
        egraph._add_decls(*exprs)
        state = egraph._state
        egraph._run_program(*(bindings.ActionCommand(bindings.Expr_(span(), state.typed_expr_to_egg(
            x.__egg_typed_expr__, False))) for x in exprs))
    if actions:
        egraph.register(*actions)


def let(egraph: EGraph, name: str, term: RuntimeExpr) -> RuntimeExpr:
    """`term` bound to the global `name` (which must not end in a digit); a reference to it."""
    if name[-1:].isdigit():
        raise ValueError(f"let name {name!r} ends in a digit (see this module's docstring)")
    egraph._add_decls(term)
    state = egraph._state
    typed = term.__egg_typed_expr__
    ref = LetRefDecl(name)
    var = state._expr_to_egg(ref)  # (cached: later expressions holding the reference write its name)
    egraph._run_program(bindings.ActionCommand(bindings.Let(span(), var.name, state.typed_expr_to_egg(typed, False))))
    return RuntimeExpr.__from_values__(egraph.__egg_decls__, TypedExprDecl(typed.tp, ref))
