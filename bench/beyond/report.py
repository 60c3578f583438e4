"""results.json → summary, results.md and results.png for bench/beyond.

The summary: per case neptune_eq's speedup over the fastest peer that passed its check, its share
of the ceiling, and the cost model's Spearman rank correlation of predicted against measured time
over the timed alternatives (per case, and over all (case, alternative) points together).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from run import spearman  # bench/run.py (bench/ is on the path: __init__.py)


def label(row: dict) -> str:
    return f"{row['program']} {row['shape']}"


def best_peer(row: dict) -> tuple[str, float] | None:
    """(name, ms) of the fastest peer that passed its check, or None."""
    return min(((n, e["ms"]) for n, e in row["impls"].items() if n != "neptune_eq" and "ms" in e),
               key=lambda t: t[1], default=None)


def speedup(row: dict) -> float | None:
    """The best peer's time over neptune_eq's (above 1: neptune_eq is faster)."""
    ours = row["impls"].get("neptune_eq", {}).get("ms")
    best = best_peer(row)
    return None if ours is None or best is None else best[1] / ours


def _points(row: dict) -> list[tuple[float, float]]:
    return [(a["predicted_ms"], a["ms"]) for a in row.get("alternatives", []) if "ms" in a]


def _number(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def summarize(rows: list[dict]) -> dict:
    ratios = {label(r): speedup(r) for r in rows}
    valid = [x for x in ratios.values() if x]
    per_case = {label(r): _number(spearman(*zip(*_points(r)))) if len(_points(r)) >= 3 else None for r in rows}
    pts = [p for r in rows for p in _points(r)]
    return {
        "speedup_over_best_peer": ratios,
        "geomean_speedup": math.exp(sum(map(math.log, valid)) / len(valid)) if valid else None,
        "of_ceiling": {label(r): r.get("of_ceiling") for r in rows},
        "spearman_per_case": per_case,
        "spearman_all": _number(spearman([p for p, _ in pts], [m for _, m in pts])) if len(pts) >= 3 else None,
        "points": len(pts),
    }


def _us(e: dict) -> str:
    return f"{e['ms'] * 1e3:.0f}" if "ms" in e else "—"


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "—" if x is None else f"{x:{spec}}{suffix}"


def markdown(rows: list[dict], summary: dict, meta: dict) -> str:
    peers = list(dict.fromkeys(n for r in rows for n in r["impls"] if n != "neptune_eq"))
    lines = [f"# bench/beyond: neptune_eq vs peers — {meta['device']}, {meta['date']}",
             f"torch {meta['torch']}, triton {meta['triton']}; median of triton.testing.do_bench; every time "
             "after a passed float64 check. Ceiling: torch.mm at the matmul's shape (attention: a square mm of "
             "the same FLOPs) or a device copy of the program's bytes; % = neptune_eq's rate over the ceiling's.",
             "", "| program | shape | dtype | neptune_eq µs | " + " | ".join(f"{p} µs" for p in peers)
             + " | best peer | speedup | ceiling | % of ceiling | kernels | plan |",
             "|" + "---|" * (10 + len(peers))]
    for r in rows:
        ours = r["impls"].get("neptune_eq", {})
        best = best_peer(r)
        ceil = r.get("ceiling", {})
        ceil_cell = (f"{ceil['what']}: {ceil['rate']:.0f} {ceil['unit']}" if "rate" in ceil
                     else ceil.get("what", "—"))
        lines.append(f"| {r['program']} | {r['shape']} | {r.get('dtype', '')} | {_us(ours)} | "
                     + " | ".join(_us(r["impls"].get(p, {})) for p in peers)
                     + f" | {best[0] if best else '—'} | {_fmt(speedup(r), '.2f', '×')} | {ceil_cell} | "
                     f"{_fmt(r.get('of_ceiling') and 100 * r['of_ceiling'], '.0f', '%')} | {r.get('kernels', '—')} | "
                     f"{_plan(r)} |")
    if summary["geomean_speedup"]:
        lines += ["", f"Geomean speedup over the best peer: {summary['geomean_speedup']:.2f}×"]
    lines += ["", "Implementations that were not timed:"]
    for r in rows:
        for n, e in r["impls"].items():
            if "error" in e:
                lines.append(f"- {label(r)} {n}: {e['error']}")
    lines += ["", f"Cost model: Spearman rank correlation of predicted vs measured time over {summary['points']} "
              f"(program, alternative) points: {_fmt(summary['spearman_all'], '.2f')}; per program: "
              + ", ".join(f"{k}: {_fmt(v, '.2f')}" for k, v in summary["spearman_per_case"].items()), ""]
    if any(r.get("alternatives") for r in rows):
        lines += ["| program | alternative | kind | predicted µs | measured µs | structure |", "|---" * 6 + "|"]
    for r in rows:
        for a in r.get("alternatives", []):
            lines.append(f"| {label(r)} | #{a['id']}{' (chosen)' if a.get('chosen') else ''} | {a['kind']} | "
                         f"{a['predicted_ms'] * 1e3:.1f} | {_us(a) if 'ms' in a else a.get('error', '—')} | "
                         f"{a['structure']} |")
    return "\n".join(lines) + "\n"


def _plan(r: dict) -> str:
    plan, model = r.get("plan", "—"), r.get("model_plan")
    return plan if not model or model == plan else f"{plan} (model's first choice: {model})"


def write_results(out: Path, rows: list[dict], meta: dict) -> str:
    """results.json (meta, rows, summary) and results.md under `out`; returns the markdown."""
    summary = summarize(rows)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary}, indent=1,
                                                 default=str))
    md = markdown(rows, summary, meta)
    (out / "results.md").write_text(md)
    return md


def merge(out: Path, sources: list[Path]) -> str:
    """One report from several runs' results.json: rows whole (each implementation in a row was timed
    beside its peers in one process), in programs.py's order; a later source's row replaces an
    earlier one of the same program and shape. Returns the markdown."""
    from .programs import PROGRAMS

    rows: dict[str, dict] = {}
    metas = []
    for src in sources:
        data = json.loads(Path(src).read_text())
        metas.append(data["meta"])
        for r in data["rows"]:
            rows[label(r)] = {**r, "source": Path(src).name}
    if len({(m["device"], m["torch"], m["triton"]) for m in metas}) > 1:
        raise ValueError("the runs come from different devices or versions: " + "; ".join(map(str, metas)))
    order = list(PROGRAMS)
    merged = sorted(rows.values(), key=lambda r: order.index(r["program"]) if r["program"] in order else len(order))
    out.mkdir(parents=True, exist_ok=True)
    return write_results(out, merged, {**metas[0], "sources": [Path(s).name for s in sources]})


def plot(src: Path, dst: Path) -> None:
    """Per case: each peer's time over neptune_eq's (log scale), and neptune_eq's share of the ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(src).read_text())
    rows = data["rows"]
    names = list(dict.fromkeys(n for r in rows for n in r["impls"] if n != "neptune_eq"))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(18, 6), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / max(1, len(names))
    colors = plt.get_cmap("tab10")
    for k, n in enumerate(names):
        xs, ys = [], []
        for i, r in enumerate(rows):
            e, ours = r["impls"].get(n, {}), r["impls"].get("neptune_eq", {})
            if "ms" in e and "ms" in ours:
                xs.append(i + k * width)
                ys.append(e["ms"] / ours["ms"])
        ax.bar(xs, ys, width, label=n, color=colors(k))
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("peer's time / neptune_eq's (above 1: neptune_eq faster)")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [label(r) for r in rows], rotation=60,
                  ha="right", fontsize=8)
    ax.legend(fontsize=8)
    ax.set_title("neptune_eq's speedup over each peer")
    shares = [100 * (r.get("of_ceiling") or 0) for r in rows]
    ax2.barh([label(r) for r in rows], shares, color="tab:green")
    ax2.set_xlabel("neptune_eq, % of the ceiling (mm TF/s or copy GB/s)")
    ax2.tick_params(axis="y", labelsize=8)
    ax2.invert_yaxis()
    meta = data["meta"]
    fig.suptitle(f"bench/beyond — {meta['device']} — {meta['date']} — torch {meta['torch']}, triton {meta['triton']}")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    plt.close(fig)
