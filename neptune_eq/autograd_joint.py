"""The training op of a joint training (neptune_eq.grad_joint): its forward runs the joint program and
returns the loss with the gradients at upstream 1, which it saves; its backward scales them by the
upstream gradient. A torch.library op with a fake kernel (what torch.compile traces; the backward is
one multiply per gradient, which AOTAutograd traces as it is), and in eager calls the same forward,
setup and backward as an autograd.Function (neptune_eq.autograd._Eager)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import ir
from .grad_joint import Joint


def joint_training_op(qualname: str, joint: Joint, names: list[str], outs: list[tuple],
                      run: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]], eager) -> Callable:
    """The call running op `<qualname>_train` (registered here) for `joint`: xs (the program's inputs,
    op order `names`) → the outputs (`outs`: (name, shape, dtype)), then the gradients of the inputs
    `joint.grads` names, in op order. `run(inputs by name)` runs the joint program; `eager` is the
    autograd.Function an eager call runs the forward, setup and backward through."""
    grads = [(k, joint.grads[n]) for k, n in enumerate(names) if n in joint.grads]
    dtypes = {o.name: getattr(torch, o.dtype or "float32") for o in joint.program.outputs}
    n_out = len(outs)

    def impl(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        res = run(dict(zip(names, xs)))
        return [res[n] for n, _, _ in outs] + [res[g].reshape(xs[k].shape) for k, g in grads]

    @torch.library.custom_op(qualname + "_train", mutates_args=())
    def top(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return impl(xs)

    @top.register_fake
    def _(xs):
        return ([xs[0].new_empty(shape, dtype=dt) for _, shape, dt in outs]
                + [xs[k].new_empty(xs[k].shape, dtype=dtypes[g]) for k, g in grads])

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*output[n_out:])
        ctx.mark_non_differentiable(*output[n_out:])

    def backward(ctx, upstream):
        got: list[torch.Tensor | None] = [None] * len(names)
        g = upstream[0]
        if g is None:  # (the loss reached nothing that needs gradients)
            return got
        for (k, _), unit in zip(grads, ctx.saved_tensors):
            got[k] = unit * g  # (out of place: a retained graph's second backward reads the units again)
        return got

    top.register_autograd(backward, setup_context=setup)

    def train(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        if torch.compiler.is_compiling():
            return top(xs)
        return list(eager.apply((impl, setup, backward), *xs))

    return train


def scaling_s(joint, run) -> float:
    """The predicted time of a joint training's backward: each gradient read and written once (times the
    upstream gradient), a launch each."""
    dev = run.compilation.device
    prog = joint.program
    nbytes = sum(math.prod(prog.output_shape(o)) * ir.DTYPE_BYTES[o.dtype or "float32"]
                 for o in prog.outputs if o.name in joint.grads.values())
    return 2 * nbytes / dev.hbm_bytes_per_s + len(joint.grads) * dev.launch_s


def scratch_over(run) -> str | None:
    """Why the compiled joint program `run` is no training alternative where its plan's scratch passes the
    limit its compile would chunk it under (neptune_eq.chunked) and no axis can be cut: a joint linear
    cross-entropy writes its fp32 logits whole (4 GiB at 8192 tokens × 128256), where the two-program
    training's backward runs in chunks. None where it fits or runs in chunks."""
    from .chunked import default_limit, plan_scratch

    if run.chunking is not None:
        return None
    limit = run.compilation.options.scratch_limit or default_limit(run.program)
    scratch = plan_scratch(run.plan, run.program)
    if scratch <= limit:
        return None
    return (f"its plan's scratch ({scratch / 2**30:.2f} GiB) passes the limit ({limit / 2**30:.2f} GiB) and no axis "
            "of it can be cut into chunks")


def joint_option(joint: Joint, run, time: Callable) -> tuple[tuple | None, str | None]:
    """The joint training as a ranked alternative — (predicted forward + scaling time, "joint", its
    report line) — or None and why it is not offered (scratch_over). `run`: the compiled joint program;
    `time(run)`: its predicted time."""
    over = scratch_over(run)
    if over is not None:
        return None, f"joint: not offered, {over}"
    scale = scaling_s(joint, run)
    rows = getattr(run, "extra_s", 0.0)  # (one-hot sums run as a scatter: neptune_eq.scatter)
    scattered = f"; {run.split.describe()}" if rows else ""
    return (time(run) + rows + scale, "joint",
            f"joint: the forward computes the gradients at upstream 1 beside the loss, the backward scales them; "
            f"predicted {(time(run) + rows) * 1e6:.1f} + scaling {scale * 1e6:.1f} µs ({run.alternative.structure})"
            f"{scattered}"), None
