"""One compile for every length: the call path that serves a new length of a dynamic function's
axes (frontend/dynamic_axes.py says which) without capturing, saturating or compiling again.

    prog = neptune_eq.compile(fn, *xs, dynamic=True)               # every dimension that can be
    prog = neptune_eq.compile(fn, *xs, dynamic={0: [2], 1: [2]})   # argument index → dimensions

A call with length 1 runs a compile of its own, like torch.compile's 0/1 specialisation.

Buckets. A length n is served by the compile for the bucket max(16, 2^⌈log₂ n⌉): a program whose
dynamic axes hold the bucket's bound as their extent (`ir.Program.dynamic`). The e-graph holds no
extent for them (no rule can use the value), the schedules are fitted at the bound, and the kernels
take the lengths as arguments (masked tails, never specialised on). Facts the compiler proves over
the index box at the bound (a mask that always holds, an index in range) hold for every smaller box
of the bucket. Which plan runs is chosen per call: the bucket's lengths (B/2, B] (the smallest
bucket's (0, 16]) fall in RANGES equal ranges, and each range runs the alternative the cost model
prices best at its middle (a decode's split-K factor follows its length: 4 at 3000, 8 at 4000; with
more than two groups of lengths, the longest two take ranges: buckets.ranged_groups), all
of them compiled and run once on the bucket's first CUDA call, so a later length never waits on
Triton. A call needing gradients runs its range's training op (`train`): the backward derived from
the bucket's program, its plans priced at the range's middle, every range's prepared at the
bucket's first training call.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import torch

from .. import ir
from ..ir import NeptuneError
from ..signatures import autocast_state, same_traced_number, traced_number
from .buckets import (
    RANGES,
    PricedAt,
    bucket,
    describe,
    plans_by_range,
    range_extents,
    range_lengths_at,
    ranged_groups,
    ranges_of,
)
from .capture import Captured
from .checks import run_checks
from .compiled import bind_after, call_layout, check_replayer, input_args, replay_checks
from .dynamic_axes import Lengths, NotDynamic, arg_axes, proved_checks, resolve, tie_lengths  # noqa: F401  (also imported from here)
from .guards import same_value

MAX_BOUND_LAYOUTS = 64  # call layouts (so lengths) a dynamic function keeps bound launches for
_SEEN = object()  # a layout called once (bound on its second call)


class StaticTraining(NeptuneError):
    """No backward is derived for the dynamic program: calls needing gradients compile per length."""


@dataclass
class DynamicFunction:
    """A capture served at every length of its dynamic axes: one compile per bucket of lengths
    (`compile_fn(program)` compiles, with the compile cache), found again by the call's lengths."""

    captured: Captured
    lengths: Lengths
    compile_fn: object
    example: tuple  # the example's signature of every argument (shape, dtype, device) or its value
    programs: dict[tuple[int, ...], object] = field(default_factory=dict)  # bucket bounds → CompiledProgram
    op: object = None  # the torch.library op of calls dynamo traces (custom_ops.dynamic_op)
    # (bucket program, its compile) → the call of its training op (custom_ops.custom_op): a call needing
    # gradients runs it; its autograd formula runs the backward derived from the bucket's program
    training_op: object = None
    no_training: str | None = None  # why no backward is derived for the buckets (calls then compile per length)
    _train: dict = field(default_factory=dict, repr=False)  # _training_key → its training call
    _out_dtypes: dict = field(default_factory=dict, repr=False)
    # layout key of a call's arguments (their shapes, so the lengths) → (launcher, BoundCall or None):
    # a length called again goes straight to the kernels, as a static compile's calls do
    _bound: OrderedDict = field(default_factory=OrderedDict, repr=False)
    # bucket bounds → {the groups' ranges: the compiled alternative run there} (plans_by_range)
    _ranged: dict = field(default_factory=dict, repr=False)
    _warm: set = field(default_factory=set, repr=False)  # buckets whose alternatives ran on CUDA
    _warm_train: set = field(default_factory=set, repr=False)  # buckets whose ranges' trainings are prepared
    _checks: object = field(default=None, repr=False)  # the index checks' Replayer (compiled.replay_checks)
    autocast: tuple = ()  # the autocast regions its capture ran under (signatures.autocast_state)

    def __post_init__(self) -> None:
        unchecked = proved_checks(self.captured, self.lengths.groups)  # (in range at every length: resolve)
        if unchecked:
            self.captured = replace(self.captured, index_checks=tuple(
                c for k, c in enumerate(self.captured.index_checks) if k not in unchecked))
        self._checks = check_replayer(self.captured.index_checks)
        self._out_dtypes = {o.name: dt for o, dt in zip(self.captured.program.outputs, self.captured.output_dtypes)}
        dynamic = {(pos, d) for pos, d, _ in self.lengths.dims}
        self._static_dims = [(b.position, [d for d in range(len(b.shape)) if (b.position, d) not in dynamic])
                             for b in self.captured.args if b.is_tensor]
        # each argument the program reads: (position, input, the group of each input dimension or its extent)
        group = {a: g for g, axes in enumerate(self.lengths.groups) for a in axes}
        p0 = self.captured.program
        self._shapes = [(b.position, b.input, [(group.get(a), p0.axes[a]) for a in p0.inputs[b.input].axes])
                        for b in self.captured.args if b.input is not None]
        padded = {o.axis: o for o in self.lengths.offsets}  # (each output's (position, offset) of such axes)
        cut = [[(p, padded[a]) for p, a in enumerate(o.axes) if a in padded] for o in p0.outputs]
        self._cut = cut if any(cut) else None

    def example_lengths(self) -> tuple[int, ...]:
        ns = [0] * len(self.lengths.groups)
        for pos, d, g in self.lengths.dims:
            ns[g] = self.example[pos][1][d]
        return tuple(ns)

    def describe(self) -> str:
        """Its dynamic lengths and each compiled bucket's plan per range of lengths (buckets.describe)."""
        for key, prog in self.programs.items():  # (every compiled bucket's ranges priced)
            if key not in self._ranged:
                self._ranged[key] = plans_by_range(prog, self.lengths.groups, key)
        return "\n".join(describe(self.lengths, self.programs, self._ranged))

    @property
    def prog(self):
        """The compile serving the example's lengths."""
        return self.program_for(self.example_lengths())

    def serves(self, args) -> tuple[int, ...] | None:
        """The groups' lengths of a call this function serves (every other dimension, dtype, device and
        baked value as in the example; no length 1, nor one at which an axis shorter than it by a
        constant would have length 1 or none), else None."""
        if not self._like_example(args) or autocast_state(args) != self.autocast:
            return None
        ns = self.lengths.of(args)
        least = self.lengths.least or (2,) * len(self.lengths.groups)
        return ns if ns is not None and all(n >= m for n, m in zip(ns, least)) else None

    def traceable(self, args) -> bool:
        """Can a call dynamo traces take this function's ops (`traced`)? As `serves` (no length 1: the
        symbolic trace takes every length ≥ 2 and decides `L > 1` without a test, so a function
        branching on it would run the other branch), and a call needing gradients where a backward is
        derived for every length (its op pair over the buckets: neptune_eq.train_dynamic); else it
        takes a static signature's op, or runs outside the graph."""
        return self.serves(args) is not None and self.trains(args)

    def _like_example(self, args) -> bool:
        """Dtypes, devices, ranks, baked values and specialised dimensions as in the example."""
        if len(args) != len(self.example):
            return False
        device = None
        for a, ex in zip(args, self.example):
            if ex[0] == "tensor":
                if not isinstance(a, torch.Tensor) or (a.dim(), a.dtype, a.device.type) != ex[2:]:
                    return False
                if device is None:
                    device = a.device
                elif a.device != device:
                    return False  # (the checked path names the mixed devices)
            elif traced_number(a):
                if not same_traced_number(a, ex[1]):
                    return False
            elif isinstance(a, torch.Tensor) or not same_value(a, ex[1]):
                return False
        # (compared one by one, not through static_mismatch's words: dynamo cannot format a symbolic length)
        return not any(args[pos].shape[d] != self.example[pos][1][d] for pos, dims in self._static_dims for d in dims)

    def static_mismatch(self, args) -> str | None:
        """Which specialised dimension of the call differs from the example's, said in words; None."""
        return next((f"dimension {d} of argument {pos} is {args[pos].shape[d]}, specialised at {want[d]}"
                     for pos, dims in self._static_dims for want in [self.example[pos][1]] for d in dims
                     if args[pos].shape[d] != want[d]), None)

    def program_for(self, ns: tuple[int, ...]):
        """The compiled plan serving lengths `ns`: the bucket's compile (once per bucket), pinned to
        the alternative chosen for the lengths' ranges."""
        key = tuple(bucket(n) for n in ns)
        prog = self.programs.get(key)
        if prog is None:
            prog = self.programs[key] = self.compile_fn(self.bucket_program(ns))
        ranged = self._ranged.get(key)
        if ranged is None:
            ranged = self._ranged[key] = plans_by_range(prog, self.lengths.groups, key)
        return ranged[ranges_of(ns, key)]

    def bucket_program(self, ns: tuple[int, ...]) -> ir.Program:
        """The program compiled for the bucket of lengths `ns`: the dynamic axes at its bounds."""
        bound = {a: bucket(n) for group, n in zip(self.lengths.groups, ns) for a in group}
        return tie_lengths(self.captured.program, self.lengths.groups).with_extents(bound).with_dynamic(
            self.lengths.axes)

    def trains(self, args) -> bool:
        """Does this function serve the call (no gradient needed, or a backward derived for every length)?
        Eagerly that is found at the first call needing gradients (StaticTraining); a call dynamo traces
        derives it first (at trace time), as it cannot take another path once it calls the training op."""
        needs = self.captured.needs_grad(args)
        if not needs or self.no_training is not None:
            return not needs
        if not torch.compiler.is_compiling():
            return True
        from ..train_dynamic import derivable

        requires = {name: args[pos].requires_grad for pos, name, _ in self._shapes}
        requires |= {n: t.requires_grad for n, t in self.captured.constants.items()}
        return derivable(self.op.qualname, tuple(requires[n] for n in self.names()))

    def train(self, args, ns):
        """fn(*args) at lengths `ns` through the training op of their range (bucket_training): its forward
        writes what the backward reads, its backward is derived from the bucket's program and compiled
        once for every length of the range. StaticTraining where no backward is derived (then
        no_training says why)."""
        from ..grad import NoBackward

        cap = self.captured
        call = self.bucket_training(ns)
        inputs = self.inputs(args, ns, cached=False)  # (a module's parameters themselves: their gradients)
        replay_checks(self._checks, cap.index_checks, inputs, self.at(ns))
        cap.check_aliases(args)
        try:
            results = call(inputs)
            self._warm_training(ns, inputs)
        except NoBackward as e:
            self.no_training = (f"{e.cause}: the backward is not derived for every length, so each length "
                                "trains through a compile of its own")
            raise StaticTraining(self.no_training) from e
        outs = [results[o.name] for o in cap.program.outputs]
        return cap.finish(args, self.shaped(outs, ns))

    def _warm_training(self, ns: tuple[int, ...], inputs: dict[str, torch.Tensor]) -> None:
        """At a bucket's first training call, every other range's training (its plans priced there) is
        derived and its backward compiled and chosen; on CUDA each also runs its forward and backward
        once at these inputs, on detached copies, so its kernels are compiled too. No later length of
        the bucket then compiles anything or waits on Triton (as _warm_bucket does for calls without
        gradients)."""
        from ..train_dynamic import prepare_training

        bounds, _ = self._training_key(ns)
        if bounds in self._warm_train:
            return
        self._warm_train.add(bounds)
        leaves = {n: t.detach().requires_grad_(t.requires_grad) for n, t in inputs.items()}
        wrt = [t for t in leaves.values() if t.requires_grad]
        requires = tuple(leaves[n].requires_grad for n in self.names())
        ran = {prepare_training(self.bucket_training(ns).qualname, requires)}  # (the plans this call runs)
        for r in itertools.product(range(RANGES), repeat=len(ranged_groups(bounds))):
            call = self.bucket_training(range_lengths_at(bounds, r))
            plans = prepare_training(call.qualname, requires)
            if plans in ran or not wrt or not next(iter(leaves.values())).is_cuda:
                continue
            ran.add(plans)
            with torch.enable_grad():
                res = call(leaves)
            outs = [res[o.name] for o in self.captured.program.outputs if res[o.name].requires_grad]
            if outs:
                torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs], allow_unused=True)

    def bucket_training(self, ns: tuple[int, ...]):
        """The call of the training op serving lengths `ns` (program inputs → outputs, by name): the
        backward derived from their bucket's program, its forward and backward plans chosen at the
        middle of the lengths' ranges as a call's inference plan is (one training per range: priced at
        the bucket's bound, causal attention at 3000 trained with the split-K key pass chosen at 4096)."""
        key = self._training_key(ns)
        call = self._train.get(key)
        if call is None:
            prog = self.program_for(ns)  # (the bucket's compile, the range's alternative)
            bounds, ranges = key
            compile_fn = PricedAt(self.compile_fn, tuple(sorted(range_extents(self.lengths.groups, bounds,
                                                                               ranges).items())))
            call = self._train[key] = self.training_op(self.bucket_program(ns), prog, compile_fn)
        return call

    def _training_key(self, ns: tuple[int, ...]) -> tuple:
        """(bucket bounds, the ranges of its ranged groups) of lengths `ns` (buckets.ranges_of)."""
        bounds = tuple(bucket(n) for n in ns)
        return bounds, ranges_of(ns, bounds)

    def trained_op(self) -> str:
        """The qualname of the training op of the example's bucket once a call trained there, else the
        op of the function's inference calls (what explain() reports on)."""
        call = self._train.get(self._training_key(self.example_lengths()))
        return call.qualname if call is not None else self.op.qualname

    def tuned(self, ns: tuple[int, ...], prog) -> None:
        """Run `prog` (prog.tune() measured it at lengths `ns`) for every length of ns's range of its
        bucket, in this process."""
        self.program_for(ns)
        key = tuple(bucket(n) for n in ns)
        self._ranged[key][ranges_of(ns, key)] = prog

    def _warm_bucket(self, ns, inputs) -> None:
        """On a bucket's first CUDA call, run each other alternative its ranges may choose once at
        these inputs (every alternative serves every length of the bucket): their kernels are then
        compiled, and no later length of the bucket waits on Triton."""
        key = tuple(bucket(n) for n in ns)
        if key in self._warm:
            return
        self._warm.add(key)
        ran = self.program_for(ns)
        for prog in {id(p): p for p in self._ranged.get(key, {}).values()}.values():
            if prog is not ran:
                prog.launcher("cuda")(inputs, self._out_dtypes)

    def inputs(self, args, ns, cached: bool = True) -> dict[str, torch.Tensor]:
        """The program's inputs for a call at group lengths `ns`; closure tensors from the copies kept
        per device unless not `cached` (read afresh: what a traced graph does)."""
        cap = self.captured
        out = {}
        for pos, name, dims in self._shapes:
            a = args[pos]
            shape = tuple(n if g is None else ns[g] for g, n in dims)
            out[name] = a if a.shape == shape else a.reshape(shape)
        device = next((t.device for t in out.values()), None)
        if cached:
            out.update(cap._constants_on(device))
        else:
            out.update({n: t.reshape(cap.program.input_shape(n)).to(device or t.device)
                        for n, t in cap.constants.items()})
        return out

    def at(self, ns) -> dict[str, int]:
        """Each dynamic axis's length in a call at group lengths `ns`."""
        return {a: n for group, n in zip(self.lengths.groups, ns) for a in group}

    def output_shapes(self, ns) -> list[tuple[int, ...]]:
        shapes = [list(s) for s in self.captured.output_shapes]
        for k, d, g, by in self.lengths.outputs:
            shapes[k][d] = ns[g] - by
        return [tuple(s) for s in shapes]

    def shaped(self, outs, ns) -> list[torch.Tensor]:
        """The program's outputs of a call at group lengths `ns` in fn's shapes: an axis padded to a
        longer one (frontend/offsets.py) cut to its own length first."""
        if self._cut:
            at = self.at(ns)
            outs = [r if not cut else _cut(r, [(p, at[o.source] - o.by) for p, o in cut])
                    for r, cut in zip(outs, self._cut)]
        return [r if r.shape == s else r.reshape(s) for r, s in zip(outs, self.output_shapes(ns))]

    def __call__(self, args, ns):
        cap = self.captured
        cap.follow_environment()
        if cap.needs_grad(args):
            return self.train(args, ns)
        inputs = None
        if cap.index_checks or cap.mutations:
            inputs = self.inputs(args, ns)
            replay_checks(self._checks, cap.index_checks, inputs, self.at(ns))
            cap.check_aliases(args)
        prog = self.program_for(ns)
        # (chunks run through run(); an output cut to a padded axis's length is no bound launch's)
        layout = call_layout(cap, args) if prog.chunking is None and self._cut is None else None
        fresh = False
        if layout is not None:
            key, ptrs = layout
            launcher = prog.launcher("cuda")
            hit = self._bound.get(key)
            if hit is not None and hit[0] is launcher:
                self._bound.move_to_end(key)
                if hit[1] is _SEEN:
                    fresh = True
                elif hit[1] is not None:
                    return cap.finish(args, hit[1](ptrs, self.output_shapes(ns),
                                                   input_args(cap, args) if hit[1].library else None))
            else:  # a length's first call stays as cheap as it can: binding waits for a second call
                self._bound[key] = (launcher, _SEEN)
        inputs = inputs if inputs is not None else self.inputs(args, ns)
        # serves() checked every shape, dtype and device against the example and the lengths: the
        # launcher runs without the program's own input checks (a decode step is tens of µs of GPU)
        results = prog.launcher("cuda" if next(iter(inputs.values())).is_cuda else "interpreter")(
            inputs, self._out_dtypes) if prog.chunking is None else prog.run(inputs, self._out_dtypes)
        if prog.chunking is None and next(iter(inputs.values())).is_cuda:
            self._warm_bucket(ns, inputs)
        outs = [results[o.name] for o in cap.program.outputs]
        outs = self.shaped(outs, ns)
        if fresh:  # launched checked twice at this layout: its later calls take the bound launches
            order = [b.input for b in cap.args if b.input is not None]
            self._bound[key] = (launcher, bind_after(launcher, inputs, order, ptrs, self._out_dtypes))
        while len(self._bound) > MAX_BOUND_LAYOUTS:  # (each keeps its buffers at its lengths alive)
            self._bound.popitem(last=False)
        return cap.finish(args, outs)

    # ---- as one torch.library op over the program's inputs (what a torch.compile'd graph calls)
    def names(self) -> list[str]:
        return list(self.captured.program.inputs)

    def _group_at(self) -> list[tuple[int, int]]:
        """(program input number, dimension) that gives each group's length."""
        specs = list(self.captured.program.inputs.values())
        return [next((k, d) for k, s in enumerate(specs) for d, a in enumerate(s.axes) if a in group)
                for group in self.lengths.groups]

    def run_inputs(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The op's kernels: the program outputs for its inputs `xs` (program order), at their lengths."""
        ns = tuple(xs[k].shape[d] for k, d in self._group_at())
        res = self.program_for(ns).run(dict(zip(self.names(), xs)), self._out_dtypes)
        return [res[o.name] for o in self.captured.program.outputs]

    def fake_outputs(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Empty outputs shaped by the inputs' (possibly symbolic) lengths."""
        p0 = self.captured.program
        at = {a: xs[k].shape[d] for (k, d), group in zip(self._group_at(), self.lengths.groups) for a in group}
        return [xs[0].new_empty(tuple(at.get(a, p0.axes[a]) for a in o.axes), dtype=self._out_dtypes[o.name])
                for o in p0.outputs]

    def traced(self, args, op):
        """fn(*args) while dynamo traces: checks, reshapes by the arguments' own (symbolic) lengths, the op."""
        from .capture import StaleCapture

        cap = self.captured
        changed = cap.guards.check()
        if changed is not None and changed.stale:
            raise StaleCapture("a value the function reads from its environment changed since it was captured; "
                               "call the compiled function once outside torch.compile to capture it again")
        other = self.static_mismatch(args)
        if other is not None:  # (eagerly such a call gets a compile of its own; dynamo cannot make one)
            raise NeptuneError(f"inside torch.compile a dynamic function serves its dynamic dimensions only: {other} "
                               "(name it in dynamic={argument: [dimensions]} to serve its lengths too; an eager call "
                               "at this shape compiles it)")
        ns = self.lengths.of(args)
        if ns is None:
            raise NeptuneError("the dynamic dimensions of this call do not keep the lengths the function ties together")
        inputs = self.inputs(args, ns, cached=False)
        run_checks(cap.index_checks, inputs, self.at(ns))
        xs = [inputs[n] for n in self.names()]
        if cap.needs_grad(args):  # (one op over every bucket: neptune_eq.train_dynamic)
            from ..train_dynamic import call

            outs = call(op.qualname, xs)
        else:
            outs = op(xs)
        return cap.finish(args, self.shaped(outs, ns))

    def reference(self, *args):
        """fn(*args) by the float64 reference evaluator at the call's lengths."""
        from ..reference import evaluate

        ns = self.serves(args)
        if ns is None:
            raise NeptuneError("reference(): these arguments are not served by this dynamic function")
        at = self.at(ns)
        inputs = self.inputs(args, ns)
        res = evaluate(self.captured.program.with_extents(at), inputs)
        outs = [res[o.name] for o in self.captured.program.outputs]
        return self.captured.structure.build(self.shaped(outs, ns))

    def digest(self) -> str:
        text = f"{self.captured.program.text(exact=True)}|{self.lengths.groups}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cut(r: torch.Tensor, cuts) -> torch.Tensor:
    for p, n in cuts:
        r = r.narrow(p, 0, n)
    return r.contiguous()  # (as eager's result: a caller may view it)


def example_signature(args) -> tuple:
    """What a dynamic function compares a call with: ("tensor", shape, rank, dtype, device type) of
    each tensor, ("value", value) of anything else."""
    return tuple(("tensor", tuple(a.shape), a.dim(), a.dtype, a.device.type) if isinstance(a, torch.Tensor)
                 else ("value", a) for a in args)
