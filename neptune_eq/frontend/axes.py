"""Axis inference by dataflow.

Every dimension of size > 1 of every traced tensor is an *axis variable*; dimensions of size 1
are not axes (`None`): the value does not vary along them, and they are squeezed from program
inputs and restored when outputs are rebuilt. Operations unify variables: elementwise
broadcasting unifies the variables in one position, a matmul unifies the contracted dimensions
and the batch dimensions. Two dimensions of equal size that never meet in an operation stay
different axes (query length and key length of self-attention, for instance).

Reshapes relate variables instead of unifying them: merging dimensions (b, h) into one records
`m = merge(b, h)`, splitting records the same relation the other way. A merge of the parts of an
earlier split (or a split of an earlier merge) with the same extents gives back the original
variables, so `x.view(B*H, L, D)` ... `.view(B, H, L, D)` round-trips. When the analysis is
done (`AxisTable.resolve`) each relation picks a direction: either the parts are program axes
and the whole is the index expression `b·H + h`, or the whole is an axis and the parts are
`m // H` and `m % H` (grouped-query attention: the kv head of query head h is h // G).

If an operation would put one variable in two positions of its result (`doc[:, None] ==
doc[None, :]`, `x @ x.T`), the later operand is *renamed*: it is evaluated at fresh variables,
which is always sound; the translator substitutes the fresh axes into its expression.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, field

from .. import ir
from .exprs import const, mul
from .source import CaptureError

Dim = int | None  # an axis variable, or None for a dimension of size 1


@dataclass(frozen=True)
class Relation:
    """whole = parts in row-major order (whole = p0·(e1·e2…) + p1·(e2…) + …)."""

    whole: int
    parts: tuple[int, ...]


class AxisTable:
    """Union-find over axis variables, with merge/split relations and what each variable is used for."""

    def __init__(self) -> None:
        self._parent: list[int] = []
        self._extent: list[int] = []
        self._data: list[bool] = []  # the class holds a dimension of a program input
        self.relations: list[Relation] = []
        self.at: object = None  # what the translator is reading (its graph node), for errors
        self.reshaped_at: list = []  # the `at`s whose reshapes made the relations, first seen first
        self.prefer: set[int] = set()  # reduced, contracted or output: rather a program axis
        self.substituted: set[int] = set()  # indexed, sliced or renamed: must be a program axis
        self.indexed: set[int] = set()  # indexed by a tensor (gather): named after the others

    def mark_indexed(self, v: Dim, *, by_tensor: bool = True) -> None:
        """v's axis is replaced by an index expression somewhere, so it must be a program axis."""
        if v is not None:
            self.substituted.add(v)
            if by_tensor:
                self.indexed.add(v)

    # ---------------------------------------------------------------- variables
    def new(self, extent: int, *, data: bool = False) -> int:
        if extent < 2:
            raise ValueError(f"axis variables have extent >= 2, got {extent}")
        self._parent.append(len(self._parent))
        self._extent.append(int(extent))
        self._data.append(data)
        return len(self._parent) - 1

    def dims_for(self, shape, *, data: bool = False) -> tuple[Dim, ...]:
        """Fresh variables for a shape (None for its size-1 dimensions)."""
        return tuple(self.new(n, data=data) if n > 1 else None for n in shape)

    def find(self, v: int) -> int:
        root = v
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[v] != root:
            self._parent[v], v = root, self._parent[v]
        return root

    def extent(self, v: int) -> int:
        return self._extent[self.find(v)]

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        if self._extent[ra] != self._extent[rb]:
            raise CaptureError(f"cannot unify axes of extents {self._extent[ra]} and {self._extent[rb]}")
        if rb < ra:
            ra, rb = rb, ra
        self._parent[rb] = ra
        self._data[ra] = self._data[ra] or self._data[rb]
        return ra

    # ---------------------------------------------------------------- combining operands
    def combine(self, n_slots: int, operands: list[list[tuple[int, Dim]]],
                apart=lambda a, b: False) -> tuple[list[Dim], dict[int, dict]]:
        """Unify the variables each operand puts into each slot.

        `operands[k]` lists (slot, variable) pairs, slot None for a dimension the operation reads at an
        index of its own (a concatenation's, a gather's): it enters no slot, but must not be unified
        with the operand's other dimensions either. `apart(root_a, root_b)` says whether two classes
        must not be unified (some value varies along both). Returns the variable of every slot (None
        where no operand has one) and, for operands that had to be renamed to keep axes apart,
        {operand index: {old root: fresh variable}}.
        """
        slot_roots: list[set[int]] = [set() for _ in range(n_slots)]
        renames: dict[int, dict[int, int]] = {}
        placed: list[list[tuple[int, int]]] = []
        for k, entries in enumerate(operands):
            vs = [(s, v) for s, v in entries if v is not None and s is not None]
            clash = self._conflicts(vs, slot_roots)
            clash |= {self.find(v) for s, v in vs
                      if any(r != self.find(v) and apart(r, self.find(v)) for r in slot_roots[s])}
            # a dimension left out whose class is already in a slot this operand fills: unified there, it
            # would become the operand's other dimension (cat([t.mT, t], -1): t's columns, the cut, in the
            # rows' slot — t read on its diagonal, silently; fuzzer seed 1170)
            filled = set().union(*(slot_roots[s] for s, _ in vs)) if vs else set()
            clash |= {self.find(v) for s, v in entries if s is None and v is not None and self.find(v) in filled}
            if clash:
                mapping = {r: self.new(self._extent[r]) for r in clash}
                self.substituted.update(clash)
                vs = [(s, mapping.get(self.find(v), v)) for s, v in vs]
                if self._conflicts(vs, slot_roots):
                    raise CaptureError("an operand uses one axis in two of its dimensions")
                renames[k] = mapping
            for s, v in vs:
                slot_roots[s].add(self.find(v))
            placed.append(vs)
        out: list[Dim] = [None] * n_slots
        for vs in placed:
            for s, v in vs:
                out[s] = v if out[s] is None else self.union(out[s], v)
        return out, renames

    def _conflicts(self, vs: list[tuple[int, int]], slot_roots: list[set[int]]) -> set[int]:
        """Roots this operand would put into a slot other than the one they already occupy."""
        clash: set[int] = set()
        seen: dict[int, int] = {}
        for s, v in vs:
            r = self.find(v)
            if seen.setdefault(r, s) != s or any(r in roots for t, roots in enumerate(slot_roots) if t != s):
                clash.add(r)
        return clash

    # ---------------------------------------------------------------- reshapes
    def merge(self, parts: list[int]) -> int:
        if len(parts) == 1:
            return parts[0]
        key = tuple(self.find(p) for p in parts)
        for rel in self.relations:
            if tuple(self.find(p) for p in rel.parts) == key:
                return rel.whole
        whole = self.new(math.prod(self.extent(p) for p in parts))
        self._relate(Relation(whole, tuple(parts)))
        return whole

    def split(self, whole: int, extents: list[int]) -> tuple[int, ...]:
        if len(extents) == 1:
            return (whole,)
        root = self.find(whole)
        for rel in self.relations:
            if self.find(rel.whole) == root and [self.extent(p) for p in rel.parts] == list(extents):
                return rel.parts
        parts = tuple(self.new(n) for n in extents)
        self._relate(Relation(whole, parts))
        return parts

    def _relate(self, rel: Relation) -> None:
        self.relations.append(rel)
        if self.at is not None and self.at not in self.reshaped_at:
            self.reshaped_at.append(self.at)

    def reshape(self, dims: tuple[Dim, ...], in_shape, out_shape) -> tuple[Dim, ...]:
        """Variables of a reshaped value: size-1 dimensions are dropped or added freely; the others
        must group into one-to-one, merge (k → 1) or split (1 → k) groups."""
        ins = [(v, n) for v, n in zip(dims, in_shape) if n != 1]
        outs = [j for j, n in enumerate(out_shape) if n != 1]
        result: list[Dim] = [None] * len(out_shape)
        i = j = 0
        while i < len(ins):
            gi, pi = [ins[i][0]], ins[i][1]
            gj, pj = [outs[j]], out_shape[outs[j]]
            i, j = i + 1, j + 1
            while pi != pj:
                if pi < pj:
                    gi.append(ins[i][0])
                    pi *= ins[i][1]
                    i += 1
                else:
                    gj.append(outs[j])
                    pj *= out_shape[outs[j]]
                    j += 1
            if len(gj) == 1:
                result[gj[0]] = self.merge(gi)
            elif len(gi) == 1:
                for jj, v in zip(gj, self.split(gi[0], [out_shape[x] for x in gj])):
                    result[jj] = v
            else:
                sizes = [self.extent(v) for v in gi]
                raise CaptureError(
                    f"reshape from {tuple(in_shape)} to {tuple(out_shape)} regroups dimensions of sizes "
                    f"{sizes} into {[out_shape[x] for x in gj]}; only merging or splitting whole axes is supported"
                )
        return tuple(result)

    # ---------------------------------------------------------------- resolution
    def close(self) -> list[Relation]:
        """Congruence closure of the relations; returns them deduplicated, in terms of roots."""
        changed = True
        while changed:
            changed = False
            by_whole: dict[tuple, Relation] = {}
            by_parts: dict[tuple, Relation] = {}
            for rel in self.relations:
                w = self.find(rel.whole)
                ps = tuple(self.find(p) for p in rel.parts)
                ext = tuple(self._extent[p] for p in ps)
                other = by_whole.setdefault((w, ext), rel)
                if other is not rel:
                    for a, b in zip(other.parts, rel.parts):
                        if self.find(a) != self.find(b):
                            self.union(a, b)
                            changed = True
                other = by_parts.setdefault(ps, rel)
                if other is not rel and self.find(other.whole) != w:
                    self.union(other.whole, w)
                    changed = True
        out: dict[tuple, Relation] = {}
        for rel in self.relations:
            r = Relation(self.find(rel.whole), tuple(self.find(p) for p in rel.parts))
            out.setdefault((r.whole, r.parts), r)
        return list(out.values())

    def resolve(self) -> Resolution:
        rels = self.close()
        must = {self.find(v) for v in self.substituted}
        red = {self.find(v) for v in self.prefer}
        derived: dict[int, tuple] = {}

        def derive(root: int, how: tuple) -> None:
            if root in derived or root in must:
                raise CaptureError("reshapes relate one axis to others in two incompatible ways")
            derived[root] = how

        for rel in rels:
            parts_needed = any(p in must or p in red for p in rel.parts)
            if parts_needed:
                merge_dir = True
            elif rel.whole in must:
                merge_dir = False
            else:
                # grouped-query attention: the query head is the axis, the kv head (data) and the
                # group position (made up by expand) are derived from it
                merge_dir = not (self._data[rel.whole] and any(not self._data[p] for p in rel.parts))
            if merge_dir:
                derive(rel.whole, ("merge", rel.parts))
            else:
                ext = tuple(self._extent[p] for p in rel.parts)
                for k, p in enumerate(rel.parts):
                    derive(p, ("split", rel.whole, k, ext))
        return Resolution(self, derived)


@dataclass
class Resolution:
    """Which variables are program axes and how the others are computed from them; axis names."""

    table: AxisTable
    derived: dict[int, tuple]
    names: dict[int, str] = field(default_factory=dict)
    extents: dict[str, int] = field(default_factory=dict)  # every axis name handed out
    reserved: set[str] = field(default_factory=set)  # not to be used as axis names (tensor names)

    def root(self, v: int) -> int:
        return self.table.find(v)

    def is_axis(self, v: int) -> bool:
        return self.root(v) not in self.derived

    # ---------------------------------------------------------------- naming
    def claim(self, v: int, preferred: str | None) -> str:
        """Name the class of v (if not yet named): `preferred`, else the next free letter after it."""
        r = self.root(v)
        if r in self.names:
            return self.names[r]
        name = self._free_name(preferred)
        self.names[r] = name
        self.extents[name] = self.table.extent(r)
        return name

    def _taken(self, name: str) -> bool:
        return name in self.extents or name in self.reserved

    def _free_name(self, preferred: str | None) -> str:
        letters = string.ascii_lowercase
        if preferred is not None and not self._taken(preferred):
            return preferred
        if preferred is not None and preferred in letters:
            k = letters.index(preferred)
            for c in letters[k + 1:] + letters[:k]:
                if not self._taken(c):
                    return c
        n = 0
        while self._taken(f"n{n}"):
            n += 1
        return f"n{n}"

    def fresh(self, base: str) -> str:
        """A new axis name with the extent of `base` (for renaming a bound axis)."""
        name = self._numbered(base, "")
        self.extents[name] = self.extents[base]
        return name

    def _numbered(self, base: str, sep: str) -> str:
        n = 1
        while self._taken(f"{base}{sep}{n}"):
            n += 1
        return f"{base}{sep}{n}"

    def name(self, v: int) -> str:
        """The axis name of v's class; derived classes are named after what they derive from."""
        r = self.root(v)
        if r in self.names:
            return self.names[r]
        how = self.derived.get(r)
        if how is None:
            return self.claim(r, None)
        merged = how[0] == "merge"
        base = "".join(self.name(p) for p in how[1]) if merged else f"{self.name(how[1])}{how[2]}"
        name = base if not self._taken(base) else self._numbered(base, "_")
        self.names[r] = name
        self.extents[name] = self.table.extent(r)
        return name

    # ---------------------------------------------------------------- index expressions
    def index(self, v: Dim, _stack: tuple = ()) -> ir.Node:
        """The integer index of variable v as an expression over program axes (0 for size-1 dims)."""
        if v is None:
            return ir.Const(0)
        r = self.root(v)
        if r in _stack:
            raise CaptureError("reshapes define an axis in terms of itself")
        how = self.derived.get(r)
        if how is None:
            return ir.Index(self.name(r))
        if how[0] == "merge":
            parts = how[1]
            out: ir.Node | None = None
            for k, p in enumerate(parts):
                stride = math.prod(self.table.extent(q) for q in parts[k + 1:])
                term = mul(self.index(p, (*_stack, r)), const(stride))
                out = term if out is None else ir.Call("add", (out, term))
            return out
        _, whole, k, ext = how
        e = self.index(whole, (*_stack, r))
        stride = math.prod(ext[k + 1:])
        if stride != 1:
            e = ir.Call("floordiv", (e, ir.Const(stride)))
        if k > 0:
            e = ir.Call("mod", (e, ir.Const(ext[k])))
        return e

    def axes(self, v: Dim) -> list[str]:
        """The program axes to iterate (reduce over) to cover variable v; [] for size-1 dims."""
        if v is None:
            return []
        r = self.root(v)
        how = self.derived.get(r)
        if how is None:
            return [self.name(r)]
        if how[0] == "merge":
            return [a for p in how[1] for a in self.axes(p)]
        raise CaptureError(
            f"cannot reduce over axis '{self.name(r)}': it is part of axis '{self.name(how[1])}' "
            f"split by a reshape"
        )

    def output_axes(self, dims: tuple[Dim, ...]) -> list[str]:
        """Program axes of an output with these dimensions, in row-major order (a reshape of the
        program's output gives the user's shape)."""
        out: list[str] = []
        k = 0
        vs = [v for v in dims if v is not None]
        while k < len(vs):
            r = self.root(vs[k])
            how = self.derived.get(r)
            if how is not None and how[0] == "split":
                _, whole, _, ext = how
                run = [self.root(v) for v in vs[k:k + len(ext)]]
                want = [self.root(p) for p in self._parts_of(whole, ext)]
                if run != want:
                    raise CaptureError(
                        f"output dimension '{self.name(r)}' is part of axis '{self.name(whole)}' without the rest of it"
                    )
                out.extend([self.name(whole)] if self.is_axis(whole) else self.axes(whole))
                k += len(ext)
            else:
                out.extend(self.axes(r))
                k += 1
        if len(set(out)) != len(out):
            raise CaptureError(f"an output varies along one axis in two dimensions ({', '.join(out)})")
        return out

    def _parts_of(self, whole: int, ext: tuple[int, ...]) -> tuple[int, ...]:
        """The parts of the split of `whole` into extents `ext`, in order."""
        w = self.root(whole)
        parts = sorted((how[2], r) for r, how in self.derived.items()
                       if how[0] == "split" and self.root(how[1]) == w and how[3] == ext)
        return tuple(r for _, r in parts)
