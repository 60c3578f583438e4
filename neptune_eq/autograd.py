"""Gradients of compiled functions: a call that needs gradients runs the program's training op, whose
autograd formula runs a derived backward program (neptune_eq.grad) through a custom op of its own.

Two backwards are derived and ranked by the cost model at the first call that needs gradients:

    recompute   the forward saves its inputs; the backward recomputes every reduction it reads
    saved       the forward also writes its row statistics (a softmax's max and sum) and the backward
                reads those and the outputs (neptune_eq.grad_saved: D = rowsum(dO∘O) for attention)

The training op always writes the statistics (a few vectors); the chosen backward decides what is kept.
A program whose dot operand is computed through a gather or a row norm trains split at it
(neptune_eq.grad_prologue, `_Split`): the op first writes the operands by a map program, runs the rest
on them, and its backward carries their gradients through the map's own backward. A program with
grouped-query heads (k[h // G]) trains over (kv head, member) axes (neptune_eq.regroup): its tensors are
viewed so at the op's boundary, and the kv gradients are sums over the member axis, not one-hot sums.
Each set of inputs that require grad has a training op of its own (`_variant`), derived at its first call:
its backward computes those gradients alone.
`training_report(qualname)` says which was chosen and why (Compiled.explain shows it). The ops are
torch.library ops with fake kernels, which torch.compile traces (AOTAutograd takes the backward op as
one node); an eager call runs the same forward, setup and backward as an autograd.Function, without
the ops' dispatch (hundreds of µs of host time a step). What cannot be differentiated (floor division of a float,
an axis read twice, a second derivative) raises NoBackward at the call that needs it, naming the cause
— never a detached result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import ir, scatter
from .autograd_joint import joint_option, joint_training_op
from .autograd_run import _BOUND, _RUNNERS, _compiled, _run  # noqa: F401  (_BOUND: tests)
from .grad import Backward, NoBackward
from .training import _derive, _Training, lengths_of, shape_at

_BACKWARD_OPS: dict[str, object] = {}  # backward op qualname → the op
_TRAINING: dict[str, _Training] = {}  # training key (_variant) → what its training calls run
_ATTACHED: dict[str, tuple] = {}  # forward op qualname → (program, input names, outputs, compile_fn)
_LAST: dict[str, str] = {}  # forward op qualname → the training key its last training call ran


def _choose(qualname: str, t: _Training, compile_fn) -> Backward:
    """The backward the cost model predicts fastest with its forward (compiled here, on the thread of
    the forward call: autograd runs the backward of CUDA tensors on a thread of its own, and the
    e-graphs of a compile must be freed on the thread that made them — egglog's are unsendable)."""
    if t.chosen is not None:
        return t.chosen
    options = []
    # (a dynamic bucket's training prices its plans at its range's lengths: frontend/buckets.PricedAt)
    time = getattr(compile_fn, "time", lambda run: run.alternative.predicted_time)
    for mode, back in (("saved", t.saved), ("recompute", t.recompute)):
        if back is None:
            continue
        bwd = _compiled(f"{qualname}:{mode}", back.program, compile_fn)
        fwd = _compiled(f"{qualname}:forward", t.forward, compile_fn)  # (the training op's, in both modes)
        total = time(fwd) + time(bwd) + getattr(bwd, "extra_s", 0.0)
        what = ("saves " + ", ".join([*back.saved.outputs, *(f"{k} = {ir.show(r)}" for k, r in
                                                              back.saved.stats.items())])
                if mode == "saved" else "saves the inputs alone, recomputes every reduction")
        options.append((total, mode, back, f"{mode}: {what}; predicted fwd {time(fwd) * 1e6:.1f}"
                                           f" + bwd {time(bwd) * 1e6:.1f} µs "
                                           f"({bwd.alternative.structure})"
                                           + (f"; {bwd.split.describe()}"
                                              if isinstance(bwd, scatter.ScatterRun) else "")
                                           + (f"; {bwd.chunking.describe()}" if bwd.chunking else "")))
    note = None
    if t.joint is not None:  # (a scalar loss: its gradients beside it, neptune_eq.grad_joint)
        option, note = joint_option(t.joint, _compiled(f"{qualname}:joint", t.joint.program, compile_fn), time)
        if option is not None:
            options.append((*option[:2], t.recompute, option[2]))
    options.sort(key=lambda o: o[0])
    t.chosen, t.mode = options[0][2], options[0][1]
    lines = ["  " + o[3] for o in options] + ([f"  {note}"] if note else [])
    if t.mode == "joint":
        t.no_gradient = set()
        t.report = ["backward: chose joint (the cost model's fastest forward + backward)", *lines]
        return t.chosen
    read = {n.tensor for o in t.chosen.program.outputs for n in ir.walk(o.expr) if isinstance(n, ir.Load)}
    t.no_gradient = {o.name for o in t.forward.outputs if t.chosen.cotangents.get(o.name) not in read}
    chosen = _compiled(f"{qualname}:{options[0][1]}", t.chosen.program, compile_fn)
    if chosen.chunking is not None:  # its chunk program is compiled here too, not at its first run
        chosen.chunk_compiled  # noqa: B018
    t.report = [f"backward: chose {options[0][1]} (the cost model's fastest forward + backward)"]
    if t.prologue is not None:
        t.report.append("  split at the computed dot operands " + ", ".join(
            f"{n} = {ir.show(f)}" for n, f in t.prologue[0].operands.items())
            + ": the core's backward gives their gradients, the map's backward carries them to the inputs")
    t.report += lines
    return t.chosen


def training_report(qualname: str) -> str:
    """Which backward the training calls of op `qualname` run, with the alternatives' predictions
    ('' before the first call that needed gradients)."""
    t = _TRAINING.get(_LAST.get(qualname, qualname))
    return "\n".join(t.report) if t is not None else ""


def tune_training(qualname: str, inputs: dict[str, torch.Tensor], tune: Callable[[object, dict], object],
                  wrt=None) -> str:
    """Tune the kernels a training call of op `qualname` runs at `inputs` (program input name → CUDA
    tensor) with gradients of `wrt` (None: every floating input): `tune(compiled, inputs)` on the
    training forward, then on the chosen backward, fed the statistics that forward writes and random
    cotangents. Returns the backward's mode."""
    if qualname not in _ATTACHED:
        raise NoBackward(f"{qualname}: no training op")
    qualname, t = _variant(qualname, wrt)
    if t.recompute is None and t.saved is None:
        raise NoBackward(t.why)
    back = _choose(qualname, t, t.compile_fn)
    if t.mode == "joint":  # (one program: the loss and the gradients at upstream 1)
        tune(_compiled(f"{qualname}:joint", t.joint.program, t.compile_fn), {n: x.detach() for n, x in inputs.items()})
        return "joint"
    fwd = _compiled(f"{qualname}:forward", t.forward, t.compile_fn)
    inputs, _ = _Split(qualname, t, list(inputs), t.compile_fn).operands(
        {n: t.split(n, x.detach()) for n, x in inputs.items()})
    inputs = {n: x for n, x in inputs.items() if n in t.forward.inputs}  # (a split training's core reads the operands)
    tune(fwd, inputs)
    written = fwd.run(inputs, {n: dt for n, _, dt in t.outs} | {s: getattr(torch, o.dtype) for o in t.forward.outputs
                                                                  if (s := o.name) in t.stats})
    mode = _mode(back)
    spec = back.program.inputs
    feed = dict(inputs)
    if back.saved is not None:
        feed |= {n: written[n] for n in (*back.saved.outputs, *back.saved.stats)}
    gen = torch.Generator(device=next(iter(inputs.values())).device).manual_seed(0)
    at = lengths_of(back.program, feed)  # (a dynamic program's cotangents at the lengths of `inputs`)
    for name in back.cotangents.values():
        feed[name] = torch.randn(shape_at(back.program, spec[name].axes, at), generator=gen, device=gen.device,
                                 dtype=getattr(torch, spec[name].dtype))
    tune(_compiled(f"{qualname}:{mode}", back.program, t.compile_fn), feed)
    return mode


def _variant(qualname: str, wrt) -> tuple[str, _Training]:
    """The training of op `qualname` for the floating inputs `wrt` (None: all of them): its own backward,
    derived on first use, computes those gradients alone — a buffer that needs none (RoPE's cos and sin,
    an additive mask) costs no reduction and cannot make the derivation fail. Keyed `qualname` for all
    floating inputs, `qualname_g<mask>` for a subset."""
    program, names, outs, compile_fn = _ATTACHED[qualname]
    floats = [n for n in names if program.inputs[n].dtype in ir.FLOAT_DTYPES]
    wrt = floats if wrt is None else [n for n in floats if n in wrt]
    key = qualname if len(wrt) == len(floats) else f"{qualname}_g{sum(1 << floats.index(n) for n in wrt):x}"
    t = _TRAINING.get(key)
    if t is None:
        t = _TRAINING[key] = _derive(program, wrt)
        t.compile_fn, t.outs = compile_fn, outs
    _LAST[qualname] = key
    return key, t


def training_op_name(qualname: str) -> str | None:
    """The torch.library training op of `qualname` for all its floating inputs, registered here if it
    was not yet ('<qualname>_train'); None where no backward is derived."""
    if qualname not in _ATTACHED:
        return None
    try:
        return _training_key(qualname, (True,) * len(_ATTACHED[qualname][1])) + "_train"
    except NoBackward:
        return None


def attach(op, qualname: str, program: ir.Program, names: list[str], outs: list[tuple],
           compile_fn: Callable[[ir.Program], object]) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """Give `op` (the inference op) training twins and return the call running them: xs → outputs
    (`names`: the program inputs in op order; `outs`: (output name, shape, dtype) in op order;
    `compile_fn(program)` compiles a program, cached). A call runs the twin of the inputs that
    require grad."""
    _ATTACHED[qualname] = (program, names, outs, compile_fn)

    def refuse(ctx, inputs, output):  # the inference op is never called with gradients
        raise NoBackward(f"{program.name}: the inference op was called where gradients are needed")

    op.register_autograd(lambda ctx, grads: None, setup_context=refuse)
    n_out = len(outs)

    trains: dict[tuple[bool, ...], object] = {}  # which inputs require grad → their training call

    def call(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        requires = tuple(x.requires_grad for x in xs)
        if torch.compiler.is_compiling():
            return _BACKWARD_OPS[_training_key(qualname, requires) + "_train"](xs)[:n_out]
        got = trains.get(requires)
        if got is None:  # (derived at the first call of each set: later calls look it up once)
            key = _training_key(qualname, requires)
            got = trains[requires] = (key, _BACKWARD_OPS[key + "_train"])
        _LAST[qualname] = got[0]
        return got[1](xs)[:n_out]

    return call


@torch.compiler.assume_constant_result  # (dynamo runs it at trace time and keeps the name: no derivation traced)
def _training_key(qualname: str, requires: tuple[bool, ...]) -> str:
    """The training key of op `qualname` called with inputs requiring grad as `requires` (op order),
    its training op registered as '<key>_train'; NoBackward where no backward is derived."""
    program, names, outs, compile_fn = _ATTACHED[qualname]
    key, t = _variant(qualname, {n for n, r in zip(names, requires) if r})
    if t.recompute is None and t.saved is None:
        raise NoBackward(f"{t.why} (so no gradient can flow through {program.name})", cause=t.why)
    _training_op(key, t, names, outs, compile_fn)
    return key


@dataclass
class _Parts:
    """What the training op of one program runs: `impl(xs)` its forward, writing the outputs, then the
    statistics `stats`, then the operands `made` of a split training; `gradients(by_name, grads, eager)`
    the inputs' gradients (None where there is none) from the tensors the forward read and wrote, by
    name, and the outputs' cotangents."""

    impl: Callable[[list[torch.Tensor]], list[torch.Tensor]]
    gradients: Callable[[dict[str, torch.Tensor], list, bool], list]
    outputs: list[str]
    stats: list[str]
    made: list[str]
    kept: Callable[[], list[str]]  # the outputs and statistics the chosen backward reads (it chooses at first use)
    specs: list[tuple]  # (shape, dtype) of each statistic, then each operand, at the program's extents
    axes: list[tuple[str, ...]]  # the axes of each statistic, then each operand (of `program`)
    program: ir.Program  # the program the op was derived from (its extents, its dynamic axes)
    no_gradient: Callable[[], set[str]]  # the outputs no gradient reaches (known once the backward is chosen)


_PARTS: dict[str, _Parts] = {}  # training key → its parts


def _parts(qualname: str, t: _Training, names: list[str], outs: list[tuple], compile_fn) -> _Parts:
    got = _PARTS.get(qualname)
    if got is not None:
        return got
    forward, stats = t.forward, t.stats
    dtypes = {n: dt for n, _, dt in outs} | {o.name: getattr(torch, o.dtype) for o in forward.outputs
                                                if o.name in stats}
    split = _Split(qualname, t, names, compile_fn)
    # every backward op a traced graph may call, registered with the training: AOTAutograd's cache
    # (warm in any process after the first) replays a compiled backward calling its op by name without
    # tracing `backward`, which would register it (until session 51: AttributeError in that backward)
    for back in (t.recompute, t.saved):
        if back is not None:
            _backward_op(qualname, back, split.core_names, outs, compile_fn, split.shared)
    if split.pro is not None:
        _backward_op(f"{qualname}_operands", split.pro[1], split.maps_names, split.specs, compile_fn, split.shared)
    key = f"{qualname}:forward"
    axes = {o.name: o.axes for o in t.program.outputs}

    def impl(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        by, made = split.operands({n: t.split(n, x) for n, x in zip(names, xs)})
        res = _run(key, _compiled(key, forward, compile_fn), {n: by[n] for n in split.core_names}, dtypes)
        return [t.merged(n, res[n]) for n, _, _ in outs] + [res[s] for s in stats] + made

    def kept() -> list[str]:
        back = _choose(qualname, t, compile_fn)
        return [*back.saved.outputs, *back.saved.stats] if back.saved is not None else []

    def gradients(by_name: dict[str, torch.Tensor], grads, eager: bool) -> list:
        if torch.is_grad_enabled():
            raise NoBackward(f"{t.program.name}: a second derivative (create_graph=True) is not derived")
        back = _choose(qualname, t, compile_fn)
        by = {c: t.split(c, by_name[c]) for c in names} | {m: by_name[m] for m in split.made}
        device = by_name[names[0]].device
        at = lengths_of(t.program, {c: x for c, x in by.items() if c in t.program.inputs})
        cots = [t.split(name, g if g is not None else torch.zeros(
                    shape_at(t.program, axes[name], at) if t.program.dynamic else shape, dtype=dt, device=device))
                for g, (name, shape, dt) in zip(grads, outs) if name in back.cotangents]
        op, direct = _backward_op(qualname, back, split.core_names, outs, compile_fn, split.shared)
        res = (direct if eager else op)([by[c] for c in split.core_names]
                                        + [t.split(k, by_name[k]) for k in kept()] + cots)
        got = dict(zip([c for c in split.core_names if c in back.grads], res))
        got = split.carried(got, by, eager)
        return [t.merged(name, got.get(name)) for name in names]

    specs = [(forward.output_shape(o), getattr(torch, o.dtype)) for o in forward.outputs if o.name in stats]
    specs += [(shape, dt) for _, shape, dt in split.specs]
    made_axes = [o.axes for o in t.prologue[0].maps.outputs] if t.prologue is not None else []
    got = _PARTS[qualname] = _Parts(impl, gradients, [n for n, _, _ in outs], list(stats), list(split.made), kept,
                                    specs, [o.axes for o in forward.outputs if o.name in stats] + made_axes,
                                    t.program, lambda: t.no_gradient)
    return got


def _training_op(qualname: str, t: _Training, names: list[str], outs: list[tuple], compile_fn):
    got = _BACKWARD_OPS.get(qualname + "_train")
    if got is not None:
        return got
    if t.joint is not None:  # (ranked here, at the op's registration: a joint op returns the gradients too)
        _choose(qualname, t, compile_fn)
    if t.mode == "joint":
        key = f"{qualname}:joint"
        dtypes = {n: dt for n, _, dt in outs}

        def run(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return _run(key, _compiled(key, t.joint.program, compile_fn), inputs, dtypes)

        got = _BACKWARD_OPS[qualname + "_train"] = joint_training_op(qualname, t.joint, names, outs, run, _Eager)
        return got
    p = _parts(qualname, t, names, outs, compile_fn)

    @torch.library.custom_op(qualname + "_train", mutates_args=())
    def top(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return p.impl(xs)

    @top.register_fake
    def _(xs):
        return ([xs[0].new_empty(shape, dtype=dt) for _, shape, dt in outs]
                + [xs[0].new_empty(shape, dtype=dt) for shape, dt in p.specs])

    def setup(ctx, inputs, output):
        by = dict(zip(p.outputs + p.stats, output))
        ctx.kept = p.kept()
        ctx.save_for_backward(*savable(inputs[0]), *(by[n] for n in ctx.kept), *output[len(p.outputs) + len(p.stats):])
        _non_differentiable(ctx, p, output)

    def backward(ctx, grads):
        return p.gradients(dict(zip(names + ctx.kept + p.made, ctx.saved_tensors)), grads, getattr(ctx, "eager", False))

    top.register_autograd(backward, setup_context=setup)

    def train(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        # the custom op is what dynamo and AOTAutograd trace; an eager call skips its dispatch, whose
        # Python ran 250 µs beside the forward's kernels and 580 beside the backward's (H100, attention
        # at L 3000; bench/probe_step_host.py): an autograd.Function of the same functions
        if torch.compiler.is_compiling():
            return top(xs)
        return list(_Eager.apply((p.impl, setup, backward), *xs))

    _BACKWARD_OPS[qualname + "_train"] = train
    return train


def _non_differentiable(ctx, p: _Parts, output) -> None:
    """An output no gradient reaches (computed from detached values, a comparison's mean) does not
    require grad, as torch's; the statistics and operands are the backward's own."""
    none = [o for n, o in zip(p.outputs, output) if n in p.no_gradient()]
    if none or len(output) > len(p.outputs):
        ctx.mark_non_differentiable(*none, *output[len(p.outputs):])


class _Split:
    """The operands a split training (t.prologue) computes before its core: `made` their names, `specs`
    (name, shape, dtype); `core_names` the core's inputs in op order, then the operands. Unsplit, no
    operands and the core is the program."""

    def __init__(self, qualname: str, t: _Training, names: list[str], compile_fn):
        self.qualname, self.compile_fn, self.pro = qualname, compile_fn, t.prologue
        self.shared: frozenset[str] = frozenset()  # inputs whose gradient both the core and the maps give
        if self.pro is None:
            self.made, self.specs, self.core_names = [], [], list(names)
            return
        pro, maps = self.pro
        self.made = list(pro.operands)
        self.specs = [(o.name, pro.maps.output_shape(o), getattr(torch, o.dtype)) for o in pro.maps.outputs]
        self.core_names = [n for n in names if n in pro.core.inputs] + self.made
        self.maps_names = [n for n in names if n in pro.maps.inputs]
        floats = {n for n in names if n in pro.core.inputs and pro.core.inputs[n].dtype in ir.FLOAT_DTYPES}
        self.shared = frozenset(n for n in self.maps_names if n in maps.grads and n in floats)

    def operands(self, by: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        """The inputs by name with the operands added, and the operands."""
        if self.pro is None:
            return by, []
        key = _operands_key(self.qualname)
        res = _run(key, _compiled(key, self.pro[0].maps, self.compile_fn), {n: by[n] for n in self.maps_names},
                   {n: dt for n, _, dt in self.specs})
        made = [res[n] for n in self.made]
        return by | dict(zip(self.made, made)), made

    def carried(self, got: dict[str, torch.Tensor], by: dict[str, torch.Tensor], eager: bool) -> dict:
        """The core's gradients `got` with those of the operands carried to the inputs they are computed
        from by the maps' backward (summed with the core's own where an input is read by both)."""
        if self.pro is None:
            return got
        maps = self.pro[1]
        cots = [got.pop(n) for n, _, _ in self.specs if n in maps.cotangents]
        op, direct = _backward_op(f"{self.qualname}_operands", maps, self.maps_names, self.specs, self.compile_fn,
                                  self.shared)
        res = (direct if eager else op)([by[n] for n in self.maps_names] + cots)
        for n, g in zip([n for n in self.maps_names if n in maps.grads], res):
            got[n] = got[n] + g if n in got else g
            if n in self.shared:
                got[n] = got[n].to(by[n].dtype)  # (both parts in float32: rounded once)
        return got


def savable(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The inputs a backward reads, an inference-mode tensor copied out of it (torch refuses to save one:
    a teacher's logits computed under torch.inference_mode() beside a student's that need gradients)."""
    return [x.clone() if x.is_inference() else x for x in xs]


class _Eager(torch.autograd.Function):
    """An eager training call: the training op's forward, setup_context and backward, run directly."""

    @staticmethod
    def forward(ctx, fns, *xs):
        impl, setup, _ = fns
        out = impl(list(xs))
        ctx.eager, ctx.fns = True, fns
        ctx.set_materialize_grads(False)  # (an output nothing reads gets None, as the op's backward expects)
        setup(ctx, (list(xs),), out)
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *ctx.fns[2](ctx, list(grads)))


def _mode(back: Backward) -> str:
    """How backward `back` reads the forward: what its compiled program is keyed by (_run_key)."""
    return "saved" if back.saved is not None else "recompute"


def _run_key(qualname: str, back: Backward) -> str:
    """The key of backward `back`'s compiled program for training `qualname` (in _RUNNERS)."""
    return f"{qualname}:{_mode(back)}"


def _operands_key(qualname: str) -> str:
    """The key of the compiled map writing a split training's operands (_Split; its backward's is
    _run_key(f"{qualname}_operands", …))."""
    return f"{qualname}:operands"


def _backward_op(qualname: str, back: Backward, names: list[str], outs: list[tuple], compile_fn,
                 wide: frozenset[str] = frozenset()):
    """The custom op (and its direct call) of backward `back`; the gradients of the inputs in `wide`
    come back in float32 (a split training's partial gradients of an input read by both the core and
    the operand maps: summed in float32 and rounded once, as torch's autograd does — rounded apart,
    the two parts of linear attention's key gradient cancel to 3.7× torch's error in fp16)."""
    mode = _mode(back)
    key = f"{qualname}_{mode}_backward"
    got = _BACKWARD_OPS.get(key)
    if got is not None:
        return got, _BACKWARD_OPS[key + ":direct"]
    extra = [*back.saved.outputs, *back.saved.stats] if back.saved is not None else []
    cot_names = [back.cotangents[n] for n, _, _ in outs if n in back.cotangents]
    wrt = [n for n in names if n in back.grads]
    spec = back.program.inputs
    shapes = [back.program.input_shape(n) for n in wrt]  # (a gradient over a split dimension's digits
                                                         # is laid out as the input: a reshape)
    cots = [(name, back.program.input_shape(name), getattr(torch, spec[name].dtype)) for name in cot_names]
    run_key, given = _run_key(qualname, back), names + extra
    got_names = [back.grads[n] for n in wrt]
    program = back.program

    def direct(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        run = _compiled(run_key, program, compile_fn)
        inputs = dict(zip(given, xs))
        # (a dynamic program: shapes at the call's lengths, read off its inputs and the cotangents)
        at = lengths_of(program, inputs | {name: g for (name, _, _), g in zip(cots, xs[len(given):])})
        for (name, shape, want), g in zip(cots, xs[len(given):]):
            shape = shape_at(program, spec[name].axes, at) if program.dynamic else shape
            inputs[name] = g.reshape(shape).to(want).contiguous()
        res = _run(run_key, run, inputs, {back.grads[n]: torch.float32 for n in wrt if n in wide} or None)
        return [res[n].reshape(shape_at(program, spec[w].axes, at) if program.dynamic else shape)
                for n, w, shape in zip(got_names, wrt, shapes)]

    @torch.library.custom_op(key, mutates_args=())
    def bop(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return direct(xs)

    @bop.register_fake
    def _(xs):
        by = dict(zip(names, xs))
        return [torch.empty_like(by[n], dtype=torch.float32 if n in wide else None) for n in wrt]

    _BACKWARD_OPS[key], _BACKWARD_OPS[key + ":direct"] = bop, direct
    return bop, direct


__all__ = ["attach", "training_op_name", "training_report", "tune_training"]
