"""Command line: `neptune-eq compile FILE [--json]`, `neptune-eq explore FILE`, `neptune-eq rules check FILE`.

FILE, for both compile and explore, is a Python file defining `program` (a DSL program) — or any
ir.Program or program builder at top level — or `fn` and `example_inputs` (a plain PyTorch
function, captured by the frontend at those inputs). Rules files are data (docs/RULES.md):
`rules check` parses and fuzzes them without executing anything.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
import traceback
from pathlib import Path

from . import ir
from .ir import NeptuneError

STRESS = ("normal", "offset", "wide")  # the input sets `compile --stress` verifies on (verify.STRESS_SETS)


def load_target(path: str) -> tuple[object, tuple]:
    """(ir.Program, ()) or (fn, example inputs): what a program file defines (see the module docstring).

    The file is a program the user runs (like `python FILE`); an exception while running it is
    reported as a NeptuneError naming the file's line. `example_inputs` may be a tuple, a single
    tensor, or a callable returning either.
    """
    p = Path(path)
    if not p.is_file():
        raise NeptuneError(f"no such file: {path}")
    env = _run_file(p)
    fn = env.get("fn")
    if fn is not None and "example_inputs" in env:
        if not callable(fn):
            raise NeptuneError(f"{path}: `fn` must be a callable (a PyTorch function or module)")
        inputs = env["example_inputs"]
        if callable(inputs):
            try:
                inputs = inputs()
            except NeptuneError:
                raise
            except BaseException as e:  # the user's code (sys.exit and Ctrl-C too): say where, without our frames
                raise NeptuneError(f"{path}: example_inputs() raised {_where(e, p)}") from None
        if not isinstance(inputs, tuple | list):
            inputs = (inputs,)
        return fn, tuple(inputs)
    prog = program_in(env)
    if prog is None:
        raise NeptuneError(f"{path} defines neither a program (a top-level `program = P.build()`, any ir.Program "
                           "or program builder) nor `fn` with `example_inputs`")
    return prog, ()


def _run_file(p: Path) -> dict:
    """The top-level names of the user's file, run as a program. Anything it raises is a NeptuneError
    (exit code 2): a SystemExit too, since `sys.exit(0)` at import would otherwise read as "verified"
    and `sys.exit(1)` as "verification failed", and a KeyboardInterrupt (no traceback of our frames)."""
    try:
        return runpy.run_path(str(p), run_name="__neptune_example__")
    except NeptuneError:
        raise
    except SyntaxError as e:
        raise NeptuneError(f"{p}:{e.lineno}: syntax error: {e.msg}") from None
    except BaseException as e:
        raise NeptuneError(f"running {p} raised {_where(e, p)}") from None


def _where(e: BaseException, p: Path) -> str:
    """'ZeroDivisionError: division by zero (at FILE:3: x = 1 / 0)': the last frame in the user's file.
    A SystemExit shows its code ('SystemExit(0)'), an exception without a message its bare name."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve() == p.resolve()]
    at = f" (at {p}:{frames[-1].lineno}: {frames[-1].line})" if frames else ""
    if isinstance(e, SystemExit):
        return f"SystemExit({e.code!r}){at}"
    return f"{type(e).__name__}: {e}{at}" if str(e) else f"{type(e).__name__}{at}"


def load_program(path: str) -> ir.Program:
    """The ir.Program a DSL program file defines (a PyTorch file is refused: use load_target)."""
    target, _ = load_target(path)
    if not isinstance(target, ir.Program):
        raise NeptuneError(f"{path} defines a PyTorch function, not a program; capture it (load_target)")
    return target


def program_in(env: dict) -> ir.Program | None:
    """The program a file's top level defines: `program`, else any ir.Program, else a program builder."""
    prog = env.get("program")
    if isinstance(prog, ir.Program):
        return prog
    for v in env.values():
        if isinstance(v, ir.Program):
            return v
    from .dsl import ProgramBuilder

    for v in env.values():
        if isinstance(v, ProgramBuilder):
            return v.build()
    return None


def target_program(path: str, *, say=None) -> ir.Program:
    """The program to compile for FILE: a DSL program as is, a PyTorch `fn` captured at its example inputs."""
    target, inputs = load_target(path)
    if isinstance(target, ir.Program):
        return target
    from .frontend import capture

    if say:
        say(f"capturing {getattr(target, '__name__', type(target).__name__)} at the example inputs ...")
    return capture(target, *inputs).program


def cmd_compile(args) -> int:
    from .pipeline import Options
    from .runtime import compile_ir
    from .saturate import Budget
    from .verify import json_number

    out = print if not args.json else (lambda *a, **k: print(*a, **k, file=sys.stderr))
    program = target_program(args.file, say=out if args.progress else None)
    t0 = time.perf_counter()
    budget = Budget(**{k: v for k, v in (("max_seconds", args.max_seconds), ("max_nodes", args.max_nodes),
                                         ("max_iterations", args.max_iterations)) if v is not None})
    options = Options(progress=True if args.progress else None, budget=budget, strict_rules=args.strict_rules)
    prog = compile_ir(program, options, rules=args.rules)
    t_compile = time.perf_counter() - t0
    c = prog.compilation
    out(str(program))
    out("")
    out(f"e-graph: {c.nodes} nodes; " + "; ".join(str(r) for r in c.saturator.reports))
    out(f"compile: {t_compile:.2f}s (" + ", ".join(f"{k} {v:.2f}s" for k, v in c.timings.items()) + ")")
    out("")
    out(f"alternatives (predicted on {c.device.name}):")
    for a in prog.alternatives[: args.alternatives]:
        mark = "*" if a.id == prog.alternative.id else " "
        out(f" {mark} {a}")
    if len(prog.alternatives) > args.alternatives:
        out(f"   ... {len(prog.alternatives) - args.alternatives} more")
    out("")
    out(prog.explain())
    t1 = time.perf_counter()
    src = prog.source
    t_lower = time.perf_counter() - t1
    out(f"\nlowered {len(prog.kernels)} kernel(s) in {t_lower:.2f}s")
    if args.source:
        out("")
        out(src)
    report = None
    if not args.no_verify:
        report = prog.verify(sets=STRESS if args.stress else ("normal",), seed=args.seed)
        out("")
        out(str(report))
    if args.json:
        print(json.dumps({
            "program": program.name,
            "kernels": len(prog.kernels),
            "plan": prog.alternative.structure,
            "alternatives": [{"id": a.id, "structure": a.structure, "predicted_time_us": a.cost.time * 1e6,
                              "hbm_bytes": a.cost.hbm_bytes, "kernels": len(a.plan.kernels)}
                             for a in prog.alternatives],
            # worst over every set verified (with --stress: normal, offset, wide); per set in "verify"
            "max_rel_err": json_number(report.worst) if report else None,
            "verified": report.passed if report else None,
            "verify": report.as_dict() if report else None,
            "egraph_nodes": c.nodes,
            "timings_s": {**c.timings, "lower": t_lower},
            "derivation": prog.alternative.plan.derivation,
            "budget_notes": c.budget_notes,  # what a budget cut short (empty: nothing)
            "numerics_notes": c.numerics_notes,  # a stable spelling preferred over a cheaper one
        }))
    return 0 if report is None or report.passed else 1


def cmd_explore(args) -> int:
    from .explorer.session import run_session

    return run_session(args.file, args.rules, progress=not args.quiet, strict_rules=args.strict_rules)


def cmd_rules_check(args) -> int:
    """Parse and fuzz every rule of the files; non-zero exit if any file or rule is bad."""
    from .rules.files import RuleFileError, load_rules_file
    from .rules.user import check_rules, resolve_rules_file

    bad = refined = 0
    for path in args.files:
        try:
            rules = load_rules_file(resolve_rules_file(path))
        except RuleFileError as e:
            print(f"error: {e}")
            bad += 1
            continue
        checks = check_rules(rules, strict=args.strict)
        print(f"{path}: {len(rules)} rule(s)")
        for chk in checks:
            print(f"  {chk}")
        bad += sum(not chk.ok for chk in checks)
        refined += sum(chk.ok and chk.refinement is not None for chk in checks)
    note = f" ({refined} refinement(s), accepted; --strict rejects them)" if refined else ""
    print(f"all rules ok{note}" if not bad else f"{bad} problem(s)")
    return 1 if bad else 0


def cmd_rules_list(args) -> int:
    from .rules.algebra import BUILTIN
    from .rules.user import shipped_rules_files

    for r in BUILTIN:
        print(r)
    print(f"\n{len(BUILTIN)} built-in algebra rules; shipped rules files (rules=<name>): "
          f"{', '.join(shipped_rules_files()) or 'none'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="neptune-eq", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile a program file, show the plan and verify it")
    c.add_argument("file", help="a DSL program file, or a file defining `fn` and `example_inputs`")
    c.add_argument("--json", action="store_true", help="end with one JSON line")
    c.add_argument("--source", action="store_true", help="print the generated Triton source")
    c.add_argument("--no-verify", action="store_true")
    c.add_argument("--stress", action="store_true",
                   help="also verify on shifted / wide-range inputs (they count in the verdict and exit code)")
    c.add_argument("--alternatives", type=int, default=8, help="how many alternatives to list")
    c.add_argument("--seed", type=int, default=None)
    c.add_argument("--progress", action="store_true", help="print saturation progress")
    c.add_argument("--max-seconds", type=float, default=None, help="compile time budget (default 20)")
    c.add_argument("--max-nodes", type=int, default=None, help="e-graph size budget (default 4000)")
    c.add_argument("--max-iterations", type=int, default=None, help="iterations per saturation phase (default 10)")
    c.add_argument("--strict-rules", action="store_true", help="reject user rules that only refine")
    c.add_argument("--rules", action="append", default=[], metavar="RULES",
                   help="extra rules: a rules file or a shipped rules-file name (repeatable)")
    c.set_defaults(fn=cmd_compile)
    e = sub.add_parser("explore", help="explore the alternatives of a program interactively")
    e.add_argument("file", help="a DSL program file, or a file defining `fn` and `example_inputs`")
    e.add_argument("--rules", action="append", default=[], metavar="RULES",
                   help="extra rules: a rules file or a shipped rules-file name (repeatable)")
    e.add_argument("--quiet", action="store_true", help="no saturation progress on stderr")
    e.add_argument("--strict-rules", action="store_true", help="reject user rules that only refine")
    e.set_defaults(fn=cmd_explore)
    r = sub.add_parser("rules", help="check or list rewrite rules")
    rsub = r.add_subparsers(dest="rules_cmd", required=True)
    rc = rsub.add_parser("check", help="parse and fuzz rules files for soundness (exit 1 on a bad rule)")
    rc.add_argument("files", nargs="+", metavar="FILE")
    rc.add_argument("--strict", action="store_true", help="also reject refinements (rules whose left side is NaN "
                    "where the right side is a number), which are otherwise accepted and marked")
    rc.set_defaults(fn=cmd_rules_check)
    rl = rsub.add_parser("list", help="list the built-in algebra rules")
    rl.set_defaults(fn=cmd_rules_list)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except NeptuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
