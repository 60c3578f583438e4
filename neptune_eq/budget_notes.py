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


def load_dependent(c) -> bool:
    """Did a time budget cut compile `c` short (a saturation phase, the fused groups tried, a correction
    search)? Its plans then depend on how loaded the host was, and it is kept out of the disk cache
    (api.compile_cached): kl_rows compiled on a busy 2-core host lost its split-K phase to the 20 s
    budget, and later compiles on an idle one read that cut plan back (found diffing plan dumps)."""
    if any(rep.stop == "time budget" for rep in c.saturator.reports):
        return True
    f = c.fusion
    return f is not None and (bool(f.skipped) or any("time budget" in (r.reason or "")
                                                     for r in f.corrections.values() if not r.found))
