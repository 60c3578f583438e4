"""Cache hints for a tensor a kernel streams more than once (lower/memory.py emits them,
extract/traffic.py prices them).

A row too long to hold on chip is streamed once per pass: softmax's rolling max and sum, then the
normalised store, read x twice. The second read can come from L2 — only if the row is still there,
and between a row's two reads every program running beside it streams its own row and writes its
output through the same cache. Loads of a tensor that a later pass of the kernel reads again are
marked `evict_last`, its last reading pass `evict_first`, and that pass's stores `evict_first`: the
lines read again are kept, the ones read for the last time or written make room. Measured on the
H100 (2026-12-06, bench/probe_persistent_rows.py, results in bench/results/h100_2026-12-06/s62/):
softmax of 4096 × 65536 fp16 rows in tiles of 16384 (32 warps) 515.6 → 368.6 µs (a device copy of the
same bytes 359), of 8192 × 32768 406.0 → 357.4 µs; in the tiles of 4096 lowered before, 538.9 → 511.1
(more programs in flight: their rows outgrow L2 even kept).
"""

from __future__ import annotations

from neptune_eq.kernel_terms import kernel_exprs
from neptune_eq.plan import KernelPlan, Pass, Plan
from neptune_eq.schedule import KernelSchedule

KEEP = "evict_last"
DROP = "evict_first"


def reread(k: KernelPlan, plan: Plan) -> dict[str, list[int]]:
    """Tensors `k` streams in two passes or more: tensor → the indices (in k.phases) of the passes
    that load it along their loop axis, in order."""
    reads: dict[str, list[int]] = {}
    for i, ph in enumerate(k.phases):
        if isinstance(ph, Pass):
            for t in dict.fromkeys(ld.tensor for e in kernel_exprs(k, plan, [ph]) for ld in e.loads
                                   if ph.axis in ld.axes):
                reads.setdefault(t, []).append(i)
    return {t: at for t, at in reads.items() if len(at) > 1}


def pass_hints(k: KernelPlan, plan: Plan, sched: KernelSchedule) -> dict[int, dict[str, str]]:
    """Phase index → {tensor: eviction policy} for its loads along the loop and its stores; empty for
    a resident schedule (its row is loaded once) or a kernel that reads nothing twice."""
    if sched.resident:
        return {}
    hints: dict[int, dict[str, str]] = {}
    for t, at in reread(k, plan).items():
        for i in at[:-1]:
            hints.setdefault(i, {})[t] = KEEP
        hints.setdefault(at[-1], {})[t] = DROP
    for i, h in hints.items():
        if DROP in h.values():
            ph = k.phases[i]
            for st in ph.stores:
                h.setdefault(st.target, DROP)
    return hints
