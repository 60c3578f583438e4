"""Reading and writing tensors: pointers (64-bit where asked), masks for tile tails and for gathered
indices that may fall outside a tensor, loads (pointer or tensor-descriptor), stores."""

from __future__ import annotations

from .. import ir
from ..index_shift import clamped_shift
from ..numeric import index_within
from ..plan import ROW_PAD, StorePlan
from .values import _TL_DTYPE, Val, _ident, _literal, block_shape

# loaded as int64: integer arithmetic is int64 (an int32 sum a.long() + b.long() must not wrap at 2^31, nor
# a product of uint8 values at 256; the frontend refuses torch's wrapping arithmetic on the 8/16-bit ones)
WIDENED_INTS = ("uint8", "int8", "int16", "int32")


class MemoryOps:
    """KernelWriter's loads and stores (a mixin: it uses the writer's scopes and values)."""

    def pointer(self, tensor: str, index: tuple[ir.Node, ...], order: tuple[str, ...] | None,
                uniform_rows: bool = False, clamp_rows: bool = False, shifts: dict[int, tuple] | None = None):
        """(pointer code, mask code or None, dims) for a block of `tensor` at `index`. With `clamp_rows`
        (a load), the tail lanes of a grid axis' tile read the axis' last element instead of being
        masked: a grid axis is never reduced inside its kernel, so what those lanes compute stays in
        them, and the stores of it are masked. A tile read under a runtime row bound (a dynamic query
        length) is then unmasked: softcap prefill's query tile masked by a runtime n_i ran 4.56 ms
        against 3.68 clamped and 3.58 for the static compile (H200, bench/probe_dynamic_strides.py). Not the
        tensor's last dimension (contiguous, as a rule): clamped, its addresses are no longer consecutive
        and the load is not vectorised (V's head dimension of 96 in a tile of 128). `shifts`: index
        positions read unclamped, position → (index Val, mask Val) (see `_unit_shifts`)."""
        self._argument(tensor)
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
                valid = self.lanes_valid(e.axis)
                if valid is not None and self._in_padding(tensor, k, e.axis, load=clamp_rows):
                    valid = None  # the tile's tail lies in the buffer's row padding (plan.ROW_PAD)
                if valid is not None and clamp_rows and e.axis in self.k.grid and e.axis not in self.row_masks \
                        and axes[k] == e.axis and k < len(axes) - 1:
                    last = f"{self.extent(e.axis)} - 1"
                    entries.append((Val(f"tl.minimum({self.vector[e.axis]}, {last})", (e.axis,), "i"), stride))
                    continue
                entries.append((Val(self.vector[e.axis], (e.axis,), "i"), stride))
                if valid is not None:
                    masks.append(valid)
            elif isinstance(e, ir.Index) and e.axis is ir.CHUNK:
                entries.append((Val("pid_chunk", (), "i"), stride))
            elif shifts and k in shifts:
                entries.append((shifts[k][0], stride))
                masks.append(shifts[k][1])
            else:
                v = self.value(e)
                lit = _literal(v.code)
                if v.kind not in ("i", "b") and lit is not None and float(lit).is_integer():
                    v = Val(str(int(lit)), v.dims, "i")  # a constant position (x[:, -1:]) folded to 6.0
                elif v.kind not in ("i", "b"):  # an integer-valued index the algebra wrote with float ops
                    v = self.bind(f"({v.code}).to(tl.int64)", v.dims, "i")
                entries.append((v, stride))
                n = self.size(axes[k])
                # (an axis read at an axis of the same group has its length; a computed index over a
                # dynamic axis is not known to stay inside the call's lengths)
                dyn = not isinstance(e, ir.Index) and self.program.dynamic & (e.axes | {axes[k]})
                if dyn or not index_within(e, self.program.axes, self.program.axes[axes[k]]):
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
            mask = _tile_mask([self.arrange(m, dims) for m in [*masks, *in_range]], [*masks, *in_range], dims)
        valid = None
        if in_range:
            valid = _tile_mask([self.arrange(m, dims) for m in in_range], in_range, dims)
        return ptr, mask, dims, valid

    def load(self, n: ir.Load, order: tuple[str, ...] | None = None) -> Val:
        key = ("load", n, order)
        hit = self.lookup(key)
        if hit is not None:
            return hit
        other = self.lookup(("load any order", n))
        if other is not None and (order is None or set(order) == set(other.dims)):
            # (K read as [d, j] for QKᵀ and as [j, d] for dS·K: one load, one view)
            dims = order or tuple(a for a in self.canon if a in other.dims)
            v = Val(self.arrange(other, dims), dims, other.kind)
            self.scopes[-1].memo[key] = v
            return v
        if len(self.scopes) > 1 and not self.is_variant(n):
            # loop-invariant (e.g. the query tile): load once before the loop
            with self.at_scope(self.home(n)):
                return self.load(n, order)
        dtype = self.plan.loaded_dtype(self.program, n.tensor)
        if n.tensor in self.plan.buffers:
            self.buffers_read.add(n.tensor)
        tma = self.descriptor_load(n) if self.sched.tma else None
        edges: list[tuple[Val, ir.Load]] = []
        if tma is not None:
            code, dims = tma
        else:
            uniform = self._uniform_here(n)
            shifts, edges = self._unit_shifts(n, uniform)
            ptr, mask, dims, valid = self.pointer(n.tensor, n.index, order, uniform_rows=uniform,
                                                  clamp_rows=True, shifts=shifts)
            hint = self.hints.get(n.tensor) if self.hint_axis in n.axes else None
            extra = f", eviction_policy={hint!r}" if hint else ""
            code = f"tl.load({ptr}, mask={mask}, other=0{extra})" if mask else f"tl.load({ptr}{extra})"
            if valid is not None and dtype.startswith("float"):
                code = f"tl.where({valid}, {code}, _nan().to({_TL_DTYPE[dtype]}))"  # keeps the load's dtype
        kind = dtype if dtype in ("float16", "bfloat16") else ("f" if dtype.startswith("float") else
                                                                ("b" if dtype == "bool" else "i"))
        v = self.bind(code, dims, kind, "x")
        if kind == "f" and dtype != self.floats:
            v = self.bind(f"{v.code}.to({self.fdt})", dims, "f", "x")
        if dtype in WIDENED_INTS:
            v = self.bind(f"{v.code}.to(tl.int64)", dims, "i", "x")
        for cond, at in edges:  # the clamped lanes read the edge element (here, as the tile is read:
            # hoisted, a kv head h // G uniform in the loop would be a vector of the program's heads)
            eptr, emask, edims, _ = self.pointer(at.tensor, at.index, None, uniform_rows=uniform, clamp_rows=True)
            edge = self.bind(f"tl.load({eptr}, mask={emask}, other=0)" if emask else f"tl.load({eptr})", edims,
                             kind, "x")
            if kind == "f" and dtype != self.floats:
                edge = self.bind(f"{edge.code}.to({self.fdt})", edims, "f", "x")
            if dtype in WIDENED_INTS:
                edge = self.bind(f"{edge.code}.to(tl.int64)", edims, "i", "x")
            v = self.bind(f"tl.where({self.arrange(cond, dims)}, {self.arrange(edge, dims)}, {v.code})", dims,
                          v.kind, "x")
        self.scopes[-1].memo[key] = v
        # a later load of n in another axis order is a transposed view of this tile (Triton reads
        # the shared-memory copy a dot operand came from transposed, rather than loading it twice)
        self.scopes[-1].memo[("load any order", n)] = v
        return v

    def _argument(self, tensor: str):
        """The kernel argument of input or plan buffer `tensor`, registered at its first use."""
        if tensor not in self.tensors:
            spec = self.program.inputs.get(tensor)
            if spec is not None:
                self.tensor(tensor, spec.axes, spec.dtype, "input")
            else:
                buf = self.plan.buffers[tensor]
                self.tensor(tensor, buf.axes, buf.dtype, "buffer")
        return self.tensors[tensor]

    def _unit_shifts(self, n: ir.Load, uniform: bool) -> tuple[dict[int, tuple[Val, Val]], list[tuple[Val, ir.Load]]]:
        """The index positions of `n` read at a clamped shift clamp(a + c, lo, hi) of a tile axis a (a
        slice, torch.cat, rotate-half), each as the unclamped index a + c under the mask lo ≤ a + c ≤ hi:
        consecutive addresses, one vectorised load, where min/max of the index had made every lane a
        load of its own (RoPE's rotated key tile ran 10× the plain kernel on the H100). The lanes the
        clamp moves read the edge element x[lo] or x[hi] instead: (condition, edge load) pairs. Exact
        for every index the clamp gives; only where the clamped index stays inside the tensor (static
        extents), else the general gathered path with its range mask."""
        shifts: dict[int, tuple[Val, Val]] = {}
        edges: list[tuple[Val, ir.Load]] = []
        axes = self._argument(n.tensor).axes
        for k, e in enumerate(n.index):
            sh = None if isinstance(e, ir.Index) or (uniform and self.uniform_index(e)) else clamped_shift(e)
            if sh is None or sh.axis not in self.vector or sh.lo > sh.hi or len(shifts) \
                    or self.program.dynamic & {sh.axis, axes[k]} or not isinstance(axes[k], str) \
                    or not index_within(e, self.program.axes, self.program.axes[axes[k]]):
                continue
            size, span = self.program.axes[axes[k]], self.program.axes[sh.axis]
            lo = int(sh.lo) if sh.lo > -float("inf") else 0
            hi = int(sh.hi) if sh.hi < float("inf") else size - 1
            t = self.bind(f"({self.vector[sh.axis]} + {sh.c})", (sh.axis,), "i")
            shifts[k] = (t, self.bind(f"({t.code} >= {lo}) & ({t.code} < {hi + 1})", (sh.axis,), "b", "m"))
            for bound, clamped, cmp in ((lo, sh.c < sh.lo, "<"), (hi, span - 1 + sh.c > sh.hi, ">")):
                if clamped:
                    at = ir.Load(n.tensor, tuple(ir.Const(float(bound)) if j == k else x
                                                 for j, x in enumerate(n.index)))
                    edges.append((self.bind(f"({t.code} {cmp} {bound})", (sh.axis,), "b", "m"), at))
        return shifts, edges

    def _in_padding(self, tensor: str, k: int, axis: str, load: bool) -> bool:
        """Whether dimension k of `tensor` is a plan buffer's last (padded) axis, tiled along `axis` by a
        tile that divides ROW_PAD: a tail lane then falls in the padding. A load may read it only along a
        grid axis (its lanes stay apart: a reduced axis would add the padding in); a store may write it."""
        buf = self.plan.buffers.get(tensor)
        if buf is None or k != len(buf.axes) - 1 or not isinstance(buf.axes[k], str) or axis in self.row_masks:
            return False
        tile = self.tiles.get(axis)
        return isinstance(tile, int) and ROW_PAD % tile == 0 and (not load or axis in self.k.grid)

    def descriptor_load(self, n: ir.Load) -> tuple[str, tuple[str, ...]] | None:
        """(code, dims) of a tile of input `n.tensor` read through a tensor descriptor, or None where
        one cannot be used. The descriptor spans the index positions that are tile vectors (their
        order kept, the last one innermost); the others are one value per program (a grid index,
        or a // G) and go into its base pointer. Out-of-bounds rows and columns read as zero, so no
        masks; the launcher checks the strides and alignment a descriptor needs at run time."""
        spec, role = self.program.inputs.get(n.tensor), "input"
        if spec is None and n.tensor in self.plan.buffers:
            # a buffer the plan allocates contiguous (a materialised GEMM operand): its rows are
            # 16-byte aligned when its extents are static and its innermost row is
            spec, role = self.plan.buffers[n.tensor], "buffer"
            if set(spec.axes) & self.program.dynamic or any(not isinstance(a, str) for a in spec.axes) or (
                    self.program.axes[spec.axes[-1]] * ir.DTYPE_BYTES.get(spec.dtype, 4)) % 16:
                return None
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
        self.tensor(n.tensor, spec.axes, spec.dtype, role)
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
            v = Val(f"tl.full({block_shape(dims)}, {v.code}, {self.fdt})", dims, "f")
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
        if v.kind not in ("i", "b"):
            code = self.rounded(code, dtype)
        hint = self.hints.get(st.target)
        self.emit(f"tl.store({ptr}, ({code}).to({_ident(st.target)}_ptr.dtype.element_ty)"
                  + (f", mask={m}" if m else "") + (f", eviction_policy={hint!r})" if hint else ")"))
        if guard:
            self.depth -= 1

    # ---------------------------------------------------------------- reductions


def _tile_mask(codes: list[str], vals: list[Val], dims: tuple[str, ...]) -> str:
    """The conjunction of mask parts as a mask of the whole tile. A part with no dimensions (one
    flag per program: a gathered row's bounds check) starts from a full tile of True: Triton's
    interpreter refuses `vector & flag` as a load mask."""
    if dims and any(not v.dims for v in vals):
        codes = [f"tl.full({block_shape(dims)}, 1, tl.int1)", *codes]
    return " & ".join(codes)
