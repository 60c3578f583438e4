"""The terminal explorer: `neptune-eq explore FILE` reads commands, one per line, and prints answers.

    list                 the ranked alternatives
    show N               alternative N: loop IR, derivation, Triton source
    diff N M             what differs between alternatives N and M
    verify N             run N against float64 on fresh random inputs
    bench N [M ...]      measured GPU times (a message without a GPU)
    svg PATH [N] [--all] write the e-graph around alternative N (default 0), highlighted;
                         --all: the whole e-graph
    rules                the rules in use and how often they matched
    help, quit

FILE is what `neptune-eq compile` takes (cli.load_target): a DSL program file (a top-level
ir.Program or program builder) or a Python file defining `fn` and `example_inputs` (a tuple, or a
callable returning one) for the PyTorch frontend. The file is a program the user runs (like
`python FILE`); rules files, by contrast, are never executed.

At a terminal the prompt has line editing through readline where Python has it (arrow keys, and
the history of earlier sessions, kept in the cache directory); tables fit the terminal's width.
Read from a pipe or a file, the session prints no prompt and keeps no history.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from ..cli import load_target
from .core import Explorer, explore
from .render import fill, terminal_width

HELP = __doc__.split("\n\n")[1]
PROMPT = "explore> "
HISTORY_LENGTH = 1000


def default_history() -> Path:
    """Where interactive sessions keep their command history: the cache directory."""
    from ..lower.launch import default_cache_dir

    return default_cache_dir() / "explore_history"


@contextmanager
def line_editing(history: Path | None) -> Iterator[None]:
    """readline for input() while the block runs (arrow keys, in-session history), with `history`
    loaded before and saved after; a no-op where Python has no readline. Never fails the session
    over the history file (unreadable, unwritable: the session just keeps none)."""
    try:
        import readline
    except ImportError:  # e.g. Windows without pyreadline: plain input() still works
        yield
        return
    if history is not None:
        try:
            readline.clear_history()
            if history.is_file():
                readline.read_history_file(str(history))
        except OSError:
            history = None
    try:
        yield
    finally:
        if history is not None:
            try:
                history.parent.mkdir(parents=True, exist_ok=True)
                readline.set_history_length(HISTORY_LENGTH)
                readline.write_history_file(str(history))
            except OSError:
                pass


class Session:
    """A read-eval-print loop over an Explorer, reading commands from `inp` and writing to `out`.

    width: the columns tables and prose are laid out in (None: the terminal's, 80 when not a
    terminal). history: the file the command history is kept in at a terminal (None: none kept
    beyond the session). Line editing (readline) is used only when `inp` is the terminal's stdin.
    """

    def __init__(self, explorer: Explorer, inp: TextIO = sys.stdin, out: TextIO = sys.stdout, *,
                 width: int | None = None, history: Path | None = None):
        self.ex, self.inp, self.out = explorer, inp, out
        self.width = terminal_width() if width is None else max(width, 20)
        self.history = history
        self.commands: dict[str, Callable[[list[str]], None]] = {
            "list": self.list_, "ls": self.list_, "show": self.show, "diff": self.diff, "verify": self.verify,
            "bench": self.bench, "svg": self.svg, "rules": self.rules, "help": self.help, "?": self.help,
        }

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _terminal(self) -> bool:
        """input() with readline needs the real stdin and stdout, both a terminal."""
        return self.inp is sys.stdin and self.out is sys.stdout and _isatty(self.inp) and _isatty(self.out)

    def run(self) -> int:
        self.say(fill(self.ex.summary(), self.width))
        self.say(self.ex.alternatives.text(self.width))
        self.say(fill("commands: list, show N, diff N M, verify N, bench N [M ...], svg PATH [N] [--all], rules, "
                      "help, quit", self.width))
        if self._terminal():
            with line_editing(self.history):
                return self._loop(self._read_terminal)
        return self._loop(self._read_stream)

    def _read_terminal(self) -> str | None:
        """One line at the prompt, edited with readline where present; None at end of input (Ctrl-D)."""
        while True:
            try:
                return input(PROMPT)
            except EOFError:
                self.say("")
                return None
            except KeyboardInterrupt:  # Ctrl-C drops the line being typed, as in a shell
                self.say("")

    def _read_stream(self) -> str | None:
        if _isatty(self.inp):  # a terminal that is not ours (no readline): still show a prompt
            print(PROMPT, end="", file=self.out, flush=True)
        line = self.inp.readline()
        return line or None

    def _loop(self, read: Callable[[], str | None]) -> int:
        while True:
            line = read()
            if line is None:
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
        self.say(self.ex.alternatives.text(self.width))

    def show(self, args: list[str]) -> None:
        (i,) = self._ids(args, 1, "show N")
        self.say(str(self.ex.show(i)))

    def diff(self, args: list[str]) -> None:
        i, j = self._ids(args, 2, "diff N M")
        self.say(str(self.ex.diff(i, j)))

    def verify(self, args: list[str]) -> None:
        (i,) = self._ids(args, 1, "verify N")
        self.say(fill(f"#{i}: {self.ex.verify(i)}", self.width))

    def bench(self, args: list[str]) -> None:
        ids = self._ids(args, None, "bench N [M ...]") if args else None  # None: the top 5
        self.say(str(self.ex.benchmark(ids)))

    def svg(self, args: list[str]) -> None:
        usage = "svg PATH [N] [--all]"
        whole = "--all" in args
        args = [a for a in args if a != "--all"]
        if not 1 <= len(args) <= 2:
            raise ValueError(f"usage: {usage}")
        i = self._ids(args[1:], 1, usage)[0] if len(args) == 2 else 0
        svg = self.ex.egraph_svg(i, whole=whole)
        Path(args[0]).write_text(svg, encoding="utf-8")
        what = f"the whole e-graph, alternative #{i} highlighted" if whole else \
            f"alternative #{i} and its neighbourhood in the e-graph"
        self.say(f"wrote {args[0]} ({len(svg)} bytes): {what}")

    def rules(self, args: list[str]) -> None:
        self.say(self.ex.rules(self.width))

    def help(self, args: list[str]) -> None:
        self.say(HELP)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def run_session(path: str, rules=(), *, inp: TextIO = sys.stdin, out: TextIO = sys.stdout,
                progress: bool = True, width: int | None = None, history: Path | None = None,
                **option_fields) -> int:
    """Load FILE (cli.load_target), compile it with `rules`, and run the command loop.
    history: the command-history file at a terminal (None: default_history())."""
    target, inputs = load_target(path)
    ex = explore(target, *inputs, rules=rules, progress=progress, **option_fields)  # progress on stderr
    return Session(ex, inp, out, width=width, history=history or default_history()).run()


__all__ = ["Session", "default_history", "line_editing", "load_target", "run_session"]
