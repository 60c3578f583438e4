"""egglog 13.2 names the variables it flattens a command into after the function or global each holds
plus a count (`E`, `E1`, `E2`, ...), so a name that is another's plus digits can be given the other's
variable: the e-graph then holds a term nobody wrote. This is what made a cross-entropy's rolling sum
read exp(cur:max_d − m) for exp(x − m) about one compile in thirty (egglog-python's global lets
`$__expr_2` and `$__expr_21`). neptune_eq writes its terms without those lets and gives the e-graph no
name ending in a digit (neptune_eq/egg_write.py, terms._egg_name); these tests pin the engine's
behaviour and check that the package's writes are immune to it."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from egglog import EGraph, bindings
from egglog.declarations import CallDecl
from egglog.egraph_state import span

from neptune_eq.egg_write import let, write
from neptune_eq.frontend import capture
from neptune_eq.pipeline import Options, compile_program
from neptune_eq.terms import Term, exp, exp2, log, log2


def _extract(eg: bindings.EGraph, name: str) -> str:
    out = eg.run_program(*eg.parse_program(f"(extract {name})"))[0]
    return out.termdag.to_string(out.term)


def test_the_engine_confuses_a_name_with_another_plus_digits():
    """Pins egglog's behaviour (if this starts failing, the engine was fixed: the workaround may go)."""
    wrong = []
    for k in range(12):
        eg = bindings.EGraph()
        eg.run_program(*eg.parse_program("(datatype T (L String) (E T) (E2 T) (P T T))"))
        for j in range(k):
            eg.run_program(*eg.parse_program(f'(let $u{j}_ (E (L "a{j}")))'))
        want = '(P (E2 (L "p")) (E (E (L "q"))))'
        eg.run_program(*eg.parse_program(f"(let $t_ {want})"))
        if _extract(eg, "$t_") != want:
            wrong.append(k)
    assert wrong, "egglog no longer confuses E's flattened variables with E2's"


def _fresh(state, typed) -> bindings._Expr:
    """The expression written out in full: no cached rendering, no let."""
    e = typed.expr
    if isinstance(e, CallDecl):
        fn, args = state.translate_call(e)
        return bindings.Call(span(), fn, [_fresh(state, a) for a in args])
    return state._expr_to_egg(e)


def _holds(eg: EGraph, term) -> bool:
    """Does the e-graph hold `term` as written: the class its write reached is the class the full
    expression evaluates to (a confused write reaches another term's class, and the full expression
    then makes a class of its own)."""
    state = eg._state
    typed = term.__egg_typed_expr__
    got = state.egraph.eval_expr(state.typed_expr_to_egg(typed, False))[1]
    return got == state.egraph.eval_expr(_fresh(state, typed))[1]


def test_terms_written_by_the_package_are_the_terms_given():
    """exp2(p)·exp(exp(q)) and log2(p)·log(log(q)) after k other exps and logs, each named by a let
    as the Encoder names a large subterm: every write holds what it was given."""
    p, q = Term.load("p[i]"), Term.load("q[i]")
    for k in range(16):
        eg = EGraph()
        for j in range(k):
            a = Term.load(f"a{j}[i]")
            let(eg, f"nq_let{j}_", exp(a) * log(a))
        terms = [exp2(p) * exp(exp(q)), log2(p) * log(log(q)), exp2(exp(p)) + exp(exp2(q))]
        write(eg, *terms)
        named = let(eg, "nq_let_last_", terms[0] + terms[1])
        write(eg, named * exp(named))
        assert all(_holds(eg, t) for t in terms), k
        assert _holds(eg, terms[0] + terms[1]) and eg._state.expr_to_let_counter == 0, k


def test_the_package_gives_the_egraph_no_name_ending_in_a_digit():
    """After compiling a training cross-entropy (forward and backward e-graphs), no function or global
    of the compile's e-graph ends in a digit, and egglog-python made no global let of its own."""
    x = torch.randn(32, 24, dtype=torch.float64)
    t = torch.randint(0, 24, (32,))
    c = compile_program(capture(lambda x, t: F.cross_entropy(x, t), x, t).program, Options())
    names = list(c.egraph._egraph.freeze().functions)
    assert names and not [n for n in names if re.search(r"\d$", n)]
    assert c.egraph._state.expr_to_let_counter == 0
    assert c.alternatives
    from neptune_eq.fusion import affine, correction  # (the searchers this process keeps: their e-graphs too)

    kept = [s for mod in (affine, correction) for s, _alive in mod._KEPT._kept.values()]
    assert kept and all(s.egraph._state.expr_to_let_counter == 0 for s in kept)


def test_no_operator_of_the_term_language_has_an_egglog_name_ending_in_a_digit():
    """Every constructor the Encoder writes (terms.CONSTRUCTORS), written once into an e-graph."""
    from neptune_eq.terms import BINARY, CONSTRUCTORS, UNARY

    x, y, z = Term.load("x[i]"), Term.load("y[i]"), Term.load("z[i]")
    eg = EGraph()
    write(eg, *(f(x, y) for f in BINARY.values()), *(f(x) for f in UNARY.values()), CONSTRUCTORS["where"](x, y, z))
    names = list(eg._egraph.freeze().functions)
    assert len(names) > len(CONSTRUCTORS) and not [n for n in names if re.search(r"\d$", n)]
