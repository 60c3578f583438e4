"""The terminal explorer: `neptune-eq explore FILE` reads commands, one per line, and prints answers.

    list                 the ranked alternatives
    show N               alternative N: loop IR, derivation, Triton source
    diff N M             what differs between alternatives N and M
    verify N             run N against float64 on fresh random inputs
    bench N [M ...]      measured GPU times (a message without a GPU)
    svg PATH [N]         write the e-graph picture (N highlighted, default 0)
    rules                the rules in use and how often they matched
    help, quit

FILE is a DSL example (a top-level ir.Program or program builder, see cli.load_program) or a
Python file defining `fn` and `example_inputs` (a tuple, or a callable returning one) for the
PyTorch frontend. The file is a program the user runs (like `python FILE`); rules files, by
contrast, are never executed.
"""

from __future__ import annotations

import runpy
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ..ir import NeptuneError
from .core import Explorer, explore

HELP = __doc__.split("\n\n")[1]


def load_target(path: str) -> tuple[object, tuple]:
    """(fn or program, example inputs) defined by a Python file."""
    p = Path(path)
    if not p.is_file():
        raise NeptuneError(f"no such file: {path}")
    env = runpy.run_path(str(p), run_name="__neptune_example__")
    fn = env.get("fn")
    if fn is not None and "example_inputs" in env:
        inputs = env["example_inputs"]
        if callable(inputs):
            inputs = inputs()
        if not isinstance(inputs, tuple | list):
            inputs = (inputs,)
        if not callable(fn):
            raise NeptuneError(f"{path}: `fn` must be a callable (a PyTorch function or module)")
        return fn, tuple(inputs)
    from ..cli import program_in

    prog = program_in(env)
    if prog is None:
        raise NeptuneError(f"{path} defines neither a program (a top-level ir.Program or program builder) nor "
                           "`fn` with `example_inputs`")
    return prog, ()


class Session:
    """A read-eval-print loop over an Explorer, reading commands from `inp` and writing to `out`."""

    def __init__(self, explorer: Explorer, inp: TextIO = sys.stdin, out: TextIO = sys.stdout):
        self.ex, self.inp, self.out = explorer, inp, out
        self.commands: dict[str, Callable[[list[str]], None]] = {
            "list": self.list_, "ls": self.list_, "show": self.show, "diff": self.diff, "verify": self.verify,
            "bench": self.bench, "svg": self.svg, "rules": self.rules, "help": self.help, "?": self.help,
        }

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def run(self) -> int:
        interactive = self.inp.isatty()
        self.say(self.ex.summary())
        self.say(str(self.ex.alternatives))
        self.say("commands: list, show N, diff N M, verify N, bench N [M ...], svg PATH [N], rules, help, quit")
        while True:
            if interactive:
                print("explore> ", end="", file=self.out, flush=True)
            line = self.inp.readline()
            if not line:
                return 0
            try:
                words = shlex.split(line)
            except ValueError as e:
                self.say(f"error: {e}")
                continue
            if not words:
                continue
            cmd, args = words[0].lower(), words[1:]
            if cmd in ("quit", "exit", "q"):
                return 0
            handler = self.commands.get(cmd)
            if handler is None:
                self.say(f"error: unknown command '{cmd}' (type help)")
                continue
            try:
                handler(args)
            except ValueError as e:  # usage errors and NeptuneError (a ValueError)
                self.say(f"error: {e}")

    # ---------------------------------------------------------------- commands
    def _ids(self, args: list[str], n: int | None, usage: str) -> list[int]:
        if n is not None and len(args) != n:
            raise ValueError(f"usage: {usage}")
        try:
            ids = [int(a.lstrip("#")) for a in args]
        except ValueError:
            raise ValueError(f"alternative ids are numbers; usage: {usage}") from None
        for i in ids:
            if not 0 <= i < len(self.ex):
                raise ValueError(f"no alternative {i}; there are {len(self.ex)} (0..{len(self.ex) - 1})")
        return ids

    def list_(self, args: list[str]) -> None:
        self.say(str(self.ex.alternatives))

    def show(self, args: list[str]) -> None:
        (i,) = self._ids(args, 1, "show N")
        self.say(str(self.ex.show(i)))

    def diff(self, args: list[str]) -> None:
        i, j = self._ids(args, 2, "diff N M")
        self.say(str(self.ex.diff(i, j)))

    def verify(self, args: list[str]) -> None:
        (i,) = self._ids(args, 1, "verify N")
        self.say(f"#{i}: {self.ex.verify(i)}")

    def bench(self, args: list[str]) -> None:
        ids = self._ids(args, None, "bench N [M ...]") if args else None  # None: the top 5
        self.say(str(self.ex.benchmark(ids)))

    def svg(self, args: list[str]) -> None:
        if not 1 <= len(args) <= 2:
            raise ValueError("usage: svg PATH [N]")
        i = self._ids(args[1:], 1, "svg PATH [N]")[0] if len(args) == 2 else 0
        svg = self.ex.egraph_svg(i)
        Path(args[0]).write_text(svg, encoding="utf-8")
        self.say(f"wrote {args[0]} ({len(svg)} bytes): the e-graph with alternative #{i} highlighted")

    def rules(self, args: list[str]) -> None:
        self.say(self.ex.rules())

    def help(self, args: list[str]) -> None:
        self.say(HELP)


def run_session(path: str, rules=(), *, inp: TextIO = sys.stdin, out: TextIO = sys.stdout,
                progress: bool = True) -> int:
    """Load FILE, compile it with `rules`, and run the command loop."""
    target, inputs = load_target(path)
    ex = explore(target, *inputs, rules=rules, progress=progress)  # True: saturation progress on stderr
    return Session(ex, inp, out).run()


__all__ = ["Session", "load_target", "run_session"]
