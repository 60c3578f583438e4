"""capture(fn, *example_inputs): trace an ordinary PyTorch function once and translate it to an
ir.Program.

    captured = capture(attn, q, k, v)
    captured.program                  # inputs q, k, v (fn's parameter names), outputs out0, out1, ...
    captured.reference(q, k, v)       # float64 result, same structure as attn(q, k, v)
    run = captured.compile()          # a CompiledFunction over neptune_eq.runtime.compile_ir
    run(q, k, v)

What a user may rely on:
- Tracing (torch.fx make_fx on fake tensors) specialises to the example shapes, dtypes and device
  kind; other shapes need a new capture. Non-tensor positional arguments are baked into the
  program and must be passed with the same value.
- Tensors fn reads from its closure, module globals or nn.Module become extra program inputs,
  named after the variable when it can be found (else const0, const1, ...); their values are kept
  on the Captured and passed automatically. Every value fn reads from its environment is guarded
  (guards.py): a compiled function re-captures when one changed (a closure tensor written in
  place only has its copies refreshed); `reference` raises StaleCapture.
- fn may return any structure of tensors (tuple, list, dict, namedtuple, nested): the same
  structure comes back; non-tensor leaves (ints, None, ...) come back as they were at capture.
- fn may write its tensor arguments in place (x.add_(1), x.copy_(y)): the compiled function
  computes their new values and copies them into the arguments after the kernels run.
- Index tensors (cross-entropy targets, gather / embedding indices, x[t]) are range-checked on
  every call as eager does (checks.py); x[t] counts negative t from the end.
- Arguments must all live on one device, CPU or CUDA. An argument or intermediate value with a
  zero-size dimension is refused (ZeroSizeCapture): there is no work to fuse; neptune_eq.compile
  evaluates fn itself for such shapes.
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch.utils import _pytree as pytree

from .. import ir
from ..grad_gather import NoBackward
from ..ir import NeptuneWarning
from ..reference import evaluate
from . import ops_index, ops_math, ops_more, ops_reduce, ops_shape
from .checks import IndexCheck, run_checks
from .guards import Guards, Held, TensorGuard, same_value
from .merge_axes import merge_reduced_axes
from .narrow_ints import guard_narrow
from .operands import InputDecl, dtype_name
from .results import Mutation, OutputStructure, find_mutations
from .scan import scan
from .sdpa import SdpaAsMath
from .source import CaptureError, SourceLocator, capture_boundary, location
from .symsizes import SizeTrace, trace_sizes
from .tracing import RESTORED, ZeroSizeCapture, check_sizes, no_warnings, trace, untouched
from .translate import Translator

HANDLERS = guard_narrow({**ops_shape.HANDLERS, **ops_math.HANDLERS, **ops_reduce.HANDLERS, **ops_index.HANDLERS,
                         **ops_more.HANDLERS}, {*ops_shape.HANDLERS, *ops_index.HANDLERS})
# operations that read a value the program narrowed without its rounding (frontend/rounding.py): moving
# values computes nothing, and a matmul rounds its operands to their dtype for the tensor cores anyway
INEXACT_READERS = frozenset({*ops_shape.HANDLERS, *ops_index.HANDLERS, *ops_reduce.CONTRACTIONS})

_DEVICE_TYPES = ("cpu", "cuda")


class StaleCapture(ir.NeptuneError):
    """A value the function read from its environment changed since it was captured. (No
    constructor of its own: dynamo traces raising it.)"""


@dataclass(frozen=True)
class ArgBinding:
    """How fn's positional argument `position` reaches the program: a tensor becomes input `input`
    (reshaped to the input's shape: size-1 dimensions are not program axes; None if the program
    does not read it), any other value is baked in (`static`)."""

    position: int
    parameter: str
    input: str | None
    shape: tuple[int, ...] | None = None  # the example's shape (tensors)
    static: object = None  # the example's value (non-tensors)
    program_shape: tuple[int, ...] | None = None  # the shape of input `input` (where it differs from `shape`)
    contiguous: bool = False  # fn reads its storage (as_strided): a call must pass it contiguous

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None


@dataclass
class Captured:
    """A traced function: its program and how to call it like the function.

    `args` says where each positional argument of fn goes (`inputs(*args)` builds the program's
    input dict), `constants` holds the values of extra inputs fn read from its environment,
    `structure` rebuilds fn's return value from the program's outputs (out0, out1, ...; the
    `mutations`' new argument values come after fn's own outputs), `index_checks` are run on every
    call, `guards` say whether the environment still holds. Valid for the example shapes only.
    """

    program: ir.Program
    args: tuple[ArgBinding, ...]
    constants: dict[str, torch.Tensor]  # extra program inputs: tensors read from fn's closure
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[torch.dtype, ...]
    structure: OutputStructure
    graph: torch.fx.GraphModule = field(repr=False, default=None)
    fn: Callable | None = field(repr=False, default=None)
    guards: Guards = field(repr=False, default_factory=Guards)
    index_checks: tuple[IndexCheck, ...] = ()
    mutations: tuple[Mutation, ...] = ()
    grad_off: str | None = None  # where fn turns gradients off (no gradient is derived for such a call)
    # a dynamic capture's sizes (frontend/symsizes.py) and the size symbol of each (argument, dimension)
    sizes: SizeTrace | None = field(repr=False, default=None)
    size_of: dict = field(repr=False, default_factory=dict)
    extents: dict = field(repr=False, default_factory=dict)  # program axis → its symbolic extents (Translation)
    # str(device) -> `constants` there (see _constants_on)
    _device_constants: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    # ---------------------------------------------------------------- binding
    def needs_grad(self, args) -> bool:
        """Autograd would ask for a gradient of this call: grad mode is on and an argument or a tensor
        fn reads from its environment (a module's parameter) requires grad."""
        if not torch.is_grad_enabled():
            return False
        needs = (any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
                 or any(t.requires_grad for t in self.constants.values()))
        if needs and self.grad_off is not None:
            raise NoBackward(f"{self.program.name}: the function turns gradients off inside ({self.grad_off}), "
                             "which the compiled function cannot see; detach the values instead (x.detach())")
        return needs

    def inputs(self, *args, cached: bool = True) -> dict[str, torch.Tensor]:
        """The program's inputs for a call fn(*args) (checked against the example shapes; all on one
        device, CPU or CUDA); closure tensors come from copies kept per device unless not `cached`."""
        if len(args) != len(self.args):
            raise CaptureError(f"captured function takes {len(self.args)} positional arguments, got {len(args)}")
        out: dict[str, torch.Tensor] = {}
        first = None
        for b, a in zip(self.args, args):
            if not b.is_tensor:
                if isinstance(a, torch.Tensor) or not same_value(a, b.static):
                    raise CaptureError(
                        f"argument '{b.parameter}' was captured as the constant {b.static!r}; got {a!r} "
                        "(capture again for other values)"
                    )
                continue
            if not isinstance(a, torch.Tensor):
                raise CaptureError(f"argument '{b.parameter}' must be a tensor, got {type(a).__name__}")
            if a.shape != b.shape:
                raise CaptureError(
                    f"argument '{b.parameter}' has shape {tuple(a.shape)}; the function was captured for "
                    f"{b.shape} (capture again for other shapes)"
                )
            first = _same_device(first, b.parameter, a)
            if b.contiguous and not a.is_contiguous():
                raise CaptureError(f"argument '{b.parameter}' is read with as_strided (its storage, in the "
                                   "layout it was captured with): pass it contiguous (.contiguous())")
            if b.input is not None:
                out[b.input] = a if b.program_shape is None else a.reshape(b.program_shape)
        device = next((t.device for t in out.values()), None)
        if cached:
            out.update(self._constants_on(device))
        else:
            out.update((name, t.reshape(self.program.input_shape(name)).to(device or t.device))
                       for name, t in self.constants.items())
        return out

    def _constants_on(self, device) -> dict[str, torch.Tensor]:
        """The closure constants on `device`, copied there once (a copy per call would synchronise)."""
        key = str(device)
        if key not in self._device_constants:
            self._device_constants[key] = {name: t.reshape(self.program.input_shape(name)).to(device or t.device)
                                           for name, t in self.constants.items()}
        return self._device_constants[key]

    def follow_environment(self) -> None:
        """Raise StaleCapture if a value fn read from its environment changed since capture; where
        only closure tensors the program reads were written in place, refresh their copies."""
        changed = self.guards.check()
        if changed is None:
            return
        if changed.stale:
            raise StaleCapture(f"{changed.describe()} since the function was captured (capture it again)")
        for copies in self._device_constants.values():
            for name, dst in copies.items():
                src = self.constants[name].reshape(dst.shape)
                if dst.data_ptr() != src.data_ptr():  # a view of the tensor itself needs nothing
                    dst.copy_(src)  # in place: bound launches keep the address
        self.guards.accept()

    def check_aliases(self, args) -> None:
        """A written argument must not share memory with another argument: eager would see the write.
        Nor may it require grad: the backward reads the value the call overwrites (refused, naming it)."""
        for m in self.mutations:
            if torch.is_grad_enabled() and args[m.position].requires_grad:
                raise NoBackward(f"argument '{m.parameter}' is written in place by {self.program.name} and "
                                 "requires grad: no gradient flows through an in-place write (write a new tensor)")
            mem = args[m.position].untyped_storage().data_ptr()
            for b, a in zip(self.args, args):
                if b.position != m.position and b.is_tensor and a.untyped_storage().data_ptr() == mem:
                    raise CaptureError(f"argument '{m.parameter}' is written in place and shares memory with "
                                       f"argument '{b.parameter}'; pass separate tensors")

    def finish(self, args, outs: list[torch.Tensor]):
        """fn's return value from the program's outputs (in fn's shapes), after writing the new
        values of the arguments fn writes in place into them."""
        for m in self.mutations:
            args[m.position].copy_(outs[m.output])
        return self.structure.build(outs)

    def outputs(self, results: dict[str, torch.Tensor]):
        """fn's return structure from the program's output tensors (by output name); the new values
        of written arguments are not applied."""
        outs = [results[o.name] for o in self.program.outputs]
        outs = [r if r.shape == shape else r.reshape(shape) for r, shape in zip(outs, self.output_shapes)]
        return self.structure.build(outs)

    # ---------------------------------------------------------------- running
    def call_with(self, run_program: Callable, args, checks: Callable | None = None):
        """fn(*args) with the program run by `run_program(inputs) -> {output name: tensor}` (the
        custom op of a call dynamo traces, or of a call that needs gradients): the same checks as a
        compiled call, run by `checks(inputs)` where given (a compiled function's, replayed from a
        CUDA graph per layout: a DPO training step had spent 0.37 ms of host time a call evaluating
        its label checks eagerly, H200). A changed environment cannot be captured again while dynamo
        traces: it raises StaleCapture; closure tensors are read afresh (a traced graph keeps no copy
        to refresh)."""
        changed = self.guards.check()
        if changed is not None and changed.stale:  # (a constant message: dynamo traces this)
            raise StaleCapture("a value the function reads from its environment changed since it was captured; "
                               "call the compiled function once outside torch.compile to capture it again")
        inputs = self.inputs(*args, cached=False)
        if self.index_checks:
            (checks or (lambda xs: run_checks(self.index_checks, xs)))(inputs)
        self.check_aliases(args)
        results = run_program(inputs)
        outs = [results[o.name].reshape(shape) for o, shape in zip(self.program.outputs, self.output_shapes)]
        return self.finish(args, outs)

    def reference(self, *args):
        """fn(*args) computed by the float64 reference evaluator of the program (float64 results).
        Raises StaleCapture if fn's environment changed, IndexOutOfRange for bad indices."""
        self.follow_environment()
        inputs = self.inputs(*args)
        run_checks(self.index_checks, inputs)
        return self.outputs(evaluate(self.program, inputs))

    def again(self, *args) -> Captured:
        """fn captured anew at `args` (after its environment changed)."""
        if self.fn is None:
            raise StaleCapture("the captured function is not known: capture it again")
        return capture(self.fn, *args, name=self.program.name)

    def compile(self, options=None) -> CompiledFunction:
        """Compile the program with neptune_eq.runtime.compile_ir; the result is called like fn and
        re-captures (and compiles again) when fn's environment changes."""
        from ..runtime import compile_ir

        return CompiledFunction(self, compile_ir(self.program, options),
                                recompile=lambda program: compile_ir(program, options))


def _same_device(first, name: str, t: torch.Tensor):
    """(name, device) of the first tensor argument; raises for a device other than CPU/CUDA or mixed."""
    if t.device.type not in _DEVICE_TYPES:
        raise CaptureError(f"argument '{name}' is on device '{t.device}'; neptune_eq runs on CPU or CUDA tensors")
    if first is None:
        return name, t.device
    if t.device != first[1]:
        raise CaptureError(f"argument '{name}' is on device '{t.device}' but argument '{first[0]}' is on "
                           f"'{first[1]}'; pass every tensor on one device")
    return first


# ---------------------------------------------------------------- capture


def capture(fn: Callable, *example_inputs, name: str | None = None, merge: bool = True,
            symbolic_lengths: bool = False) -> Captured:
    """Trace `fn(*example_inputs)` once and translate it to an ir.Program.

    Program inputs are named after fn's parameters (positional ones; *args get `name0`, `name1`);
    outputs are out0, out1, ... for the tensors fn returns (in pytree order), then the new values of
    the arguments fn writes in place. Raises CaptureError (a NeptuneError) naming the unsupported
    operation and the user's `file.py:line: code`. With `merge`, neighbouring dimensions reduced
    together are one axis of the program (merge_axes; a dynamic capture keeps every dimension). With
    `symbolic_lengths` (a dynamic capture) a length the translation introduces — a mean's divisor, the
    count of a sum over a broadcast dimension — is `len(axis)` rather than a number.
    """
    params = _parameter_names(fn, len(example_inputs))
    static = {k: a for k, a in enumerate(example_inputs) if not isinstance(a, torch.Tensor)}
    for k, a in static.items():
        if any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(a)):
            raise CaptureError(f"argument '{params[k]}' is a {type(a).__name__} holding tensors: it would be baked "
                               "in as a constant; pass its tensors as separate arguments")
    tensor_pos = [k for k in range(len(example_inputs)) if k not in static]
    first = None
    for k in tensor_pos:
        t = example_inputs[k]
        if dtype_name(t.dtype) not in ir.DTYPES:
            raise CaptureError(f"argument '{params[k]}' has unsupported dtype {t.dtype}")
        first = _same_device(first, params[k], t)
        if 0 in t.shape:
            raise ZeroSizeCapture(f"argument '{params[k]}' has shape {tuple(t.shape)}: a zero-size dimension "
                                  "leaves nothing to compute")
    env = scan(fn)  # before tracing: what fn reads now is what the trace bakes in
    for what in env.opaque:  # said, not silently stale
        warnings.warn(NeptuneWarning(f"{what} is guarded by identity only: changes to its contents after "
                                     "this capture are not seen (rebind it, or pass the values as arguments)"),
                      stacklevel=3)
    tensors = _distinct([example_inputs[k] for k in tensor_pos])
    returned: list = []  # fn's return structure, recorded while tracing

    locator = SourceLocator()

    @capture_boundary  # (a frame outside this one is not fn's: an error is never located there)
    def traced(*ts):
        args = list(example_inputs)
        for k, t in zip(tensor_pos, ts):
            args[k] = t
        with locator, SdpaAsMath():
            out = fn(*args)
        leaves, spec = pytree.tree_flatten(out)
        returned[:] = [spec, leaves]
        return [x for x in leaves if isinstance(x, torch.Tensor)]

    small = {id(g.tensor): g.tensor.detach().clone() for g in env.guards.tensors if g.tensor.numel() <= RESTORED}
    gm = trace(traced, tensors)
    untouched(env.guards.tensors, small)
    check_sizes(gm)
    spec, leaves = returned
    # (on contiguous copies: a view's strides — a KV cache k_cache[:, :, :S] — gave the symbolic trace
    # tests of strides against sizes that no length proof could hold, and its lengths stayed static)
    def symbolic():
        with no_warnings():
            return trace(traced, [t.contiguous() for t in tensors], mode="symbolic")

    sizes = trace_sizes(symbolic, gm) if symbolic_lengths else None
    mutations = find_mutations(gm, [params[k] for k in tensor_pos], tensor_pos, example_inputs)
    constants = _constants(gm, env.names, taken=set(params))
    decls = [InputDecl(params[k], t.dtype) for k, t in zip(tensor_pos, tensors)]
    tx = Translator(gm.graph, decls, constants, HANDLERS, name=name or _function_name(fn),
                    inexact_readers=INEXACT_READERS, symbolic_lengths=symbolic_lengths, sizes=sizes)
    tr = tx.run()
    if merge:
        tr = replace(tr, program=merge_reduced_axes(tr.program))
    used = set(tr.program.inputs)
    bindings = tuple(
        ArgBinding(k, params[k], None, static=example_inputs[k]) if k in static
        else ArgBinding(k, params[k], params[k] if params[k] in used else None, tuple(example_inputs[k].shape),
                        program_shape=_reshaped(tr.program, params[k], example_inputs[k].shape),
                        contiguous=params[k] in tx.storage_reads)
        for k in range(len(example_inputs))
    )
    structure = OutputStructure.of(spec, leaves)
    kept = {target: name in used for target, (name, _) in constants.items()}
    guards = env.guards
    for g in guards.tensors:  # a closure tensor the program reads: written in place, refresh the copies
        g.refresh = any(kept[target] and value is g.tensor for target, (_, value) in constants.items())
    seen = {id(g.tensor) for g in guards.tensors}
    for target, (cname, value) in constants.items():  # every other lifted tensor: its version
        if id(value) not in seen:
            guards.tensors.append(TensorGuard(Held(value, f"captured tensor '{cname}'"), value, value._version,
                                              refresh=kept[target]))
    return Captured(
        program=tr.program,
        args=bindings,
        constants={name: value for name, value in constants.values() if name in used},
        output_shapes=tuple(tr.output_shapes),
        output_dtypes=tuple(tr.output_dtypes),
        structure=structure,
        graph=gm,
        fn=fn,
        guards=guards,
        index_checks=tr.checks,
        mutations=mutations,
        grad_off=locator.grad_off,
        sizes=sizes.hold(tx.written_sizes) if sizes is not None else None,
        size_of=_size_symbols(sizes, example_inputs, tensor_pos, tensors),
        extents=tr.extents,
    )


def _size_symbols(sizes: SizeTrace | None, example_inputs, tensor_pos, tensors) -> dict:
    """(argument position, dimension) → its size symbol in `sizes` (the traced tensors are the distinct
    arguments: one passed twice is one placeholder)."""
    if sizes is None:
        return {}
    by = {(p, d): s for s, (p, d) in sizes.sizes.items()}
    out = {}
    for k in tensor_pos:
        p = next(i for i, t in enumerate(tensors) if t is example_inputs[k])
        for d in range(example_inputs[k].dim()):
            if (p, d) in by:
                out[(k, d)] = by[(p, d)]
    return out


def _reshaped(program: ir.Program, name: str, shape) -> tuple[int, ...] | None:
    """The program's shape of input `name` where it differs from the argument's `shape`, else None."""
    if name not in program.inputs:
        return None
    want = program.input_shape(name)
    return None if tuple(shape) == want else want


def _function_name(fn) -> str:
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    name = getattr(inspect.unwrap(fn), "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)
    return re.sub(r"\W", "_", name) if name else "captured"


def _parameter_names(fn, n: int) -> list[str]:
    if isinstance(fn, torch.nn.Module):
        fn = fn.forward
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return [f"arg{k}" for k in range(n)]
    names: list[str] = []
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            names += [f"{p.name}{k}" for k in range(n - len(names))]
            break
    if len(names) < n:
        raise CaptureError(f"{getattr(fn, '__name__', fn)} takes {len(names)} positional arguments, got {n}")
    return names[:n]


def _distinct(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Tracing identifies arguments by object: the same tensor passed twice is cloned for the second."""
    seen: set[int] = set()
    out = []
    for t in tensors:
        out.append(t.clone() if id(t) in seen else t)
        seen.add(id(t))
    return out


def _constants(gm, names: dict[int, str], taken: set[str]) -> dict[str, tuple[str, torch.Tensor]]:
    """get_attr target -> (program input name, value) for tensors captured from fn's environment
    (`names`: a variable name for each tensor found there, by id)."""
    out: dict[str, tuple[str, torch.Tensor]] = {}
    used = set(taken)
    counter = 0
    for node in gm.graph.nodes:
        if node.op != "get_attr" or node.target in out:
            continue
        value = getattr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            raise CaptureError(f"unsupported captured value {node.target}")
        name = names.get(id(value))
        if name is None or name in used:
            while f"const{counter}" in used:
                counter += 1
            name = f"const{counter}"
        if value.device.type not in _DEVICE_TYPES:
            raise CaptureError(f"the function reads tensor '{name}' on device '{value.device}'; neptune_eq runs on "
                               "CPU or CUDA tensors", location(next(iter(node.users), None)))
        used.add(name)
        out[node.target] = (name, value)
    return out


from .compiled import CompiledFunction  # noqa: E402  (it calls back into Captured)

__all__ = ["ArgBinding", "Captured", "CompiledFunction", "Mutation", "OutputStructure", "StaleCapture",
           "ZeroSizeCapture", "capture"]
