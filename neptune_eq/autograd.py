"""Gradients of compiled functions: the custom op of a compiled program gets a backward that runs
the derived backward program (neptune_eq.grad) through its own custom op.

The forward op saves its inputs; the backward op recomputes what it needs from them (the backward
program is compiled like any program, at the first forward call that needs gradients: saturation and
fusion decide what is recomputed in which pass). Both are torch.library ops with fake kernels, so
eager autograd and torch.compile (AOTAutograd traces the backward op as one node) take the same
path. What cannot be differentiated (floor division of a float, an axis read twice, a second
derivative) raises NoBackward at the call that would need it, naming the cause — never a detached
result.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import ir
from .grad import Backward, NoBackward, backward_program

_BACKWARD_OPS: dict[str, object] = {}  # forward op qualname → its backward op
_BACKWARD_RUNNERS: dict[str, object] = {}  # forward op qualname → the compiled backward (on first use)


def attach(op, qualname: str, program: ir.Program, names: list[str], outs: list[tuple],
           compile_fn: Callable[[ir.Program], object]) -> None:
    """Register `op`'s autograd formula. `names`: the program inputs in op order; `outs`: (output name,
    shape, dtype) in op order; `compile_fn(program)` compiles the backward program (cached)."""
    try:
        back = backward_program(program)
    except Exception as e:  # a forward runs whatever the derivation hits; a call needing gradients refuses
        why = str(e) if isinstance(e, NoBackward) else f"{program.name}: the backward could not be derived ({e!r})"

        def refuse(ctx, inputs, output):  # asked for only when an input requires grad
            raise NoBackward(f"{why} (so no gradient can flow through {program.name})")

        op.register_autograd(lambda ctx, grads: None, setup_context=refuse)
        return
    bop = _backward_op(qualname, back, names, outs, compile_fn)
    diff = [k for k, n in enumerate(names) if n in back.grads]

    def setup(ctx, inputs, output):
        # the backward program is compiled here, on the thread of the forward call: autograd runs the
        # backward of CUDA tensors on a thread of its own, and the e-graphs of a compile must be freed
        # on the thread that made them (egglog's are unsendable)
        _compiled_backward(qualname, back, compile_fn)
        ctx.save_for_backward(*inputs[0])

    def backward(ctx, grads):
        if torch.is_grad_enabled():
            raise NoBackward(f"{program.name}: a second derivative (create_graph=True) is not derived")
        xs = list(ctx.saved_tensors)
        cots = [g if g is not None else torch.zeros(shape, dtype=dt, device=xs[0].device)
                for g, (name, shape, dt) in zip(grads, outs) if name in back.cotangents]
        res = bop(xs + cots)
        out: list = [None] * len(xs)
        for k, r in zip(diff, res):
            out[k] = r
        return out

    op.register_autograd(backward, setup_context=setup)


def _compiled_backward(qualname: str, back: Backward, compile_fn):
    run = _BACKWARD_RUNNERS.get(qualname)
    if run is None:
        run = _BACKWARD_RUNNERS[qualname] = compile_fn(back.program)
    return run


def _backward_op(qualname: str, back: Backward, names: list[str], outs: list[tuple], compile_fn):
    got = _BACKWARD_OPS.get(qualname)
    if got is not None:
        return got
    cot_names = [back.cotangents[n] for n, _, _ in outs if n in back.cotangents]
    wrt = [n for n in names if n in back.grads]
    spec = back.program.inputs

    @torch.library.custom_op(qualname + "_backward", mutates_args=())
    def bop(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        run = _compiled_backward(qualname, back, compile_fn)
        inputs = dict(zip(names, xs))
        for name, g in zip(cot_names, xs[len(names):]):
            want = getattr(torch, spec[name].dtype)
            inputs[name] = g.reshape(back.program.input_shape(name)).to(want).contiguous()
        res = run.run(inputs)
        return [res[back.grads[n]] for n in wrt]

    @bop.register_fake
    def _(xs):
        by = dict(zip(names, xs))
        return [torch.empty_like(by[n]) for n in wrt]

    _BACKWARD_OPS[qualname] = bop
    return bop


__all__ = ["attach"]
