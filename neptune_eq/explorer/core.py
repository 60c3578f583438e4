"""The explorer: one compile, its ranked alternatives, and ways to look at and compare them.

    ex = explore(fn, *example_inputs, rules=["my.rules"])   # or explore(program)
    ex.alternatives          # ranked table: id, structure, predicted time, HBM bytes, FLOPs, verified
    print(ex.show(0))        # loop IR, derivation (rules in order, with corrections), Triton source
    print(ex.diff(0, 1))     # what differs: structure, kernels, passes, cost terms, IR and source
    ex.verify(1)             # runs alternative 1 against float64 (cached in the table)
    ex.egraph_svg()          # the chosen plan's neighbourhood in the e-graph (whole=True: all of it)
    ex.benchmark([0, 1])     # measured on the GPU (a message, not numbers, without one)
    ex.pin(1)                # a compiled program (or function) that runs alternative 1
"""

from __future__ import annotations

import difflib
import html
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from .. import ir
from ..ir import NeptuneError
from ..pipeline import Alternative, Compilation, Options, compile_program
from ..runtime import CompiledProgram, with_user_rules
from ..verify import VerifyReport
from . import bench, graph
from .derivation import Derivation, MinimalRules, budget_warnings, derive, not_offered, phase_report, user_rule_names
from .render import Shown, fill, html_table, pre, sections_text, terminal_width, text_table, wrap


@dataclass(repr=False)
class Entry:
    """One row of `Explorer.alternatives`."""

    alternative: Alternative
    verification: VerifyReport | None = None

    @property
    def id(self) -> int:
        return self.alternative.id

    @property
    def structure(self) -> str:
        return self.alternative.structure

    @property
    def predicted_time(self) -> float:
        """Seconds, from the analytic cost model."""
        return self.alternative.cost.time

    @property
    def predicted_us(self) -> float:
        return self.alternative.cost.time * 1e6

    @property
    def hbm_bytes(self) -> float:
        return self.alternative.cost.hbm_bytes

    @property
    def flops(self) -> float:
        return self.alternative.cost.flops

    @property
    def kernels(self) -> int:
        return len(self.alternative.plan.kernels)

    @property
    def verified(self) -> bool | None:
        """None until verified (ex.verify(i)), then whether it passed."""
        return None if self.verification is None else self.verification.passed

    def cells(self) -> list[str]:
        return [f"#{self.id}", f"{self.predicted_us:.2f}", si(self.hbm_bytes, "B"), si(self.flops, "FLOP"),
                str(self.kernels), _VERDICT[self.verified], self.structure]

    def __str__(self) -> str:
        return (f"#{self.id}: {self.structure} — predicted {self.predicted_us:.2f} µs, {si(self.hbm_bytes, 'B')} HBM, "
                f"{si(self.flops, 'FLOP')}, verified: {_VERDICT[self.verified]}")

    __repr__ = __str__


HEADERS = ["id", "predicted µs", "HBM", "FLOPs", "kernels", "verified", "structure"]
_VERDICT = {None: "-", True: "yes", False: "FAILED"}  # Entry.verified as the table shows it


def si(x: float, unit: str) -> str:
    """1.23 MB, 456 kFLOP: three significant digits with a decimal prefix."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


class AlternativeTable(Sequence):
    """The ranked alternatives, best first; prints as a table (text in a terminal, HTML in Jupyter)."""

    def __init__(self, entries: list[Entry], device: str):
        self._entries, self.device = entries, device

    def __getitem__(self, i):
        return self._entries[i]

    def __len__(self) -> int:
        return len(self._entries)

    def text(self, width: int | None = None) -> str:
        """The table as text no wider than `width` (None: the terminal's width, 80 when not a terminal).
        A long structure is cut with an ellipsis (`show N` has it whole); when even that is not
        enough the FLOPs, then the HBM column are left out."""
        width = terminal_width() if width is None else width
        head = fill(f"{len(self)} alternatives, predicted on {self.device}, best first:", width)
        return head + "\n" + text_table(HEADERS, [e.cells() for e in self._entries], {1, 2, 3, 4}, width=width,
                                        shrink={6}, drop=(3, 2))

    def __str__(self) -> str:
        return self.text()

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return wrap(f"<p>{len(self)} alternatives, predicted on {html.escape(self.device)}, best first</p>"
                    + html_table(HEADERS, [e.cells() for e in self._entries]))


class Explorer:
    """Interactive view of one compilation (see the module docstring)."""

    def __init__(self, compilation: Compilation, captured=None, *, progress=None, seconds: float = 0.0):
        self.compilation = compilation
        self.captured = captured  # frontend.Captured when built from a PyTorch function
        self.progress = progress
        self.seconds = seconds
        self._entries = [Entry(a) for a in compilation.alternatives]
        self._programs: dict[int, CompiledProgram] = {}
        self._minimal = MinimalRules(compilation, progress)

    # ---------------------------------------------------------------- the table
    @property
    def program(self) -> ir.Program:
        return self.compilation.program

    @property
    def alternatives(self) -> AlternativeTable:
        return AlternativeTable(self._entries, self.compilation.device.name)

    def _alt(self, i: int) -> Alternative:
        if not isinstance(i, int) or not 0 <= i < len(self._entries):
            n = len(self._entries)
            raise NeptuneError(f"no alternative {i!r}; there are {n} (ids 0..{n - 1})")
        return self._entries[i].alternative

    def compiled(self, i: int) -> CompiledProgram:
        """The compiled program running alternative i (shared between show, verify and benchmark)."""
        self._alt(i)
        if i not in self._programs:
            self._programs[i] = CompiledProgram(self.compilation, i)
        return self._programs[i]

    def pin(self, i: int):
        """A compiled program that runs alternative i; for a PyTorch function, callable like the function."""
        prog = CompiledProgram(self.compilation, self._alt(i).id)
        if self.captured is not None:
            from ..frontend.capture import CompiledFunction

            return CompiledFunction(self.captured, prog)
        return prog

    # ---------------------------------------------------------------- looking at one plan
    def derivation(self, i: int, *, minimal_rules: bool = True) -> Derivation:
        """How alternative i was derived (recorded from the compile; minimal rule sets computed on request)."""
        return derive(self.compilation, self._alt(i), self._minimal if minimal_rules else None)

    def source(self, i: int) -> str:
        return self.compiled(i).source

    def show(self, i: int, *, minimal_rules: bool = True, source: bool = True) -> Shown:
        """Alternative i: summary, cost terms, loop IR, derivation and Triton source."""
        alt = self._alt(i)
        e = self._entries[i]
        c = alt.cost
        head = [str(e)]
        head += [str(k) for k in c.kernels]
        sections = [(f"alternative #{alt.id} of {self.program.name}", "\n".join(head), "text"),
                    ("loop IR", alt.plan.show(), "text"),
                    ("derivation", str(self.derivation(i, minimal_rules=minimal_rules)), "text")]
        rejected = not_offered(self.compilation)
        if rejected:
            sections.append(("fusions the rules could not justify", "\n".join(rejected), "text"))
        warnings = budget_warnings(self.compilation)
        if warnings:
            sections.append(("budget warnings", "\n".join(warnings), "text"))
        if source:
            try:
                src = self.source(i)
            except Exception as ex:  # lowering is another team's module: show why, keep the rest
                src = f"# lowering failed: {type(ex).__name__}: {ex}"
            sections.append(("Triton source", src, "python"))
        return Shown(sections_text(sections), sections)

    def diff(self, i: int, j: int, *, source: bool = True) -> Shown:
        """What differs between alternatives i and j: structure, kernels, passes, derivation, costs, IR, source."""
        a, b = self._alt(i), self._alt(j)
        ta, tb = a.cost.terms(), b.cost.terms()
        rows = []
        for k in ta:
            ratio = f"{tb[k] / ta[k]:.2f}×" if ta[k] else "-"
            rows.append([k, f"{ta[k]:.4g}", f"{tb[k]:.4g}", ratio])
        summary = [f"#{i}: {a.structure}", f"#{j}: {b.structure}",
                   f"kernels: {len(a.plan.kernels)} vs {len(b.plan.kernels)}; passes: "
                   f"{_passes(a)} vs {_passes(b)}; split-K: {_split(a)} vs {_split(b)}"]
        da = [s.rule + ": " + s.text for s in self.derivation(i, minimal_rules=False).steps]
        db = [s.rule + ": " + s.text for s in self.derivation(j, minimal_rules=False).steps]
        only = [f"- only #{i}: {s}" for s in da if s not in db] + [f"+ only #{j}: {s}" for s in db if s not in da]
        sections = [(f"#{i} vs #{j}", "\n".join(summary), "text"),
                    (f"cost terms (#{j} / #{i})", text_table(["term", f"#{i}", f"#{j}", "ratio"], rows, {1, 2, 3}),
                     "text"),
                    ("derivation steps that differ", "\n".join(only) or "(same steps)", "text"),
                    ("loop IR (unified diff)", _udiff(a.plan.show(), b.plan.show(), i, j) or "(identical)", "text")]
        if source:
            try:
                sd = _udiff(self.source(i), self.source(j), i, j) or "(identical)"
            except Exception as ex:
                sd = f"(lowering failed: {type(ex).__name__}: {ex})"
            sections.append(("Triton source (unified diff)", sd, "text"))
        return Shown(sections_text(sections), sections)

    # ---------------------------------------------------------------- running
    def verify(self, i: int, **kw) -> VerifyReport:
        """Run alternative i on fresh random inputs against float64 (CPU through the interpreter without a GPU)."""
        import torch

        kw.setdefault("device", "cuda" if torch.cuda.is_available() else "cpu")
        if self.progress is not None:
            self.progress(f"  verifying #{i} on {kw['device']} ...")
        report = self.compiled(i).verify(**kw)
        self._entries[i].verification = report
        return report

    def benchmark(self, ids: Sequence[int] | int | None = None) -> bench.BenchmarkReport:
        """Median GPU times (triton.testing.do_bench) of the given alternatives (default: the top 5)."""
        ids = [ids] if isinstance(ids, int) else list(ids) if ids is not None else list(range(min(5, len(self))))
        alts = [self._alt(i) for i in ids]
        msg = bench.no_gpu_message()
        if msg is not None:
            return bench.BenchmarkReport("no GPU", [bench.Measurement(a.id, a.structure, a.cost.time * 1e6)
                                                    for a in alts], message=msg)
        import torch

        from ..reference import random_inputs

        inputs = random_inputs(self.program, seed=0, device="cuda")
        return bench.measure(alts, lambda k: (lambda: self.compiled(k).run(inputs)),
                             device=torch.cuda.get_device_name(), timer=bench.do_bench_median, progress=self.progress)

    def __len__(self) -> int:
        return len(self._entries)

    # ---------------------------------------------------------------- the e-graph
    def egraph_dot(self, i: int = 0, *, whole: bool = False, max_classes: int | None = None,
                   max_nodes: int = 4) -> str:
        """Graphviz dot text of the e-graph, alternative i highlighted: its neighbourhood (at most
        max_classes e-classes, default 60), or every e-class with whole=True (see explorer/graph.py)."""
        return graph.egraph_dot(self.compilation, self._alt(i), whole=whole, max_classes=max_classes,
                                max_nodes=max_nodes)

    def egraph_svg(self, i: int = 0, *, whole: bool = False, max_classes: int | None = None,
                   max_nodes: int = 4) -> str:
        """SVG of egraph_dot(...) through graphviz `dot` (a NeptuneError saying so when it is not installed)."""
        return graph.svg_of_dot(self.egraph_dot(i, whole=whole, max_classes=max_classes, max_nodes=max_nodes))

    # ---------------------------------------------------------------- rules and reports
    def rules(self, width: int | None = None) -> str:
        """The rules this compile used (user rules first) with their matches in the algebra phase
        (a table no wider than `width`; None: the terminal's width)."""
        c = self.compilation
        rep = phase_report(c, "algebra")
        matches = rep.matches if rep else {}
        corr: dict[str, int] = {}
        for res in (c.fusion.corrections.values() if c.fusion else []):
            for name, k in res.matches.items():
                corr[name] = corr.get(name, 0) + k
        user = user_rule_names(c)
        builtin = [r for r in (c.fusion.rules if c.fusion else []) if r.name not in user]
        rows = [[r.name, str(matches.get(r.name, 0)), str(corr.get(r.name, 0)), origin, r.math]
                for r, origin in [*((u, u.origin) for u in user.values()), *((b, "built-in") for b in builtin)]]
        width = terminal_width() if width is None else width
        return (fill(f"{len(user)} user rule(s), {len(builtin)} built-in; matches in the algebra phase and in the "
                     "correction searches", width) + "\n"
                + text_table(["rule", "algebra", "corrections", "origin", "math"], rows, {1, 2},
                             width=width, shrink={0, 3, 4}))

    def summary(self) -> str:
        c = self.compilation
        lines = [f"program {self.program.name}: {len(self)} alternatives in {self.seconds:.2f}s; e-graph {c.nodes} "
                 f"e-nodes; " + "; ".join(str(r) for r in c.saturator.reports)]
        if c.options.rules:
            lines.append(f"user rules: {', '.join(f'{r.name} ({r.origin})' for r in c.options.rules)}")
        lines += [f"warning: {w}" for w in budget_warnings(c)]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"{self.summary()}\n{self.alternatives}"

    def _repr_html_(self) -> str:
        body = pre(self.summary()) + self.alternatives._repr_html_()
        try:
            svg = graph.inline_svg(self.egraph_svg(0))
            body += f"<details><summary>e-graph (alternative #0 highlighted)</summary>{svg}</details>"
        except NeptuneError as e:
            body += pre(f"(no e-graph picture: {e})")
        return wrap(body)


def _passes(a: Alternative) -> int:
    return sum(len(k.passes()) for k in a.plan.kernels)


def _split(a: Alternative) -> str:
    s = [str(split) for _, _, split in a.plan.groups if split > 1]
    return ", ".join(s) or "none"


def _udiff(x: str, y: str, i: int, j: int) -> str:
    return "\n".join(difflib.unified_diff(x.splitlines(), y.splitlines(), f"#{i}", f"#{j}", lineterm=""))


_OPTION_FIELDS = {f.name for f in fields(Options)}


def explore(fn, *example_inputs, rules=(), progress=None, options: Options | None = None, **option_fields) -> Explorer:
    """Compile `fn` and return an Explorer over its ranked alternatives.

    fn: a plain PyTorch function or module (captured at `example_inputs` by neptune_eq.frontend.capture),
        an ir.Program, or a DSL program builder (then no example inputs).
    rules: extra rewrite rules (rules-file paths or shipped names, Rule objects, egglog rewrites); each is
        checked for soundness first (an unsound rule raises UnsoundRuleError with a counterexample).
    progress: True (print saturation progress to stderr), a callable taking a line, or None.
    options / option_fields: pipeline Options, or any of its fields by name (budget=, split_factors=, ...).
    """
    from ..dsl import ProgramBuilder
    from ..saturate import stderr_progress

    unknown = set(option_fields) - _OPTION_FIELDS
    if unknown:
        raise NeptuneError(f"explore() got unknown option(s) {', '.join(sorted(unknown))}; "
                           f"Options fields are {', '.join(sorted(_OPTION_FIELDS))}")
    printer = stderr_progress if progress is True else (progress or None)
    opts = with_user_rules(replace(options or Options(), **option_fields, progress=printer), rules)
    captured = None
    if isinstance(fn, ProgramBuilder):
        fn = fn.build()
    if isinstance(fn, ir.Program):
        if example_inputs:
            raise NeptuneError("explore(program) takes no example inputs (they are for PyTorch functions)")
        program = fn
    elif callable(fn):
        from ..frontend import capture

        if printer:
            printer(f"capturing {getattr(fn, '__name__', type(fn).__name__)} ...")
        captured = capture(fn, *example_inputs)
        program = captured.program
    else:
        raise NeptuneError(f"explore() takes a PyTorch function or an ir.Program, not {type(fn).__name__}")
    if printer:
        printer(f"compiling {program.name} ({len(opts.rules)} user rule(s)) ...")
    t0 = time.perf_counter()
    c = compile_program(program, opts)
    seconds = time.perf_counter() - t0
    if printer:
        printer(f"{len(c.alternatives)} alternatives in {seconds:.2f}s")
    return Explorer(c, captured, progress=printer, seconds=seconds)


__all__ = ["AlternativeTable", "Entry", "Explorer", "explore"]
