"""What a compile's budgets and limits cut short, one line each: for explain(), the CLI and the
explorer (a Compilation's `budget_notes`)."""

from __future__ import annotations

from .fusion.search import MAX_GROUPS_PER_AXIS


def budget_notes(c) -> list[str]:
    """One line per thing a budget or limit cut short, for explain(), the CLI and the explorer."""
    b = c.options.budget
    out = []
    for rep in c.saturator.reports:
        if "budget" in rep.stop:
            limit = f"max_nodes={b.max_nodes}" if "node" in rep.stop else f"max_seconds={b.max_seconds:g}"
            out.append(f"saturation phase '{rep.name}' stopped by the {rep.stop} ({limit}); "
                       f"{rep.iterations} iterations, {rep.nodes} e-nodes")
    f = c.fusion
    if f is not None:
        if f.skipped:
            out.append(f"time budget (max_seconds={b.max_seconds:g}) ran out while fused groups over "
                       f"{', '.join(f.skipped)} were tried; the untried fusions are not among the alternatives")
        if f.capped:
            out.append(f"fused groups over {', '.join(f.capped)} beyond the {MAX_GROUPS_PER_AXIS} nearest were "
                       "not tried")
        cut = sum(1 for r in f.corrections.values() if not r.found and "budget" in r.reason)
        if cut:
            out.append(f"{cut} correction search(es) stopped by a budget before finding a correction")
    out += [f"fusion dropped, no extractable term: {d}" for d in c.dropped_loops[:3]]
    if c.plans_truncated:
        out.append(f"plan enumeration stopped at max_plans={c.options.max_plans}")
    return out
