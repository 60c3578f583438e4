"""The torch.library custom ops a compiled function's calls run inside torch.compile'd code (and
its training calls everywhere): one per compiled program (its text and plan), registered once per
process, since torch.library's registry is process-wide; `_RUNNERS` lets tune() swap the program an
op runs for its tuned compile."""

from __future__ import annotations

import hashlib

import torch

from . import ir
from .autograd import attach
from .frontend.buckets import PricedAt
from .runtime import CompiledProgram

_OPS: dict[str, tuple] = {}  # qualname → (inference op, training call)
_RUNNERS: dict[str, object] = {}  # op → the program (or dynamic function) it runs


# (registering an op runs outside dynamo: traced, it broke the graph at hashlib, and each resume frame
# held the registry as a constant, which dynamo's structured trace printed — every compiled program's
# text: 4 s → 26 s after two test files' compiles, 123 s in the full suite, for one new shape)
@torch.compiler.disable
def custom_op(program: ir.Program, output_dtypes, prog: CompiledProgram, compile_fn):
    """A torch.library op running `prog` (the compile of `program`, whose outputs have torch dtypes
    `output_dtypes`) on the program's inputs (in program order), with a fake kernel and the derived
    backward (neptune_eq.autograd; `compile_fn` compiles the backward program)."""
    names = list(program.inputs)
    outs = [(o.name, program.output_shape(o), dt) for o, dt in zip(program.outputs, output_dtypes)]
    # (a dynamic bucket's training per range of lengths: its plans priced there, frontend/buckets.PricedAt)
    priced = compile_fn.at if isinstance(compile_fn, PricedAt) else ()
    digest = hashlib.sha256(f"{program.text(exact=True)}|{prog.alternative.structure}|{priced}".encode()
                            ).hexdigest()[:16]
    qualname = f"neptune_eq::p{digest}"
    _RUNNERS[qualname] = prog
    if qualname not in _OPS:
        @torch.library.custom_op(qualname, mutates_args=())
        def op(xs: list[torch.Tensor]) -> list[torch.Tensor]:
            res = _RUNNERS[qualname].run(dict(zip(names, xs)), {n: dt for n, _, dt in outs})
            return [res[n] for n, _, _ in outs]

        @op.register_fake
        def _(xs):
            return [xs[0].new_empty(shape, dtype=dt) for _, shape, dt in outs]

        train = attach(op, qualname, program, names, outs, compile_fn)
        _OPS[qualname] = (op, train)
    op, train = _OPS[qualname]

    def call(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        xs = [inputs[n] for n in names]
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in xs)
        res = train(xs) if grad else op(xs)  # (the training op also writes what its backward reads)
        return {n: r for (n, _, _), r in zip(outs, res)}

    call.qualname = qualname
    return call


@torch.compiler.disable
def dynamic_op(family):
    """A torch.library op running a dynamic function's program at the lengths of its inputs (each
    bucket's compile chosen at the call), with a fake kernel shaped by those lengths."""
    qualname = f"neptune_eq::d{family.digest()}"
    _RUNNERS[qualname] = family
    if qualname not in _OPS:
        @torch.library.custom_op(qualname, mutates_args=())
        def op(xs: list[torch.Tensor]) -> list[torch.Tensor]:
            return _RUNNERS[qualname].run_inputs(xs)

        @op.register_fake
        def _(xs):
            return _RUNNERS[qualname].fake_outputs(xs)

        _OPS[qualname] = (op, None)
    op = _OPS[qualname][0]
    op.qualname = qualname
    return op
