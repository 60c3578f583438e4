"""User rules: turn what a user hands over into checked Rule objects before any e-graph sees them.

    user_rules(["my.rules", "sqrt_div", my_rule, rewrite(sqrt(a) / sqrt(b)).to(sqrt(a / b))])

accepts, in any mix:
    a path to a rules file (rules/files.py says the format; the file is read as data),
    the name of a rules file shipped in the package's rules folder (rules/<name>.rules; these are
        loaded only when named, never by default),
    a Rule (rules.base.rw / birw over our sorts),
    an egglog rewrite or birewrite over the Term sort, optionally as a (name, rewrite) pair; its
        conditions must be ones the helpers in rules.base produce (free_of, positive, ...), since
        the fuzzer has to know how to sample values that satisfy them.

Every rule is validated (a left side that is an operation, no variable on the right that the left
does not bind, a name that is not taken) and fuzzed for soundness (rules/soundness.py: both sides in
float64 on random values including ±inf, NaN, huge and tiny magnitudes and the domain edges of log
and sqrt, reductions over extents 1, 2, 3, 5 and 8). An unsound rule is rejected with
UnsoundRuleError showing the counterexample. A refinement (sound, but its left side is NaN where its
right side is a number, like a/a → 1 at a = 0) is accepted with a RuleRefinementWarning naming the
sample, or rejected with RefinementRuleError under strict checking (`strict=True`; the compile
option `strict_rules`; `neptune-eq rules check --strict`).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from egglog import RewriteOrRule, String, f64, i64, var
from egglog.declarations import TypedExprDecl
from egglog.egraph import _fact_like
from egglog.pretty import pretty_decl
from egglog.runtime import RuntimeExpr

from neptune_eq.ir import NeptuneError, NeptuneWarning
from neptune_eq.terms import Term

from .algebra import BUILTIN
from .base import Cond, Rule, extent_of, free_of, is_finite, is_nonneg, nonzero, normal, not_zero, positive, varies
from .files import RuleFileError, load_rules_file
from .patterns import PatternError, pattern_of
from .soundness import Counterexample, Verdict, fmt_value, rule_verdict

RULES_DIR = Path(__file__).resolve().parent  # shipped *.rules files live next to this module
RuleSpec = str | Path | Rule | RewriteOrRule | tuple


class RuleError(NeptuneError):
    """A user rule that cannot be used as written (the message says why)."""


class UnsoundRuleError(RuleError):
    """A user rule whose two sides differ on some float64 values."""

    def __init__(self, rule: Rule, counterexample: Counterexample):
        self.rule, self.counterexample = rule, counterexample
        super().__init__(
            f"{_where(rule)}rule '{rule.name}' ({rule.math}) is unsound: {_cx_text(counterexample)}. A rule must "
            "give the same value as its left side wherever the left side is defined (not NaN), for all "
            "float64 values including ±inf, NaN, 0, huge and tiny magnitudes, and every extent of a reduced "
            "axis; restrict it with a condition (e.g. `if positive(c)`, `if b free of j`) or drop it")


class RefinementRuleError(RuleError):
    """A refinement (sound, but its left side is undefined where its right side is not) under strict checking."""

    def __init__(self, rule: Rule, refinement: Counterexample):
        self.rule, self.refinement = rule, refinement
        super().__init__(
            f"{_where(rule)}rule '{rule.name}' ({rule.math}) is a refinement, rejected by strict rule checking: "
            f"{_refinement_text(refinement)}. Without strict checking it would be accepted with a warning; add a "
            "condition that excludes those values or drop the rule")


class RuleRefinementWarning(NeptuneWarning):
    """A user rule was accepted although it is a refinement: a compiled program may give a number where the
    original program gives NaN. Turn it into an error with strict rule checking, or with
    warnings.simplefilter("error", RuleRefinementWarning)."""


def _where(rule: Rule) -> str:
    return f"{rule.origin}: " if rule.origin not in ("builtin", "python") else ""


def _cx_text(cx: Counterexample) -> str:
    return f"with {cx.where}: left side = {fmt_value(cx.lhs)}, right side = {fmt_value(cx.rhs)}"


def _refinement_text(cx: Counterexample) -> str:
    return f"left side undefined (nan) at {cx.where}, right side {fmt_value(cx.rhs)}"


def _refinement_warning(rule: Rule, cx: Counterexample) -> None:
    warnings.warn(
        f"{_where(rule)}rule '{rule.name}' ({rule.math}) is accepted as a refinement: {_refinement_text(cx)}; a "
        "compiled program may give a number where the original gives NaN. Pass strict_rules=True (or run "
        "`neptune-eq rules check --strict`) to reject refinements", RuleRefinementWarning,
        stacklevel=_user_stacklevel())


_PACKAGE_DIRS = (str(RULES_DIR), str(Path(sys.modules[NeptuneError.__module__].__file__).resolve().parent))


def _user_stacklevel() -> int:
    """The warnings.warn stacklevel of the first caller outside neptune_eq, so the warning names the user's line."""
    frame, level = sys._getframe(2), 2  # 1 is _refinement_warning itself
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def shipped_rules_files() -> list[str]:
    """Names of the rules files shipped in the package (usable as rules=<name>)."""
    return sorted(p.stem for p in RULES_DIR.glob("*.rules"))


def resolve_rules_file(spec: str | Path) -> Path:
    p = Path(spec)
    if p.is_file():
        return p
    if isinstance(spec, str) and spec.isidentifier() and (RULES_DIR / f"{spec}.rules").is_file():
        return RULES_DIR / f"{spec}.rules"
    shipped = ", ".join(shipped_rules_files()) or "none"
    raise RuleFileError(f"no rules file '{spec}' (not a file; shipped rules files: {shipped})")


def user_rules(specs: RuleSpec | list[RuleSpec] | tuple[RuleSpec, ...] | None, *,
               strict: bool = False) -> tuple[Rule, ...]:
    """Checked user rules from paths, shipped rules-file names, Rule objects and egglog rewrites: one of
    them, or a list or tuple of them (anything else is a RuleError naming it).

    Raises UnsoundRuleError for an unsound rule; a refinement is accepted with a RuleRefinementWarning,
    or raises RefinementRuleError when `strict`."""
    if specs is None:
        return ()
    if isinstance(specs, str | Path | Rule | RewriteOrRule) or _is_named_rewrite(specs):
        specs = [specs]
    if not isinstance(specs, list | tuple):  # 42 was a raw TypeError; a dict's keys were read as file names
        raise RuleError(f"rules={_short(specs)} ({type(specs).__name__}) is not a rule spec: {_ACCEPTED}, or a "
                        "list or tuple of those")
    rules: list[Rule] = []
    for k, spec in enumerate(specs):
        if isinstance(spec, Rule):
            rules.append(spec if spec.origin != "builtin" else _as_user(spec))
        elif isinstance(spec, RewriteOrRule):
            rules.append(from_egglog(spec, name=f"user_rule_{k}"))
        elif _is_named_rewrite(spec):
            rules.append(from_egglog(spec[1], name=spec[0]))
        elif isinstance(spec, str | Path):
            rules.extend(load_rules_file(resolve_rules_file(spec)))
        else:
            raise RuleError(f"cannot use {_short(spec)} ({type(spec).__name__}) as a rule: pass {_ACCEPTED}")
    names: dict[str, Rule] = {}
    for r in rules:
        if r.name in names:
            raise RuleError(f"{_where(r)}rule name '{r.name}' is used twice (also at {names[r.name].origin})")
        names[r.name] = r
        validate(r)
        verdict = check_rule(r, strict=strict)
        if verdict.refinement is not None:
            _refinement_warning(r, verdict.refinement)
    return tuple(rules)


_ACCEPTED = ("a rules-file path or shipped rules-file name, a Rule (rules.base.rw / birw), or an egglog "
             "rewrite(lhs).to(rhs) over Term (optionally as a (name, rewrite) pair)")


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_named_rewrite(spec) -> bool:
    return isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(
        spec[1], RewriteOrRule)


def _as_user(rule: Rule) -> Rule:
    return Rule(rule.name, rule.lhs, rule.rhs, rule.conds, rule.bidirectional, origin="python")


def check_rule(rule: Rule, *, strict: bool = False) -> Verdict:
    """The fuzzer's verdict on a sound rule; UnsoundRuleError (with a counterexample) if it is not sound,
    RefinementRuleError if it is a refinement and `strict`."""
    try:
        verdict = rule_verdict(rule)
    except (KeyError, ValueError, TypeError, IndexError) as e:
        raise RuleError(f"{_where(rule)}cannot check rule '{rule.name}' ({rule.math}) for soundness: {e}") from None
    if verdict.counterexample is not None:
        raise UnsoundRuleError(rule, verdict.counterexample)
    if strict and verdict.refinement is not None:
        raise RefinementRuleError(rule, verdict.refinement)
    return verdict


def validate(rule: Rule) -> None:
    """Structural checks egglog would otherwise report obscurely (or not at all)."""
    if rule.origin != "builtin" and rule.name in {r.name for r in BUILTIN}:
        raise RuleError(f"{_where(rule)}rule name '{rule.name}' is taken by a built-in rule; choose another name")
    try:
        lhs, rhs = rule.lhs_pattern, rule.rhs_pattern
    except PatternError as e:
        raise RuleError(f"{_where(rule)}rule '{rule.name}': {e}") from None
    sides = [(lhs, rhs, "left")] + ([(rhs, lhs, "right")] if rule.bidirectional else [])
    bound = {c.var for c in rule.conds if c.kind == "extent"}
    for src, dst, side in sides:
        if src.kind == "var":
            raise RuleError(f"{_where(rule)}rule '{rule.name}': the {side} side is the bare variable '{src.name}'; "
                            "a rule must match an operation (egglog cannot enumerate every term)")
        if src.kind == "lit":
            raise RuleError(f"{_where(rule)}rule '{rule.name}': the {side} side is a bare literal; write the "
                            "constant as a term (e.g. Term(1.0)) and match an operation")
        unbound = set(dst.vars()) - set(src.vars()) - bound
        if unbound:
            raise RuleError(f"{_where(rule)}rule '{rule.name}': {', '.join(sorted(unbound))} on the "
                            f"{'right' if side == 'left' else 'left'} side "
                            f"{'is' if len(unbound) == 1 else 'are'} not bound by the {side} side")
    all_vars = {**lhs.vars(), **rhs.vars()}
    for c in rule.conds:
        for v in (c.var, c.axis):
            if v is not None and v not in all_vars:
                raise RuleError(f"{_where(rule)}rule '{rule.name}': condition `{c}` names '{v}', which does not "
                                "occur in the rule")


# ---------------------------------------------------------------- egglog rewrites → Rule


def from_egglog(rewrite: RewriteOrRule, name: str) -> Rule:
    """A Rule from an egglog `rewrite(lhs).to(rhs, *conds)` or `birewrite` over the Term sort."""
    decl = rewrite.decl
    kind = type(decl).__name__
    if kind not in ("RewriteDecl", "BiRewriteDecl"):
        raise RuleError(f"rule '{name}': only egglog rewrite/birewrite rules can be checked and used, not {kind} "
                        "(general rules with actions cannot be fuzzed for soundness)")
    if getattr(decl, "subsume", False):
        raise RuleError(f"rule '{name}': subsume=True deletes terms from the e-graph and is not supported")
    if decl.tp.ident.name != "Term":
        raise RuleError(f"rule '{name}': rules must rewrite Term expressions, not {decl.tp.ident.name}")
    decls = rewrite.__egg_decls__
    lhs = RuntimeExpr.__from_values__(decls, TypedExprDecl(decl.tp, decl.lhs))
    rhs = RuntimeExpr.__from_values__(decls, TypedExprDecl(decl.tp, decl.rhs))
    try:
        pl, pr = pattern_of(lhs), pattern_of(rhs)
    except PatternError as e:
        raise RuleError(f"rule '{name}': {e}") from None
    conds = _conds_of(name, decl.conditions, decls, {**pl.vars(), **pr.vars()})
    return Rule(name, lhs, rhs, conds, bidirectional=kind == "BiRewriteDecl", origin="python")


_SORTS = {"Term": Term, "f64": f64, "i64": i64, "String": String}


def _candidate_conds(sorts: dict[str, str]) -> list[Cond]:
    """Every condition the rules.base helpers could build over the rule's variables."""
    axes = [var(n, String) for n, s in sorts.items() if s == "String"]
    out: list[Cond] = []
    for n, s in sorts.items():
        v = var(n, _SORTS[s]) if s in _SORTS else None
        if s == "Term":
            out += [is_finite(v), not_zero(v), is_nonneg(v), *(free_of(v, ax) for ax in axes),
                    *(varies(v, ax) for ax in axes)]
        elif s == "f64":
            out += [positive(v), normal(v), nonzero(v)]
        elif s == "i64":
            out += [extent_of(v, ax) for ax in axes]
    return out


def _conds_of(name: str, conditions, decls, sorts: dict[str, str]) -> tuple[Cond, ...]:
    remaining = list(conditions)
    conds: list[Cond] = []
    for cond in _candidate_conds(sorts):
        facts = [_fact_like(f).fact for f in cond.facts]
        if all(f in remaining for f in facts):
            for f in facts:
                remaining.remove(f)
            conds.append(cond)
    if remaining:
        text = pretty_decl(decls, remaining[0])
        raise RuleError(f"rule '{name}': cannot interpret the condition `{text}`; use the helpers of "
                        "neptune_eq.rules.base (free_of, varies, positive, nonzero, normal, is_finite, is_nonneg, "
                        "not_zero, extent_of) so that the soundness fuzzer can sample values satisfying it")
    return tuple(conds)


# ---------------------------------------------------------------- checking files (CLI)


@dataclass
class RuleCheck:
    rule: Rule
    problem: str | None = None  # None: valid and no counterexample found
    refinement: Counterexample | None = None  # accepted, but the left side is undefined where the right is not

    @property
    def ok(self) -> bool:
        return self.problem is None

    def __str__(self) -> str:
        where = f"  [{self.rule.origin}]" if self.rule.origin not in ("builtin", "python") else ""
        if not self.ok:
            return f"FAIL  {self.rule.name}: {self.rule.math}{where}\n      {self.problem}"
        if self.refinement is not None:
            return (f"ok    {self.rule.name}: {self.rule.math}{where}\n      (refinement: "
                    f"{_refinement_text(self.refinement)}; --strict rejects it)")
        return f"ok    {self.rule.name}: {self.rule.math}{where}"


def check_rules(rules: Iterable[Rule], *, strict: bool = False) -> list[RuleCheck]:
    """Validate and fuzz each rule on its own, collecting every problem instead of stopping at the first.

    A refinement is ok (with its sample in RuleCheck.refinement) unless `strict`, where it is a problem."""
    out = []
    for r in rules:
        try:
            validate(r)
            verdict = check_rule(r, strict=strict)
            out.append(RuleCheck(r, refinement=verdict.refinement))
        except UnsoundRuleError as e:
            out.append(RuleCheck(r, f"unsound: {_cx_text(e.counterexample)}"))
        except RefinementRuleError as e:
            out.append(RuleCheck(r, f"refinement rejected (strict): {_refinement_text(e.refinement)}",
                                 e.refinement))
        except RuleError as e:
            out.append(RuleCheck(r, str(e)))
    return out


__all__ = ["RULES_DIR", "RefinementRuleError", "RuleCheck", "RuleError", "RuleFileError", "RuleRefinementWarning",
           "UnsoundRuleError", "check_rule", "check_rules", "from_egglog", "resolve_rules_file",
           "shipped_rules_files", "user_rules", "validate"]
