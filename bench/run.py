"""The whole comparison: the ten Neptune operators, neptune_eq beside SDPA, FlexAttention and
torch.compile, in one process on one GPU. Writes results.json, results.md and results.png.

    python bench/run.py                      # everything (GPU)
    python bench/run.py --ops causal_pf --sizes 4096
    python bench/run.py --dry                # CPU smoke test of the harness: tiny sizes, interpreter,
                                             # wall-clock timings that mean nothing

Every implementation is checked against the float64 reference before it is timed; a failed check
is recorded and not timed. Timing: triton.testing.do_bench (CUDA events, warm-up excluded, L2
cleared between runs), median.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from cases import HEADS, TOLERANCE, Case, all_cases, reference, rel_err_rows  # noqa: E402
from peers import PEERS  # noqa: E402

import neptune_eq  # noqa: E402, F401  (first: Triton interpreter on a CPU-only machine)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def timer(dry: bool):
    if dry:
        def t(fn):
            fn()
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        return t
    from neptune_eq.explorer.bench import do_bench_median  # do_bench's defaults: 25 ms warm-up, 100 ms runs

    return do_bench_median


def host_and_gpu_times(thunk, calls: int = 200) -> dict:
    """Where the time goes: `host_ms`, the host's time to issue one call (calls issued back to back,
    no synchronisation, so the GPU's own time only shows when it is the slower side), and `gpu_ms`,
    the call replayed as a CUDA graph (no host work at all). A measured time near host_ms and well
    above gpu_ms means the call is bound by its launch path, not by its kernels."""
    import triton.testing

    out = {}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        thunk()
    out["host_ms"] = (time.perf_counter() - t0) * 1e3 / calls
    torch.cuda.synchronize()
    try:
        out["gpu_ms"] = triton.testing.do_bench_cudagraph(thunk, return_mode="median")
    except Exception as e:  # not capturable (e.g. a host synchronisation inside)
        out["gpu_ms_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return out


def pick_alternatives(compiled, limit: int = 5) -> list:
    """The chosen plan plus the best of each other kind: a GEMM operand written once, split-K,
    unfused (several kernels), two-pass."""

    def kind(a):
        p = a.plan
        if any(b.operand for b in p.buffers.values()):
            return "materialised"
        if any(ph.split > 1 for k in p.kernels for ph in k.passes()):
            return "split"
        if len(p.kernels) > 1:
            return "unfused"
        if any(ph.kind == "rolling" for k in p.kernels for ph in k.passes()):
            return "rolling"
        return "multipass"

    picks = {}  # kind → its first (best-ranked) alternative
    for a in compiled.alternatives:
        picks.setdefault(kind(a), a)
        if len(picks) >= limit:
            break
    return [(a, k) for k, a in picks.items()]


def run_case(case: Case, args, measure) -> dict:
    from neptune_eq.frontend import capture
    from neptune_eq.frontend.capture import CompiledFunction
    from neptune_eq.runtime import compile_ir
    from neptune_eq.tune import autotune, choose_plan

    device = "cpu" if args.dry else "cuda"
    q, k, v = case.inputs(device)
    row = {"op": case.op, "L": case.L, "kind": case.kind, "useful_flops": case.useful_flops(),
           "io_bytes": case.io_bytes(), "impls": {}, "alternatives": []}
    t0 = time.perf_counter()
    captured = capture(case.fn, q, k, v)
    compiled = compile_ir(captured.program)
    row["compile_s"] = time.perf_counter() - t0
    ref, rows = reference(case, captured, device)

    def record(thunk, tol, note=""):
        entry = {"note": note}
        try:
            out = thunk()
            err = rel_err_rows(out, ref, rows)
            entry["rel_err"] = err
            if not err <= tol:
                entry["error"] = f"failed the float64 check: rel err {err:.2e} > {tol:g}"
                return entry
            ms = measure(thunk)
            entry["ms"] = ms
            if args.host and device == "cuda":
                entry.update(host_and_gpu_times(thunk))
            entry["tflops"] = row["useful_flops"] / (ms * 1e-3) / 1e12
            entry["gbps"] = row["io_bytes"] / (ms * 1e-3) / 1e9
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            if args.verbose:
                traceback.print_exc()
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        return entry

    row["model_plan"] = compiled.alternative.structure
    if not args.dry and not args.no_tune:
        t1 = time.perf_counter()
        inputs = captured.inputs(q, k, v)
        compiled = choose_plan(compiled, inputs, candidates=3, progress=args.verbose)
        autotune(compiled, inputs, progress=args.verbose, cache_file=Path(args.tuning_out))
        row["tune_s"] = time.perf_counter() - t1
    fn = CompiledFunction(captured, compiled)
    row["plan"] = compiled.alternative.structure
    row["impls"]["neptune_eq"] = record(lambda: fn(q, k, v), TOLERANCE["neptune_eq"], compiled.alternative.structure)
    row["impls"]["neptune_eq"]["predicted_ms"] = compiled.alternative.cost.time * 1e3
    if args.alternatives:
        for alt, kind in pick_alternatives(compiled.pin(0)):
            pinned = compiled.pin(alt.id)
            if alt.id == compiled.alternative.id:
                pinned.schedules = compiled.schedules  # the tuned one
            pf = CompiledFunction(captured, pinned)
            e = record(lambda pf=pf: pf(q, k, v), TOLERANCE["neptune_eq"], alt.structure)
            e.update({"id": alt.id, "kind": kind, "structure": alt.structure,
                      "predicted_ms": alt.cost.time * 1e3, "tuned": alt.id == compiled.alternative.id})
            row["alternatives"].append(e)
    for name in args.peers:
        builder = PEERS[name]
        try:
            thunk, note = builder(case, q, k, v)
        except Exception as e:
            thunk, note = None, f"{type(e).__name__}: {str(e)[:200]}"
        if thunk is None:
            row["impls"][name] = {"error": f"not applicable: {note}"}
            continue
        row["impls"][name] = record(thunk, TOLERANCE["peer"], note)
    return row


def best_peer(row) -> tuple[str, float] | None:
    """(name, ms) of the fastest peer that ran, or None."""
    return min(((n, e["ms"]) for n, e in row["impls"].items() if n != "neptune_eq" and "ms" in e),
               key=lambda t: t[1], default=None)


def speedup(row) -> float | None:
    ours = row["impls"].get("neptune_eq", {}).get("ms")
    best = best_peer(row)
    if ours is None or best is None:
        return None
    return best[1] / ours


def spearman(xs, ys) -> float:
    import numpy as np

    if len(xs) < 3:
        return float("nan")
    rx = np.argsort(np.argsort(xs))
    ry = np.argsort(np.argsort(ys))
    return float(np.corrcoef(rx, ry)[0, 1])


def summarize(rows: list[dict]) -> dict:
    largest = {}
    for r in rows:
        if r["op"] not in largest or r["L"] > largest[r["op"]]["L"]:
            largest[r["op"]] = r
    ratios = {op: speedup(r) for op, r in largest.items()}
    valid = [x for x in ratios.values() if x]
    pts = [(a["predicted_ms"], a["ms"]) for r in rows for a in r["alternatives"] if "ms" in a]
    within, within_largest = {}, {}
    for r in rows:
        meas = [a for a in r["alternatives"] if "ms" in a]
        if not meas:
            continue
        best = min(a["ms"] for a in meas)
        # the model's first choice is listed first (pick_alternatives); if it failed it is not within
        first = r["alternatives"][0]
        ok = "ms" in first and first["ms"] <= 1.10 * best
        within.setdefault(r["op"], []).append(ok)
        if r is largest[r["op"]]:
            within_largest[r["op"]] = ok
    return {
        "ratio_largest_L": ratios,
        "geomean": math.exp(sum(math.log(x) for x in valid) / len(valid)) if valid else None,
        "spearman": spearman([p for p, _ in pts], [m for _, m in pts]) if pts else None,
        "points": len(pts),
        "chosen_within_10pct_of_best_measured": {op: all(v) for op, v in within.items()},
        "chosen_within_10pct_at_largest_L": within_largest,
    }


def _plan_cell(r: dict) -> str:
    plan, model = r.get("plan", ""), r.get("model_plan")
    return plan if not model or model == plan else f"{plan} (model's first choice: {model})"


def markdown(rows: list[dict], summary: dict, meta: dict) -> str:
    peers = sorted({n for r in rows for n in r["impls"] if n != "neptune_eq"})
    lines = [f"# neptune_eq vs peers — {meta['device']}, {meta['date']}",
             f"torch {meta['torch']}, triton {meta['triton']}; fp16, head_dim 128, batch 1; "
             "median of triton.testing.do_bench; TF/s = useful FLOPs (4·heads·head_dim per unmasked pair)",
             "", "| op | L | neptune_eq µs | TF/s | GB/s | " + " | ".join(f"{p} µs" for p in peers)
             + " | best peer | speedup | plan |", "|" + "---|" * (7 + len(peers))]
    for r in rows:
        ours = r["impls"].get("neptune_eq", {})
        cells = []
        for p in peers:
            e = r["impls"].get(p, {})
            cells.append(f"{e['ms'] * 1e3:.0f}" if "ms" in e else "—")
        best = best_peer(r)
        sp = speedup(r)
        lines.append(
            f"| {r['op']} | {r['L']} | {ours.get('ms', float('nan')) * 1e3:.0f} | {ours.get('tflops', 0):.0f} | "
            f"{ours.get('gbps', 0):.0f} | " + " | ".join(cells) + f" | {best[0] if best else '—'} | "
            f"{f'{sp:.2f}×' if sp else '—'} | {_plan_cell(r)} |")
    lines += ["", f"Geomean speedup over the best peer at the largest L: {summary['geomean']:.2f}×"
              if summary["geomean"] else "", ""]
    lines.append("Notes on peers that did not run:")
    for r in rows:
        for n, e in r["impls"].items():
            if "error" in e:
                lines.append(f"- {r['op']} L={r['L']} {n}: {e['error']}")
    lines += ["", "Cost model: Spearman rank correlation of predicted vs measured time over "
              f"{summary['points']} (op, size, alternative) points: {summary['spearman']}",
              "Chosen plan within 10% of the best measured alternative, at every size: "
              + ", ".join(f"{op}: {'yes' if ok else 'no'}"
                          for op, ok in summary["chosen_within_10pct_of_best_measured"].items()),
              "... at the largest size: "
              + ", ".join(f"{op}: {'yes' if ok else 'no'}"
                          for op, ok in summary["chosen_within_10pct_at_largest_L"].items())]
    return "\n".join(lines) + "\n"


def write_results(out: Path, rows: list[dict], meta: dict, footer: str = "") -> str:
    """results.json (meta, rows, summary) and results.md under `out`; returns the markdown."""
    summary = summarize(rows)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows, "summary": summary}, indent=1))
    md = markdown(rows, summary, meta) + footer
    (out / "results.md").write_text(md)
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="*")
    ap.add_argument("--sizes", nargs="*", type=int)
    ap.add_argument("--peers", nargs="*", default=list(PEERS))
    ap.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "results"))
    ap.add_argument("--no-alternatives", dest="alternatives", action="store_false")
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--dry", action="store_true", help="CPU smoke test of this script (numbers mean nothing)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--host", action="store_true",
                    help="also record each call's host time and its time replayed as a CUDA graph")
    ap.add_argument("--tuning", default=str(HERE / "tuning.json"),
                    help="tuning cache (JSON) to start from; the updated one is written next to the results")
    args = ap.parse_args(argv)
    if args.dry:
        cases = [Case(op, 64, head_dim=32, heads=(4, 2) if HEADS[op][0] != HEADS[op][1] else (2, 2))
                 for op in (args.ops or HEADS)]
        args.peers = [p for p in args.peers if p == "sdpa"]
    else:
        cases = all_cases(args.ops, args.sizes)
    import triton

    meta = {"device": "CPU (dry run)" if args.dry else torch.cuda.get_device_name(), "date": str(date.today()),
            "torch": torch.__version__, "triton": triton.__version__}
    measure = timer(args.dry)
    out = Path(args.out)
    args.tuning_out = str(out / "tuning.json")
    out.mkdir(parents=True, exist_ok=True)
    if Path(args.tuning).exists() and Path(args.tuning) != Path(args.tuning_out):
        Path(args.tuning_out).write_text(Path(args.tuning).read_text())
    rows, md = [], ""
    t_start = time.perf_counter()
    for n, case in enumerate(cases):
        t0 = time.perf_counter()
        try:
            row = run_case(case, args, measure)
        except Exception as e:
            traceback.print_exc()
            row = {"op": case.op, "L": case.L, "kind": case.kind, "impls": {"neptune_eq": {"error": repr(e)[:300]}},
                   "alternatives": []}
        rows.append(row)
        ours = row["impls"].get("neptune_eq", {})
        times = {name: f"{e['ms'] * 1e3:.0f}µs" + (f" (host {e['host_ms'] * 1e3:.0f}, graph {e['gpu_ms'] * 1e3:.0f})"
                                                    if "gpu_ms" in e else "")
                 for name, e in row["impls"].items() if "ms" in e}
        log(f"[{n + 1}/{len(cases)}] {case.label}: {times} "
            f"{'err ' + ours['error'] if 'error' in ours else ''} ({time.perf_counter() - t0:.0f}s, "
            f"total {time.perf_counter() - t_start:.0f}s)")
        md = write_results(out, rows, meta)  # after every case, so a cut-off run keeps what it measured
    print(md)
    try:
        from plot import plot

        plot(out / "results.json", out / "results.png")
    except Exception as e:
        log(f"no plot: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
