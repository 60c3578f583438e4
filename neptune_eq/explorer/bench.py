"""Measured times of alternatives on the GPU (triton.testing.do_bench, median).

Without a CUDA GPU there is nothing to measure: the report then carries a message saying so and
no numbers (the Triton interpreter's times say nothing about a GPU). Every alternative is run on
the same random inputs; compiling a kernel the first time is not measured (do_bench warms up).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .render import html_table, pre, text_table, wrap

Timer = Callable[[Callable[[], object]], float]  # returns milliseconds


@dataclass
class Measurement:
    id: int
    structure: str
    predicted_us: float
    measured_us: float | None = None
    error: str | None = None


@dataclass
class BenchmarkReport:
    device: str
    rows: list[Measurement] = field(default_factory=list)
    message: str | None = None  # why nothing was measured

    @property
    def measured(self) -> bool:
        return any(r.measured_us is not None for r in self.rows)

    def times_us(self) -> dict[int, float]:
        return {r.id: r.measured_us for r in self.rows if r.measured_us is not None}

    def rank_correlation(self) -> float | None:
        """Spearman's ρ between predicted and measured times (None with fewer than 3 measurements)."""
        pts = [(r.predicted_us, r.measured_us) for r in self.rows if r.measured_us is not None]
        if len(pts) < 3:
            return None
        rp, rm = _ranks([p for p, _ in pts]), _ranks([m for _, m in pts])
        n = len(pts)
        mp, mm = sum(rp) / n, sum(rm) / n
        cov = sum((a - mp) * (b - mm) for a, b in zip(rp, rm))
        var = math.sqrt(sum((a - mp) ** 2 for a in rp) * sum((b - mm) ** 2 for b in rm))
        return cov / var if var else None

    def _table(self) -> tuple[list[str], list[list[str]]]:
        headers = ["id", "predicted µs", "measured µs", "measured/predicted", "structure"]
        rows = []
        for r in self.rows:
            meas = f"{r.measured_us:.2f}" if r.measured_us is not None else (f"error: {r.error}" if r.error else "-")
            ratio = f"{r.measured_us / r.predicted_us:.2f}" if r.measured_us and r.predicted_us else "-"
            rows.append([f"#{r.id}", f"{r.predicted_us:.2f}", meas, ratio, r.structure])
        return headers, rows

    def __str__(self) -> str:
        if self.message:
            return self.message
        headers, rows = self._table()
        out = [f"measured on {self.device} (triton.testing.do_bench, median)", text_table(headers, rows, {1, 2, 3})]
        rho = self.rank_correlation()
        if rho is not None:
            out.append(f"rank correlation predicted vs measured (Spearman ρ): {rho:.2f}")
        elif len(self.times_us()) >= 3:
            out.append("rank correlation predicted vs measured (Spearman ρ): undefined, the predictions or the "
                       "measurements all tie")
        return "\n".join(out)

    def _repr_html_(self) -> str:
        if self.message:
            return wrap(pre(self.message))
        headers, rows = self._table()
        return wrap(f"<p>measured on {self.device}</p>" + html_table(headers, rows))


def _ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda k: xs[k])
    ranks = [0.0] * len(xs)
    k = 0
    while k < len(order):
        j = k
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[k]]:
            j += 1
        for t in range(k, j + 1):
            ranks[order[t]] = (k + j) / 2
        k = j + 1
    return ranks


def no_gpu_message() -> str | None:
    """None when a CUDA GPU is available, else the reason nothing can be measured."""
    import torch

    if torch.cuda.is_available():
        return None
    return ("benchmark: no CUDA GPU on this machine (torch.cuda.is_available() is False), so nothing was measured. "
            "Kernels here run in Triton's CPU interpreter, whose times say nothing about a GPU; the predicted times "
            "in the alternatives table come from the analytic cost model. Run the same benchmark on a machine with "
            "a GPU to measure.")


def do_bench_median(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, return_mode="median"))


def measure(alternatives: Sequence, run_for: Callable[[int], Callable[[], object]], *, device: str, timer: Timer,
            progress: Callable[[str], None] | None = None) -> BenchmarkReport:
    """Time `run_for(id)()` for each alternative with `timer` (milliseconds); failures are reported per row."""
    report = BenchmarkReport(device)
    for k, alt in enumerate(alternatives):
        row = Measurement(alt.id, alt.structure, alt.cost.time * 1e6)
        if progress is not None:
            progress(f"  benchmark {k + 1}/{len(alternatives)}: #{alt.id} {alt.structure}")
        try:
            fn = run_for(alt.id)
            fn()  # compile and check it runs before timing
            row.measured_us = timer(fn) * 1e3
        except Exception as e:  # a failing plan is reported, the others still measured
            row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        report.rows.append(row)
    return report


__all__ = ["BenchmarkReport", "Measurement", "do_bench_median", "measure", "no_gpu_message"]
