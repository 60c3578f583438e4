"""A scalar loss and its gradients as one program: the gradients computed beside the loss, in its forward.

The gradient of a scalar output is linear in its upstream gradient g: ∂L/∂x·g. So the training forward
may compute the loss and ∂L/∂x at g = 1 in one program, and the backward only scale them by g (Liger-
Kernel's fused linear cross-entropy computes its gradients so). The joint program is the forward's
outputs beside its recompute backward's (neptune_eq.grad) with the upstream gradient replaced by the
constant 1; it goes through the same pipeline, whose plan space then holds what two programs cannot
share: linear cross-entropy's logits written once by one GEMM and read by the log-sum-exp and by the
operand of both gradient GEMMs (three GEMMs, where the forward and a backward need four: the backward
computes its logits again).

What it costs: the gradients are written in the forward and held until the backward (the memory of
the inputs' gradients, earlier than a backward would allocate them), and the backward reads and
writes them once more to scale them (skipped where the upstream gradient is None). A gradient stored
at 16 bits and scaled by a g that is no power of two is rounded twice (half an ulp more). The cost
model ranks it against the two-program trainings (neptune_eq.autograd._choose) with the scaling
priced as the memory pass it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ir
from .grad import Backward


@dataclass(frozen=True)
class Joint:
    """`program` computes the forward's outputs, then the gradients of `output` at upstream 1:
    `grads[input]` names the program output holding ∂output/∂input."""

    program: ir.Program
    output: str
    grads: dict[str, str]


def why_no_joint(program: ir.Program) -> str | None:
    """None where the gradients of `program` can be computed beside it (one output, a floating
    scalar: its upstream gradient is one number), else why not."""
    if len(program.outputs) != 1:
        return f"{len(program.outputs)} outputs (a joint training needs one, a scalar)"
    out = program.outputs[0]
    if out.axes:
        return f"output '{out.name}' is over ({', '.join(map(str, out.axes))}), not a scalar"
    if program.dynamic:
        return "dynamic axes (a joint program's gradients would be shaped per call)"
    return None


def joint_program(program: ir.Program, back: Backward) -> Joint | None:
    """The joint program of `program` and its recompute backward `back` (None where why_no_joint says
    so, or where `back` reads anything but the inputs and the upstream gradient)."""
    if why_no_joint(program) is not None or back.saved is not None:
        return None
    out = program.outputs[0]
    upstream = back.cotangents.get(out.name)
    if upstream is None or set(back.cotangents) != {out.name}:
        return None
    one = {ir.Load(upstream, ()): ir.Const(1.0)}
    grads = [ir.Output(o.name, o.axes, ir.substitute(o.expr, one), o.dtype) for o in back.program.outputs]
    if any(isinstance(n, ir.Load) and n.tensor == upstream for g in grads for n in ir.walk(g.expr)):
        return None  # (the upstream read otherwise than as the scalar: not the linear form assumed)
    inputs = dict(program.inputs) | {n: s for n, s in back.program.inputs.items() if n != upstream}
    joint = ir.Program(f"{program.name}_joint", dict(program.axes) | dict(back.program.axes), inputs,
                       [*program.outputs, *grads]).validate()
    return Joint(joint, out.name, dict(back.grads))
