"""Reductions inside a kernel: a monoid over a block axis (exact in int64 for integer bodies,
NaN-propagating for max/min), and sums of products that become tl.dot."""

from __future__ import annotations

import math

from .. import ir
from ..contraction import gemm_sides, is_product, opened
from ..numeric import INT_IDENTITY, compute_dtype, held_dtypes, held_wide, reciprocal_exact
from ..ops import MONOIDS, OPS
from .values import (
    _TL_DTYPE,
    Val,
    _fmt_float,
    _fmt_num,
    _ident,
    _literal,
    _Scope,
    block_shape,
)


class ContractOps:
    """KernelWriter's reductions (a mixin)."""

    def contract(self, op: str, axis: str, body: ir.Node, mask: Val | None, acc: Val | None = None,
                 integer: bool = False) -> Val:
        """op-reduce `body` over the block axis `axis` (masked-out elements contribute the identity).
        With `acc` (a sum only) the result is acc + the reduction when it becomes a tl.dot that can
        accumulate into acc in place, else the reduction alone: callers check `Val.kind == "acc"`.
        An integer body (or `integer`: the component is an integer reduction, numeric.integral)
        reduces exactly in int64."""
        if axis in self.kloops and not any(sc.axis == axis for sc in self.scopes):
            # (also where a pass over `axis` holds its tile but the value is computed before that pass,
            # hoisted out of it: there its offsets do not exist yet — a layer norm's backward reading a
            # sum over the pass's axis, fuzz --big seed 34, referenced offs_j before its loop)
            return self.contract_loop(op, axis, body, mask)
        ident = MONOIDS[op].identity
        scale = _positive_scale(body) if op in ("max", "min") and not integer else None
        if scale is not None:
            # max_j(c·x) = c·max_j(x) for c > 0 (exactly, in floating point too: rounding is monotone;
            # c·±inf = ±inf keeps masked-out identities). The tile then needs no c·x of its own, so
            # where c·x feeds a subtraction (softmax's c·s − m) the two fuse into one FMA.
            c, rest = scale
            r = self.contract(op, axis, rest, mask)
            return self.bind(f"{r.code} * {_fmt_float(c)}", r.dims, "f", "r")
        if op == "sum" and axis in self.vector and not integer:
            dot = self.try_dot(axis, body, mask, acc)
            if dot is not None:
                return dot
        v = self.value(body)
        lit = None if v.dims else _literal(v.code)
        if integer and lit is not None:  # a count: where(p, 1, 0) with the mask split off leaves 1
            v, kind, ident = Val(str(int(lit)), (), "i"), "i", INT_IDENTITY[op]
        elif integer or v.kind in ("i", "b"):  # exact, in int64 (like torch's integer sums)
            v, kind, ident = Val(f"({v.code}).to(tl.int64)", v.dims, "i"), "i", INT_IDENTITY[op]
        else:
            v, kind = self.f32(v), "f"
        # (a count's body is the constant 1: its mask gives the other axes it varies over)
        dims = tuple(a for a in self.canon if a in set(v.dims) | {axis} | set(mask.dims if mask is not None else ()))
        code = self.arrange(v, dims)
        if axis not in v.dims:
            code = f"tl.full({block_shape(dims)}, {code}, {self.dtype_of(kind)})" if _literal(v.code) is not None \
                else f"tl.broadcast_to({code}, {block_shape(dims)})"
        if mask is not None:
            mcode = self.arrange(mask, dims)
            code = f"tl.where({mcode}, {code}, {_fmt_num(ident)})"
        out_dims = tuple(d for d in dims if d != axis)
        fmt = MONOIDS[op].triton_reduce
        if self.target != "cuda" and op in ("max", "min") and kind == "f":  # (lower/triton.py: _nan_amax)
            fmt = f"_nan_a{op}({{0}}, {{1}})"
        return self.bind(fmt.format(code, dims.index(axis)), out_dims, kind, "r")

    def contract_loop(self, op: str, axis: str, body: ir.Node, mask: Val | None) -> Val:
        """op-reduce `body` over `axis` in a loop of tiles (a K-loop): an inline contraction over an
        axis too long for one tile, nested where it is used (the hidden axis of linear cross-entropy,
        inside the pass over the vocabulary). The accumulator stays on chip; a sum of products
        accumulates on the tensor cores."""
        a = _ident(axis)
        dims = tuple(d for d in self.canon if d in self.eff_dims(body) and d != axis)
        acc = self.bind(f"tl.full({block_shape(dims)}, {_fmt_num(MONOIDS[op].identity)}, {self.fdt})", dims, "f",
                        "acc")
        outer_lines, outer_depth = self.lines, self.depth
        outer = self.vector.get(axis), self.starts.get(axis), self.tail_masks.get(axis)
        body_lines: list[str] = []
        self.lines, self.depth = body_lines, outer_depth + 1
        self.scopes.append(_Scope(axis=axis, variant=set(), lines=body_lines, depth=outer_depth + 1))
        self.vector[axis], self.starts[axis] = f"offs_{a}", f"start_{a}"
        self.tail_masks[axis] = not self.tiled_exactly(axis, self.tiles[axis])
        try:
            self.emit(f"offs_{a} = start_{a} + tl.arange(0, BLOCK_{a})")
            valid = Val(f"(offs_{a} < {self.extent(axis)})", (axis,), "b") if self.tail_masks[axis] else None
            if mask is not None and valid is not None:
                valid = self.conj(valid, mask)
            elif mask is not None:
                valid = mask
            part = self.contract(op, axis, body, valid, acc=acc if op == "sum" else None)
            if part.kind == "acc":
                new = part.code
            else:
                codes, _ = self.align([acc, part])
                new = OPS[MONOIDS[op].combine].triton.format(*codes)
            self.emit(f"{acc.code} = {new}")
        finally:
            self.scopes.pop()
            del self.vector[axis], self.starts[axis], self.tail_masks[axis]
            if outer[0] is not None:  # (the pass over `axis` this loop ran before: its tile again)
                self.vector[axis], self.starts[axis], self.tail_masks[axis] = outer
            self.lines, self.depth = outer_lines, outer_depth
        stages = f", num_stages={self.sched.num_stages}" if self.target == "cuda" else ""
        self.emit(f"for start_{a} in tl.range(0, {self.extent(axis)}, BLOCK_{a}{stages}):")
        self.lines.extend(body_lines)
        return Val(acc.code, dims, "f")

    def dtype_of(self, kind: str) -> str:
        """The Triton dtype of a computed value of `kind` ("f" compute float, "i" int64)."""
        return "tl.int64" if kind == "i" else self.fdt

    def try_dot(self, k: str, body: ir.Node, mask: Val | None, acc: Val | None = None) -> Val | None:
        body_dims = set(self.eff_dims(body))
        have = body_dims | set(mask.dims if mask is not None else ())  # (a mask may add an axis)
        out = [a for a in self.canon if a in have and a != k]
        if len(out) != 2 or any(self.tiles.get(a, 1) < 16 for a in [*out, k]):
            return None
        m, n = out
        if acc is not None and acc.dims == (n, m):  # the state is laid out [n, m] (passes._computed_on_the_right)
            m, n = n, m
        left, right, post, along_k = [], [], [], []
        factors, preds = self.masked_factors(body)
        for f in factors:
            fd = set(self.eff_dims(f))
            if fd == {k}:  # a factor over k alone may scale either operand: placed below
                along_k.append(f)
                continue
            if k not in fd:
                # a per-row (or per-column) factor scales its operand: the tensor cores then
                # accumulate in place (an [m, n] product per step would serialise the MMAs)
                if fd and fd <= {m}:
                    left.append(f)
                elif fd and fd <= {n}:
                    right.append(f)
                elif fd <= {m, n}:
                    post.append(f)
                else:
                    return None
                continue
            if fd <= {m, k}:
                left.append(f)
            elif fd <= {n, k}:
                right.append(f)
            else:
                return None
        # A factor over k alone joins an operand that is computed already, so that a loaded 16-bit
        # operand stays one: Σ_i (h[i, d] / l[i]) · p[i, j] would otherwise multiply two fp32 tiles
        # (an IEEE dot, off the tensor cores) where h · (p / l) casts p once and runs on them.
        # (a side with no factor is built in registers too: the 0/1 matrix below)
        native = [bool(side) and data_operand(side) for side in (left, right)]
        (right if native[0] and not native[1] else left).extend(along_k)
        if not left and not right:
            return None
        # A side with no factor is the constant 1 under the conditions that vary along it: a zero-branch
        # where(t[i] = j, h[i, d], 0) is the dot of h with a 0/1 matrix (exact in 16 bits), not an
        # [i, j, d] block of selections summed in registers. (As for any masked dot here, the loaded
        # operand is taken as finite: an inf in h meets the 0s as NaN — README, "What is guaranteed".)
        left, right = left or [ir.Const(1.0)], right or [ir.Const(1.0)]
        if mask is not None:
            md = set(mask.dims)
            side = "left" if md <= {m, k} else ("right" if md <= {n, k} else None)
            if side is None:
                return None
        # A computed operand may hold inf or NaN in a masked-out lane (1/l of an empty row, or of a
        # padding row loaded as 0), which a zero in the other operand would not cancel (0·NaN is NaN);
        # a loaded operand holds data (or the zero of a masked load) there. So a mask over k alone
        # also goes to a computed second operand, and a computed operand the mask does not reach gets
        # the k axis' bounds.
        md = set(mask.dims) if mask is not None else set()
        computed = [not data_operand(side) for side in (left, right)]
        if mask is not None and not md <= body_dims and computed[0 if md <= {n, k} else 1]:
            return None  # the mask alone brings an axis; the other operand, computed, may hold inf where it is 0
        a_mask = mask if mask is not None and md <= {m, k} else None
        b_mask = mask if mask is not None and md <= {n, k} and (not md <= {m, k} or (md <= {k} and computed[1])) \
            else None
        valid_k = self.lanes_valid(k)
        a_mask = a_mask if a_mask is not None or not computed[0] else valid_k
        b_mask = b_mask if b_mask is not None or not computed[1] else valid_k
        for p in preds:  # a where's zero branch masks the operand it varies with: exact when the other
            pd = set(p.dims)  # operand is data (finite) or gets the mask too
            to_a, to_b = pd <= {m, k}, pd <= {n, k} and not pd <= {m, k}
            if not (to_a or to_b):
                return None
            to_a, to_b = to_a or (pd <= {k} and computed[0]), to_b or (pd <= {k} and computed[1])
            if (not to_a and computed[0]) or (not to_b and computed[1]):
                return None
            a_mask = self.both(a_mask, p) if to_a else a_mask
            b_mask = self.both(b_mask, p) if to_b else b_mask
        a_at, b_at = self._invariant_at(left, a_mask, valid_k), self._invariant_at(right, b_mask, valid_k)
        a = self._at(a_at, lambda: self.operand(left, (m, k), a_mask))
        b = self._at(b_at, lambda: self.operand(right, (k, n), b_mask))
        if a.native and not b.native and wide_operand(right, self.plan):
            a = self.f32(a)  # (a float32 value beside a 16-bit load: multiplied in float32, held_wide)
        elif b.native and not a.native and wide_operand(left, self.plan):
            b = self.f32(b)
        elif a.native and not b.native:
            b = self._cast(b, a.kind, b_at)
        elif b.native and not a.native:
            a = self._cast(a, b.kind, a_at)
        elif a.native and b.native and a.kind != b.kind:
            a, b = self.f32(a), self.f32(b)
        elif not a.native and not b.native and (kind := self._data_dtype(left + right, k)) is not None:
            # both computed, each an elementwise function of one 16-bit dtype's data (RoPE's q·cos +
            # rotate_half(q)·sin beside k's): rounded to it once, as torch holds such values, rather
            # than an fp32 IEEE dot off the tensor cores (1.86 s against SDPA's 0.6 ms, H100)
            a, b = self._cast(a, kind, a_at), self._cast(b, kind, b_at)
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
            r = self._scale(r, f)
        return r

    def _invariant_at(self, factors: list[ir.Node], mask: Val | None, valid_k: Val | None) -> int | None:
        """The outer scope a computed operand may be built in once, where none of its factors varies in
        the innermost loop and its mask is at most the contraction axis' own tail (attention's rotated
        query tile, cast to 16 bits once per program rather than every key step); None otherwise."""
        if len(self.scopes) == 1 or (mask is not None and mask is not valid_k) or data_operand(factors):
            return None
        at = max(self.home(f) for f in factors)
        return at if at < len(self.scopes) - 1 and (mask is None or not self._along_loops(mask.dims)) else None

    def _along_loops(self, dims) -> bool:
        """Does an index over `dims` change along an enclosing loop?"""
        return any(sc.axis in dims for sc in self.scopes[1:])

    def _at(self, at: int | None, make) -> Val:
        if at is None:
            return make()
        with self.at_scope(at):
            return make()

    def _cast(self, v: Val, kind: str, at: int | None) -> Val:
        """v converted to the 16-bit `kind` for the tensor cores: in place, or bound once in scope `at`
        where v was built there (memoised: the three key loops of a causal kernel share it)."""
        code = f"{self.rounded(v.code, kind)}.to({_TL_DTYPE[kind]})"
        if at is None:
            return Val(code, v.dims, kind)
        key = ("cast", v.code, kind)
        hit = self.scopes[at].memo.get(key)
        if hit is None:
            with self.at_scope(at):
                hit = self.scopes[at].memo[key] = self.bind(code, v.dims, kind, "c")
        return hit

    def masked_factors(self, body: ir.Node) -> tuple[list[ir.Node], list[Val]]:
        """The factors of `body` (contraction.opened: a divisor b is the factor 1/b, a zero-branch where
        is opened) and the conditions under which it is not 0, as boolean values."""
        parts = opened(body)
        return list(parts.factors), [self.as_bool(self.value(c)) for c in parts.conditions]

    def both(self, a: Val | None, b: Val) -> Val:
        """a ∧ b (b when a is None)."""
        return b if a is None else self.conj(a, b)

    def _mul(self, a: Val, b: Val) -> Val:
        codes, dims = self.align([a, b])
        return self.bind(f"{codes[0]} * {codes[1]}", dims, "f")

    def _scale(self, prod: Val, f: ir.Node) -> Val:
        """prod · f; for an opened divisor f = 1/b, prod / b unless 1/b is exact (numeric.reciprocal_exact:
        1/b of a subnormal b is ∞ where prod / b is finite)."""
        b = _divisor(f)
        if b is not None and not reciprocal_exact(b, self.program.inputs):
            codes, dims = self.align([prod, self.f32(self.value(b))])
            return self.bind(f"({codes[0]} / {codes[1]})", dims, "f")
        return self._mul(prod, self.f32(self.value(f)))

    def _data_dtype(self, factors: list[ir.Node], k: str) -> str | None:
        return data_dtype(factors, k, self.plan, self.program)

    def operand(self, factors: list[ir.Node], order: tuple[str, str], mask: Val | None) -> Val:
        if len(factors) == 1 and isinstance(factors[0], ir.Load):
            if mask is not None and self._zero_filled(factors[0], mask):
                mask = None
            v = self.load(factors[0], order=tuple(a for a in order if a in self.eff_dims(factors[0])))
            if v.dims != order:
                v = Val(self.arrange(v, order), order, v.kind)
            if mask is not None:  # masked in its own dtype: a 16-bit operand stays one for the tensor cores
                if not set(mask.dims) <= set(order):
                    return self._computed_operand(factors, order, mask)
                codes, dims = self.align([mask, v])
                w = self.bind(f"tl.where({codes[0]}, {codes[1]}, 0.0)", dims, v.kind, "p")
                v = Val(self.arrange(w, order), order, v.kind)
            return v
        return self._computed_operand(factors, order, mask)

    def _zero_filled(self, load: ir.Load, mask: Val) -> bool:
        """Is `mask` the tail mask of an axis `load` indexes directly, whose lanes the load itself reads
        as 0 (masked, not clamped, not in a buffer's row padding)? Then selecting on it again is a
        no-op: it had been evaluated on the query tile every step of attention's loop at a head
        dimension of 96 in a tile of 128."""
        if len(mask.dims) != 1:
            return False
        (axis,) = mask.dims
        valid = self.lanes_valid(axis)
        return valid is not None and valid.code == mask.code and any(
            isinstance(e, ir.Index) and e.axis == axis and not self._in_padding(load.tensor, k, axis, load=True)
            and not (axis in self.k.grid and k < len(load.index) - 1)  # (clamped there: memory.pointer)
            for k, e in enumerate(load.index))

    def _computed_operand(self, factors: list[ir.Node], order: tuple[str, str], mask: Val | None) -> Val:
        # a divisor's factor 1/b last: the product before it is then divided (see _scale)
        factors = sorted(factors, key=lambda f: _divisor(f) is not None)
        prod = self.f32(self.value(factors[0]))
        for f in factors[1:]:
            prod = self._scale(prod, f)
        if not prod.dims and _literal(prod.code) is not None:  # (a bare number is float32 under a mask, 1
            prod = Val(f"tl.full([], {prod.code}, {self.fdt})", (), "f")  # beside float64, and no tensor
            # at all broadcast alone: tl.broadcast_to(1.0, …) failed to compile, a sink logit's dK)
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


def _divisor(f: ir.Node) -> ir.Node | None:
    """b of an opened divisor's factor 1/b (contraction.opened), else None."""
    return f.args[1] if isinstance(f, ir.Call) and f.op == "div" and f.args[0] == ir.Const(1.0) else None


def data_dtype(factors: list[ir.Node], k: str, plan, program: ir.Program) -> str | None:
    """The one 16-bit dtype of every floating tensor the factors load: the dtype torch holds such a
    function of the data in (QK-norm's q·rsqrt(mean_d q²)·w, its row reduction computed in the tile,
    is a bf16 tensor to torch; an fp32 IEEE dot of it ran off the tensor cores). A final statistic
    read as a factor — a plan buffer of a reduction — is the kernels' float32 copy of what torch held
    in the data's dtype (F.normalize(q) @ F.normalize(keys)ᵀ in fp16, both norms computed first: each
    operand an fp16 tensor to torch; a gated attention's backward, dV = Σ_i P[i, j]·(dO·σ(g))[i, e]
    with P from the row max and sum written by the forward: both operands 16-bit tensors to torch).
    None otherwise: where a factor reads a running state (the operand then is not torch's value and
    could overflow 16 bits, below), and where a factor is marked float32 (`round_f32`: the frontend's
    operand of a float32 matmul, F.normalize(q.float()))."""
    dtypes = set()
    factors = list(factors)
    buffers = plan.buffers

    def dtype_of(t: str) -> str | None:
        if t in buffers and not buffers[t].operand:
            return None  # (a statistic the plan wrote: a row factor, or one along k — attention's
            # row max and sum in its backward's dV = Σ_i P·dO', P a 16-bit tensor to torch)
        if (spec := program.inputs.get(t)) is not None and spec.holds is not None:
            return None  # (a statistic a training forward saved: its log-sum-exp, read by that dV)
        return plan.loaded_dtype(program, t)

    for f in factors:
        for n in ir.walk(f):
            if isinstance(n, ir.StateRef) and n.kind is ir.RefKind.INLINE and n.name in plan.inline:
                factors.append(plan.inline[n.name])  # (a reduction computed in the tile)
            elif isinstance(n, ir.StateRef) and (n.running or k in n.axes):
                # (a running state is no row factor of torch's: q / ‖q‖ over the tiles so far is larger
                # than q / ‖q‖, unbounded where a partial sum is near 0, and in 16 bits it could overflow
                # where the float32 operand and torch's do not; a state varying along k is none either)
                return None
        dtypes |= held_dtypes(f, dtype_of)
    return dtypes.pop() if len(dtypes) == 1 and dtypes <= {"float16", "bfloat16"} else None


def wide_operand(side: list[ir.Node], plan) -> bool:
    """A dot operand torch holds in float32 (numeric.held_wide), computed here or written once as such
    (a float32 operand buffer: extract/materialise.py)."""
    if len(side) == 1 and isinstance(side[0], ir.Load) and (buf := plan.buffers.get(side[0].tensor)) is not None:
        return buf.operand and buf.dtype == "float32"
    return held_wide(side)


def tensor_core_dot(left: list[ir.Node], right: list[ir.Node], k: str, plan, program: ir.Program) -> bool:
    """Does the lowering multiply Σ_k left·right on the tensor cores (16-bit operands), rather than as
    a float32 IEEE dot on the FMA pipe? As ContractOps.try_dot decides: a side that is one 16-bit load
    is taken as it is stored and the other side cast to its dtype (two loads of different 16-bit
    dtypes meet in float32); two computed sides are rounded to their data's 16-bit dtype where
    `data_dtype` finds one. Float32 data (a `.float()` matmul) multiplies in IEEE float32, as torch's
    default matmul precision does. The cost model prices by it (extract/cost.py)."""
    def native(side: list[ir.Node]) -> str | None:
        if len(side) == 1 and isinstance(side[0], ir.Load):
            dt = plan.loaded_dtype(program, side[0].tensor)
            return dt if dt in ("float16", "bfloat16") else None
        return None

    a, b = native(left), native(right)
    if a or b:  # (a float32 value beside a 16-bit load multiplies in float32: held_wide)
        wide = (not b and wide_operand(right, plan)) or (not a and wide_operand(left, plan))
        return not wide and not (a and b and a != b)
    return data_dtype([*left, *right], k, plan, program) is not None


def float32_product(body: ir.Node, k: str, axes, plan, program: ir.Program) -> bool:
    """Is Σ_k `body` (a product over `k` and two of the kernel's `axes`, a tile contraction) multiplied
    in float32, off the 16-bit tensor cores (tensor_core_dot)? Its precision is then the schedule's
    (KernelSchedule.input_precision). Float64 programs multiply in float64."""
    if compute_dtype(program) == "float64":
        return False
    sides = gemm_sides(body, k, axes, program.axes, conditions=True)
    if sides is None:
        return False  # (no tile GEMM: a product over three tiled axes of one factor runs on the ALUs)
    return not tensor_core_dot(list(sides.left), list(sides.right), k, plan, program)


def float32_products(exprs: list[ir.Node], axes, plan, program: ir.Program) -> bool:
    """Does any tile contraction among `exprs` (a sum of a product over `axes`) multiply in float32?"""
    return any(isinstance(n, ir.Reduce) and n.op == "sum" and is_product(n.body)
               and len([a for a in n.body.axes if a in axes or a == n.axis]) >= 3  # (not a row dot)
               and float32_product(n.body, n.axis, axes, plan, program)
               for e in exprs for n in ir.walk(e))


def data_operand(factors: list[ir.Node]) -> bool:
    """Every factor is loaded or constant (an operand that holds data, not values computed in registers)."""
    return all(isinstance(f, ir.Load | ir.Const) for f in factors)
