"""The kernel writer: scopes, broadcasting by axis name, and expressions (elementwise calls, integer
and float arithmetic, predicates). Memory (loads, stores, pointers) and reductions (contractions,
tl.dot) are its mixins in memory.py and contract.py."""

from __future__ import annotations

from contextlib import contextmanager

from .. import ir
from ..kernel_terms import inner_axes
from ..numeric import compute_dtype, index_range, reciprocal_exact, written_out
from ..ops import MONOIDS, OPS
from ..plan import KernelPlan, Plan
from ..schedule import KernelSchedule
from .contract import ContractOps
from .databounds import INTEGER, DataBound, in_kernel, index_comparisons, loop_range
from .memory import MemoryOps
from .values import (
    _TL_DTYPE,
    TensorArg,
    Val,
    _fmt_float,
    _folded,
    _ident,
    _int_const,
    _literal,
    _Scope,
)


class KernelWriter(MemoryOps, ContractOps):
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
        self.exact_arith = False  # an unrolled reduction was written: no FMA contraction (unrolled)
        self.tensors: dict[str, TensorArg] = {}
        self.extents: list[str] = []
        self.inner = inner_axes(kernel, plan)
        self.tiles = schedule.tiles
        # inline contractions over axes longer than their tile run as K-loops where they are used
        self.kloops = {a for a in self.inner if schedule.tiles.get(a, program.axes[a]) < program.axes[a]}
        self.vector: dict[str, str] = {}  # axis → name of its offsets vector in the current scope
        self.scalar: dict[str, str] = {}  # axis → scalar index name
        self.tail_masks: dict[str, bool] = {}  # axis → whether loads along it need a bounds mask now
        self.row_masks: dict[str, str] = {}  # axis → its validity mask when the tile is padded past its step
        self.starts: dict[str, str] = {}  # axis → first index of its offsets vector (offs = start + arange)
        self.descriptors: dict[str, tuple[int, ...]] = {}  # tensor → dimensions its descriptor spans
        self.buffers_read: set[str] = set()
        self.buffers_written: set[str] = set()
        self.reversed_states: set[str] = set()  # 2-D states laid out [n, m] for the tensor cores (passes.py)
        self.data_bounds: list[DataBound] = []  # loop bounds the launcher works out per call (databounds.py)
        self.hints: dict[str, str] = {}  # tensor → cache eviction policy in the current pass (eviction.py)
        self.hint_axis: str | None = None  # that pass's loop axis: the loads along it take the hint
        order = [a for a in kernel.grid if self.tiles.get(a, 1) > 1]
        loop_axes = list(dict.fromkeys(p.axis for p in kernel.passes()))
        self.canon = order + [a for a in loop_axes if a not in order] + sorted(self.inner - set(order) - set(loop_axes))

    # ---------------------------------------------------------------- helpers
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def tmp(self, stem: str = "t") -> str:
        self.n_tmp += 1
        return f"{stem}{self.n_tmp}"

    def tiled_exactly(self, axis: str, tile: int) -> bool:
        """Do tiles of `tile` cover `axis` with no lane past its end? Never known for a dynamic axis."""
        return axis not in self.program.dynamic and self.program.axes[axis] % tile == 0

    def one_tile(self, axis: str, tile: int | None) -> bool:
        """Is `axis` exactly one tile of `tile` lanes (no lane past its end)? Never known for a dynamic axis."""
        return axis not in self.program.dynamic and self.program.axes[axis] == tile

    def size(self, axis: str) -> str:
        """The length of `axis` in code: a literal where the kernel is compiled for it, else n_<axis>."""
        return self.extent(axis) if axis in self.program.dynamic else str(self.program.axes[axis])

    def data_bound(self, db: DataBound) -> tuple[str, str, str, str]:
        """Code of the (lo, hi, flo, fhi) loop offsets of this program under `db`: computed here where
        it compares the loop index with integers this program reads once (in_kernel_bound), else
        read from its argument tensor, db<k>_ptr [tiles of each grid axis of db..., 4], worked out
        per call by the launcher."""
        own = self.in_kernel_bound(db)
        if own is not None:
            return own
        if db not in self.data_bounds:
            self.data_bounds.append(db)
        k = self.data_bounds.index(db)
        if self.lookup(("data bound", k)) is None:  # read once where every pass sees it
            at = " + ".join(f"t_{_ident(a)} * db{k}_s{m}" for m, (a, _) in enumerate(db.grid)) or "0"
            for m, name in enumerate(("dlo", "dhi", "dflo", "dfhi")):
                self.emit(f"{name}{k} = tl.load(db{k}_ptr + {at} + {m})")
            self.scopes[-1].memo[("data bound", k)] = k
        return f"dlo{k}", f"dhi{k}", f"dflo{k}", f"dfhi{k}"

    def in_kernel_bound(self, db: DataBound) -> tuple[str, str, str, str] | None:
        """(lo, hi, flo, fhi) of `db` computed by the program itself, where every comparison is the
        loop index against integers over the program's own grid lanes (a request's length lens[b]:
        FlashAttention's varlen kernels read their offsets the same way): their min and max over the
        lanes inside the extents bound the loop. None else. An integer has no NaN."""
        if not in_kernel(db, self.k.grid, self.program):
            return None
        cmps = index_comparisons(db)
        vals = [self.value(v) for _, v in cmps]
        if any(x.kind not in ("i", *INTEGER) for x in vals):
            return None
        ranges = [loop_range(op, *self.lane_range(x), self.size(db.axis)) for (op, _), x in zip(cmps, vals)]
        lo, hi, flo, fhi = zip(*ranges)
        return (_fold("tl.maximum", lo), _fold("tl.minimum", hi), _fold("tl.maximum", flo),
                _fold("tl.minimum", fhi))

    def lane_range(self, x: Val) -> tuple[str, str]:
        """Code of the min and max of integer value x over the program's lanes inside the extents
        (x itself for a scalar; masked lanes read as ±(2^31 − 1), which can only widen the range)."""
        if not x.dims:
            return x.code, x.code
        key = ("lane range", x.code)
        hit = self.lookup(key)
        if hit is None:
            valid = [m for m in (self.lanes_valid(a) for a in x.dims) if m is not None]
            mask = " & ".join(self.arrange(m, x.dims) for m in valid)
            lo = f"tl.where({mask}, {x.code}, 2147483647)" if valid else x.code
            hi = f"tl.where({mask}, {x.code}, -2147483647)" if valid else x.code
            hit = self.scopes[-1].memo[key] = (self.bind(f"tl.min({lo})", (), "i", "vmin").code,
                                               self.bind(f"tl.max({hi})", (), "i", "vmax").code)
        return hit

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
        if len(self.scopes) == 1:
            return False
        return self.variant_in(n, self.scopes[-1])

    def home(self, n: ir.Node) -> int:
        """The innermost scope in which n varies (0: the program level), where computing it once
        serves every iteration of the loops inside (a K-loop nested in a pass: a value of the pass's
        tile is computed per pass iteration, not per K step)."""
        for k in range(len(self.scopes) - 1, 0, -1):
            if self.scopes[k].lines is not None and self.variant_in(n, self.scopes[k]):
                return k
        return 0

    @contextmanager
    def at_scope(self, k: int):
        """Emit at scope k's level (its lines and depth; only the scopes up to it visible)."""
        saved = self.scopes, self.lines, self.depth, dict(self.tail_masks)
        sc = self.scopes[k]
        self.scopes = self.scopes[:k + 1]
        self.lines, self.depth = (sc.lines, sc.depth) if k else (self.hoist_lines, self.hoist_depth)
        try:
            yield
        finally:
            self.scopes, self.lines, self.depth, self.tail_masks = saved

    def variant_in(self, n: ir.Node, sc: _Scope) -> bool:
        if sc.axis is not None and sc.axis in n.axes:
            return True
        for m in ir.walk(n):
            if isinstance(m, ir.StateRef) and m in sc.variant:
                return True
            if isinstance(m, ir.StateRef) and m.kind is ir.RefKind.INLINE:
                inner = self.plan.inline.get(m.name)
                if inner is not None and self.variant_in(inner, sc):
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

    def conj(self, a: Val, b: Val) -> Val:
        """a ∧ b as a mask."""
        return self._logical("and", a, b)

    def _logical(self, op: str, a: Val, b: Val) -> Val:
        """a ∧ b or a ∨ b. Triton's interpreter cannot `&` / `|` a tile with a predicate of one value per
        program read from data (a row test when a program takes one row): there it selects instead."""
        codes, dims = self.align([a, b])
        if self.target != "cuda" and dims and not (a.dims and b.dims):
            flag, tile = (codes[0], codes[1]) if not a.dims else (codes[1], codes[0])
            code = f"tl.where({flag}, {tile}, False)" if op == "and" else f"tl.where({flag}, True, {tile})"
            return self.bind(code, dims, "b", "m")
        return self.bind(OPS[op].triton.format(*codes), dims, "b", "m")

    def rounded(self, code: str, dtype: str) -> str:
        """`code` (fp32) ready to convert to `dtype`: bfloat16 rounds to nearest even on the GPU, and in
        Triton's interpreter (which truncates) through _rne_bf16."""
        return f"_rne_bf16({code})" if dtype == "bfloat16" and self.target != "cuda" else code

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
            # loop-invariant: compute before the loop (in the innermost loop where it varies, if any)
            k = self.home(n)
            with self.at_scope(k):
                v = self._value(n)
            self.scopes[k].memo[n] = v
            return v
        v = self._value(n)
        self.scopes[-1].memo[n] = v
        return v

    def lanes_valid(self, axis: str) -> Val | None:
        """Which lanes of a block axis lie inside its extent (None: all of them)."""
        if axis not in self.vector or not self.tail_masks.get(axis, True):
            return None
        code = self.row_masks.get(axis) or f"({self.vector[axis]} < {self.extent(axis)})"
        return Val(code, (axis,), "b")

    def _value(self, n: ir.Node) -> Val:
        if isinstance(n, ir.Const):
            return Val(_fmt_float(n.value), (), "f")
        if isinstance(n, ir.Index):
            if n.axis in self.vector:
                return Val(self.vector[n.axis], (n.axis,), "i")
            if n.axis in self.scalar:
                return Val(self.scalar[n.axis], (), "i")
            raise KeyError(f"axis {n.axis} has no index in kernel {self.k.name}")
        if isinstance(n, ir.Length):  # a dynamic axis's length is the kernel's argument n_<axis>
            if n.axis not in self.program.dynamic:
                return Val(str(self.program.axes[n.axis]), (), "i")
            return Val(self.extent(n.axis), (), "i")
        if isinstance(n, ir.StateRef):
            if n.kind is ir.RefKind.INLINE and n.name in self.plan.inline:
                return self.value(self.plan.inline[n.name])
            if n.kind is ir.RefKind.INLINE:  # computed by an earlier pass of this kernel over another axis
                final = self.lookup(ir.StateRef(ir.RefKind.FINAL, n.name, n.ref_axes))
                if final is not None:
                    return final
            raise KeyError(f"symbol {n.key} is not available in kernel {self.k.name}")
        if isinstance(n, ir.Load):
            return self.load(n)
        if isinstance(n, ir.Reduce):  # (over a padded tile, the lanes past the extent are masked out)
            short = self.unrolled(n)
            return short if short is not None else self.contract(n.op, n.axis, n.body, self.lanes_valid(n.axis))
        assert isinstance(n, ir.Call)
        op = OPS[n.op]
        if all(isinstance(a, ir.Const) for a in n.args):
            return self._value(_folded(n))  # Triton's math functions take tensors, not literals
        args = [self.value(a) for a in n.args]
        lits = [None if a.dims else _literal(a.code) for a in args]
        if n.op == "div" and None not in lits:  # (values that became literals: 0 / 0 is NaN, not Python's error)
            return self._value(_folded(ir.Call("div", tuple(ir.Const(v) for v in lits))))
        if n.op == "float":
            return self.f32(args[0])
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
        if n.op in ("and", "or"):
            return self._logical(n.op, *(self.as_bool(a) for a in args))
        if n.op == "not":
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
        if n.op == "div" and n.args[0] != ir.Const(1.0) and reciprocal_exact(n.args[1], self.program.inputs):
            # a tile over a row's value (dP / l): one reciprocal per row, a multiply per element (a
            # division is ~10 instructions); within rounding of a / b where 1/b is exact. Taken whatever
            # the layout (also where b varies as a does): a value computed in two kernels, one holding b
            # per row and one per element, then has the same bits in both — a value compared with its own
            # min recomputed elsewhere (softmax rows, log-softmax over the other axis, amin) meets it
            inv = self.value(ir.Call("div", (ir.Const(1.0), n.args[1])))
            codes, dims = self.align([self.f32(args[0]), self.f32(inv)])
            return self.bind(f"({codes[0]} * {codes[1]})", dims, "f")
        codes, dims = self.align([self.f32(a) for a in args])
        return self.bind(op.triton.format(*codes), dims, "f")

    def unrolled(self, n: ir.Reduce) -> Val | None:
        """A reduction over a short axis of static length (numeric.written_out: a point's 3 coordinates)
        as one term per index, combined in index order: the body at d = 0, 1, 2 holds no d axis, so no
        [.., .., 4]-padded block and no reduction across lanes, and the value has the same bits in every
        kernel computing it (the kernel then runs without FMA contraction: exact_arith). None for any
        other reduction, and for integer terms (summed exactly in int64 by contract, in any order)."""
        if not written_out(n, self.program):
            return None
        if n.axis not in self.vector or n.axis in self.kloops:
            raise ir.NeptuneError(f"internal error: kernel {self.k.name} cannot write out the reduction over "
                                  f"'{n.axis}' ({ir.show(n)}) term by term")
        terms = [self.value(ir.substitute(n.body, {ir.Index(n.axis): ir.Const(float(k))}))
                 for k in range(self.program.axes[n.axis])]
        if any(t.kind in ("i", "b") for t in terms):
            return None
        self.exact_arith = True
        fmt = OPS[MONOIDS[n.op].combine].triton
        acc = self.f32(terms[0])
        for t in terms[1:]:
            codes, dims = self.align([acc, self.f32(t)])
            acc = self.bind(fmt.format(*codes), dims, "f", "r")
        return acc

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
        # floats as torch computes them (div_floor_floating, remainder), from fmod (Triton's float %)
        codes, dims = self.align([self.f32(v) for v in args])
        x, y = codes
        r = self.bind(f"{x} % {y}", dims, "f")
        off = f"(({r.code} != 0) & (({y} < 0) != ({r.code} < 0)))"  # fmod's sign differs from y's
        if n.op == "mod":
            return self.bind(f"tl.where({off}, {r.code} + {y}, {r.code})", dims, "f")
        d = self.bind(f"({x} - {r.code}) / {y} - tl.where({off}, 1.0, 0.0)", dims, "f")
        fl = self.bind(f"tl.floor({d.code})", dims, "f")
        fl = self.bind(f"tl.where({d.code} - {fl.code} > 0.5, {fl.code} + 1.0, {fl.code})", dims, "f")
        q = f"tl.where({d.code} != 0, {fl.code}, 0.0 * ({x} / {y}))"  # a zero keeps the sign of x / y
        return self.bind(f"tl.where({y} == 0, {x} / {y}, {q})", dims, "f")

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
        if isinstance(n, ir.StateRef):
            if n.kind is ir.RefKind.INLINE and n.name in self.plan.inline:
                return self.eff_dims(self.plan.inline[n.name])
            return frozenset(n.axes & set(self.vector))
        if isinstance(n, ir.Reduce):
            return self.eff_dims(n.body) - {n.axis}
        out2: frozenset[str] = frozenset()
        for c in n.children():
            out2 |= self.eff_dims(c)
        return out2

    # ---------------------------------------------------------------- memory


def _fold(fn: str, codes) -> str:
    """Code of fn over `codes` (tl.maximum / tl.minimum of two at a time)."""
    out = codes[0]
    for c in codes[1:]:
        out = f"{fn}({out}, {c})"
    return out
