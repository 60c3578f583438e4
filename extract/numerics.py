"""Numerics-aware extraction: which exponentials under a sum may overflow, which differences of sums
cancel, and what explain() says when the compiler took a stable spelling instead of the cheapest one.

The extractor (extract/terms.py) prices exp/exp2 of an exponent that the nonpos analysis cannot show to
be ≤ 0 as OVERFLOW_RISK times its work. When the cheapest program sums such exponentials (a naive
exp(x)/Σexp(x), log Σ exp(x)), the pipeline's stabilise phase adds the shifted equivalents
(rules.algebra.STABILITY: Σⱼ eᵇ = e^M·Σⱼ e^(b−M)) and extracts again; likewise a difference of two sums
≥ 0 (Σa²/n − (Σa/n)², priced CANCEL_RISK per point summed) gets its centred equivalent. This module
finds the risks and words the difference.
"""

from __future__ import annotations

from neptune_eq import ir
from neptune_eq.irtext import show

from .view import EGraphView

FLOAT32_EXP_LIMIT = 88.72  # e^x overflows float32 above this
FLOAT16_EXP_LIMIT = 11.09


def _risky(n: ir.Node, classes: dict[ir.Node, int], view: EGraphView) -> bool:
    return isinstance(n, ir.Call) and n.op in ("exp", "exp2") and classes.get(n.args[0]) not in view.nonpos


def overflow_risks(terms: list[ir.Node], classes: dict[ir.Node, int], view: EGraphView) -> list[ir.Node]:
    """The distinct exponentials in `terms` whose exponent is not known to be ≤ 0."""
    return list(dict.fromkeys(n for t in terms for n in ir.walk(t) if _risky(n, classes, view)))


def summed_overflow_risks(terms: list[ir.Node], classes: dict[ir.Node, int], view: EGraphView,
                          axis_order: tuple[str, ...]) -> list[ir.Node]:
    """The risky exponentials inside the body of a sum that vary along the summed axis: what a max
    shift over that axis can repair (an exp that is an output of its own, sigmoid's e^−x, or a per-head
    factor such as ALiBi's slope 2^(−8h/H) has no shifted equivalent and is left alone)."""
    out: dict[ir.Node, None] = {}
    for t in terms:
        for r in ir.walk(t):
            if isinstance(r, ir.Reduce) and r.op == "sum":
                bit = 1 << axis_order.index(r.axis)
                out.update((n, None) for n in overflow_risks([r.body], classes, view)
                           if view.deps.get(classes.get(n.args[0], -1), 0) & bit)
    return list(out)


def _summed_axes(n: ir.Node) -> set[str]:
    return {r.axis for r in ir.walk(n) if isinstance(r, ir.Reduce) and r.op == "sum"}


def cancellation_risks(terms: list[ir.Node], classes: dict[ir.Node, int], view: EGraphView) -> list[ir.Node]:
    """The differences a − b of two values ≥ 0 that both hold a sum over the same axis (E[x²] − E[x]²):
    what a centred spelling can repair (TermExtractor.may_cancel prices the same thing)."""
    out: dict[ir.Node, None] = {}
    for t in terms:
        for n in ir.walk(t):
            if isinstance(n, ir.Call) and n.op == "sub" and all(classes.get(a) in view.nonneg for a in n.args) \
                    and _summed_axes(n.args[0]) & _summed_axes(n.args[1]):
                out[n] = None
    return list(out)


def _short(n: ir.Node) -> str:
    text = show(n)
    return text if len(text) <= 60 else text[:57] + "..."


def stability_notes(names: list[str], old: dict[str, ir.Node], new: dict[str, ir.Node],
                    before: list[ir.Node], after: list[ir.Node]) -> list[str]:
    """One line per output whose program changed while its overflow or cancellation risks went down
    (`before`, `after`: the risky nodes of the representative program before and after)."""
    kept = set(after)
    gone = [n for n in before if n not in kept]
    notes = []
    for name in names:
        walked = set(ir.walk(old[name]))
        mine = [n for n in gone if n in walked]
        if old[name] is new[name] or not mine:
            continue
        exps = [n for n in mine if isinstance(n, ir.Call) and n.op in ("exp", "exp2")]
        if exps:
            notes.append(f"output {name}: the max-shifted form was chosen over a cheaper one that sums "
                         f"{_short(exps[0])}, an exponential of unshifted values: it overflows float32 past "
                         f"e^{FLOAT32_EXP_LIMIT} (fp16 past e^{FLOAT16_EXP_LIMIT}) where the result is finite")
        subs = [n for n in mine if n not in exps]
        if subs:
            notes.append(f"output {name}: the centred form was chosen over a cheaper one that computes "
                         f"{_short(subs[0])}, a difference of two sums ≥ 0: it cancels every digit they share "
                         f"(float32 keeps none of a variance of 1 around a mean of 1e4)")
    return notes
