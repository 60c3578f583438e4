"""One pass of a kernel: state init, the tile loops bounded by affine masks (masked edge tiles,
an unmasked interior), the per-tile update with its corrections, and split-K's combine phase."""

from __future__ import annotations

from contextlib import contextmanager

from .. import ir
from ..contraction import opened
from ..masks import affine, affine_part, conjunction, conjuncts
from ..ops import MONOIDS, OPS
from ..plan import CompPlan, Pass
from .databounds import bound_for, data_conjuncts, in_kernel, with_plan_terms
from .kernel import KernelWriter
from .values import (
    Val,
    _fmt_float,
    _fmt_num,
    _ident,
    _Scope,
    block_shape,
    hoist_broadcasts,
)

CURRENT, OLD, FINAL = ir.RefKind.CURRENT, ir.RefKind.OLD, ir.RefKind.FINAL


def _unbounded(mask: ir.Node) -> ir.Node:
    """The conjuncts of `mask` a full tile must still evaluate: those that are not affine (a tile
    between flo and fhi meets every affine one, the loop bounds say so: causal's j <= i), e.g. the
    zero-sum guard l ≠ 0 beside a causal mask."""
    return conjunction([p for p in conjuncts(mask) if affine(p) is None])


def _canonical_dims(w: KernelWriter, c: CompPlan) -> tuple[str, ...]:
    return tuple(a for a in w.canon if a in c.free and a in w.vector)


def _state_dims(w: KernelWriter, c: CompPlan) -> tuple[str, ...]:
    dims = _canonical_dims(w, c)
    return dims[::-1] if len(dims) == 2 and c.name in w.reversed_states else dims


def _computed_on_the_right(w: KernelWriter, c: CompPlan, k: str) -> bool:
    """Would the tensor cores read a computed operand of c's contraction over `k` as their right
    operand (B), and a loaded one as their left (A), in the state's canonical layout [m, n]? Hopper's
    wgmma reads B from shared memory only, so a computed B is written there every step; the state
    laid out [n, m] computes the transposed product with the computed operand as A, from registers
    (dKᵀ += Qᵀ·dSᵀ becomes dK += dS·Q)."""
    dims = _canonical_dims(w, c)
    if c.op != "sum" or len(dims) != 2:
        return False
    m, n = dims
    vec = set(w.vector) | {k}
    computed = {m: False, n: False}
    for f in opened(c.core).factors:
        fd = set(f.axes) & vec
        if k in fd:
            side = m if fd <= {m, k} else (n if fd <= {n, k} else None)
            if side is None:
                return False
            computed[side] |= not isinstance(f, ir.Load | ir.Const)
        elif fd and (fd <= {m} or fd <= {n}):  # a per-row factor scales the operand it shares an axis with
            computed[m if fd <= {m} else n] = True
    return computed[n] and not computed[m]


def _state(w: KernelWriter, c: CompPlan, name: str) -> Val:
    """The carried state of component c, held in variable `name`."""
    return Val(name, _state_dims(w, c), "i" if c.integer else "f")


def _state_init(w: KernelWriter, c: CompPlan) -> str:
    """A state tile holding the monoid's identity (int64 for an integer reduction)."""
    dtype = w.dtype_of("i" if c.integer else "f")
    return f"tl.full({block_shape(_state_dims(w, c))}, {_fmt_num(c.identity)}, {dtype})"


# ---------------------------------------------------------------- passes


class _PassWriter:
    """Emits one pass: state init, the tile loops (bounded by affine masks), the per-tile update."""

    def __init__(self, w: KernelWriter, ps: Pass):
        self.w, self.ps = w, ps
        self.axis = ps.axis
        self.tile = w.tiles[ps.axis]
        self.data_bounded: set[str] = set()  # components whose masks bound the loop whole (see bounds)

    def state_names(self, c: CompPlan) -> str:
        return f"st_{_ident(c.name)}"

    def run(self) -> None:
        w, ps = self.w, self.ps
        w.reversed_states |= {c.name for c in ps.comps if _computed_on_the_right(w, c, ps.axis)}
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
        if w.sched.resident:  # the whole axis is one tile, loaded once for every pass (see resident())
            self.resident()
        elif full_lo is None:
            self.loop(lo, hi, masked=True)
        else:
            w.emit(f"lo_{j} = {lo}")
            w.emit(f"hi_{j} = {hi}")
            w.emit(f"flo_{j} = {full_lo}")
            w.emit(f"fhi_{j} = {full_hi}")
            # the masked tiles before the full ones (every component is a monoid or a rolling update,
            # so the order of the tiles is free): with the full tiles' loop after a masked loop, ptxas
            # (CUDA 12.8, Hopper) serialises every wgmma of the kernel (advisory C7515; causal
            # attention's forward: 227 registers serialised, masked loops first 194 and pipelined).
            # FlashAttention runs its diagonal blocks first too
            if full_lo != lo:  # (a map's whole tiles start at its start: no masked head)
                self.loop(f"lo_{j}", f"flo_{j}", masked=True)
            self.loop(f"fhi_{j}", f"hi_{j}", masked=True)
            self.loop(f"flo_{j}", f"fhi_{j}", masked=False)
        for c in ps.comps:
            w.scopes[0].memo[c.ref(FINAL)] = _state(w, c, self.state_names(c))
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
            masked_by = c.mask is not None and not _is_true(c.mask)
            cons = affine_part(c.mask) if masked_by else []
            usable = True  # every affine conjunct bounds the loop
            c_low, c_high, c_flow, c_fhigh = [], [], [], []
            for a in cons:
                cj = a.coefficient(j)
                others = [(x, v) for x, v in a.coef if x != j]
                if abs(cj) > 1 or any(x not in w.scalar and x not in w.k.grid for x, _ in others):
                    usable = False  # evaluated per element in every tile
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
            covered = not masked_by or affine(c.mask) is not None  # no conjunct left to evaluate per element
            if not covered:  # comparisons of input values: bounds worked out per call
                mask = with_plan_terms(c.mask, w.plan, w.program)  # (a document counted from offsets)
                data = data_conjuncts(mask, j, w.program)
                db = bound_for(data, j, T, [(x, w.sched.step(x)) for x in w.k.grid], w.program) if data else None
                if db is not None and not w.sched.data_bounds and not in_kernel(db, w.k.grid, w.program):
                    db = None  # (the schedule visits every tile: no table worked out per call)
                if db is not None:
                    lo_code, hi_code, flo_code, fhi_code = w.data_bound(db)
                    c_low.append(lo_code)
                    c_high.append(hi_code)
                    c_flow.append(flo_code)
                    c_fhigh.append(fhi_code)
                covered = db is not None and all(affine(p) is not None or p in db.preds for p in conjuncts(mask))
                if covered:  # whole tiles where every comparison holds need not evaluate them
                    self.data_bounded.add(c.name)
            # a comp whose mask keeps a comparison of values (softmax's zero-sum guard l ≠ 0) evaluates
            # its whole mask in every tile (tile_update), so it does not stop the others' full tiles
            all_affine = all_affine and usable
            lows.append(_max(c_low) if c_low else "0")
            highs.append(_min(c_high) if c_high else n_j)
            flows.append(_max(c_flow) if c_flow else "0")
            fhighs.append(_min(c_fhigh) if c_fhigh else n_j)
        if not self.ps.comps:
            if self.axis in w.program.dynamic:
                # a map over a dynamic axis: its whole tiles unmasked, then one masked tail. Masked whole,
                # its loads and stores run scalar: the length is no constexpr, so `offs < n` proves no
                # alignment (a softmax's normalised store over rows of dynamic length)
                return "0", n_j, "0", f"({n_j} // {T}) * {T}"
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
        scope = _Scope(axis=self.axis, variant={c.ref(k) for c in self.ps.comps for k in ir.RUNNING}, lines=body,
                       depth=outer_depth + 1)
        w.scopes.append(scope)
        # an axis a later pass of the kernel reads whole (an inline contraction over it) keeps its
        # full-width offsets outside this loop: they are restored after it
        outer = (w.vector.get(self.axis), w.starts.get(self.axis), w.tail_masks.get(self.axis))
        w.vector[self.axis] = f"offs_{j}"
        w.starts[self.axis] = f"start_{j}"
        w.tail_masks[self.axis] = masked
        w.emit(f"offs_{j} = start_{j} + tl.arange(0, BLOCK_{j})")
        valid = Val(f"(offs_{j} < {w.extent(self.axis)})", (self.axis,), "b") if masked else None
        self.tile_update(valid, masked, bounded=True)
        for st in self.ps.stores:
            w.store(st)
        w.scopes.pop()
        del w.vector[self.axis]
        del w.starts[self.axis]
        w.tail_masks.pop(self.axis, None)
        w.lines, w.depth = outer_lines, outer_depth
        restore = outer[0] is not None
        if restore:
            w.vector[self.axis], w.starts[self.axis], w.tail_masks[self.axis] = outer
        if not any("tl.dot(" in line for line in body):  # (tensor-core loops keep the code they were measured with)
            hoisted, body = hoist_broadcasts(w.lines, w.depth, body, lambda: w.tmp("b"))
            for line in hoisted:
                w.emit(line)
        if w.sched.wide_index:  # an int32 loop counter would wrap on its last step past 2^31
            lo = f"tl.cast({lo}, tl.int64)"
        if w.sched.warp_specialize and not masked and w.target == "cuda":
            # Triton splits the loop's loads, MMAs and softmax across warp groups (Hopper, Blackwell)
            w.emit(f"for start_{j} in tl.range({lo}, {hi}, BLOCK_{j}, warp_specialize=True):")
        else:
            w.emit(f"for start_{j} in range({lo}, {hi}, BLOCK_{j}):")
        w.lines.extend(body)
        if restore:  # (the loop rebound the name)
            w.emit(f"{outer[0]} = {outer[1]} + tl.arange(0, BLOCK_{j})")

    def resident(self) -> None:
        """The pass over an axis held whole: no loop, the tile's values (loads, and what is computed
        from them) live in one scope shared by every pass of the kernel, so a row read by three passes
        is read once (softmax: max, sum and the normalised store from one load)."""
        w, j = self.w, _ident(self.axis)
        sc = w.scopes[-1]
        if sc.axis != self.axis:
            sc = _Scope(axis=self.axis, variant=set(), lines=w.lines, depth=w.depth)
            w.scopes.append(sc)
            w.hoist_lines, w.hoist_depth = w.lines, w.depth
            w.vector[self.axis] = f"offs_{j}"
            w.starts[self.axis] = "0"
            w.tail_masks[self.axis] = not w.one_tile(self.axis, self.tile)
            w.emit(f"offs_{j} = tl.arange(0, BLOCK_{j})")
        sc.variant |= {c.ref(k) for c in self.ps.comps for k in ir.RUNNING}
        masked = w.tail_masks[self.axis]
        valid = Val(f"(offs_{j} < {w.extent(self.axis)})", (self.axis,), "b") if masked else None
        self.tile_update(valid, masked, bounded=False)
        for st in self.ps.stores:
            w.store(st)

    def tile_update(self, valid: Val | None, masked: bool, *, bounded: bool) -> None:
        """One tile's update of every component. `bounded`: the tile lies in the loop range that the
        affine and data bounds worked out (bounds()), and an unmasked one where all of them hold, so
        only the other conjuncts are evaluated; a resident row is one tile with no such range, so
        each component evaluates its whole mask (it did not: the causal mask of a softmax of 64-wide
        rows, held whole in one exact tile, was dropped)."""
        w = self.w
        whole = masked or not bounded
        sc = w.scopes[-1]
        new: dict[str, Val] = {}
        olds = {c.name: _state(w, c, self.state_names(c)) for c in self.ps.comps}
        for c in self.ps.comps:  # (an affine repair may read any state's old value)
            sc.memo[c.ref(OLD)] = olds[c.name]
        for c in self.ps.comps:
            old = olds[c.name]
            mask = valid
            if c.mask is not None and not _is_true(c.mask) and (
                    whole or (affine(c.mask) is None and c.name not in self.data_bounded)):
                m = w.as_bool(w.value(c.mask if whole else _unbounded(c.mask)))
                mask = m if mask is None else self._and(mask, m)
            combine = MONOIDS[c.op].combine
            if c.affine:
                carried = _affine_carried(w, c, olds)
            elif c.producers and c.corr is not None:
                h = w.f32(w.value(c.corr))
                refs = {p: Val(self.state_names(pc), _state_dims(w, pc), "f")
                        for pc in self.ps.comps for p in c.producers if pc.name == p}
                h = _guarded(w, self.ps, c, h, refs)
                carried = _apply(w, c, old, h)
            else:
                carried = old
            sdims = _state_dims(w, c)
            part = w.contract(c.op, self.axis, c.core, mask, acc=carried if combine == "add" else None,
                              integer=c.integer)
            if part.kind == "acc":  # the dot already added the carried state
                nv = Val(part.code, part.dims, "f")
                if part.dims != sdims and set(part.dims) == set(sdims):  # (kept in the state's layout, as _apply)
                    nv = w.bind(w.arrange(nv, sdims), sdims, "f", "n")
                new[c.name] = nv
                sc.memo[c.ref(CURRENT)] = nv
                continue
            codes, dims = w.align([carried, part])
            code = OPS[combine].triton.format(*codes)
            if dims != sdims and set(dims) <= set(sdims):
                # (align lays the sum out canonically: a state kept transposed for the tensor cores,
                # updated here without a dot, a tile too small for one, is laid back out as the state)
                code = f"tl.broadcast_to({w.arrange(Val(code, dims, old.kind), sdims)}, {block_shape(sdims)})"
            nv = w.bind(code, sdims if set(dims) <= set(sdims) else dims, old.kind, "n")
            new[c.name] = nv
            sc.memo[c.ref(CURRENT)] = nv
        for c in self.ps.comps:
            w.emit(f"{self.state_names(c)} = {new[c.name].code}")

    def _and(self, a: Val, b: Val) -> Val:
        return self.w.memoised(("and", a.code, b.code), lambda: self.w.conj(a, b))


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


def _affine_carried(w: KernelWriter, c: CompPlan, states: dict[str, Val]) -> Val:
    """Σₖ hₖ·tₖ over the old states tₖ (the references in hₖ resolve in the current scope). A state
    still 0 contributes 0 whatever its coefficient: before the first element a max producer is −∞
    and hₖ may be NaN there, where nothing was accumulated."""
    total: Val | None = None
    for name, coef in c.affine:
        h = w.f32(w.value(coef))
        st = states[name]
        codes, dims = w.align([st, h])
        term = w.bind(f"tl.where({codes[0]} == 0.0, 0.0, {codes[0]} * {codes[1]})", dims, "f", "a")
        if total is None:
            total = term
        else:
            codes, dims = w.align([total, term])
            total = w.bind(f"{codes[0]} + {codes[1]}", dims, "f", "a")
    assert total is not None
    sdims = _state_dims(w, c)
    if total.dims != sdims and set(total.dims) <= set(sdims):
        total = w.bind(f"tl.broadcast_to({w.arrange(total, sdims)}, {block_shape(sdims)})", sdims, "f", "a")
    return total


def _moved(w: KernelWriter, ps: Pass, c: CompPlan, states: dict[str, Val], new: dict[str, Val]) -> Val:
    """An affine component's partial result moved from the references of `states` to `new` (split-K)."""
    with _references(w, ps.comps, states, new):
        return _affine_carried(w, c, states)


@contextmanager
def _references(w: KernelWriter, comps: list[CompPlan], old: dict[str, Val], new: dict[str, Val]):
    """A scope where the old and current values of `comps` are `old` and `new` (a split-K combine
    moving one partial state's reference point)."""
    scope = _Scope(axis=None, variant={x.ref(k) for x in comps for k in ir.RUNNING}, lines=w.lines, depth=w.depth)
    w.scopes.append(scope)
    for x in comps:
        scope.memo[x.ref(OLD)] = old[x.name]
        if x.name in new:
            scope.memo[x.ref(CURRENT)] = new[x.name]
    try:
        yield
    finally:
        w.scopes.pop()


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
    producers = [next(x for x in ps.comps if x.name == p) for p in c.producers]
    with _references(w, producers, ref, new):
        h = _guarded(w, ps, c, w.f32(w.value(c.corr)), ref)
    return _apply(w, c, state, h)


def _apply(w: KernelWriter, c: CompPlan, state: Val, h: Val) -> Val:
    """state ⊗' h. An integer state (an argmax's index) takes a reset's h only — ⊗'s neutral element
    or its annihilator (fusion/reset.py) — and keeps its dtype: the state where h is neutral, the
    monoid's integer identity where it is not."""
    codes, dims = w.align([state, h])
    if not c.integer:
        code, kind = OPS[c.dist].triton.format(*codes), "f"
        if c.op in ("max", "min"):
            # nothing accumulated yet: the identity (±∞) stays whatever h is — a running max of w/‖w‖ repaired
            # by ‖old‖/‖cur‖ met h = 0 on its first tile, and −∞·0 made every row NaN (fuzz --big seed 73)
            code = f"tl.where({codes[0]} == {_fmt_float(c.identity)}, {codes[0]}, {code})"
    else:
        neutral = "0.0" if c.dist == "add" else "1.0"
        code, kind = f"tl.where({codes[1]} == {neutral}, {codes[0]}, {_fmt_num(c.identity)})", "i"
    if dims != state.dims and set(dims) == set(state.dims):
        # (align lays the product out canonically; a state kept transposed for the tensor cores stays so:
        # repaired in [d, e] and accumulated by the dot, a [e, d] state had been stored transposed — with
        # equal tiles no shape told, and the gradient of a Gram matrix's min was wrong, fuzz seed 20)
        code, dims = w.arrange(Val(code, dims, kind), state.dims), state.dims
    return w.bind(code, dims, kind, "c")
