"""x.detach() inside a compiled function: the capture writes stopgrad(x), the value of x through which
no gradient flows (grad.py derives none through it). The compiler sees the program without it — a
detached row max is still the row max the rules fuse and correct — so a forward is compiled exactly
as if the function had not detached; only the derived backward differs."""

from __future__ import annotations

from dataclasses import replace

from . import ir

STOPGRAD = "stopgrad"


def without_stopgrad(program: ir.Program) -> ir.Program:
    """`program` with every stopgrad(x) read as x, in its outputs and in what its inputs hold (a saved
    statistic's definition); the same program where it has none."""
    roots = [o.expr for o in program.outputs] + [s.holds for s in program.inputs.values() if s.holds is not None]
    if not any(isinstance(n, ir.Call) and n.op == STOPGRAD for r in roots for n in ir.walk(r)):
        return program

    def fn(old: ir.Node, new: ir.Node) -> ir.Node:
        return new.args[0] if isinstance(new, ir.Call) and new.op == STOPGRAD else new

    memo: dict = {}
    return replace(program, outputs=[replace(o, expr=ir.rebuild(o.expr, fn, memo)) for o in program.outputs],
                   inputs={n: s if s.holds is None else replace(s, holds=ir.rebuild(s.holds, fn, memo))
                           for n, s in program.inputs.items()})
