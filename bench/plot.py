"""results.json → results.png: speedup over the best peer per op (largest L) and TF/s or GB/s per size."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(src: Path, dst: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(src).read_text())
    rows = data["rows"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    ratios = data["summary"]["ratio_largest_L"]
    vals = [ratios.get(op) or 0 for op in ops]
    axes[0].bar(ops, vals, color=["tab:green" if v >= 1 else "tab:red" for v in vals])
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_title("speedup over the best peer (largest L)")
    axes[0].tick_params(axis="x", rotation=60)
    for ax, kind, key, unit in ((axes[1], "pf", "tflops", "TF/s"), (axes[2], "dc", "gbps", "GB/s")):
        for op in [o for o in ops if o.endswith(kind)]:
            pts = sorted((r["L"], r["impls"].get("neptune_eq", {}).get(key)) for r in rows if r["op"] == op)
            pts = [(L, y) for L, y in pts if y]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=op)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("L")
        ax.set_ylabel(f"neptune_eq {unit}")
        ax.set_title(f"{'prefill' if kind == 'pf' else 'decode'}: neptune_eq {unit}")
        ax.legend(fontsize=8)
    meta = data["meta"]
    fig.suptitle(f"{meta['device']} — {meta['date']} — torch {meta['torch']}, triton {meta['triton']}")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    plot(Path(sys.argv[1]), Path(sys.argv[2]))
