"""Lowering a kernel plan to Triton source: one @triton.jit function per kernel.

Nothing here knows what a program computes: tiles come from the schedule, loops from the plan's
passes, state updates from the components (body, mask, correction), masks and loop bounds from
the programs' own predicates. Each value is a block whose dimensions are named by axes; ops
broadcast by axis name; a sum over an axis of a product whose factors split into [m, k] and
[k, n] blocks becomes tl.dot with fp32 accumulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .. import ir
from ..masks import affine, conjunction
from ..numeric import INT_IDENTITY, compute_dtype, index_range, index_within
from ..ops import MONOIDS, OPS
from ..plan import Combine, CompPlan, KernelPlan, Pass, Plan, StorePlan
from ..schedule import KernelSchedule, inner_axes

_TL_DTYPE = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16", "int32": "tl.int32",
             "int64": "tl.int64", "bool": "tl.int1", "float64": "tl.float64"}


@dataclass
class Val:
    code: str
    dims: tuple[str, ...]
    kind: str  # "f" float32, "i" integer, "b" boolean, or a native load dtype ("float16", ...)

    @property
    def native(self) -> bool:
        return self.kind not in ("f", "i", "b")


@dataclass
class TensorArg:
    name: str
    axes: tuple[str, ...]
    dtype: str
    role: str  # "input" | "output" | "buffer"


@dataclass
class KernelSource:
    """Generated code for one kernel and what the launcher needs to call it."""

    name: str
    source: str  # the @triton.jit function
    tensors: list[TensorArg]
    extents: list[str]  # axes passed as n_<axis>
    grid: list[tuple[str, int]]  # (axis, step) in pid decomposition order (last fastest)
    chunks: int
    constexprs: dict[str, int]
    schedule: KernelSchedule
    # tensors read through tensor descriptors → the dimensions (index positions) each descriptor spans
    descriptors: dict[str, tuple[int, ...]] = field(default_factory=dict)
    buffers_read: frozenset[str] = frozenset()  # intermediate buffers an earlier kernel wrote
    buffers_written: frozenset[str] = frozenset()
    # launched as a programmatic dependent launch (CUDA): starts while the kernel before it drains
    # and waits (gdc_wait) for that kernel's results before its first instruction
    pdl: bool = False


def _int_const(n: ir.Node) -> int | None:
    if isinstance(n, ir.Const) and math.isfinite(n.value) and float(n.value).is_integer() and abs(n.value) < 2**63:
        return int(n.value)
    return None


_LITERALS = {"POS_INF": math.inf, "NEG_INF": -math.inf, "True": 1.0, "False": 0.0}


def _literal(code: str) -> float | None:
    """The value of `code` where it is a number written into the source (not a tensor), else None."""
    if code in _LITERALS:
        return _LITERALS[code]
    try:
        return float(code)
    except ValueError:
        return None


def _folded(n: ir.Call) -> ir.Const:
    """A call on constants, evaluated at code generation (float64, like the reference)."""
    import numpy as np

    return ir.Const(float(np.asarray(OPS[n.op].numpy(*(np.float64(a.value) for a in n.args)), dtype=float)))


def _fmt_num(v: float | int) -> str:
    """A float literal, or an integer one for integer values (int64 identities)."""
    return str(v) if isinstance(v, int) else _fmt_float(v)


def _fmt_float(v: float) -> str:
    if math.isinf(v):
        return "POS_INF" if v > 0 else "NEG_INF"
    if math.isnan(v):
        return "_nan()"
    return repr(float(v))


def _ident(name: str) -> str:
    out = "".join(ch if ch.isalnum() else "_" for ch in name)
    return out if out[:1].isalpha() else "v_" + out


@dataclass
class _Scope:
    memo: dict = field(default_factory=dict)
    variant: set = field(default_factory=set)  # sym names that vary in this scope (loop state)
    axis: str | None = None  # loop axis of this scope


class KernelWriter:
    """Writes one kernel. Scopes: program level, then one per loop body (memo of emitted values)."""

    def __init__(self, plan: Plan, kernel: KernelPlan, program: ir.Program, schedule: KernelSchedule,
                 target: str):
        self.plan, self.k, self.program, self.sched, self.target = plan, kernel, program, schedule, target
        self.floats = compute_dtype(program)  # the precision of "f" values
        self.fdt = _TL_DTYPE[self.floats]
        self.lines: list[str] = []
        self.depth = 1
        self.scopes: list[_Scope] = [_Scope()]
        self.n_tmp = 0
        self.tensors: dict[str, TensorArg] = {}
        self.extents: list[str] = []
        self.inner = inner_axes(kernel, plan)
        self.tiles = schedule.tiles
        self.vector: dict[str, str] = {}  # axis → name of its offsets vector in the current scope
        self.scalar: dict[str, str] = {}  # axis → scalar index name
        self.tail_masks: dict[str, bool] = {}  # axis → whether loads along it need a bounds mask now
        self.row_masks: dict[str, str] = {}  # axis → its validity mask when the tile is padded past its step
        self.starts: dict[str, str] = {}  # axis → first index of its offsets vector (offs = start + arange)
        self.descriptors: dict[str, tuple[int, ...]] = {}  # tensor → dimensions its descriptor spans
        self.buffers_read: set[str] = set()
        self.buffers_written: set[str] = set()
        order = [a for a in kernel.grid if self.tiles.get(a, 1) > 1]
        loop_axes = list(dict.fromkeys(p.axis for p in kernel.passes()))
        self.canon = order + [a for a in loop_axes if a not in order] + sorted(self.inner - set(order) - set(loop_axes))

    # ---------------------------------------------------------------- helpers
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def tmp(self, stem: str = "t") -> str:
        self.n_tmp += 1
        return f"{stem}{self.n_tmp}"

    def extent(self, axis: str) -> str:
        if axis not in self.extents:
            self.extents.append(axis)
        return f"n_{_ident(axis)}"

    def tensor(self, name: str, axes: tuple[str, ...], dtype: str, role: str) -> TensorArg:
        t = self.tensors.get(name)
        if t is None:
            t = self.tensors[name] = TensorArg(name, axes, dtype, role)
        return t

    def lookup(self, key):
        for sc in reversed(self.scopes):
            if key in sc.memo:
                return sc.memo[key]
        return None

    def memoised(self, key, make) -> Val:
        """The value bound for `key` in a visible scope, else `make()` bound in the current one."""
        hit = self.lookup(key)
        if hit is None:
            hit = self.scopes[-1].memo[key] = make()
        return hit

    def is_variant(self, n: ir.Node) -> bool:
        """Does n change from one iteration of the innermost loop to the next?"""
        sc = self.scopes[-1]
        if len(self.scopes) == 1:
            return False
        if sc.axis is not None and sc.axis in n.axes:
            return True
        for m in ir.walk(n):
            if isinstance(m, ir.Sym) and m.name in sc.variant:
                return True
            if isinstance(m, ir.Sym) and m.name.startswith("val:"):
                inner = self.plan.inline.get(m.name[4:])
                if inner is not None and self.is_variant(inner):
                    return True
        return False

    def block_dims(self, axes) -> tuple[str, ...]:
        return tuple(a for a in self.canon if a in axes and (a in self.vector))

    # ---------------------------------------------------------------- broadcasting
    def arrange(self, v: Val, dims: tuple[str, ...]) -> str:
        """Code for v laid out with `dims` (a superset of v.dims, possibly reordered)."""
        have = [d for d in dims if d in v.dims]
        code = v.code
        if tuple(have) != v.dims:
            if len(v.dims) == 2:
                code = f"tl.trans({code})"
            else:
                perm = [v.dims.index(d) for d in have]
                code = f"tl.permute({code}, {tuple(perm)})"
        if not v.dims or tuple(have) == dims:
            return code
        idx = ", ".join(":" if d in v.dims else "None" for d in dims)
        return f"{code}[{idx}]"

    def align(self, vals: list[Val]) -> tuple[list[str], tuple[str, ...]]:
        dims = tuple(a for a in self.canon if any(a in v.dims for v in vals))
        return [self.arrange(v, dims) for v in vals], dims

    def f32(self, v: Val) -> Val:
        """v as a float of the kernel's compute precision (float32, or float64 for float64 programs)."""
        if v.kind == "f":
            return v
        if v.kind in ("i", "b"):
            return Val(f"({v.code}).to({self.fdt})", v.dims, "f")
        return Val(f"{v.code}.to({self.fdt})", v.dims, "f")

    def as_bool(self, v: Val) -> Val:
        """v as a predicate (a mask or condition that came out of the algebra as a number: ≠ 0)."""
        if v.kind == "b":
            return v
        lit = None if v.dims else _literal(v.code)
        if lit is not None:
            return Val("True" if lit != 0 else "False", (), "b")
        return self.bind(f"({v.code} != 0)", v.dims, "b", "m")

    def bind(self, code: str, dims, kind: str, stem: str = "t") -> Val:
        name = self.tmp(stem)
        self.emit(f"{name} = {code}")
        return Val(name, tuple(dims), kind)

    # ---------------------------------------------------------------- expressions
    def value(self, n: ir.Node) -> Val:
        hit = self.lookup(n)
        if hit is not None:
            return hit
        if not self.is_variant(n) and len(self.scopes) > 1:
            # loop-invariant: compute before the loop (the program-level scope)
            saved_scopes, saved_lines, saved_depth = self.scopes, self.lines, self.depth
            self.scopes = self.scopes[:1]
            self.lines = self.hoist_lines
            self.depth = self.hoist_depth
            try:
                v = self._value(n)
            finally:
                self.scopes, self.lines, self.depth = saved_scopes, saved_lines, saved_depth
            self.scopes[0].memo[n] = v
            return v
        v = self._value(n)
        self.scopes[-1].memo[n] = v
        return v

    def _value(self, n: ir.Node) -> Val:
        if isinstance(n, ir.Const):
            return Val(_fmt_float(n.value), (), "f")
        if isinstance(n, ir.Index):
            if n.axis in self.vector:
                return Val(self.vector[n.axis], (n.axis,), "i")
            if n.axis in self.scalar:
                return Val(self.scalar[n.axis], (), "i")
            raise KeyError(f"axis {n.axis} has no index in kernel {self.k.name}")
        if isinstance(n, ir.Sym):
            kind, name = n.name.split(":", 1)
            if kind == "val" and name in self.plan.inline:
                return self.value(self.plan.inline[name])
            raise KeyError(f"symbol {n.name} is not available in kernel {self.k.name}")
        if isinstance(n, ir.Load):
            return self.load(n)
        if isinstance(n, ir.Reduce):
            return self.contract(n.op, n.axis, n.body, None)
        assert isinstance(n, ir.Call)
        op = OPS[n.op]
        if all(isinstance(a, ir.Const) for a in n.args):
            return self._value(_folded(n))  # Triton's math functions take tensors, not literals
        args = [self.value(a) for a in n.args]
        data = args[1:] if n.op == "where" else args
        nodes = n.args[1:] if n.op == "where" else n.args
        if (op.integer_ok or n.op == "where") and any(a.kind in ("i", "b") for a in data) and all(
                a.kind in ("i", "b") or _int_const(x) is not None for a, x in zip(data, nodes)):
            # integer arithmetic (the kv head h // group, integer data): exact, in integers
            data = [Val(str(_int_const(x)), (), "i") if a.kind not in ("i", "b") else a for a, x in zip(data, nodes)]
            args = [args[0], *data] if n.op == "where" else data
            if n.op == "where":
                codes, dims = self.align([self.as_bool(args[0]), *data])
                return self.bind(op.triton.format(*codes), dims, "i")
        if n.op in ("and", "or", "not"):
            codes, dims = self.align([self.as_bool(a) for a in args])
            return self.bind(op.triton.format(*codes), dims, "b", "m")
        if op.predicate:
            if all(a.kind in ("i", "b") for a in args):
                codes, dims = self.align(args)
            else:
                codes, dims = self.align([self.f32(a) for a in args])
            return self.bind(op.triton.format(*codes), dims, "b", "m")
        if n.op == "where":
            cond = self.as_bool(args[0])
            rest = [self.f32(a) for a in args[1:]]
            codes, dims = self.align([cond, *rest])
            return self.bind(op.triton.format(*codes), dims, "f")
        if n.op in ("floordiv", "mod"):
            return self.floor_div_mod(n, args)
        if all(a.kind in ("i", "b") for a in args) and op.integer_ok:
            codes, dims = self.align(args)
            return self.bind(op.triton.format(*codes), dims, "i")
        codes, dims = self.align([self.f32(a) for a in args])
        return self.bind(op.triton.format(*codes), dims, "f")

    def floor_div_mod(self, n: ir.Call, args: list[Val]) -> Val:
        """a // b and a % b rounding toward −∞ like torch (and the IR's reference); Triton's // and %
        truncate toward zero, which differs when the signs differ. Plain where both operands are
        provably non-negative (the kv head h // G)."""
        a, b = n.args
        ra, rb = index_range(a, self.program.axes), index_range(b, self.program.axes)
        if all(v.kind in ("i", "b") for v in args):
            codes, dims = self.align(args)
            x, y = codes
            q = self.bind(f"{x} // {y}" if n.op == "floordiv" else f"{x} % {y}", dims, "i")
            if ra is not None and rb is not None and ra[0] >= 0 and rb[0] > 0:
                return q
            if n.op == "floordiv":  # one less where the division was inexact and the signs differ
                return self.bind(f"tl.where(({q.code} * {y} != {x}) & (({x} < 0) != ({y} < 0)), {q.code} - 1, "
                                 f"{q.code})", dims, "i")
            return self.bind(f"tl.where(({q.code} != 0) & (({q.code} < 0) != ({y} < 0)), {q.code} + {y}, "
                             f"{q.code})", dims, "i")
        codes, dims = self.align([self.f32(v) for v in args])
        x, y = codes
        fl = f"tl.floor({x} / {y})"
        return self.bind(fl if n.op == "floordiv" else f"{x} - {y} * {fl}", dims, "f")

    def uniform_index(self, e: ir.Node) -> Val | None:
        """An index entry with one value for all valid rows of the program's padded tile: the row
        index itself when a tile holds a single row (step 1), or a // G when the tile advances by a
        divisor of G (grouped-query heads). Tensors read in a loop are then loaded once per tile."""
        got = ir.grouped_index(e)
        if got is None:
            return None
        a, g = got
        step = self.sched.steps.get(a)
        if step is None or a not in self.vector or a not in self.k.grid or g % step:
            return None
        return Val(f"((t_{_ident(a)} * {step}) // {g})" if g > 1 else f"t_{_ident(a)}", (), "i")

    def _uniform_here(self, ld: ir.Load) -> bool:
        loop = self.scopes[-1].axis
        return loop is not None and loop in ld.axes

    def eff_dims(self, n: ir.Node) -> frozenset[str]:
        """Vector dimensions the value of n has in this kernel (uniform indices removed)."""
        if isinstance(n, ir.Load):
            uni = self._uniform_here(n)
            out: set[str] = set()
            for e in n.index:
                if not (uni and self.uniform_index(e) is not None):
                    out |= self.eff_dims(e)
            return frozenset(out)
        if isinstance(n, ir.Index):
            return frozenset({n.axis} & set(self.vector))
        if isinstance(n, ir.Sym):
            kind, name = n.name.split(":", 1)
            if kind == "val" and name in self.plan.inline:
                return self.eff_dims(self.plan.inline[name])
            return frozenset(n.axes & set(self.vector))
        if isinstance(n, ir.Reduce):
            return self.eff_dims(n.body) - {n.axis}
        out2: frozenset[str] = frozenset()
        for c in n.children():
            out2 |= self.eff_dims(c)
        return out2

    # ---------------------------------------------------------------- memory
    def pointer(self, tensor: str, index: tuple[ir.Node, ...], order: tuple[str, ...] | None,
                uniform_rows: bool = False):
        """(pointer code, mask code or None, dims) for a block of `tensor` at `index`."""
        if tensor not in self.tensors:
            spec = self.program.inputs.get(tensor)
            if spec is not None:
                self.tensor(tensor, spec.axes, spec.dtype, "input")
            else:
                buf = self.plan.buffers[tensor]
                self.tensor(tensor, buf.axes, buf.dtype, "buffer")
        entries = []
        masks = []
        in_range = []  # validity of computed (gathered) indices that may fall outside the tensor
        uniform = uniform_rows
        axes = self.tensors[tensor].axes
        for k, e in enumerate(index):
            stride = f"{_ident(tensor)}_s{k}"
            u = self.uniform_index(e) if uniform else None
            if u is not None:
                entries.append((u, stride))
            elif isinstance(e, ir.Index) and e.axis in self.vector:
                entries.append((Val(self.vector[e.axis], (e.axis,), "i"), stride))
                if self.tail_masks.get(e.axis, True):
                    code = self.row_masks.get(e.axis) or f"({self.vector[e.axis]} < {self.extent(e.axis)})"
                    masks.append(Val(code, (e.axis,), "b"))
            elif isinstance(e, ir.Index) and e.axis == "chunk":
                entries.append((Val("pid_chunk", (), "i"), stride))
            else:
                v = self.value(e)
                if v.kind not in ("i", "b"):  # an integer-valued index the algebra wrote with float ops
                    v = self.bind(f"({v.code}).to(tl.int64)", v.dims, "i")
                entries.append((v, stride))
                n = self.program.axes[axes[k]]
                if not index_within(e, self.program.axes, n):
                    # a data-dependent (or possibly out-of-bounds) index: lanes outside [0, n) read
                    # nothing (never memory past the tensor) and give NaN, not a plausible number
                    in_range.append(self.bind(f"({v.code} >= 0) & ({v.code} < {n})", v.dims, "b", "m"))
        dims = order or tuple(a for a in self.canon if any(a in v.dims for v, _ in entries))
        parts = []
        for v, stride in entries:
            code = self.arrange(v, dims) if v.dims else v.code
            if self.sched.wide_index and _literal(code) is None:
                code = f"({code}).to(tl.int64)"  # offsets past 2^31 elements (huge tensors, strides)
            parts.append(f"{code} * {stride}")
        ptr = " + ".join([f"{_ident(tensor)}_ptr", *parts])
        mask = None
        if masks or in_range:
            mask = " & ".join(self.arrange(m, dims) for m in [*masks, *in_range])
        valid = None
        if in_range:
            valid = " & ".join(self.arrange(m, dims) for m in in_range)
        return ptr, mask, dims, valid

    def load(self, n: ir.Load, order: tuple[str, ...] | None = None) -> Val:
        key = ("load", n, order)
        hit = self.lookup(key)
        if hit is not None:
            return hit
        if len(self.scopes) > 1 and not self.is_variant(n):
            # loop-invariant (e.g. the query tile): load once before the loop
            saved = self.scopes, self.lines, self.depth, dict(self.tail_masks)
            self.scopes, self.lines, self.depth = self.scopes[:1], self.hoist_lines, self.hoist_depth
            try:
                v = self.load(n, order)
            finally:
                self.scopes, self.lines, self.depth, self.tail_masks = saved
            return v
        dtype = (self.program.inputs[n.tensor].dtype if n.tensor in self.program.inputs
                 else self.plan.buffers[n.tensor].dtype)
        if n.tensor in self.plan.buffers:
            self.buffers_read.add(n.tensor)
        tma = self.descriptor_load(n) if self.sched.tma else None
        if tma is not None:
            code, dims = tma
        else:
            ptr, mask, dims, valid = self.pointer(n.tensor, n.index, order, uniform_rows=self._uniform_here(n))
            code = f"tl.load({ptr}, mask={mask}, other=0)" if mask else f"tl.load({ptr})"
            if valid is not None and dtype.startswith("float"):
                code = f"tl.where({valid}, {code}, _nan())"
        kind = dtype if dtype in ("float16", "bfloat16") else ("f" if dtype.startswith("float") else
                                                                ("b" if dtype == "bool" else "i"))
        v = self.bind(code, dims, kind, "x")
        if kind == "f" and dtype != self.floats:
            v = self.bind(f"{v.code}.to({self.fdt})", dims, "f", "x")
        self.scopes[-1].memo[key] = v
        return v

    def descriptor_load(self, n: ir.Load) -> tuple[str, tuple[str, ...]] | None:
        """(code, dims) of a tile of input `n.tensor` read through a tensor descriptor, or None where
        one cannot be used. The descriptor spans the index positions that are tile vectors (their
        order kept, the last one innermost); the others are one value per program (a grid index,
        or a // G) and go into its base pointer. Out-of-bounds rows and columns read as zero, so no
        masks; the launcher checks the strides and alignment a descriptor needs at run time."""
        spec = self.program.inputs.get(n.tensor)
        if spec is None or not 1 <= len(n.index) <= 5:
            return None
        uniform = self._uniform_here(n)
        base, span, seen = [], [], set()
        for k, e in enumerate(n.index):
            u = self.uniform_index(e) if uniform else None
            if u is not None:
                base.append((k, u.code))
            elif isinstance(e, ir.Index) and e.axis in self.vector and e.axis in self.starts and e.axis not in seen:
                span.append((k, e.axis))
                seen.add(e.axis)
            elif not self.eff_dims(e) and not self.is_variant(e) and (v := self.value(e)).kind == "i":
                base.append((k, v.code))  # one index per program, e.g. the kv head h // G
            else:
                return None
        itemsize = {"float16": 2, "bfloat16": 2, "float32": 4}.get(spec.dtype)
        last = len(n.index) - 1
        if (itemsize is None or not span or span[-1][0] != last or self.tiles[span[-1][1]] * itemsize < 16
                or any(self.tiles[a] > 256 for _, a in span)):
            return None
        t = _ident(n.tensor)
        dims_at = tuple(k for k, _ in span)
        if self.descriptors.setdefault(n.tensor, dims_at) != dims_at:
            return None  # one descriptor layout per tensor (the launcher checks that one)
        self.tensor(n.tensor, spec.axes, spec.dtype, "input")
        bkey = ("desc", n.tensor, tuple(base), tuple(a for _, a in span))

        def make() -> Val:
            saved = self.lines, self.depth
            self.lines, self.depth = (self.hoist_lines, self.hoist_depth) if len(self.scopes) > 1 else saved
            try:
                ptr = f"{t}_ptr" + "".join(f" + {code} * {t}_s{k}" for k, code in base)
                shape = ", ".join(self.extent(a) for _, a in span)
                strides = ", ".join([f"{t}_s{k}" for k, _ in span[:-1]] + ["1"])
                block = ", ".join(f"BLOCK_{_ident(a)}" for _, a in span)
                name = self.tmp(f"{t}_desc")
                self.emit(f"{name} = tl.make_tensor_descriptor({ptr}, shape=[{shape}], strides=[{strides}], "
                          f"block_shape=[{block}])")
                return Val(name, (), "desc")
            finally:
                self.lines, self.depth = saved

        desc = self.scopes[0].memo.get(bkey)
        if desc is None:
            desc = self.scopes[0].memo[bkey] = make()
        offsets = ", ".join(self.starts[a] for _, a in span)
        return f"{desc.code}.load([{offsets}])", tuple(a for _, a in span)

    def store(self, st: StorePlan) -> None:
        is_buffer = st.target in self.plan.buffers
        if is_buffer:
            self.buffers_written.add(st.target)
        spec_axes = st.axes
        dtype = st.dtype if not is_buffer else self.plan.buffers[st.target].dtype
        self.tensor(st.target, spec_axes, dtype, "buffer" if is_buffer else "output")
        v = self.value(st.expr)
        if v.kind not in ("i", "b"):
            v = self.f32(v)  # integers are stored as they are (exactly), floats in the compute precision
        index = tuple(ir.Index(a) for a in spec_axes)
        ptr, mask, dims, _ = self.pointer(st.target, index, None)
        if _literal(v.code) is not None:  # a constant output (x·0 summed): a tile of it, not a literal
            v = Val(f"tl.full({_shape(self, dims)}, {v.code}, {self.fdt})", dims, "f")
        dims_all = tuple(a for a in self.canon if a in set(dims) | set(v.dims))
        if set(v.dims) - set(dims):
            raise ValueError(f"store of {st.target} over {spec_axes} from a value over {v.dims}")
        code = self.arrange(v, dims)
        # programs that replicate the value along grid axes the target lacks do not store
        extra = [a for a in self.k.grid if a not in spec_axes and self.tiles.get(a, 1) >= 1]
        guard = " and ".join(f"(t_{_ident(a)} == 0)" for a in extra)
        m = mask
        if guard:
            self.emit(f"if {guard}:")
            self.depth += 1
        if dims != dims_all:
            code = self.arrange(Val(code, dims, "f"), dims_all)
        self.emit(f"tl.store({ptr}, ({code}).to({_ident(st.target)}_ptr.dtype.element_ty)"
                  + (f", mask={m})" if m else ")"))
        if guard:
            self.depth -= 1

    # ---------------------------------------------------------------- reductions
    def factors(self, n: ir.Node) -> list[ir.Node]:
        if isinstance(n, ir.Call) and n.op == "mul":
            return self.factors(n.args[0]) + self.factors(n.args[1])
        return [n]

    def contract(self, op: str, axis: str, body: ir.Node, mask: Val | None, acc: Val | None = None) -> Val:
        """op-reduce `body` over the block axis `axis` (masked-out elements contribute the identity).
        With `acc` (a sum only) the result is acc + the reduction when it becomes a tl.dot that can
        accumulate into acc in place, else the reduction alone: callers check `Val.kind == "acc"`."""
        ident = MONOIDS[op].identity
        scale = _positive_scale(body) if op in ("max", "min") else None
        if scale is not None:
            # max_j(c·x) = c·max_j(x) for c > 0 (exactly, in floating point too: rounding is monotone;
            # c·±inf = ±inf keeps masked-out identities). The tile then needs no c·x of its own, so
            # where c·x feeds a subtraction (softmax's c·s − m) the two fuse into one FMA.
            c, rest = scale
            r = self.contract(op, axis, rest, mask)
            return self.bind(f"{r.code} * {_fmt_float(c)}", r.dims, "f", "r")
        if op == "sum" and axis in self.vector:
            dot = self.try_dot(axis, body, mask, acc)
            if dot is not None:
                return dot
        v = self.value(body)
        if v.kind in ("i", "b"):  # an integer reduction: exact, in int64 (like torch's integer sums)
            v, kind, ident = Val(f"({v.code}).to(tl.int64)", v.dims, "i"), "i", INT_IDENTITY[op]
        else:
            v, kind = self.f32(v), "f"
        dims = tuple(a for a in self.canon if a in set(v.dims) | {axis})
        code = self.arrange(v, dims)
        if axis not in v.dims:
            code = f"tl.full({_shape(self, dims)}, {code}, {self.dtype_of(kind)})" if _literal(v.code) is not None \
                else f"tl.broadcast_to({code}, {_shape(self, dims)})"
        if mask is not None:
            mcode = self.arrange(mask, dims)
            code = f"tl.where({mcode}, {code}, {_fmt_num(ident)})"
        out_dims = tuple(d for d in dims if d != axis)
        return self.bind(MONOIDS[op].triton_reduce.format(code, dims.index(axis)), out_dims, kind, "r")

    def dtype_of(self, kind: str) -> str:
        """The Triton dtype of a computed value of `kind` ("f" compute float, "i" int64)."""
        return "tl.int64" if kind == "i" else self.fdt

    def try_dot(self, k: str, body: ir.Node, mask: Val | None, acc: Val | None = None) -> Val | None:
        out = [a for a in self.canon if a in self.eff_dims(body) and a != k]
        if len(out) != 2 or any(self.tiles.get(a, 1) < 16 for a in [*out, k]):
            return None
        m, n = out
        left, right, post = [], [], []
        for f in self.factors(body):
            fd = set(self.eff_dims(f))
            if k not in fd:
                if fd <= {m, n}:
                    post.append(f)
                    continue
                return None
            if fd <= {m, k}:
                left.append(f)
            elif fd <= {n, k}:
                right.append(f)
            else:
                return None
        if not left or not right:
            return None
        if mask is not None:
            md = set(mask.dims)
            side = "left" if md <= {m, k} else ("right" if md <= {n, k} else None)
            if side is None:
                return None
        a = self.operand(left, (m, k), mask if mask is not None and set(mask.dims) <= {m, k} else None)
        b = self.operand(right, (k, n), mask if mask is not None and set(mask.dims) <= {n, k}
                         and not set(mask.dims) <= {m, k} else None)
        if a.native and not b.native:
            b = Val(f"{b.code}.to({_TL_DTYPE[a.kind]})", b.dims, a.kind)
        elif b.native and not a.native:
            a = Val(f"{a.code}.to({_TL_DTYPE[b.kind]})", a.dims, b.kind)
        elif a.native and b.native and a.kind != b.kind:
            a, b = self.f32(a), self.f32(b)
        if self.target != "cuda" and "bfloat16" in (a.kind, b.kind):
            a, b = self.f32(a), self.f32(b)  # Triton's interpreter multiplies bf16 as raw integers
        if self.floats == "float64":  # float64 programs multiply in float64 (no tensor-core rounding)
            a, b = self.f32(a), self.f32(b)
        prec = "" if a.native else f", input_precision=\"{self.sched.input_precision}\""
        if self.floats == "float64":
            prec = ', input_precision="ieee", out_dtype=tl.float64'
        if acc is not None and not post and acc.dims == (m, n):
            # the tensor cores add into the running state: no second [m, n] tile, no separate add
            return self.bind(f"tl.dot({a.code}, {b.code}, {acc.code}{prec})", (m, n), "acc", "d")
        r = self.bind(f"tl.dot({a.code}, {b.code}{prec})", (m, n), "f", "d")
        for f in post:
            r = self._mul(r, self.f32(self.value(f)))
        return r

    def _mul(self, a: Val, b: Val) -> Val:
        codes, dims = self.align([a, b])
        return self.bind(f"{codes[0]} * {codes[1]}", dims, "f")

    def operand(self, factors: list[ir.Node], order: tuple[str, str], mask: Val | None) -> Val:
        if len(factors) == 1 and isinstance(factors[0], ir.Load) and mask is None:
            v = self.load(factors[0], order=tuple(a for a in order if a in self.eff_dims(factors[0])))
            if v.dims != order:
                v = Val(self.arrange(v, order), order, v.kind)
            return v
        prod = self.f32(self.value(factors[0]))
        for f in factors[1:]:
            prod = self._mul(prod, self.f32(self.value(f)))
        if mask is not None:
            codes, dims = self.align([mask, prod])
            prod = self.bind(f"tl.where({codes[0]}, {codes[1]}, 0.0)", dims, "f", "p")
        code = self.arrange(prod, order) if set(prod.dims) == set(order) else \
            self.arrange(prod, order) if prod.dims else prod.code
        if set(prod.dims) != set(order):
            shape = ", ".join(f"BLOCK_{_ident(a)}" for a in order)
            code = f"tl.broadcast_to({code}, ({shape},))"
        return Val(code, order, "f")


def _positive_scale(n: ir.Node) -> tuple[float, ir.Node] | None:
    """(c, x) when n is c·x (or x·c) with c a finite constant > 0."""
    if isinstance(n, ir.Call) and n.op == "mul":
        for a, b in (n.args, n.args[::-1]):
            if isinstance(a, ir.Const) and math.isfinite(a.value) and a.value > 0:
                return a.value, b
    return None


def _state_dims(w: KernelWriter, c: CompPlan) -> tuple[str, ...]:
    return tuple(a for a in w.canon if a in c.free and a in w.vector)


def _shape(w: KernelWriter, dims) -> str:
    return "[" + ", ".join(f"BLOCK_{_ident(a)}" for a in dims) + "]"


def _state(w: KernelWriter, c: CompPlan, name: str) -> Val:
    """The carried state of component c, held in variable `name`."""
    return Val(name, _state_dims(w, c), "i" if c.integer else "f")


def _state_init(w: KernelWriter, c: CompPlan) -> str:
    """A state tile holding the monoid's identity (int64 for an integer reduction)."""
    dtype = w.dtype_of("i" if c.integer else "f")
    return f"tl.full({_shape(w, _state_dims(w, c))}, {_fmt_num(c.identity)}, {dtype})"


# ---------------------------------------------------------------- passes


def _sub(e: ir.Node | None, mapping: dict[ir.Node, ir.Node]) -> ir.Node | None:
    return None if e is None else ir.substitute(e, mapping)


class _PassWriter:
    """Emits one pass: state init, the tile loops (bounded by affine masks), the per-tile update."""

    def __init__(self, w: KernelWriter, ps: Pass):
        self.w, self.ps = w, ps
        self.axis = ps.axis
        self.tile = w.tiles[ps.axis]

    def state_names(self, c: CompPlan) -> str:
        return f"st_{_ident(c.name)}"

    def run(self) -> None:
        w, ps = self.w, self.ps
        for c in ps.comps:
            w.emit(f"{self.state_names(c)} = {_state_init(w, c)}")
        lo, hi, full_lo, full_hi = self.bounds()
        j = _ident(self.axis)
        n_j = w.extent(self.axis)
        if ps.split > 1:
            w.emit(f"ntiles_{j} = ({hi} - {lo} + {self.tile - 1}) // {self.tile}")
            w.emit(f"per_{j} = (ntiles_{j} + {ps.split - 1}) // {ps.split}")
            w.emit(f"c_lo_{j} = {lo} + pid_chunk * per_{j} * {self.tile}")
            w.emit(f"c_hi_{j} = tl.minimum({hi}, c_lo_{j} + per_{j} * {self.tile})")
            lo, hi = f"c_lo_{j}", f"c_hi_{j}"
            if full_lo is not None:
                full_lo = f"tl.minimum(tl.maximum({full_lo}, {lo}), {hi})"
                full_hi = f"tl.maximum(tl.minimum({full_hi}, {hi}), {full_lo})"
        if full_lo is None:
            self.loop(lo, hi, masked=True)
        else:
            w.emit(f"lo_{j} = {lo}")
            w.emit(f"hi_{j} = {hi}")
            w.emit(f"flo_{j} = {full_lo}")
            w.emit(f"fhi_{j} = {full_hi}")
            self.loop(f"lo_{j}", f"flo_{j}", masked=True)
            self.loop(f"flo_{j}", f"fhi_{j}", masked=False)
            self.loop(f"fhi_{j}", f"hi_{j}", masked=True)
        for c in ps.comps:
            w.scopes[0].memo[ir.Sym(f"fin:{c.name}", c.free)] = _state(w, c, self.state_names(c))
        _ = n_j

    # ---- bounds from affine predicates
    def bounds(self):
        """(lo, hi) of the loop and (full_lo, full_hi) of the tiles where every predicate holds."""
        w, j = self.w, self.axis
        n_j = w.extent(j)
        T = self.tile
        lows, highs, flows, fhighs = [], [], [], []
        all_affine = True
        for c in self.ps.comps:
            cons = affine(c.mask) if c.mask is not None and not _is_true(c.mask) else ([] if c.mask is None
                                                                                     or _is_true(c.mask) else None)
            if cons is None:
                all_affine = False
                continue
            c_low, c_high, c_flow, c_fhigh = [], [], [], []
            for a in cons:
                cj = a.coefficient(j)
                others = [(x, v) for x, v in a.coef if x != j]
                if abs(cj) > 1 or any(x not in w.scalar and x not in w.k.grid for x, _ in others):
                    all_affine = False  # evaluated per element in every tile
                    continue
                mn, mx = self.box(others)
                if cj == 0:  # a condition on the program's rows alone (q_idx >= 5, h > 0): the loop
                    # runs only if some row of the tile meets it, unmasked only if every row does
                    c_high.append(f"tl.where(({a.const}) + ({mn}) <= 0, {n_j}, 0)")
                    c_fhigh.append(f"tl.where(({a.const}) + ({mx}) <= 0, {n_j}, 0)")
                    continue
                if cj > 0:  # j <= -(const + Σ) : upper bound
                    c_high.append(f"(-({a.const}) - ({mn}) + 1)")
                    c_fhigh.append(f"(-({a.const}) - ({mx}) + 1)")
                else:  # j >= const + Σ : lower bound
                    c_low.append(f"({a.const} + ({mn}))")
                    c_flow.append(f"({a.const} + ({mx}))")
            lows.append(_max(c_low) if c_low else "0")
            highs.append(_min(c_high) if c_high else n_j)
            flows.append(_max(c_flow) if c_flow else "0")
            fhighs.append(_min(c_fhigh) if c_fhigh else n_j)
        if not self.ps.comps:
            return "0", n_j, None, None
        lo = f"tl.maximum(0, {_min(lows)})" if lows else "0"
        hi = f"tl.minimum({n_j}, {_max(highs)})" if highs else n_j
        lo = f"(({lo}) // {T}) * {T}"
        if not all_affine:
            return lo, hi, None, None
        flo = f"tl.maximum({lo}, ((({_max(flows)}) + {T - 1}) // {T}) * {T})"
        fhi = f"tl.maximum({flo}, (tl.minimum({hi}, {_min(fhighs)}) // {T}) * {T})"
        return lo, hi, flo, fhi

    def box(self, terms):
        """(min, max) code of Σ coef·x over the program's tile of each grid axis x."""
        w = self.w
        mins, maxs = [], []
        for x, v in terms:
            if x in w.scalar:
                mins.append(f"{v} * {w.scalar[x]}")
                maxs.append(f"{v} * {w.scalar[x]}")
                continue
            st = w.sched.step(x)
            lo = f"t_{_ident(x)} * {st}"
            hi = f"(t_{_ident(x)} * {st} + {st} - 1)"
            a, b = (lo, hi) if v > 0 else (hi, lo)
            mins.append(f"{v} * {a}")
            maxs.append(f"{v} * {b}")
        return " + ".join(mins) or "0", " + ".join(maxs) or "0"

    # ---- the loop
    def loop(self, lo: str, hi: str, *, masked: bool) -> None:
        w, j = self.w, _ident(self.axis)
        outer_lines, outer_depth = w.lines, w.depth
        body: list[str] = []
        w.hoist_lines, w.hoist_depth = outer_lines, outer_depth
        w.lines, w.depth = body, outer_depth + 1
        scope = _Scope(axis=self.axis, variant={f"cur:{c.name}" for c in self.ps.comps}
                       | {f"old:{c.name}" for c in self.ps.comps})
        w.scopes.append(scope)
        w.vector[self.axis] = f"offs_{j}"
        w.starts[self.axis] = f"start_{j}"
        w.tail_masks[self.axis] = masked
        w.emit(f"offs_{j} = start_{j} + tl.arange(0, BLOCK_{j})")
        valid = Val(f"(offs_{j} < {w.extent(self.axis)})", (self.axis,), "b") if masked else None
        self.tile_update(valid, masked)
        for st in self.ps.stores:
            w.store(st)
        w.scopes.pop()
        del w.vector[self.axis]
        del w.starts[self.axis]
        w.tail_masks.pop(self.axis, None)
        w.lines, w.depth = outer_lines, outer_depth
        if w.sched.wide_index:  # an int32 loop counter would wrap on its last step past 2^31
            lo = f"tl.cast({lo}, tl.int64)"
        if w.sched.warp_specialize and not masked and w.target == "cuda":
            # Triton splits the loop's loads, MMAs and softmax across warp groups (Hopper, Blackwell)
            w.emit(f"for start_{j} in tl.range({lo}, {hi}, BLOCK_{j}, warp_specialize=True):")
        else:
            w.emit(f"for start_{j} in range({lo}, {hi}, BLOCK_{j}):")
        w.lines.extend(body)

    def tile_update(self, valid: Val | None, masked: bool) -> None:
        w = self.w
        sc = w.scopes[-1]
        new: dict[str, Val] = {}
        for c in self.ps.comps:
            old = _state(w, c, self.state_names(c))
            sc.memo[ir.Sym(f"old:{c.name}", c.free)] = old
            mask = valid
            if c.mask is not None and not _is_true(c.mask) and (masked or affine(c.mask) is None):
                m = w.as_bool(w.value(c.mask))
                mask = m if mask is None else self._and(mask, m)
            combine = MONOIDS[c.op].combine
            if c.producers and c.corr is not None:
                h = w.f32(w.value(c.corr))
                refs = {p: Val(self.state_names(pc), _state_dims(w, pc), "f")
                        for pc in self.ps.comps for p in c.producers if pc.name == p}
                h = _guarded(w, self.ps, c, h, refs)
                codes, dims = w.align([old, h])
                carried = w.bind(OPS[c.dist].triton.format(*codes), dims, "f", "c")
            else:
                carried = old
            sdims = _state_dims(w, c)
            part = w.contract(c.op, self.axis, c.core, mask, acc=carried if combine == "add" else None)
            if part.kind == "acc":  # the dot already added the carried state
                new[c.name] = nv = Val(part.code, part.dims, "f")
                sc.memo[ir.Sym(f"cur:{c.name}", c.free)] = nv
                continue
            codes, dims = w.align([carried, part])
            code = OPS[combine].triton.format(*codes)
            if dims != sdims:
                code = f"tl.broadcast_to({code}, {_shape(w, sdims)})" if set(dims) <= set(sdims) else code
            nv = w.bind(code, sdims if set(dims) <= set(sdims) else dims, old.kind, "n")
            new[c.name] = nv
            sc.memo[ir.Sym(f"cur:{c.name}", c.free)] = nv
        for c in self.ps.comps:
            w.emit(f"{self.state_names(c)} = {new[c.name].code}")

    def _and(self, a: Val, b: Val) -> Val:
        def make():
            codes, dims = self.w.align([a, b])
            return self.w.bind(f"({codes[0]} & {codes[1]})", dims, "b", "m")

        return self.w.memoised(("and", a.code, b.code), make)


def _is_true(n: ir.Node) -> bool:
    return isinstance(n, ir.Const) and n.value != 0.0


def _max(xs: list[str]) -> str:
    out = xs[0]
    for x in xs[1:]:
        out = f"tl.maximum({out}, {x})"
    return out


def _min(xs: list[str]) -> str:
    out = xs[0]
    for x in xs[1:]:
        out = f"tl.minimum({out}, {x})"
    return out


def _combine_phase(w: KernelWriter, cb: Combine) -> None:
    """Fold the chunk states of a split pass: (r,t) ⊙ (r_c,t_c) with the pass's own corrections."""
    ps = cb.source
    names = {c.name: f"st_{_ident(c.name)}" for c in ps.comps}
    for c in ps.comps:
        w.emit(f"{names[c.name]} = {_state_init(w, c)}")
    outer_lines, outer_depth = w.lines, w.depth
    body: list[str] = []
    w.hoist_lines, w.hoist_depth = outer_lines, outer_depth
    w.lines, w.depth = body, outer_depth + 1
    scope = _Scope(axis="chunk", variant={f"{k}:{c.name}" for c in ps.comps for k in ("cur", "old")})
    w.scopes.append(scope)
    parts: dict[str, Val] = {}
    for c in ps.comps:
        ld = ir.Load(f"part_{c.name}", (ir.Index("chunk"), *(ir.Index(a) for a in c.free)))
        v = w.load(ld)
        parts[c.name] = v if c.integer else w.f32(v)
    new: dict[str, Val] = {}
    for c in ps.comps:
        old = _state(w, c, names[c.name])
        comb = MONOIDS[c.op].combine
        if c.producers and c.corr is not None:
            olds = {p: Val(names[p], _state_dims(w, next(x for x in ps.comps if x.name == p)), "f")
                    for p in c.producers}
            a = _corrected(w, ps, c, old, olds, new)
            b = _corrected(w, ps, c, parts[c.name], {p: parts[p] for p in c.producers}, new)
        else:
            a, b = old, parts[c.name]
        codes, dims = w.align([a, b])
        nv = w.bind(OPS[comb].triton.format(*codes), dims, "f", "n")
        new[c.name] = nv
    for c in ps.comps:
        w.emit(f"{names[c.name]} = {new[c.name].code}")
    w.scopes.pop()
    w.lines, w.depth = outer_lines, outer_depth
    w.emit("for pid_chunk in range(0, CHUNKS):")
    w.lines.extend(body)
    for c in ps.comps:
        w.scopes[0].memo[ir.Sym(f"fin:{c.name}", c.free)] = _state(w, c, names[c.name])


def _guarded(w: KernelWriter, ps: Pass, c: CompPlan, h: Val, ref: dict[str, Val]) -> Val:
    """While a max/min producer still holds its identity nothing was accumulated: use the annihilator."""
    if not c.guard:
        return h
    for p in c.producers:
        pc = next(x for x in ps.comps if x.name == p)
        def make(r=ref[p], h=h, pc=pc):
            codes, dims = w.align([r, h])
            return w.bind(f"tl.where({codes[0]} == {_fmt_float(pc.identity)}, {_fmt_float(c.annihilator)}, "
                          f"{codes[1]})", dims, "f", "h")

        h = w.memoised(("guard", ref[p].code, h.code, c.annihilator), make)
    return h


def _corrected(w: KernelWriter, ps: Pass, c: CompPlan, state: Val, ref: dict[str, Val],
               new: dict[str, Val]) -> Val:
    """state ⊗' h(ref → new): move a partial result's reference point from `ref` to `new`."""
    scope = _Scope(axis=None, variant={f"{k}:{p}" for p in c.producers for k in ("old", "cur")})
    w.scopes.append(scope)
    for p in c.producers:
        pc = next(x for x in ps.comps if x.name == p)
        scope.memo[ir.Sym(f"old:{p}", pc.free)] = ref[p]
        scope.memo[ir.Sym(f"cur:{p}", pc.free)] = new[p]
    h = _guarded(w, ps, c, w.f32(w.value(c.corr)), ref)
    w.scopes.pop()
    codes, dims = w.align([state, h])
    return w.bind(OPS[c.dist].triton.format(*codes), dims, "f", "c")


# ---------------------------------------------------------------- kernels and modules


def _work_grows_with(k: KernelPlan) -> set[str]:
    """Grid axes along which the masked loop ranges grow (causal: the key range grows with the query)."""
    out: set[str] = set()
    for ps in k.passes():
        for c in ps.comps:
            cons = affine(c.mask) if c.mask is not None else None
            for a in cons or ():
                cj = a.coefficient(ps.axis)
                for x, v in a.coef:
                    if x != ps.axis and cj > 0 and v < 0:  # j <= x + ...: the upper bound grows with x
                        out.add(x)
    return out


def write_kernel(plan: Plan, k: KernelPlan, program: ir.Program, sched: KernelSchedule, target: str,
                 fn_name: str) -> KernelSource:
    w = KernelWriter(plan, k, program, sched, target)
    grid = [(a, sched.tiles.get(a, 1)) for a in k.grid]
    w.emit("pid = tl.program_id(0)")
    if k.chunks > 1:
        w.emit("pid_chunk = pid % CHUNKS")
        w.emit("pid = pid // CHUNKS")
    heavy_last = _work_grows_with(k)
    for a, tile in reversed(grid):
        ia = _ident(a)
        n = w.extent(a)
        step = sched.step(a)
        ntiles = f"(({n} + {step} - 1) // {step})"
        if a in heavy_last:  # the programs with the most loop tiles start first: a shorter tail
            w.emit(f"t_{ia} = {ntiles} - 1 - pid % {ntiles}")
        else:
            w.emit(f"t_{ia} = pid % {ntiles}")
        if sched.wide_index:  # t·step + tile may pass 2^31 on an axis that long
            w.emit(f"t_{ia} = t_{ia}.to(tl.int64)")
        w.emit(f"pid = pid // {ntiles}")
        if tile > 1:
            w.emit(f"offs_{ia} = t_{ia} * {step} + tl.arange(0, BLOCK_{ia})")
            w.vector[a] = f"offs_{ia}"
            w.starts[a] = f"t_{ia} * {step}"
            if step < tile:  # a padded tile: rows past the step belong to the next program
                w.row_masks[a] = f"((tl.arange(0, BLOCK_{ia}) < {step}) & (offs_{ia} < {n}))"
            w.tail_masks[a] = program.axes[a] % tile != 0 or step < tile  # specialised shapes: no mask if tiles divide
        else:
            w.scalar[a] = f"t_{ia}"
    for a in sorted(w.inner):
        if a not in w.vector:
            ia = _ident(a)
            w.emit(f"offs_{ia} = tl.arange(0, BLOCK_{ia})")
            w.vector[a] = f"offs_{ia}"
            w.starts[a] = "0"
            w.tail_masks[a] = program.axes[a] != sched.tiles.get(a)
    w.hoist_lines, w.hoist_depth = w.lines, w.depth
    for ph in k.phases:
        if isinstance(ph, Combine):
            _combine_phase(w, ph)
        else:
            _PassWriter(w, ph).run()
    for st in k.epilogue:
        w.store(st)
    # signature
    # strides and extents are compile-time constants: a program is compiled per shape anyway, the
    # compiler folds the index arithmetic, and a launch passes only pointers (see lower/launch.py)
    params = []
    for t in w.tensors.values():
        params.append(f"{_ident(t.name)}_ptr")
        params += [f"{_ident(t.name)}_s{i}: tl.constexpr" for i in range(len(t.axes))]
    params += [f"n_{_ident(a)}: tl.constexpr" for a in w.extents]
    consts = {}
    for a, tile in sched.tiles.items():
        consts[f"BLOCK_{_ident(a)}"] = tile
    if k.chunks > 1 or any(isinstance(ph, Combine) for ph in k.phases):
        chunks = k.chunks if k.chunks > 1 else next(ph.chunks for ph in k.phases if isinstance(ph, Combine))
        consts["CHUNKS"] = chunks
    else:
        chunks = 1
    params += [f"{c}: tl.constexpr" for c in consts]
    header = f"@triton.jit\ndef {fn_name}({', '.join(params)}):\n"
    src = header + "\n".join(w.lines) + "\n"
    return KernelSource(fn_name, src, list(w.tensors.values()), list(w.extents),
                        [(a, sched.step(a)) for a, _ in grid], k.chunks, consts, sched, dict(w.descriptors),
                        frozenset(w.buffers_read), frozenset(w.buffers_written))


def _dependent_launches(kernels: list[KernelSource]) -> list[KernelSource]:
    """A kernel that reads what the kernel just before it wrote (split-K's combine reading the chunk
    states) is launched as a programmatic dependent launch: its programs are scheduled while the
    writer's last programs finish, and its first instruction, gdc_wait, waits for the writer to
    complete and its stores to be visible. The writer signals early (gdc_launch_dependents at its
    start: every one of its programs is then already running, so the waiting ones take no place it
    needs). A decode step saves the launch gap between its two kernels. Both calls sit under the
    constexpr USE_PDL, which the launcher sets where the GPU has grid dependency control (Hopper
    and later; elsewhere the kernels compile without them and launch plainly)."""
    out = list(kernels)
    for i in range(1, len(out)):
        prev, ks = out[i - 1], out[i]
        if not ks.buffers_read & prev.buffers_written:
            continue
        out[i - 1] = _with_first_line(prev, "tl.extra.cuda.gdc_launch_dependents()")
        out[i] = replace(_with_first_line(ks, "tl.extra.cuda.gdc_wait()"), pdl=True)
    return out


def pdl_supported() -> bool:
    """Does this Triton launch kernels as programmatic dependent launches (launch_pdl) and have
    the grid-dependency intrinsics?"""
    try:
        import dataclasses

        import triton.language.extra.cuda as cuda
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    names = {f.name for f in dataclasses.fields(CUDAOptions)}
    return "launch_pdl" in names and hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


def _with_first_line(ks: KernelSource, line: str) -> KernelSource:
    """`ks` with `if USE_PDL: line` as the first statement of its body (and USE_PDL a parameter)."""
    head, body = ks.source.split("):\n", 1)
    if "USE_PDL" not in ks.constexprs:
        head += ", USE_PDL: tl.constexpr"
    return replace(ks, source=f"{head}):\n    if USE_PDL:\n        {line}\n{body}",
                   constexprs={**ks.constexprs, "USE_PDL": True})


PRELUDE = '''import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))
POS_INF = tl.constexpr(float("inf"))


@triton.jit
def _nan():
    # NaN as a value: a NaN global constexpr never equals itself, and Triton refuses to relaunch a
    # kernel whose globals "changed since it was compiled"
    return tl.full([], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _nan_max(a, b):
    # max/min reductions propagate NaN, like torch's amax/amin (tl.max drops it)
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nan_min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
'''

TANH_CUDA = '''

@triton.jit
def _tanh(x):
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)
'''

TANH_PORTABLE = '''

@triton.jit
def _tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1), exact at ±inf and accurate to fp32 rounding elsewhere
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
'''


def write_module(plan: Plan, program: ir.Program, schedules: list[KernelSchedule], target: str,
                 prefix: str) -> tuple[str, list[KernelSource]]:
    kernels = [write_kernel(plan, k, program, s, target, f"{prefix}_{k.name}")
               for k, s in zip(plan.kernels, schedules)]
    if target == "cuda" and pdl_supported():
        kernels = _dependent_launches(kernels)
    fast = target == "cuda" and any(s.fast_math for s in schedules)
    src = PRELUDE + (TANH_CUDA if fast else TANH_PORTABLE)
    for ks in kernels:
        src += "\n\n" + ks.source
    return src, kernels


_ = (conjunction, math)
