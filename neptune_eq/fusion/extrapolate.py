"""A running sum read additively is read as the running mean: the reference of Welford and Chan.

A body that uses a sum's final value additively, say the variance's Σⱼ (xⱼ − S/N)², cannot be carried
around the partial sum S′ of the elements seen so far: S′/N is far from the final mean early in the pass,
and moving the accumulated state to a later reference cancels large terms (affine.relative_uses). What
the pass can carry instead is the mean of the elements seen, S′/n′ (n′ a count of them): it is a good
estimate all along, and it *is* S/N at the end of the pass, where n′ = N. So, exactly:

    S (final, read additively)  →  (S′/n′)·N         S·(1/N), S/N  →  S′/n′

Around that reference the accumulated deviations sum to zero, Σ_seen (xⱼ − S/n) = S − n·(S/n) = 0: the
*centred* body b_S − S/n is a basis body of the affine search whose accumulated value is known to be 0.
The expansion g(R′) = (x − r − δ)² = (x − r)² − 2δ·(x − r) + δ² (r = S/n, δ = r′ − r) then drops its
middle term, which leaves Chan's update M₂′ = M₂ + n·δ² + Σ_tile (x − r′)², without the cancelling
2δ·S − 2δ·n·r the same identity would read over the running sum itself.

Only sums whose every element counts (no mask along the loop axis) are read so: a count of the loop's
positions is then the count of the sum's terms. Nothing here knows variance: any body whose running sums
are used additively is tried, and fusion/affine.py finds (or does not find) the repair.
"""

from __future__ import annotations

from neptune_eq import ir

OLD, CUR = ir.RefKind.OLD, ir.RefKind.CURRENT
_TOL = 1e-9  # S·c with c·N within this of 1 is S/N written with the reciprocal folded


def _is_ref(n: ir.Node, names: set[str], kind: ir.RefKind = CUR) -> bool:
    return isinstance(n, ir.StateRef) and n.kind is kind and n.name in names


def _mean_of(n: ir.Node, names: set[str], extent: int) -> ir.StateRef | None:
    """The running sum of `names` that `n` divides by the extent (S/N, S·(1/N), (1/N)·S), or None."""
    if not isinstance(n, ir.Call) or n.op not in ("mul", "div"):
        return None
    a, b = n.args
    if n.op == "div":
        return a if _is_ref(a, names) and isinstance(b, ir.Const) and b.value == extent else None
    for s, c in ((a, b), (b, a)):
        if _is_ref(s, names) and isinstance(c, ir.Const) and abs(c.value * extent - 1.0) <= _TOL:
            return s
    return None


def extrapolate(core: ir.Node, names: set[str], extent: int, count: ir.StateRef) -> ir.Node:
    """`core` with the running values of the sums `names` replaced by their extrapolation from the
    running mean: S/N → S/n, S → (S/n)·N (n = `count`, the elements seen; exact at the pass's end)."""
    def f(old: ir.Node, new: ir.Node) -> ir.Node:  # judged on the original node: a mean S/N is replaced
        s = _mean_of(old, names, extent)                 # whole, whatever its rebuilt children became
        if s is not None:
            return ir.Call("div", (s, count))
        if _is_ref(old, names):
            return ir.Call("mul", (ir.Call("div", (old, count)), ir.Const(float(extent))))
        return new

    return ir.rebuild(core, f)


def mean_symbols(names, free, count: str) -> dict[ir.Node, ir.Node]:
    """S/n at the current and old references → one symbol each (mean_S), for the affine search: the
    rules may distribute over a symbol (finite), not over a quotient (n = 0 before the first element)."""
    out: dict[ir.Node, ir.Node] = {}
    for s in names:
        for kind in (CUR, OLD):
            out[ir.Call("div", (ir.StateRef(kind, s, free), ir.StateRef(kind, count, free)))] = \
                ir.StateRef(kind, f"mean_{s}", free)
    return out


def opaque_symbols(nodes, axis: str, free) -> dict[ir.Node, ir.Node]:
    """Subterms free of `axis` that are fixed for the pass (final states, per-row inputs) or a function
    of one running value and nothing else (log S′, the −∞ guard of a max) → one symbol each, for the
    affine search: they are coefficients to the repair, whose inside the rules need not see. The
    current and old forms of one subterm get one name (so the rebasing R′ = R + (R′ − R) pairs
    them), and the rules may distribute over a symbol, which is finite, where they may not over
    log S (−∞ at S = 0, before the first element; a state still 0 contributes nothing to a repair,
    lower/passes.py). The e-graph of a KL divergence's body stays small enough to find its repair."""
    out: dict[ir.Node, ir.Node] = {}
    names: dict[ir.Node, str] = {}

    def go(n: ir.Node) -> None:
        if n in out or isinstance(n, ir.Const | ir.StateRef) or not isinstance(n, ir.Call | ir.Load):
            return
        if axis not in n.axes:
            leaves = {m for m in ir.walk(n) if isinstance(m, ir.StateRef | ir.Load | ir.Index)}
            refs = {(m.kind, m.name) for m in leaves if isinstance(m, ir.StateRef) and m.kind in (CUR, OLD)}
            if not refs or (len(refs) == 1 and len(leaves) == 1):  # fixed, or a function of one running value
                (kind, state), = refs or {(ir.RefKind.FINAL, "")}
                key = ir.rebuild(n, lambda _o, m: ir.StateRef(OLD, m.name, m.ref_axes)
                                 if isinstance(m, ir.StateRef) and m.kind is CUR else m)
                name = names.setdefault(key, f"{state or 'fixed'}'{len(names)}")
                out[n] = ir.StateRef(kind, name, tuple(a for a in free if a in n.axes))
                return
        for c in n.children():
            go(c)

    for n in nodes:
        go(n)
    return out


def mean_shifts(names, free) -> dict[ir.Node, ir.Node]:
    """The current mean as the old one moved by a shift symbol, mean′ = mean + δ: the search's
    coefficients then come out in δ (Chan's n·δ²), not as differences of two large means."""
    return {ir.StateRef(CUR, f"mean_{s}", free): ir.Call("add", (ir.StateRef(OLD, f"mean_{s}", free),
                                                                 ir.StateRef(CUR, f"shift_{s}", free)))
            for s in names}


def shifts_back(names, free) -> dict[ir.Node, ir.Node]:
    """δ → mean′ − mean, the inverse of mean_shifts."""
    return {ir.StateRef(CUR, f"shift_{s}", free): ir.Call("sub", (ir.StateRef(CUR, f"mean_{s}", free),
                                                                  ir.StateRef(OLD, f"mean_{s}", free)))
            for s in names}


def centred(body_old: ir.Node, name: str, free) -> ir.Node:
    """The deviation of a sum's body from the mean of the elements seen, b − S/n (as its symbol), at
    the old references: summed over those elements it is exactly 0."""
    return ir.Call("sub", (body_old, ir.StateRef(OLD, f"mean_{name}", free)))
