"""Rules files: rewrite rules written as data, one per line, read without executing anything.

    # comments and blank lines are ignored
    sqrt_div:   sqrt(a) / sqrt(b) -> sqrt(a / b)
    sum_scale:  sum_j(a * k) -> sum_j(a) * k          if k free of j
    exp_split:  exp(a + b) <-> exp(a) * exp(b)
    max_scale:  max_j(a * c) -> max_j(a) * c          if positive(c)

Each side is an expression in a small language: + - * / and unary minus, numbers (and `inf`),
comparisons (< <= > >= == !=, for `where` conditions), the functions exp exp2 log log2 tanh sqrt
rsqrt abs max2 min2 where, and reductions sum_<axis>(body), max_<axis>(body), min_<axis>(body)
whose axis is a pattern variable too. Every other lowercase name is a pattern variable matching
any term. Conditions after `if`, separated by commas:

    x free of j      x does not vary along the axis variable j
    positive(c)      c matches a numeric constant that is finite and > 0   (c is then a constant variable)
    nonzero(c)       c matches a numeric constant ≠ 0                      (idem)
    normal(c)        c matches a numeric constant with c and 1/c finite    (idem)
    nonneg(x)        x is known to be ≥ 0 (the e-graph's nonneg analysis)
    finite(x)        no syntactic ±inf can reach x
    not_zero(x)      x is not known to equal the constant 0

Files are UTF-8 (a leading byte-order mark is accepted); outside comments a rule is ASCII. Numbers
must be exact: an integer literal must fit a 64-bit integer and be exactly a float64 (|n| ≤ 2**53,
or a multiple of a power of two that is), a float literal must not overflow to inf or underflow to 0.

The expressions are parsed with Python's `ast` module in 'eval' mode and then walked with a strict
whitelist of node types: names, numbers, + - * /, unary minus, single comparisons and calls of the
functions above. Attribute access, subscripts, lambdas, keywords, strings and every other call are
rejected with an error naming the file and line. Nothing in the file is ever evaluated.
"""

from __future__ import annotations

import ast
import math
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from egglog import String, f64, var

from neptune_eq.ir import NeptuneError
from neptune_eq.ops import OPS
from neptune_eq.terms import CONSTRUCTORS, Term, red

from .base import Cond, Rule, free_of, is_finite, is_nonneg, nonzero, normal, not_zero, positive

MAX_FILE_BYTES = 1_000_000
MAX_LINE_CHARS = 2_000
MAX_NODES = 200  # per side: keeps every later recursive walk shallow
I64_MAX = 2**63 - 1

FUNCTIONS = {name: OPS[name].arity for name in ("exp", "exp2", "expm1", "log", "log2", "log1p", "erf", "tanh", "sin",
                                                 "cos", "sqrt", "rsqrt", "abs", "max2", "min2", "where")}
_REDUCTION = re.compile(r"^(sum|max|min)_([a-z][a-z0-9]*)$")
_VARIABLE = re.compile(r"^[a-z][a-z0-9_]*$")
_RULE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_FREE_OF = re.compile(r"^([A-Za-z_]\w*)\s+free\s+of\s+([A-Za-z_]\w*)$")
CONSTANT_CONDS = {"positive": positive, "nonzero": nonzero, "normal": normal}  # take a constant variable
TERM_CONDS = {"nonneg": is_nonneg, "finite": is_finite, "not_zero": not_zero}  # take a term variable
_ARITH = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
_COMPARE = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_FORBIDDEN = {ast.Attribute: "attribute access", ast.Subscript: "subscripts", ast.Lambda: "a lambda",
              ast.Starred: "starred arguments", ast.JoinedStr: "f-strings", ast.IfExp: "conditional expressions",
              ast.NamedExpr: "assignment expressions", ast.BoolOp: "and/or (use where(...))",
              ast.Tuple: "tuples", ast.List: "lists", ast.Dict: "dicts", ast.Set: "sets",
              ast.ListComp: "comprehensions", ast.GeneratorExp: "comprehensions", ast.Await: "await",
              ast.Yield: "yield"}


class RuleFileError(NeptuneError):
    """A rules file (or one line of it) that cannot be read; the message names the file and line."""


@dataclass
class _Line:
    """What one rule line declares, before it is built into egglog terms."""

    source: str
    lineno: int
    text: str
    axes: set[str] = field(default_factory=set)  # axis variables (String)
    constants: set[str] = field(default_factory=set)  # constant variables (f64)
    terms: set[str] = field(default_factory=set)  # term variables

    def error(self, msg: str) -> RuleFileError:
        text = self.text.strip()
        if len(text) > 160:  # a pathological line is named, not echoed whole
            text = f"{text[:120]} … {text[-30:]}"
        return RuleFileError(f"{self.source}:{self.lineno}: {msg}\n    {text}")


def load_rules_file(path: str | Path) -> list[Rule]:
    """The rules of a rules file (read as text; never executed)."""
    p = Path(path)
    if not p.is_file():
        raise RuleFileError(f"no such rules file: {path}")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise RuleFileError(f"{path}: rules file larger than {MAX_FILE_BYTES} bytes")
    data = p.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise RuleFileError(f"{path}: not a UTF-8 text file (it starts with a UTF-16 byte-order mark); "
                            "save it as UTF-8")
    try:
        text = data.decode("utf-8-sig")  # a UTF-8 byte-order mark (as some editors write) is dropped
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise RuleFileError(f"{path}:{line}: not a UTF-8 text file ({e.reason}: byte 0x{data[e.start]:02x} at "
                            f"offset {e.start}); save it as UTF-8") from None
    return parse_rules(text, str(path))


def parse_rules(text: str, source: str = "<rules>") -> list[Rule]:
    """Rules from the text of a rules file; `source` names it in errors and in each rule's origin."""
    out: list[Rule] = []
    seen: dict[str, int] = {}
    text = text.removeprefix("\ufeff")  # a byte-order mark before the first line
    for lineno, raw in enumerate(text.splitlines(), 1):
        stripped = raw.split("#", 1)[0].strip()
        if not stripped:
            continue
        line = _Line(source, lineno, raw)
        if len(raw) > MAX_LINE_CHARS:
            raise line.error(f"line longer than {MAX_LINE_CHARS} characters")
        odd = next((ch for ch in stripped if not ch.isascii()), None)
        if odd is not None:  # say which character, rather than a puzzling syntax error (invisible ones above all)
            what = unicodedata.name(odd, "unnamed character")
            raise line.error(f"character U+{ord(odd):04X} ({what}) at column {raw.index(odd) + 1}: rules are "
                             "ASCII outside comments")
        rule = _parse_line(line, stripped)
        if rule.name in seen:
            raise line.error(f"rule '{rule.name}' is already defined on line {seen[rule.name]}")
        seen[rule.name] = lineno
        out.append(rule)
    return out


def _parse_line(line: _Line, text: str) -> Rule:
    name, sep, body = text.partition(":")
    name = name.strip()
    if not sep or not _RULE_NAME.match(name):
        raise line.error("expected `name: lhs -> rhs [if condition, ...]` (the name is letters, digits and _)")
    both = body.count("<->")
    one = body.replace("<->", "").count("->")
    if both + one != 1:
        raise line.error("expected exactly one arrow: `->` (rewrite) or `<->` (both directions)")
    lhs_text, _, rest = body.partition("<->" if both else "->")
    m = re.search(r"\sif\s", rest)
    rhs_text, cond_text = (rest[:m.start()], rest[m.end():]) if m else (rest, "")
    lhs_tree, rhs_tree = _parse_expr(line, lhs_text, "left side"), _parse_expr(line, rhs_text, "right side")
    cond_specs = [c.strip() for c in cond_text.split(",")] if cond_text.strip() else []
    if any(not c for c in cond_specs):
        raise line.error("empty condition (conditions are separated by single commas)")
    for tree in (lhs_tree, rhs_tree):
        _declare(line, tree)
    conds_parsed = [_parse_cond(line, c) for c in cond_specs]
    for kind, v, axis in conds_parsed:
        if kind in CONSTANT_CONDS:
            line.constants.add(v)
        if axis is not None and axis not in line.axes:
            raise line.error(f"'{axis}' in `{v} free of {axis}` is not the axis of a reduction in the rule")
    clash = line.axes & line.terms
    if clash:
        raise line.error(f"'{sorted(clash)[0]}' is used both as an axis and as a value")
    used = line.terms
    conds: list[Cond] = []
    for kind, v, axis in conds_parsed:
        if v not in used:
            raise line.error(f"condition on '{v}', which does not occur in the rule")
        if kind == "free_of":
            if v in line.constants:
                raise line.error(f"'{v}' is a constant; 'free of' takes a term variable")
            conds.append(free_of(var(v, Term), var(axis, String)))
        elif kind in CONSTANT_CONDS:
            conds.append(CONSTANT_CONDS[kind](var(v, f64)))
        else:
            if v in line.constants:
                raise line.error(f"'{v}' is a constant (it has a constant condition); {kind}() takes a term variable")
            conds.append(TERM_CONDS[kind](var(v, Term)))
    lhs, rhs = _build(line, lhs_tree), _build(line, rhs_tree)
    return Rule(name, lhs, rhs, tuple(conds), bidirectional=bool(both), origin=f"{line.source}:{line.lineno}")


def _parse_expr(line: _Line, text: str, what: str) -> ast.expr:
    text = text.strip()
    if not text:
        raise line.error(f"the {what} is empty")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        msg = getattr(e, "msg", None) or str(e) or type(e).__name__
        raise line.error(f"cannot read the {what} `{text}`: {msg}") from None
    _check(line, tree.body, what, text)
    return tree.body


def _check(line: _Line, node: ast.AST, what: str, source: str) -> None:
    """Whitelist walk: only names, numbers, + - * /, unary ±, one comparison and allowed calls."""
    stack = [node]
    seen = 0
    while stack:
        n = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise line.error(f"the {what} is too large (more than {MAX_NODES} operations)")
        if isinstance(n, ast.Name):
            continue
        if isinstance(n, ast.Constant):
            if isinstance(n.value, bool) or not isinstance(n.value, int | float):
                raise line.error(f"only numbers may appear as constants in the {what}, not {n.value!r}")
            _check_number(line, n, ast.get_source_segment(source, n) or repr(n.value))
            continue
        if isinstance(n, ast.BinOp):
            if type(n.op) not in _ARITH:
                raise line.error(f"operator {_op_text(n.op)} is not supported (use + - * / and the functions)")
            stack += [n.left, n.right]
        elif isinstance(n, ast.UnaryOp):
            if not isinstance(n.op, ast.USub | ast.UAdd):
                raise line.error(f"operator {_op_text(n.op)} is not supported")
            stack.append(n.operand)
        elif isinstance(n, ast.Compare):
            if len(n.ops) != 1 or type(n.ops[0]) not in _COMPARE:
                raise line.error("only single comparisons < <= > >= == != are supported")
            stack += [n.left, *n.comparators]
        elif isinstance(n, ast.Call):
            if not isinstance(n.func, ast.Name):
                kind = next((v for k, v in _FORBIDDEN.items() if isinstance(n.func, k)), "a computed callable")
                raise line.error(f"only the rule functions may be called, by name; calling {kind} is not allowed")
            fname = n.func.id
            if fname not in FUNCTIONS and not _REDUCTION.match(fname):
                raise line.error(f"unknown function '{fname}' (allowed: {', '.join(FUNCTIONS)}, "
                                 "sum_<axis>, max_<axis>, min_<axis>)")
            if n.keywords or any(isinstance(a, ast.Starred) for a in n.args):
                raise line.error(f"{fname}() takes positional arguments only")
            arity = FUNCTIONS.get(fname, 1)
            if len(n.args) != arity:
                raise line.error(f"{fname}() takes {arity} argument{'s' if arity != 1 else ''}, got {len(n.args)}")
            stack += list(n.args)
        else:
            kind = next((v for k, v in _FORBIDDEN.items() if isinstance(n, k)), type(n).__name__)
            raise line.error(f"not allowed in a rule: {kind}")


def _check_number(line: _Line, n: ast.Constant, written: str) -> None:
    """Refuse a literal that the rule could only use rounded: rules constants are float64."""
    shown = written if len(written) <= 40 else f"{written[:20]}…{written[-8:]} ({len(written)} characters)"
    v = n.value
    if isinstance(v, int):
        if v > I64_MAX:
            raise line.error(f"integer literal {shown} does not fit a 64-bit integer (largest {I64_MAX})")
        if float(v) != v:
            raise line.error(f"integer literal {shown} is not exactly a float64 (it would be {float(v)!r}); write "
                             "the float you mean")
    elif math.isinf(v):
        raise line.error(f"number {shown} overflows float64 (it would be inf); write inf if you mean infinity")
    elif v == 0 and re.search(r"[1-9]", re.split(r"[eE]", written)[0]):
        raise line.error(f"number {shown} underflows float64 (it would be 0); write 0 if you mean zero")


def _op_text(op: ast.AST) -> str:
    return {ast.Pow: "**", ast.Mod: "%", ast.FloorDiv: "//", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
            ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>", ast.Invert: "~", ast.Not: "not"}.get(
        type(op), type(op).__name__)


def _declare(line: _Line, tree: ast.expr) -> None:
    """Collect the pattern variables of a side: axis variables of reductions and value variables."""
    callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            m = _REDUCTION.match(n.func.id)
            if m:
                line.axes.add(m.group(2))
        elif isinstance(n, ast.Name) and id(n) not in callees:
            name = n.id
            if name == "inf":
                continue
            if not _VARIABLE.match(name):
                raise line.error(f"'{name}' is not a pattern variable (variables are lowercase identifiers)")
            if name in FUNCTIONS or _REDUCTION.match(name) or name in CONSTANT_CONDS or name in TERM_CONDS:
                raise line.error(f"'{name}' is a function name; it cannot be a pattern variable")
            line.terms.add(name)


def _parse_cond(line: _Line, text: str) -> tuple[str, str, str | None]:
    m = _FREE_OF.match(text)
    if m:
        v, axis = m.groups()
        for x in (v, axis):
            if not _VARIABLE.match(x):
                raise line.error(f"'{x}' in condition `{text}` is not a pattern variable")
        return "free_of", v, axis
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    ok = (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and not tree.keywords
          and len(tree.args) == 1 and isinstance(tree.args[0], ast.Name))
    if not ok or tree.func.id not in {**CONSTANT_CONDS, **TERM_CONDS}:
        raise line.error(f"unknown condition `{text}` (expected `x free of j`, "
                         f"{', '.join(f'{k}(x)' for k in [*CONSTANT_CONDS, *TERM_CONDS])})")
    v = tree.args[0].id
    if not _VARIABLE.match(v):
        raise line.error(f"'{v}' in condition `{text}` is not a pattern variable")
    return tree.func.id, v, None


def _build(line: _Line, n: ast.expr) -> Term:
    """The egglog term of a checked expression tree."""
    if isinstance(n, ast.Constant):
        return Term(f64(float(n.value)))
    if isinstance(n, ast.Name):
        if n.id == "inf":
            return Term(f64(math.inf))
        if n.id in line.constants:
            return Term(var(n.id, f64))
        return var(n.id, Term)
    if isinstance(n, ast.UnaryOp):
        lit = _literal(n.operand)
        if lit is not None:
            return Term(f64(-lit if isinstance(n.op, ast.USub) else lit))
        inner = _build(line, n.operand)
        return -inner if isinstance(n.op, ast.USub) else inner
    if isinstance(n, ast.BinOp):
        return CONSTRUCTORS[_ARITH[type(n.op)]](_build(line, n.left), _build(line, n.right))
    if isinstance(n, ast.Compare):
        return CONSTRUCTORS[_COMPARE[type(n.ops[0])]](_build(line, n.left), _build(line, n.comparators[0]))
    if isinstance(n, ast.Call):
        m = _REDUCTION.match(n.func.id)
        if m:
            return red(m.group(1), var(m.group(2), String), _build(line, n.args[0]))
        return CONSTRUCTORS[n.func.id](*(_build(line, a) for a in n.args))
    raise line.error(f"{type(n).__name__} is not allowed in a rule")  # unreachable after _check


def _literal(n: ast.expr) -> float | None:
    if isinstance(n, ast.Constant) and isinstance(n.value, int | float) and not isinstance(n.value, bool):
        return float(n.value)
    if isinstance(n, ast.Name) and n.id == "inf":
        return math.inf
    return None


__all__ = ["FUNCTIONS", "RuleFileError", "load_rules_file", "parse_rules"]
