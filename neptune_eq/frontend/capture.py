"""capture(fn, *example_inputs): trace an ordinary PyTorch function once and translate it to an
ir.Program.

    captured = capture(attn, q, k, v)
    captured.program                  # inputs q, k, v (fn's parameter names), outputs out0, out1, ...
    captured.reference(q, k, v)       # float64 result, same structure as attn(q, k, v)
    run = captured.compile()          # neptune_eq.runtime.compile_ir(captured.program)
    run(q, k, v)

Tracing (torch.fx make_fx on fake tensors) specialises to the example shapes and dtypes: calling
with the example shapes does not trace again, other shapes need a new capture. Non-tensor
positional arguments (ints, floats, ...) are baked into the program and must be passed with the
same value. Tensors the function reads from its closure or module globals become extra program
inputs, named after the variable when it can be found (else const0, const1, ...); their values
are kept on the Captured and passed automatically.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch._decomp import get_decompositions
from torch.func import functionalize
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from .. import ir
from ..reference import evaluate
from . import ops_index, ops_math, ops_reduce, ops_shape
from .source import CaptureError, SourceLocator, describe, in_torch, is_internal
from .translate import InputDecl, Translator, dtype_name

HANDLERS = {**ops_shape.HANDLERS, **ops_math.HANDLERS, **ops_reduce.HANDLERS, **ops_index.HANDLERS}

# fused kernels (SDPA on CPU, layer/RMS norm) and activations are traced as their math
_aten = torch.ops.aten
_DECOMPOSITIONS = get_decompositions([
    _aten._scaled_dot_product_flash_attention_for_cpu.default, _aten.native_layer_norm.default,
    _aten._fused_rms_norm.default, _aten.silu.default, _aten.gelu.default,
])


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

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None


@dataclass
class Captured:
    """A traced function: its program and how to call it like the function.

    `args` says where each positional argument of fn goes (`inputs(*args)` builds the program's
    input dict), `constants` holds the values of extra inputs fn read from its environment, and
    `outputs(results)` turns the program's outputs (out0, out1, ...) back into fn's return value: a
    tensor, or a tuple when fn returned a tuple or list. Valid for the example shapes only.
    """

    program: ir.Program
    args: tuple[ArgBinding, ...]
    constants: dict[str, torch.Tensor]  # extra program inputs: tensors read from fn's closure
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[torch.dtype, ...]
    returns_tuple: bool
    graph: torch.fx.GraphModule = field(repr=False, default=None)
    # str(device) -> `constants` there (see _constants_on)
    _device_constants: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    # ---------------------------------------------------------------- binding
    def inputs(self, *args) -> dict[str, torch.Tensor]:
        """The program's inputs for a call fn(*args) (checked against the example shapes)."""
        if len(args) != len(self.args):
            raise CaptureError(f"captured function takes {len(self.args)} positional arguments, got {len(args)}")
        out: dict[str, torch.Tensor] = {}
        for b, a in zip(self.args, args):
            if not b.is_tensor:
                if isinstance(a, torch.Tensor) or a != b.static:
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
            if b.input is not None:
                out[b.input] = a if b.program_shape is None else a.reshape(b.program_shape)
        device = next((t.device for t in out.values()), None)
        out.update(self._constants_on(device))
        return out

    def _constants_on(self, device) -> dict[str, torch.Tensor]:
        """The closure constants on `device`, copied there once (a copy per call would synchronise)."""
        key = str(device)
        if key not in self._device_constants:
            self._device_constants[key] = {name: t.reshape(self.program.input_shape(name)).to(device or t.device)
                                           for name, t in self.constants.items()}
        return self._device_constants[key]

    def outputs(self, results: dict[str, torch.Tensor]):
        """fn's return structure from the program's output tensors (by output name)."""
        outs = [results[o.name] for o in self.program.outputs]
        outs = [r if r.shape == shape else r.reshape(shape) for r, shape in zip(outs, self.output_shapes)]
        return tuple(outs) if self.returns_tuple else outs[0]

    # ---------------------------------------------------------------- running
    def reference(self, *args):
        """fn(*args) computed by the float64 reference evaluator of the program (float64 results)."""
        return self.outputs(evaluate(self.program, self.inputs(*args)))

    def compile(self, options=None) -> CompiledFunction:
        """Compile the program with neptune_eq.runtime.compile_ir; the result is called like fn."""
        from ..runtime import compile_ir

        return CompiledFunction(self, compile_ir(self.program, options))


@dataclass
class CompiledFunction:
    """A compiled capture: call it with fn's arguments; outputs come back in fn's dtypes."""

    captured: Captured
    compiled: object  # neptune_eq.runtime.CompiledProgram
    # the kernels store straight into outputs of fn's dtypes (no conversion pass afterwards)
    _out_dtypes: dict[str, torch.dtype] = field(init=False, repr=False)
    # layout key of the arguments (see _layout) → (launcher, BoundCall or None): the fast path
    _bound: dict = field(init=False, repr=False, default_factory=dict)
    _order: list[str] = field(init=False, repr=False)  # program inputs in argument order

    def __post_init__(self) -> None:
        self._out_dtypes = {o.name: dt for o, dt in zip(self.captured.program.outputs, self.captured.output_dtypes)}
        self._order = [b.input for b in self.captured.args if b.input is not None]

    def __call__(self, *args):
        layout = self._layout(args)
        fresh = False
        if layout is not None:
            key, ptrs = layout
            launcher = self.compiled.launcher("cuda")  # replaced when the schedules change
            hit = self._bound.get(key)
            if hit is not None and hit[0] is launcher:
                if hit[1] is not None:
                    outs = hit[1](ptrs, self.captured.output_shapes)
                    return tuple(outs) if self.captured.returns_tuple else outs[0]
            else:
                fresh = True
        inputs = self.captured.inputs(*args)
        result = self.captured.outputs(self.compiled.run(inputs, self._out_dtypes))
        if fresh:
            # checked and launched once for this layout: later calls go straight to the kernels
            # (unless an input had to be copied to reach the program's shape)
            views = all(inputs[name].data_ptr() == p for name, p in zip(self._order, ptrs))
            self._bound[key] = (launcher, launcher.bind(inputs, self._order, self._out_dtypes) if views else None)
        return result

    def _layout(self, args) -> tuple[tuple, list[int]] | None:
        """(key, input addresses) of a call on CUDA tensors: the key holds everything the checks and
        the kernels' specialisation depend on (shape, dtype, device, strides, 16-byte alignment of
        each tensor, the baked-in values); None for anything else (the checked path reports it)."""
        if len(args) != len(self.captured.args):
            return None
        key, ptrs = [], []
        for b, a in zip(self.captured.args, args):
            if not b.is_tensor:
                if isinstance(a, torch.Tensor) or a != b.static:
                    return None
                continue
            if not isinstance(a, torch.Tensor) or not a.is_cuda:
                return None
            p = a.data_ptr()
            key.append((a.shape, a.dtype, a.device, a.stride(), p % 16 == 0))
            if b.input is not None:
                ptrs.append(p)
        return tuple(key), ptrs


# ---------------------------------------------------------------- capture


def _reshaped(program: ir.Program, name: str, shape) -> tuple[int, ...] | None:
    """The program's shape of input `name` where it differs from the argument's `shape`, else None."""
    if name not in program.inputs:
        return None
    want = program.input_shape(name)
    return None if tuple(shape) == want else want


def capture(fn: Callable, *example_inputs, name: str | None = None) -> Captured:
    """Trace `fn(*example_inputs)` once and translate it to an ir.Program.

    Program inputs are named after fn's parameters (positional ones; *args get `name0`, `name1`);
    outputs are out0, out1, ... in the order fn returns them (a tensor or a tuple/list of tensors).
    Raises CaptureError (a NeptuneError) naming the unsupported operation and the user's
    `file.py:line: code`.
    """
    params = _parameter_names(fn, len(example_inputs))
    static = {k: a for k, a in enumerate(example_inputs) if not isinstance(a, torch.Tensor)}
    tensor_pos = [k for k in range(len(example_inputs)) if k not in static]
    tensors = _distinct([example_inputs[k] for k in tensor_pos])
    for k, t in zip(tensor_pos, tensors):
        if dtype_name(t.dtype) not in ir.DTYPES:
            raise CaptureError(f"argument '{params[k]}' has unsupported dtype {t.dtype}")

    def traced(*ts):
        args = list(example_inputs)
        for k, t in zip(tensor_pos, ts):
            args[k] = t
        with SourceLocator():
            return fn(*args)

    gm = _trace(traced, tensors)
    out_val = _output_value(gm)
    constants = _constants(gm, fn, taken=set(params))
    decls = [InputDecl(params[k], t.dtype) for k, t in zip(tensor_pos, tensors)]
    tx = Translator(gm.graph, decls, constants, HANDLERS, name=name or _function_name(fn))
    tr = tx.run()
    used = set(tr.program.inputs)
    bindings = tuple(
        ArgBinding(k, params[k], None, static=example_inputs[k]) if k in static
        else ArgBinding(k, params[k], params[k] if params[k] in used else None, tuple(example_inputs[k].shape),
                        program_shape=_reshaped(tr.program, params[k], example_inputs[k].shape))
        for k in range(len(example_inputs))
    )
    return Captured(
        program=tr.program,
        args=bindings,
        constants={name: value for name, value in constants.values() if name in used},
        output_shapes=tuple(tr.output_shapes),
        output_dtypes=tuple(tr.output_dtypes),
        returns_tuple=isinstance(out_val, tuple | list),
        graph=gm,
    )


def _trace(traced, tensors) -> torch.fx.GraphModule:
    try:
        with fx_traceback.preserve_node_meta():
            # functionalize: in-place updates (s.masked_fill_(...), s += b) become value semantics
            return make_fx(functionalize(traced, remove="mutations"), tracing_mode="fake",
                           decomposition_table=_DECOMPOSITIONS, _allow_non_fake_inputs=True)(*tensors)
    except CaptureError:
        raise
    except Exception as e:  # tracing runs user code: say where it failed
        where = _failure_location(e)
        first = (str(e).strip().splitlines() or [""])[0]
        if "data-dependent" in str(e) or "DataDependent" in type(e).__name__:
            raise CaptureError("control flow or shapes that depend on tensor values are not supported (the "
                               f"function is traced once, on fake tensors): {first}", where) from e
        raise CaptureError(f"tracing failed: {type(e).__name__}: {first}", where) from e


def _failure_location(e: BaseException) -> str | None:
    tb = e.__traceback__
    last = None
    while tb is not None:
        if not is_internal(tb.tb_frame.f_code.co_filename):
            last = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return describe(*last) if last else None


def _function_name(fn) -> str:
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    name = getattr(inspect.unwrap(fn), "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)
    return re.sub(r"\W", "_", name) if name else "captured"


def _output_value(gm):
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return out.args[0]


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


def _constants(gm, fn, taken: set[str]) -> dict[str, tuple[str, torch.Tensor]]:
    """get_attr target -> (program input name, value) for tensors captured from fn's environment."""
    names = _environment_names(fn)
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
        used.add(name)
        out[node.target] = (name, value)
    return out


def _environment_names(fn) -> dict[int, str]:
    """id(tensor) -> variable name for tensors in fn's closure and referenced globals (and those of
    the callables found there, one level deep: FlexAttention's score_mod/mask_mod)."""
    found: dict[int, str] = {}

    def scan(f, depth: int) -> None:
        f = inspect.unwrap(f) if callable(f) else f
        while hasattr(f, "func"):  # functools.partial
            f = f.func
        code = getattr(f, "__code__", None)
        if code is None or in_torch(code.co_filename):
            return
        env = {k: c.cell_contents for k, c in zip(code.co_freevars, f.__closure__ or ()) if _has(c)}
        env.update({k: f.__globals__[k] for k in code.co_names if k in getattr(f, "__globals__", {})})
        for k, v in env.items():
            if isinstance(v, torch.Tensor):
                found.setdefault(id(v), k)
            elif depth > 0 and callable(v) and not isinstance(v, type):
                scan(v, depth - 1)

    if isinstance(fn, torch.nn.Module):
        for name, t in [*fn.named_parameters(), *fn.named_buffers()]:
            name = re.sub(r"\W", "_", name)
            found.setdefault(id(t), f"p{name}" if name[0].isdigit() else name)
        fn = fn.forward
    scan(fn, 2)
    return found


def _has(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


__all__ = ["ArgBinding", "Captured", "CompiledFunction", "capture"]
