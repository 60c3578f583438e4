"""Loading generated modules and launching their kernels on torch tensors.

The generated source is executed from memory (a copy named by its hash is written under the cache
directory for tools to read, never read back); on a CPU the kernels run through Triton's interpreter.
"""

from __future__ import annotations

import hashlib
import linecache
import math
import os
import stat
import sys
import types
import warnings
from pathlib import Path

import torch

from .. import ir
from .._interpret import quiet_ieee, require_interpreter
from ..cachedir import cache_dir as cache_dir_at
from ..cachedir import default_cache_dir
from ..ir import NeptuneError, NeptuneWarning
from ..plan import Plan
from .bound import BoundCall
from .buffers import TORCH_DTYPES, Buffers
from .databounds import bound_tensor, evaluation_box
from .library import LibraryGemm, run_gemm
from .replay import MAX_ELEMENTS, STAGED_ELEMENTS, Replayer, layout_of, shapes_of
from .values import KernelSource, _ident


def load_module(source: str, cache_dir: Path | None = None):
    """The module of generated `source`, executed from this text in memory.

    Nothing is imported from disk: a copy is written to `cache_dir/kernels/nq_<hash>.py` (for
    profilers, tracebacks and people to read; a directory that cannot be written is skipped with
    one CacheWarning) and that path is the module's file name, but the code run is compiled from
    `source` itself, and `inspect` / Triton read the source from linecache, filled with the same
    text. So a file planted or swapped in the cache directory is never executed."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"neptune_eq_kernels_{digest}"
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    disk = cache_dir_at(cache_dir)
    rel = f"kernels/nq_{digest}.py"
    filename = str(disk.path.absolute() / rel)
    if not _same_file(filename, source):
        disk.write(rel, source.encode())
    # an entry without a modification time is never re-read from disk by linecache.checkcache
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    mod = types.ModuleType(name)
    mod.__file__ = filename
    code = compile(source, filename, "exec")
    sys.modules[name] = mod
    try:
        exec(code, mod.__dict__)
        _rewrite_now(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def _same_file(filename: str, source: str) -> bool:
    """Does `filename` already hold `source` (so the copy need not be rewritten)? Only compared:
    a symbolic link or a FIFO planted there is neither followed nor waited on."""
    data = source.encode()
    try:
        fd = os.open(filename, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) and st.st_size == len(data) and os.read(fd, len(data) + 1) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def _rewrite_now(mod) -> None:
    """Triton's interpreter re-reads each kernel's source on its first launch to rewrite it; do that
    now, while linecache holds our text, so a later linecache.clearcache() cannot send it to the
    file on disk (GPU kernels read their source once, when the module runs @triton.jit)."""
    for v in list(vars(mod).values()):
        rewrite = getattr(v, "rewrite", None)
        if type(v).__name__ == "InterpretedFunction" and callable(rewrite):
            rewrite()


class Launcher:
    """Runs a plan's kernels: allocates outputs, reuses intermediate buffers, launches with
    precomputed grids and argument layouts (decode kernels run for tens of microseconds, so the
    host work per call must stay small)."""

    def __init__(self, program: ir.Program, plan: Plan, kernels: list[KernelSource], module, fallback=None,
                 widened=None):
        self.program, self.plan, self.kernels, self.module = program, plan, kernels, module
        # kernels with 32-bit offsets: `widened()` gives the same kernels with 64-bit offsets, for
        # inputs whose strides reach past 2^31 elements (a view of a huge tensor)
        self._widened, self._wide_launcher = widened, None
        # kernels that read inputs through tensor descriptors need 16-byte aligned rows and a unit
        # innermost stride; `fallback()` gives a launcher of pointer loads for inputs that lack them
        # (the plan's own buffers are allocated contiguous: the lowering checked their rows)
        self._descriptors = [(name, dims) for ks in kernels for name, dims in ks.descriptors.items()
                             if name in program.inputs]
        self._any_descriptor = any(ks.descriptors for ks in kernels)
        self._fallback, self._fallback_launcher = fallback, None
        self._allocator_checked = False  # Triton's scratch allocator set (once, on the first CUDA call)
        self._buffers = Buffers(program, plan, kernels)  # intermediate buffers, reused across calls
        self._runners: dict = {}  # specialisation key → Triton's compiled kernel
        self._fixed: dict = {}  # specialisation key → its runner at the one grid of a static program
        self._stages: dict[int, int] = {}  # kernel → the pipeline stages it was launched with
        # the loop bounds read from input values, replayed per layout from a CUDA graph (lower/replay.py)
        sides = [side for ks in kernels for db in ks.data_bounds for p in db.preds for side in p.args]
        cells = [math.ceil(program.axes[db.axis] / db.tile)  # each bound's table of tile pairs
                 * math.prod(math.ceil(program.axes[a] / t) for a, t in db.grid)
                 for ks in kernels for db in ks.data_bounds]
        small = all(math.prod(program.axes[a] for a in evaluation_box(side)) <= MAX_ELEMENTS for side in sides) and \
            all(c <= MAX_ELEMENTS for c in cells)
        self._bounds_replay = Replayer(self._bounds_eager) if small else None
        # (its values staged: the graph reads its own copies of the inputs the bounds read, refreshed each call)
        self._bounds_staged = Replayer(lambda read, inputs, axes: self._bounds_eager({**inputs, **read}, axes))
        self._bound_inputs = sorted({n.tensor for side in sides for n in ir.walk(side) if isinstance(n, ir.Load)})
        self._out_shapes = [(o.name, self.program.output_shape(o), TORCH_DTYPES[o.dtype or "float32"])
                            for o in program.outputs]
        # a dynamic axis's length is read from the first input that has it (input name, dimension)
        self._lengths = length_sources(program)
        self._calls = []
        pdl = any(ks.pdl for ks in kernels) and _has_grid_dependency_control()
        for ks in kernels:
            consts = dict(ks.constexprs)
            if "USE_PDL" in consts:  # see lower/triton.py: _dependent_launches
                consts["USE_PDL"] = pdl
            opts = {"num_warps": ks.schedule.num_warps, "num_stages": ks.schedule.num_stages}
            if ks.pdl and pdl:
                opts["launch_pdl"] = True
            if ks.exact_arith:
                opts["enable_fp_fusion"] = False
            extents, grid = _sizes(ks, program.axes)
            fn = ks.library if ks.library is not None else getattr(module, ks.name)
            self._calls.append((fn, [t.name for t in ks.tensors], extents, grid, consts, {**consts, **opts}))

    def _at(self, inputs: dict[str, torch.Tensor]) -> tuple[list, list, dict[str, int] | None]:
        """This call's launches and output shapes: the compiled ones, or for a dynamic program those
        of the lengths the inputs have (with the lengths, which check_inputs has checked)."""
        if not self._lengths:
            return self._calls, self._out_shapes, None
        axes = dict(self.program.axes)
        for a, (name, d) in self._lengths.items():
            axes[a] = inputs[name].shape[d]
        calls = [(fn, names, *_sizes(ks, axes), kw, cuda_kw)
                 for ks, (fn, names, _, _, kw, cuda_kw) in zip(self.kernels, self._calls)]
        outs = [(name, tuple(axes[a] for a in o.axes), dt) for o, (name, _, dt) in zip(self.program.outputs,
                                                                                     self._out_shapes)]
        return calls, outs, axes

    def _wide_for(self, inputs: dict[str, torch.Tensor]) -> Launcher | None:
        """The 64-bit-offset launcher where some input's element offsets pass int32, else None."""
        if self._widened is None or not any(not t.is_contiguous() and span_past_int32(t) for t in inputs.values()):
            return None  # a contiguous input's span is its size, which the compile-time check covered
        if self._wide_launcher is None:
            self._wide_launcher = self._widened()
        return self._wide_launcher

    def __call__(self, inputs: dict[str, torch.Tensor], out_dtypes: dict[str, torch.dtype] | None = None,
                 compiled: list | None = None, into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Run the plan's kernels; `compiled`, if given, receives Triton's compiled kernel of each
        launch (its .asm holds the TTGIR, PTX and SASS). `into`: output name → a contiguous tensor of
        its shape and dtype to write it into (a chunked sum's accumulator, read element by element
        by the store that overwrites it: chunked.aliasable)."""
        wide = self._wide_for(inputs)
        if wide is not None:
            return wide(inputs, out_dtypes, compiled, into)
        device = next(iter(inputs.values())).device
        if self._descriptors:
            bad = next((n for n, dims in self._descriptors if not descriptor_ok(inputs[n], dims)), None)
            if bad is not None:
                if self._fallback is None:
                    raise NeptuneError(f"input '{bad}' cannot be read through a tensor descriptor (it needs a "
                                       "16-byte aligned start and row strides, innermost stride 1)")
                if self._fallback_launcher is None:
                    self._fallback_launcher = self._fallback()
                return self._fallback_launcher(inputs, out_dtypes, compiled, into)
        if self._any_descriptor and device.type == "cuda" and not self._allocator_checked:
            _ensure_allocator()
            self._allocator_checked = True
        tensors: dict[str, torch.Tensor] = dict(inputs)
        outs = {}
        calls, out_shapes, axes = self._at(inputs)
        for name, shape, dt in out_shapes:
            dt = (out_dtypes or {}).get(name) or dt
            t = (into or {}).get(name)
            if t is None or tuple(t.shape) != tuple(shape) or t.dtype != dt or not t.is_contiguous():
                t = torch.empty(shape, dtype=dt, device=device)
            outs[name] = tensors[name] = t
        for name in self.plan.buffers:
            tensors[name] = self._buffers.get(device, name, axes)
        cuda = device.type == "cuda"
        if not cuda:
            require_interpreter()
        bounds = self._bounds_at(inputs, axes)
        for ki, (fn, names, extents, grid, interp_kw, cuda_kw) in enumerate(calls):
            if isinstance(fn, LibraryGemm):  # the vendor's GEMM, on the CPU too (lower/library.py)
                run_gemm(fn, tensors)
                continue
            ks_bounds = [bounds[db] for db in self.kernels[ki].data_bounds]
            args, _ = _launch_args([tensors[n] for n in names], extents, ks_bounds)
            if not cuda:
                with quiet_ieee():  # inf and NaN are results here, as on the GPU, not warnings
                    fn[grid](*args, **interp_kw)  # the interpreter takes no num_warps / num_stages
                continue
            # Triton specialises a kernel on its constexprs (here strides and extents) and on each
            # pointer's dtype and 16-byte alignment; a kernel compiled for the same key is launched
            # directly, without the JIT's per-call argument binding (tens of µs on a slow host)
            key = self._key(ki, device, [tensors[n] for n in names], axes)
            ck = self._runners.get(key)
            if ck is None or compiled is not None:
                ck = self._runners[key] = self._compile(ki, fn, grid, args, cuda_kw)
                if not self._lengths:  # one grid: Triton's runner for it (it takes a full 3-d grid) kept
                    self._fixed[key] = ck[(grid[0], 1, 1)]
                if compiled is not None:
                    compiled.append(ck)
            else:
                (self._fixed.get(key) or ck[(grid[0], 1, 1)])(*args, *interp_kw.values())
        return outs

    def _compile(self, ki: int, fn, grid, args: list, cuda_kw: dict):
        """Compile and launch kernel `ki` (launch_fitting); the stage count that fitted serves its
        later specialisations too."""
        kw = {**cuda_kw, "num_stages": self._stages.get(ki, cuda_kw["num_stages"])}
        ck, self._stages[ki] = launch_fitting(fn, grid, args, kw, self.kernels[ki].name)
        return ck

    def _bounds_at(self, inputs: dict[str, torch.Tensor], axes: dict[str, int] | None) -> dict:
        """The (lo, hi) loop offsets of each data-dependent bound of the kernels, from this call's
        inputs (lower/databounds.py); one tensor per bound, shared by the kernels that use it. On
        CUDA a layout's later calls replay the work from a CUDA graph (lower/replay.py)."""
        if not any(ks.data_bounds for ks in self.kernels):
            return {}
        if next(iter(inputs.values())).device.type != "cuda" or self._bounds_replay is None:
            return self._bounds_eager(inputs, axes)
        read = {n: inputs[n] for n in self._bound_inputs}
        at = tuple(sorted((axes or {}).items()))
        if read and sum(t.numel() for t in read.values()) <= STAGED_ELEMENTS:  # (fresh each call: serving)
            return self._bounds_staged.staged((at, shapes_of(read)), read, inputs, axes)
        layout = (at, layout_of(list(read.values())))
        return self._bounds_replay(layout, inputs, axes)

    def _bounds_eager(self, inputs: dict[str, torch.Tensor], axes: dict[str, int] | None) -> dict:
        dbs = {db for ks in self.kernels for db in ks.data_bounds}
        program = self.program.with_extents(axes) if axes else self.program
        return {db: bound_tensor(db, program, inputs) for db in dbs}

    def _key(self, ki: int, device, tensors: list[torch.Tensor], axes: dict[str, int] | None = None) -> tuple:
        """What Triton specialises kernel `ki` on (see _spec_key): a dynamic program's strides are
        arguments, specialised on 1 and on divisibility by 16 only, and so are the lengths of its
        specialised axes (program.specialised: a chunk axis; its last chunk may be of another class
        than the others, and a kernel compiled for lengths divisible by 16 reads and writes whole
        groups of 16 past a length that is not)."""
        if not self._lengths:
            return _spec_key(ki, device, tensors)
        classes = tuple((a, axes[a] == 1, axes[a] % 16 == 0) for a in sorted(self.program.specialised)
                        if axes and a in axes)
        return (ki, device.index, classes, *((x.dtype, x.data_ptr() % 16 == 0,
                                              tuple((s == 1, s % 16 == 0) for s in x.stride())) for x in tensors))

    def bind(self, inputs: dict[str, torch.Tensor], order: list[str], out_dtypes: dict[str, torch.dtype] | None = None
             ) -> BoundCall | None:
        """This plan's launches for inputs laid out like `inputs` (same dtypes, strides, 16-byte
        alignment, CUDA device), with every argument fixed but the addresses of the inputs named in
        `order` and of the outputs: a later call passes those addresses alone (see BoundCall). The
        inputs not in `order` (closure constants) are fixed too. None where the kernels were not
        launched for this layout yet, off CUDA, or with tensor descriptors (checked per call)."""
        wide = self._wide_for(inputs)
        if wide is not None:
            return wide.bind(inputs, order, out_dtypes)
        device = next(iter(inputs.values())).device
        if not self._binds_on(device) or self._descriptors or any(ks.data_bounds for ks in self.kernels):
            # (loop bounds read from the inputs' values are worked out on every call)
            return None
        slot = {name: k for k, name in enumerate(order)}
        calls, out_shapes, axes = self._at(inputs)
        outs = [(name, shape, (out_dtypes or {}).get(name) or dt) for name, shape, dt in out_shapes]
        # stand-ins laid out as the call's outputs will be (fresh allocations: contiguous, aligned)
        tensors = {**inputs, **{name: torch.empty(shape, dtype=dt, device=device) for name, shape, dt in outs}}
        for k, (name, _, _) in enumerate(outs):
            slot[name] = len(order) + k
        for name in self.plan.buffers:
            tensors[name] = self._buffers.get(device, name, axes)
        launches = []
        for ki, (fn, names, extents, grid, interp_kw, _) in enumerate(calls):
            if isinstance(fn, LibraryGemm):  # it takes tensors: views of the call's, laid out as these
                views = tuple((n, slot.get(n), tuple(tensors[n].shape), tuple(tensors[n].stride()),
                               None if n in slot else tensors[n]) for n in dict.fromkeys((fn.a, fn.b, fn.out)))
                launches.append((fn, views, None))
                continue
            xs = [tensors[n] for n in names]
            ck = self._runners.get(self._key(ki, device, xs, axes))
            if ck is None:
                return None
            runner = ck[(grid[0], 1, 1)]
            argv, at = _launch_args(xs, extents)
            slots = tuple((pos, slot[n]) for pos, n in zip(at, names) if n in slot)
            for pos, n, x in zip(at, names, xs):
                argv[pos] = None if n in slot else x.data_ptr()  # the call's own addresses go in the slots
            launches.append((runner, [*argv, *interp_kw.values()], slots))
        keep = [t for n, t in tensors.items() if n not in slot]  # fixed addresses stay alive
        return BoundCall(launches, [(dt, device) for _, _, dt in outs], keep)

    @staticmethod
    def _binds_on(device: torch.device) -> bool:
        """Launches bind on CUDA alone (the interpreter takes tensors; tests stand in for the GPU here)."""
        return device.type == "cuda"


def launch_fitting(fn, grid, args: list, kw: dict, name: str) -> tuple:
    """Triton's compiled kernel of `fn`, launched at `grid`, and the pipeline stages it took. The
    schedule was fitted to shared memory by a model (shared_memory.shared_bytes, checked against what
    Triton requires); where Triton still finds more shared memory than the device has (a layout
    conversion the model does not count), the kernel is compiled again with one stage fewer, down
    to one, with a warning naming it: the same kernel, slower, rather than a failed call."""
    from triton.runtime.errors import OutOfResources

    stages = kw["num_stages"]
    while True:
        try:
            return fn[grid](*args, **{**kw, "num_stages": stages}), stages
        except OutOfResources as e:
            if e.name != "shared memory" or stages <= 1:
                raise
            warnings.warn(f"kernel {name} needs {e.required} bytes of shared memory at {stages} pipeline stages, "
                          f"the device has {e.limit}: compiled again with {stages - 1}", NeptuneWarning, stacklevel=3)
            stages -= 1


def span_past_int32(t: torch.Tensor) -> bool:
    """Does some element of `t` lie more than 2^31 − 1 elements from its first (|strides| · extents)?"""
    return sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 1) > 2**31 - 1


def _launch_args(tensors: list[torch.Tensor], extents: list[int], bounds=()) -> tuple[list, list[int]]:
    """A generated kernel's positional arguments (each tensor then its strides, then the extents,
    then each data bound's tensor with its strides but the last) and the position of each tensor."""
    args, at = [], []
    for x in tensors:
        at.append(len(args))
        args.append(x)
        args.extend(x.stride())
    args.extend(extents)
    for b in bounds:
        args.append(b)
        args.extend(b.stride()[:-1])
    return args, at


def _sizes(ks: KernelSource, axes: dict[str, int]) -> tuple[list[int], tuple[int]]:
    """Kernel `ks`'s extent arguments and grid at axis lengths `axes`."""
    n_prog = ks.chunks
    for a, step in ks.grid:
        n_prog *= math.ceil(axes[a] / step)
    return [axes[a] for a in ks.extents], (n_prog,)


def _has_grid_dependency_control() -> bool:
    """Programmatic dependent launch needs compute capability 9.0 or later (Hopper)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def _spec_key(ki: int, device: torch.device, tensors: list[torch.Tensor]) -> tuple:
    """What Triton specialises kernel `ki` on, besides its constexprs: each pointer's dtype and
    16-byte alignment (and, our strides being constexprs, each tensor's strides)."""
    return (ki, device.index, *((x.dtype, x.data_ptr() % 16 == 0, x.stride()) for x in tensors))


def descriptor_ok(t: torch.Tensor, dims: tuple[int, ...]) -> bool:
    """Can tiles of `t` spanning `dims` (the last one innermost) be read through a tensor
    descriptor? Its start, and every stride but the innermost (which must be 1), must be multiples
    of 16 bytes; dimensions of extent 1 are never stepped along and do not count."""
    size = t.element_size()
    if t.data_ptr() % 16 or t.stride(dims[-1]) != 1:
        return False
    return all((st * size) % 16 == 0 for k, (st, n) in enumerate(zip(t.stride(), t.shape))
               if k != dims[-1] and n > 1)


def _ensure_allocator() -> None:
    """Descriptors made inside a kernel live in global scratch memory that Triton asks its
    allocator for; give it torch's CUDA allocator unless the user has set one."""
    import triton

    try:
        from triton.runtime import _allocation

        unset = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except (ImportError, AttributeError):  # another triton layout: set ours
        unset = True
    if unset:
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def check_inputs(program: ir.Program, inputs: dict[str, torch.Tensor], specs: tuple | None = None,
                 sources: dict | None = None) -> None:
    """Raise NeptuneError naming the first input that is missing, extra, or of the wrong type,
    dtype or shape. With `specs` (input_specs(program), computed once) the common case, all fine,
    is a few comparisons: it runs on every call. A dynamic axis takes its length from the first
    input that has it (at most the length the program was compiled for)."""
    specs = specs if specs is not None else input_specs(program)
    if program.dynamic:
        lengths = call_lengths(program, inputs, sources)
        specs = tuple((name, dt, tuple(lengths.get(a, n) for a, n in zip(program.inputs[name].axes, shape)))
                      for name, dt, shape in specs)
    ts = [inputs.get(name) for name, _, _ in specs]
    if len(inputs) == len(specs) and all(isinstance(t, torch.Tensor) and t.dtype == dt and t.shape == shape
                                         for t, (_, dt, shape) in zip(ts, specs)):
        return
    if program.dynamic:
        program = program.with_extents(lengths)
    for name, spec in program.inputs.items():
        if name not in inputs:
            raise NeptuneError(f"missing input '{name}' (expected axes {spec.axes})")
        t = inputs[name]
        if not isinstance(t, torch.Tensor):
            raise NeptuneError(f"input '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != TORCH_DTYPES[spec.dtype]:
            raise NeptuneError(f"input '{name}' has dtype {str(t.dtype).replace('torch.', '')}; the program was "
                               f"compiled for {spec.dtype}")
        want = program.input_shape(name)
        if tuple(t.shape) != want:
            pairs = ", ".join(f"{a}={n}" for a, n in zip(spec.axes, want))
            raise NeptuneError(f"input '{name}' has shape {tuple(t.shape)}; expected {want} ({pairs})")
    extra = set(inputs) - set(program.inputs)
    if extra:
        raise NeptuneError(f"unexpected inputs {sorted(extra)} (program inputs: {sorted(program.inputs)})")


def call_lengths(program: ir.Program, inputs: dict[str, torch.Tensor], sources=None) -> dict[str, int]:
    """The lengths of a dynamic program's dynamic axes in this call (`sources`: length_sources(program),
    computed once); raises NeptuneError for one past what the program was compiled for."""
    out: dict[str, int] = {}
    for a, (name, d) in (sources if sources is not None else length_sources(program)).items():
        t = inputs.get(name)
        if isinstance(t, torch.Tensor) and t.dim() == len(program.inputs[name].axes):
            out[a] = t.shape[d]
    for a, n in out.items():
        if not 1 <= n <= program.axes[a]:
            raise NeptuneError(f"axis '{a}' has length {n} in this call; the program was compiled for lengths "
                               f"1 to {program.axes[a]} of it")
    return out


def length_sources(program: ir.Program) -> dict[str, tuple[str, int]]:
    """length_source of every dynamic axis the program uses, in program order (the first one named in an
    error is stable)."""
    used = {a for s in program.inputs.values() for a in s.axes} | {a for o in program.outputs for a in o.axes}
    used |= {n.axis for o in program.outputs for n in ir.walk(o.expr)
             if isinstance(n, ir.Index | ir.Reduce | ir.Length)}
    return {a: length_source(program, a) for a in program.axes if a in program.dynamic and a in used}


def length_source(program: ir.Program, axis: str) -> tuple[str, int]:
    """(input, dimension) that has the length of dynamic `axis`: the first input declared over it,
    else the first input a load reads at it (x[j, d] with x declared [i, d]: j's length is i's); a copy
    of another axis (program.same_length), where that one's is."""
    if axis in program.same_length:
        return length_source(program, program.same_length[axis])
    for name, spec in program.inputs.items():
        if axis in spec.axes:
            return name, spec.axes.index(axis)
    for o in program.outputs:
        for n in ir.walk(o.expr):
            if isinstance(n, ir.Load):
                for d, e in enumerate(n.index):
                    if isinstance(e, ir.Index) and e.axis == axis:
                        return n.tensor, d
    raise NeptuneError(f"dynamic axis '{axis}' is read by no input: its length cannot be known at the call")


def input_specs(program: ir.Program) -> tuple:
    """(name, torch dtype, shape) of each program input."""
    return tuple((name, TORCH_DTYPES[spec.dtype], program.input_shape(name)) for name, spec in program.inputs.items())


_ = _ident, default_cache_dir  # re-exported
