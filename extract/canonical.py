"""A numbering of an e-graph's classes and nodes that follows from its structure alone.

egglog's ids, and the order of its function tables and rows, depend on the order terms reached it,
which egglog-python varies between processes (it names the shared subterms of a term in the order it
pops them from a set). Everything that breaks a tie by position — two spellings of equal cost, two
moves of equal gain — must see the e-graph in an order that does not: this one.

Each class gets a colour by colour refinement (1-dimensional Weisfeiler-Leman): first from its
analysis facts and its nodes' ops and primitive arguments, then repeatedly from its nodes with their
children's colours, until no class splits off. Classes are ordered by colour and each class's nodes
by (op, primitive arguments, children's colours). Two classes keep one colour only if no unfolding
of them tells them apart, so which of them comes first changes no extraction. The hashes are
integer arithmetic (splitmix64) and, for strings, blake2b: the same in every process.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

import numpy as np

Node = tuple[str, tuple, str]  # (op, args, sort): args are class ids or primitives, as `is_class` says

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_P = np.uint64(0x9E3779B97F4A7C15)  # (the golden ratio's odd 64-bit multiplier: mixes argument positions)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping)."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def canonical_order(classes: dict[int, list[Node]], is_class: dict[str, tuple[bool, ...]],
                    facts: dict[int, tuple[int, ...]], n_ids: int) -> tuple[list[int], dict[int, list[int]]]:
    """The classes (ids below n_ids; `facts` per class: its analysis values as ints, all classes alike
    long) in canonical order, and per class the indices of its nodes in canonical order."""
    hashes = StableHashes()
    plain = {op: hashes.label(op, sort, ()) for ns in classes.values() for op, _, sort in ns if all(is_class[op])}
    cls, label, kids = [], [], []  # per node: its class, a hash of (op, sort, primitives), its class arguments
    for c, ns in classes.items():
        for op, args, sort in ns:
            if op in plain:  # (most nodes: an op over classes)
                label.append(plain[op])
                kids.append(args)
            else:
                mask = is_class[op]
                label.append(hashes.label(op, sort, tuple(a for a, m in zip(args, mask) if not m)))
                kids.append(tuple(a for a, m in zip(args, mask) if m))
            cls.append(c)
    arity = max((len(k) for k in kids), default=0)
    # children as a [nodes, arity] table; a missing argument reads slot n_ids, a colour of its own
    table = np.full((len(kids), arity), n_ids, dtype=np.int64)
    for k, ks in enumerate(kids):
        table[k, :len(ks)] = ks
    node_class = np.asarray(cls, dtype=np.int64)
    node_label = np.asarray([h & _MASK for h in label], dtype=np.uint64)
    present = np.asarray(list(classes), dtype=np.int64)
    colour = np.zeros(n_ids + 1, dtype=np.uint64)
    fact = np.zeros(len(classes), dtype=np.uint64)
    for column in zip(*(facts[c] for c in classes)):
        fact = _mix(fact * _P + np.asarray(column, dtype=np.int64).view(np.uint64))
    colour[present] = fact
    colour[present] = _mix(colour[present] + _sum_by_class(_mix(node_label), node_class, n_ids)[present])
    count = len(np.unique(colour[present]))
    for _ in range(len(classes)):
        sig = node_label
        for j in range(arity):  # (position-sensitive: a − b is not b − a)
            sig = _mix(sig * _P + colour[table[:, j]])
        new = _mix(colour * _P + _sum_by_class(_mix(sig), node_class, n_ids))  # (a sum: the nodes' multiset)
        colour[present] = new[present]
        got = len(np.unique(colour[present]))
        if got == count:  # no class split off: no later round splits one
            break
        count = got
    values = colour.tolist()
    order = sorted(classes, key=values.__getitem__)  # (stable: classes of one colour keep their given order)
    ranked: dict[int, list[int]] = {}
    k0 = 0
    for c, ns in classes.items():
        span = range(k0, k0 + len(ns))
        ranked[c] = sorted(range(len(ns)), key=lambda i: (ns[i][0], label[span[i]],
                                                           [values[a] for a in kids[span[i]]])) if len(ns) > 1 else [0]
        k0 += len(ns)
    return order, ranked


def _sum_by_class(x: np.ndarray, node_class: np.ndarray, n_ids: int) -> np.ndarray:
    out = np.zeros(n_ids + 1, dtype=np.uint64)
    np.add.at(out, node_class, x)  # (uint64: wraps, a commutative hash of the multiset)
    return out


@dataclass
class StableHashes:
    """Hashes of str, int, float, bool and nested tuples of them that are the same in every process
    (Python's hash of a str is salted per process, and of a NaN it is its address); strings memoised."""

    _strings: dict[str, int] = field(default_factory=dict)
    _labels: dict[tuple, int] = field(default_factory=dict)

    def of(self, x) -> int:
        if isinstance(x, str):
            h = self._strings.get(x)
            if h is None:
                digest = hashlib.blake2b(x.encode(), digest_size=8).digest()
                h = self._strings[x] = hash((2, int.from_bytes(digest, "little")))
            return h
        if isinstance(x, tuple):
            return hash(tuple(self.of(v) for v in x))
        if isinstance(x, bool | int):
            return hash((0, int(x)))
        if isinstance(x, float):
            return hash((1, struct.unpack("<q", struct.pack("<d", x))[0]))
        return self.of(str(x))

    def label(self, op: str, sort: str, prims: tuple) -> int:
        """of((op, sort, prims)), memoised by a key that tells 0.0 from -0.0 and 1 from 1.0."""
        key = (op, sort, tuple((type(p), struct.pack("<d", p) if isinstance(p, float) else p) for p in prims))
        h = self._labels.get(key)
        if h is None:
            h = self._labels[key] = self.of((op, sort, prims))
        return h
