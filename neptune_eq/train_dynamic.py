"""Training a dynamic function inside torch.compile: one pair of torch.library ops over every length.

An eager call needing gradients runs the training op of its range of lengths (frontend/dynamic.py
`train`). A graph dynamo traces cannot choose a bucket (the lengths are symbols), so it calls one op over all of
them, per set of inputs that require grad:

    <family>_g<mask>_train    the inputs → the outputs, the statistics and the operands the bucket's
                              training forward writes (its fake shaped by the inputs' symbolic lengths)
    <family>_g<mask>_bwd      the inputs, everything the forward wrote and the outputs' cotangents →
                              the gradients of the inputs that require grad

Each runs, at the call, the kernels its inputs' range compiled (the forward and the backward the
cost model chose there). The forward's statistics are those of the example's bucket: a bucket
whose derivation writes others is refused by name (never read as the wrong tensors).

`prepare_training` derives, compiles and chooses one range's training ahead of its first call (a
bucket prepares every range's at its first training call: frontend/dynamic.py).
"""

from __future__ import annotations

import torch

from .autograd import (
    _PARTS,
    _TRAINING,
    _compiled,
    _non_differentiable,
    _operands_key,
    _Parts,
    _run_key,
    _training_key,
    savable,
)
from .ir import NeptuneError
from .training import lengths_of, shape_at

_FAMILIES: dict[str, object] = {}  # a dynamic function's op name → the function (frontend.dynamic.DynamicFunction)
_TRAIN_OPS: dict[str, object] = {}  # training op name → the op


def register(family) -> None:
    _FAMILIES[family.op.qualname] = family


def _bucket_parts(family, ns: tuple[int, ...], requires: tuple[bool, ...]) -> _Parts:
    """The training of the bucket of lengths `ns` for the inputs `requires` marks."""
    call = family.bucket_training(ns)
    return _PARTS[_training_key(call.qualname, requires)]


def _structure(p: _Parts) -> tuple:
    return tuple(p.outputs), tuple(p.stats), tuple(p.made), tuple(p.axes)


@torch.compiler.assume_constant_result  # (dynamo runs it at trace time and keeps the name)
def training_key(qualname: str, requires: tuple[bool, ...]) -> str:
    """The name of the training op of dynamic function `qualname` for inputs requiring grad as
    `requires` (program input order), registered here at first use (the example's bucket derived)."""
    family = _FAMILIES[qualname]
    mask = sum(1 << k for k, r in enumerate(requires) if r)
    name = f"{qualname}_g{mask:x}"
    if name not in _TRAIN_OPS:
        _TRAIN_OPS[name] = _family_op(name, family, requires)
    return name


@torch.compiler.assume_constant_result  # (run at trace time: the graph calls the training op or not)
def derivable(qualname: str, requires: tuple[bool, ...]) -> bool:
    """Is a backward derived for every length of dynamic function `qualname` for inputs requiring grad
    as `requires`? Derived here (training_key) at first use; where none is, its family says why
    (`no_training`), and the call takes a static compile's op or runs outside the graph, as an eager
    call compiles its own. It had raised NoBackward inside dynamo's trace (an internal error)."""
    from .grad_gather import NoBackward

    try:
        training_key(qualname, requires)
    except NoBackward as e:
        _FAMILIES[qualname].no_training = str(e)
        return False
    return True


def prepare_training(qualname: str, requires: tuple[bool, ...]) -> tuple:
    """Derive op `qualname`'s training for inputs requiring grad as `requires` (op order) and compile
    and choose its backward now, running nothing (a dynamic bucket prepares every range's at its first
    training call: frontend/dynamic.py). Returns which compiled plans it runs (two trainings returning
    the same run the same kernels)."""
    key = _training_key(qualname, requires)
    _PARTS[key].kept()
    t = _TRAINING[key]
    runs = [_compiled(f"{key}:forward", t.forward, t.compile_fn),
            _compiled(_run_key(key, t.chosen), t.chosen.program, t.compile_fn)]
    if t.prologue is not None:  # (the computed operands' map and its backward: _Split compiles them at first use)
        runs.append(_compiled(_operands_key(key), t.prologue[0].maps, t.compile_fn))
        runs.append(_compiled(_run_key(f"{key}_operands", t.prologue[1]), t.prologue[1].program, t.compile_fn))
    return tuple((id(run.compilation), run.choice) for run in runs)


def _family_op(name: str, family, requires: tuple[bool, ...]):
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    names = family.names()
    with unset_fake_temporarily():  # (compiles and derives with real tensors: float64 checks)
        p0 = _bucket_parts(family, family.example_lengths(), requires)
        p0.kept()  # (the example bucket's backward chosen: which outputs no gradient reaches)
    want = _structure(p0)
    program = family.captured.program
    wrt = [k for k, r in enumerate(requires) if r]

    def parts(xs: list[torch.Tensor]) -> _Parts:
        ns = tuple(xs[k].shape[d] for k, d in family._group_at())
        p = _bucket_parts(family, ns, requires)
        if _structure(p) != want:
            raise NeptuneError(f"{program.name}: the training of lengths {ns} saves {p.stats + p.made} where the "
                               f"example's saves {p0.stats + p0.made}: one torch.compile'd graph cannot serve "
                               "both (call it eagerly at these lengths)")
        return p

    @torch.library.custom_op(name + "_train", mutates_args=())
    def top(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return parts(xs).impl(xs)

    @top.register_fake
    def _(xs):
        at = lengths_of(program.with_dynamic(family.lengths.axes), dict(zip(names, xs)))
        extra = [xs[0].new_empty(shape_at(p0.program, axes, at), dtype=dt) for axes, (_, dt) in zip(p0.axes, p0.specs)]
        return family.fake_outputs(xs) + extra

    @torch.library.custom_op(name + "_bwd", mutates_args=())
    def bwd(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        n, m = len(names), len(p0.outputs) + len(p0.stats) + len(p0.made)
        wrote = dict(zip(p0.outputs + p0.stats + p0.made, xs[n:n + m]))
        grads = parts(xs[:n]).gradients(dict(zip(names, xs[:n])) | wrote, xs[n + m:], True)
        return [grads[k] if grads[k] is not None else torch.zeros_like(xs[k]) for k in wrt]

    @bwd.register_fake
    def _(xs):
        return [torch.empty_like(xs[k]) for k in wrt]

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*savable(inputs[0]), *output)
        _non_differentiable(ctx, p0, output)

    def backward(ctx, grads):
        saved = list(ctx.saved_tensors)
        outs = saved[len(names):len(names) + len(p0.outputs)]
        cots = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads, outs)]
        got = iter(bwd(saved + cots))
        return [next(got) if r else None for r in requires]

    top.register_autograd(backward, setup_context=setup)
    return top


def call(qualname: str, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs of dynamic function `qualname` on its program inputs `xs` (traced by dynamo), with
    gradients for the inputs that require them."""
    op = _TRAIN_OPS[training_key(qualname, tuple(x.requires_grad for x in xs))]
    return op(xs)[:len(_FAMILIES[qualname].captured.program.outputs)]


__all__ = ["call", "derivable", "prepare_training", "register", "training_key"]
