"""One compile for every length: which dimensions of a captured function's arguments may change
between calls, and the call path that serves a new length without capturing, saturating or
compiling again.

    prog = neptune_eq.compile(fn, *xs, dynamic=True)               # every dimension that can be
    prog = neptune_eq.compile(fn, *xs, dynamic={0: [2], 1: [2]})   # argument index → dimensions

Which dimensions can be (`resolve`). A dimension is a program axis; the program must be the same
at every length of it, up to that axis's extent. That is tested, not assumed: fn is captured again
(on fake tensors, milliseconds) with the axis one length moved, and the two programs, their index
checks, return structure and output shapes are compared. A length fn reads as a number (x[:, -1],
1 / x.shape[1] in a mean, a slice to L // 2) changes a constant of the program, and the axis stays
specialised (or, when the user named it, the compile is refused naming the difference). Axes fn
keeps equal (torch.ones(L, L).tril() against scores [L, S]) move together as one group; a final
capture moves every group at once by different amounts. A size-1 dimension is no axis (it
broadcasts) and a call with length 1 runs a compile of its own, like torch.compile's 0/1
specialisation.

Buckets. A length n is served by the compile for the bucket max(16, 2^⌈log₂ n⌉): a program whose
dynamic axes hold the bucket's bound as their extent (`ir.Program.dynamic`). The e-graph holds no
extent for them (no rule can use the value), the schedules are fitted at the bound, and the kernels
take the lengths as arguments (masked tails, never specialised on). Facts the compiler proves over
the index box at the bound (a mask that always holds, an index in range) hold for every smaller box
of the bucket. Which plan runs is chosen per call: the bucket's lengths (B/2, B] fall in RANGES
equal ranges, and each range runs the alternative the cost model prices best at its middle (a
decode's split-K factor follows its length: 4 at 3000, 8 at 4000), all of them compiled and run
once on the bucket's first CUDA call, so a later length never waits on Triton.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from .. import ir
from ..ir import NeptuneError
from .buckets import MAX_RANGED_GROUPS, bucket, length_range, plans_by_range
from .capture import ArgBinding, Captured, capture
from .checks import composed, run_checks
from .compiled import bind_after, call_layout
from .guards import same_value

MAX_BOUND_LAYOUTS = 64  # call layouts (so lengths) a dynamic function keeps bound launches for
_SEEN = object()  # a layout called once (bound on its second call)


class NotDynamic(NeptuneError):
    """A dimension named dynamic cannot be: the program depends on its length beyond its extent."""


def arg_axes(b: ArgBinding, program: ir.Program) -> tuple[str | None, ...] | None:
    """The program axis of each dimension of tensor argument `b` (None for a size-1 dimension, which
    is no axis), or None where the program reshapes the argument otherwise."""
    if not b.is_tensor or b.input is None:
        return None
    axes = program.inputs[b.input].axes
    if b.program_shape is None:
        return tuple(axes)
    kept = [k for k, n in enumerate(b.shape) if n != 1]
    if len(kept) != len(axes) or tuple(b.shape[k] for k in kept) != tuple(b.program_shape):
        return None
    out: list[str | None] = [None] * len(b.shape)
    for k, a in zip(kept, axes):
        out[k] = a
    return tuple(out)


@dataclass(frozen=True)
class Lengths:
    """The dynamic axes of a capture: `groups` of program axes that keep one length, `dims` the
    (argument, dimension, group) of every tensor argument dimension on them, `outputs` the (output,
    dimension, group) of fn's outputs' dimensions on them, `static` why other candidates stay fixed."""

    groups: tuple[tuple[str, ...], ...]
    dims: tuple[tuple[int, int, int], ...]
    outputs: tuple[tuple[int, int, int], ...]
    static: tuple[tuple[str, str], ...] = ()

    @property
    def axes(self) -> frozenset[str]:
        return frozenset(a for g in self.groups for a in g)

    def of(self, args) -> tuple[int, ...] | None:
        """Each group's length in a call, or None where the call's dimensions of one group differ."""
        out: list[int | None] = [None] * len(self.groups)
        for pos, d, g in self.dims:
            n = args[pos].shape[d]
            if out[g] is None:
                out[g] = n
            elif out[g] != n:
                return None
        return tuple(out)


def resolve(c0: Captured, spec, example, stats=None) -> Lengths:
    """The dynamic axes of capture `c0` (of fn at `example`): `spec` True (every dimension that can
    be) or {argument index: [dimensions]} (each must be: NotDynamic otherwise). Each probe capture
    is counted in `stats.captures`."""
    def probe(groups, only=None):
        if stats is not None:
            stats.captures += 1
        return _probe(c0, example, groups, maps, only)

    p0 = c0.program
    maps = {b.position: arg_axes(b, p0) for b in c0.args if b.is_tensor}
    named: dict[str, str] = {}  # axis → how the user named it
    if not (spec is True or isinstance(spec, dict)):
        raise NeptuneError(f"dynamic={spec!r}: expected True or a dict {{argument index: [dimensions]}}")
    if spec is True:  # every axis but the innermost dimension of a matrix (a head or model dimension)
        inner = {axes[-1] for axes in maps.values() if axes is not None and len(axes) >= 2}
        for axes in maps.values():
            for a in axes or ():
                if a is not None and a not in inner:
                    named.setdefault(a, "")
    else:
        for pos, dims in dict(spec).items():
            b = c0.args[pos] if isinstance(pos, int) and 0 <= pos < len(c0.args) else None
            if b is None or not b.is_tensor:
                raise NeptuneError(f"dynamic={spec!r}: argument {pos!r} is not a tensor argument of the function")
            for d in dims:
                what = f"dimension {d} of argument '{b.parameter}'"
                if not -len(b.shape) <= d < len(b.shape):
                    raise NeptuneError(f"dynamic: {what} does not exist (shape {b.shape})")
                axes = maps.get(pos)
                a = axes[d] if axes is not None else None
                if a is None:
                    why = ("has length 1 in the example (a size-1 dimension broadcasts; give an example of length "
                           "≥ 2)" if b.shape[d] == 1 else "is reshaped with others inside the function")
                    raise NotDynamic(f"dynamic: {what} {why}")
                named.setdefault(a, what)
    groups: list[tuple[str, ...]] = []
    static: list[tuple[str, str]] = []
    taken: set[str] = set()
    for a in [a for a in p0.axes if a in named]:
        if a in taken:
            continue
        same = tuple(x for x in p0.axes if x not in taken and p0.axes[x] == p0.axes[a])
        why = None
        for group in dict.fromkeys([(a,), same]):
            why = probe([*groups, group], only=len(groups))
            if why is None:
                groups.append(group)
                taken.update(group)
                break
        if why is not None:
            if named[a]:
                raise NotDynamic(f"dynamic: {named[a]} (axis '{a}') cannot change length: {why}")
            static.append((a, why))
    if len(groups) > 1:
        why = probe(groups)
        if why is not None:
            raise NotDynamic(f"dynamic: axes {groups} cannot change length together: {why}")
    index = {a: g for g, group in enumerate(groups) for a in group}
    dims = tuple((pos, d, index[a]) for pos, axes in maps.items() for d, a in enumerate(axes or ()) if a in index)
    if groups and stats is not None:
        stats.captures += 1
    outs = _output_dims(c0, example, groups, maps) if groups else ()
    return Lengths(tuple(groups), dims, outs, tuple(static))


def _moved(c0: Captured, groups, only: int | None = None) -> dict[str, int]:
    """New extents for a probe: group g (or only group `only`) moves by 3 + 2g, clear of every other extent."""
    taken = set(c0.program.axes.values())
    out: dict[str, int] = {}
    for g, group in enumerate(groups):
        if only is not None and g != only:
            continue
        n = c0.program.axes[group[0]] + 3 + 2 * g
        while n in taken:
            n += 1
        taken.add(n)
        out.update({a: n for a in group})
    return out


def _probe_args(c0: Captured, example, maps, moved: dict[str, int]) -> list:
    args = list(example)
    for pos, axes in maps.items():
        if axes is None or not any(a in moved for a in axes):
            continue
        x = example[pos]
        shape = [moved.get(a, n) if a is not None else n for a, n in zip(axes, x.shape)]
        args[pos] = torch.empty(shape, dtype=x.dtype, device=x.device)  # values are never read: traced fake
    return args


def _probe(c0: Captured, example, groups, maps, only: int | None = None) -> str | None:
    """Why fn's program is not the same with `groups` moved (None: it is)."""
    moved = _moved(c0, groups, only)
    try:
        with _quiet():
            c1 = capture(c0.fn, *_probe_args(c0, example, maps, moved), name=c0.program.name, merge=False)
    except NeptuneError as e:
        return f"the function does not trace at other lengths of it ({str(e).splitlines()[0]})"
    return _difference(c0, c1, moved, maps)


@contextlib.contextmanager
def _quiet():
    """A probe that fails to trace is an answer, not an error to log (fake tensors log their own)."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _readable(line: str) -> str:
    """A line of exact program text with its hexadecimal floats written as decimals."""
    return re.sub(r"-?0x[0-9a-f.]+p[+-]\d+", lambda m: f"{float.fromhex(m.group(0)):g}", line)


def _difference(c0: Captured, c1: Captured, moved: dict[str, int], maps) -> str | None:
    try:
        want = c0.program.with_extents(moved).text(exact=True).splitlines()
    except ir.ProgramError as e:  # another axis reads a tensor along it: they must move together
        return f"it is tied to another axis ({e})"
    got = c1.program.text(exact=True).splitlines()
    if want != got:
        k = next((k for k, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
        a = _readable(want[k]) if k < len(want) else "(nothing)"
        b = _readable(got[k]) if k < len(got) else "(nothing)"
        return f"the program depends on its length (at {_lengths(moved)} it reads `{b.strip()}` for `{a.strip()}`)"
    if {b.position: arg_axes(b, c1.program) for b in c1.args if b.is_tensor} != maps:
        return "the function reshapes an argument by its length"
    key = [(c.op, str(c.index), c.size, c.wraps, c.ignore) for c in c0.index_checks]
    if key != [(c.op, str(c.index), c.size, c.wraps, c.ignore) for c in c1.index_checks] or any(
            set(moved) & (set(c.program.axes) if c.program is not None else composed(c)) for c in c0.index_checks):
        return "an index check depends on it (a gather or index along it)"
    if (c0.structure, c0.mutations, c0.output_dtypes) != (c1.structure, c1.mutations, c1.output_dtypes):
        return "what the function returns depends on it"
    if {n: t.shape for n, t in c0.constants.items()} != {n: t.shape for n, t in c1.constants.items()}:
        return "a tensor the function reads from its environment depends on it"
    return None


def _lengths(moved: dict[str, int]) -> str:
    return ", ".join(f"{a}={n}" for a, n in moved.items())


def _output_dims(c0: Captured, example, groups, maps) -> tuple[tuple[int, int, int], ...]:
    """(output, dimension, group) of the output dimensions on a dynamic axis, from one more capture
    with every group moved (checked to be the same program by resolve)."""
    moved = _moved(c0, groups)
    c1 = capture(c0.fn, *_probe_args(c0, example, maps, moved), name=c0.program.name, merge=False)
    length = {moved[g[0]]: k for k, g in enumerate(groups)}
    out = []
    for k, (s0, s1) in enumerate(zip(c0.output_shapes, c1.output_shapes)):
        for d, (n0, n1) in enumerate(zip(s0, s1)):
            if n0 == n1:
                continue
            g = length.get(n1)
            if g is None or c0.program.axes[groups[g][0]] != n0:
                raise NotDynamic(f"dynamic: dimension {d} of output {k} changes from {n0} to {n1} when the lengths "
                                 f"move to {_lengths(moved)}: it is not one of them (a flatten of a dynamic axis)")
            out.append((k, d, g))
    return tuple(out)


@dataclass
class DynamicFunction:
    """A capture served at every length of its dynamic axes: one compile per bucket of lengths
    (`compile_fn(program)` compiles, with the compile cache), found again by the call's lengths."""

    captured: Captured
    lengths: Lengths
    compile_fn: object
    example: tuple  # the example's signature of every argument (shape, dtype, device) or its value
    programs: dict[tuple[int, ...], object] = field(default_factory=dict)  # bucket bounds → CompiledProgram
    op: object = None  # the torch.library op of calls dynamo traces (api._dynamic_op)
    _out_dtypes: dict = field(default_factory=dict, repr=False)
    # layout key of a call's arguments (their shapes, so the lengths) → (launcher, BoundCall or None):
    # a length called again goes straight to the kernels, as a static compile's calls do
    _bound: OrderedDict = field(default_factory=OrderedDict, repr=False)
    # bucket bounds → {the groups' ranges: the compiled alternative run there} (plans_by_range)
    _ranged: dict = field(default_factory=dict, repr=False)
    _warm: set = field(default_factory=set, repr=False)  # buckets whose alternatives ran on CUDA

    def __post_init__(self) -> None:
        self._out_dtypes = {o.name: dt for o, dt in zip(self.captured.program.outputs, self.captured.output_dtypes)}
        dynamic = {(pos, d) for pos, d, _ in self.lengths.dims}
        self._static_dims = [(b.position, [d for d in range(len(b.shape)) if (b.position, d) not in dynamic])
                             for b in self.captured.args if b.is_tensor]
        # each argument the program reads: (position, input, the group of each input dimension or its extent)
        group = {a: g for g, axes in enumerate(self.lengths.groups) for a in axes}
        p0 = self.captured.program
        self._shapes = [(b.position, b.input, [(group.get(a), p0.axes[a]) for a in p0.inputs[b.input].axes])
                        for b in self.captured.args if b.input is not None]

    @property
    def prog(self):
        """The compile serving the example's lengths."""
        ns = [0] * len(self.lengths.groups)
        for pos, d, g in self.lengths.dims:
            ns[g] = self.example[pos][1][d]
        return self.program_for(tuple(ns))

    def serves(self, args) -> tuple[int, ...] | None:
        """The groups' lengths of a call this function serves (every other dimension, dtype, device and
        baked value as in the example; no length 1), else None."""
        if not self._like_example(args):
            return None
        ns = self.lengths.of(args)
        return ns if ns is not None and all(n >= 2 for n in ns) else None

    def traceable(self, args) -> bool:
        """Can a call dynamo traces take this function's op (`traced`)? As `serves`, a length of 1
        included, and no gradient asked (the op has no backward; a training call takes a static
        signature's op)."""
        return (self._like_example(args) and self.lengths.of(args) is not None
                and not self.captured.needs_grad(args))

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
            p0 = self.captured.program
            bound = {a: b for group, b in zip(self.lengths.groups, key) for a in group}
            prog = self.programs[key] = self.compile_fn(p0.with_extents(bound).with_dynamic(self.lengths.axes))
        if len(key) > MAX_RANGED_GROUPS:
            return prog
        ranged = self._ranged.get(key)
        if ranged is None:
            ranged = self._ranged[key] = plans_by_range(prog, self.lengths.groups, key)
        return ranged[tuple(length_range(n, b) for n, b in zip(ns, key))]

    def tuned(self, ns: tuple[int, ...], prog) -> None:
        """Run `prog` (prog.tune() measured it at lengths `ns`) for every length of ns's range of its
        bucket, in this process."""
        self.program_for(ns)
        key = tuple(bucket(n) for n in ns)
        if key in self._ranged:
            self._ranged[key][tuple(length_range(n, b) for n, b in zip(ns, key))] = prog
        else:
            self.programs[key] = prog

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

    def output_shapes(self, ns) -> list[tuple[int, ...]]:
        shapes = [list(s) for s in self.captured.output_shapes]
        for k, d, g in self.lengths.outputs:
            shapes[k][d] = ns[g]
        return [tuple(s) for s in shapes]

    def __call__(self, args, ns):
        cap = self.captured
        cap.follow_environment()
        inputs = None
        if cap.index_checks or cap.mutations:
            inputs = self.inputs(args, ns)
            run_checks(cap.index_checks, inputs)
            cap.check_aliases(args)
        prog = self.program_for(ns)
        layout = call_layout(cap, args) if prog.chunking is None else None  # (chunks: through run())
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
                    return cap.finish(args, hit[1](ptrs, self.output_shapes(ns)))
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
        outs = [r if r.shape == s else r.reshape(s) for r, s in zip(outs, self.output_shapes(ns))]
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
        run_checks(cap.index_checks, inputs)
        outs = op([inputs[n] for n in self.names()])
        outs = [r.reshape(s) for r, s in zip(outs, self.output_shapes(ns))]
        return cap.finish(args, outs)

    def reference(self, *args):
        """fn(*args) by the float64 reference evaluator at the call's lengths."""
        from ..reference import evaluate

        ns = self.serves(args)
        if ns is None:
            raise NeptuneError("reference(): these arguments are not served by this dynamic function")
        at = {a: n for group, n in zip(self.lengths.groups, ns) for a in group}
        inputs = self.inputs(args, ns)
        res = evaluate(self.captured.program.with_extents(at), inputs)
        outs = [res[o.name] for o in self.captured.program.outputs]
        return self.captured.structure.build([r.reshape(s) for r, s in zip(outs, self.output_shapes(ns))])

    def digest(self) -> str:
        text = f"{self.captured.program.text(exact=True)}|{self.lengths.groups}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def example_signature(args) -> tuple:
    """What a dynamic function compares a call with: ("tensor", shape, rank, dtype, device type) of
    each tensor, ("value", value) of anything else."""
    return tuple(("tensor", tuple(a.shape), a.dim(), a.dtype, a.device.type) if isinstance(a, torch.Tensor)
                 else ("value", a) for a in args)
