"""bench/beyond: neptune_eq beside eager PyTorch, torch.compile, SDPA / FlexAttention and Liger-Kernel
on the programs of programs.py, with a matmul or copy ceiling for each, in one process on one GPU.
Writes results.json, results.md and results.png.

    python bench/beyond/run.py                            # everything (GPU)
    python bench/beyond/run.py --programs softmax causal_gqa --verbose
    python bench/beyond/run.py --dry                      # CPU: tiny sizes, Triton's interpreter;
                                                          # every code path, timings that mean nothing

Every implementation is checked against float64 before it is timed (check.py); a failed check is
recorded and not timed. Timing: triton.testing.do_bench (CUDA events, warm-up excluded, L2 cleared
between runs), median, as bench/run.py. neptune_eq is compiled with neptune_eq.compile(fn, *inputs)
and tuned with prog.tune(*inputs); besides its chosen plan, the cost model's top alternatives are
timed so that the model's ranking can be checked (Spearman in the report).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
if __name__ == "__main__" and not __package__:  # `python bench/beyond/run.py`: run it as the package's module
    sys.path[0] = str(HERE.parent)  # bench/ (whose run.py is `run`) instead of this folder
    sys.path.append(str(HERE.parent.parent))  # neptune_eq from this checkout, unless one is installed
    from beyond.run import main

    sys.exit(main())

import torch  # noqa: E402
from run import pick_alternatives, timer  # noqa: E402  (bench/run.py; bench/ is on the path: __init__.py)

import neptune_eq  # noqa: E402  (first: Triton interpreter on a CPU-only machine)

from .check import Reference, Timer, checked_time, describe, reference, tolerance  # noqa: E402
from .peers import PEERS, Builder, Peer  # noqa: E402
from .programs import Case, CopyCeiling, MatmulCeiling, cases  # noqa: E402
from .report import merge, plot, write_results  # noqa: E402

DRY_PEERS = ("eager", "sdpa", "flex", "liger")  # torch.compile takes long on a CPU: name it to run it


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RunOptions:
    dry: bool = False
    tune: bool = True
    alternatives: int = 4  # the model's top-ranked plans timed beside the chosen one (0: none)
    verbose: bool = False
    cache_dir: str | None = None  # neptune_eq's compile and tuning cache (None: its default)

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"


def rate(case: Case, work: float, ms: float) -> float:
    """GB/s of a memory-bound program's bytes, else TF/s of its FLOPs."""
    return work / (ms * 1e-3) / (1e9 if case.program.kind == "memory" else 1e12)


def unit(case: Case) -> str:
    return "GB/s" if case.program.kind == "memory" else "TF/s"


def _free(device: str) -> None:
    """Give the GPU memory of what is no longer referenced back (large programs follow each other)."""
    if device == "cuda":
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _bytes(n: float) -> str:
    return next(f"{n / f:.3g} {u}" for f, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B")) if n >= f or f == 1)


def measure_ceiling(case: Case, device: str, measure: Timer) -> dict:
    """The ceiling's own time and rate: torch.mm at its shape in the program's dtype, or y.copy_(x)."""
    c = case.ceiling
    dtype = case.program.dtype
    if isinstance(c, MatmulCeiling):
        a = torch.randn(c.m, c.k, device=device, dtype=dtype)
        b = torch.randn(c.k, c.n, device=device, dtype=dtype)
        what, work = f"torch.mm {c.m}×{c.k}×{c.n} {str(dtype).removeprefix('torch.')}", c.flops
        thunk = lambda: torch.mm(a, b)  # noqa: E731
    elif isinstance(c, CopyCeiling):
        src = torch.empty(c.nbytes // 2, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        what, work = f"copy of {_bytes(c.nbytes / 2)} (moves {_bytes(c.nbytes)})", c.nbytes
        thunk = lambda: dst.copy_(src)  # noqa: E731
    else:
        raise TypeError(f"unknown ceiling {c!r}")
    try:
        ms = measure(thunk)
    except Exception as e:
        return {"what": what, "error": describe(e)}
    return {"what": what, "ms": ms, "rate": rate(case, work, ms), "unit": unit(case)}


def run_neptune(case: Case, xs: tuple, ref: Reference, opts: RunOptions, measure: Timer, row: dict) -> None:
    """Compile (and on a GPU tune) neptune_eq, time its plan and the model's top alternatives into `row`."""
    from neptune_eq.frontend.compiled import CompiledFunction

    log("  neptune_eq: compile")
    t0 = time.perf_counter()
    prog = neptune_eq.compile(case.program.fn, *xs, cache_dir=opts.cache_dir)
    row["compile_s"] = time.perf_counter() - t0
    row["model_plan"] = prog.program.alternative.structure
    if opts.tune and not opts.dry:
        log("  neptune_eq: tune")
        t1 = time.perf_counter()
        try:
            prog.tune(*xs, progress=opts.verbose)
        except Exception as e:  # the untuned plan is still timed
            row["tune_error"] = describe(e, 300)
            log(f"  neptune_eq: tuning failed: {row['tune_error']}")
        row["tune_s"] = time.perf_counter() - t1
    chosen = prog.program
    row["plan"] = chosen.alternative.structure
    row["kernels"] = len(chosen.plan.kernels)
    log(f"  neptune_eq: {row['plan']}")
    entry = checked_time(lambda: prog(*xs), ref, tolerance(case, "neptune_eq"), measure, verbose=opts.verbose)
    entry.update(note=row["plan"], predicted_ms=chosen.alternative.cost.time * 1e3)
    row["impls"]["neptune_eq"] = entry
    for alt, kind in alternatives_to_time(chosen, opts.alternatives):
        log(f"  neptune_eq alternative #{alt.id} ({kind}): {alt.structure}")
        # every alternative with its default schedules, the chosen one too: the model prices the
        # defaults, and a tuned plan beside untuned ones ranks the tuning, not the model (linear CE's
        # tuned K-loop measured 13.8 ms, its default 30 ms); the tuned time is neptune_eq's entry
        run = CompiledFunction(prog.captured, chosen.pin(alt.id))
        e = checked_time(lambda run=run: run(*xs), ref, tolerance(case, "neptune_eq"), measure, verbose=opts.verbose)
        e.update(id=alt.id, kind=kind, structure=alt.structure, predicted_ms=alt.cost.time * 1e3,
                 chosen=alt.id == chosen.alternative.id)
        row["alternatives"].append(e)
        del run


def alternatives_to_time(compiled, top: int) -> list[tuple[object, str]]:
    """The model's `top` best plans, then the best of each other kind (split-K, unfused, ...; bench's
    pick_alternatives), each once, the model's first choice first. Nothing when top is 0."""
    if top <= 0:
        return []
    first = compiled.pin(0)
    out = {a.id: (a, "rank") for a in first.alternatives[:top]}
    for a, kind in pick_alternatives(first):
        out[a.id] = (a, kind)
    return sorted(out.values(), key=lambda t: t[0].id)


def run_case(case: Case, opts: RunOptions, peers: Mapping[str, Builder], measure: Timer) -> dict:
    device = opts.device
    row = {"program": case.name, "dims": dict(case.dims), "shape": case.shape, "kind": case.program.kind,
           "dtype": str(case.program.dtype).removeprefix("torch."), "work": case.work, "unit": unit(case),
           "impls": {}, "alternatives": []}
    log("  inputs and float64 reference")
    xs = case.inputs(device)
    ref = reference(case, xs)
    row["checked_rows"] = None if ref.rows is None else len(ref.rows)
    try:
        run_neptune(case, xs, ref, opts, measure, row)
    except Exception as e:
        row["impls"].setdefault("neptune_eq", {})["error"] = describe(e, 300)
        if opts.verbose:
            traceback.print_exc()
    _free(device)
    for name, builder in peers.items():
        log(f"  peer {name}")
        try:
            got = builder(case, xs)
        except Exception as e:
            row["impls"][name] = {"error": f"setup failed: {describe(e)}"}
            continue
        if not isinstance(got, Peer):
            row["impls"][name] = {"error": got.reason}
            continue
        entry = checked_time(got.run, ref, tolerance(case, name), measure, verbose=opts.verbose)
        row["impls"][name] = {**entry, "note": got.note}
        del got
        _free(device)
    for e in row["impls"].values():
        if "ms" in e:
            e["rate"] = rate(case, case.work, e["ms"])
    log("  ceiling")
    row["ceiling"] = measure_ceiling(case, device, measure)
    if "rate" in row["ceiling"]:
        for e in row["impls"].values():
            if "rate" in e:
                e["of_ceiling"] = e["rate"] / row["ceiling"]["rate"]
        if "of_ceiling" in row["impls"].get("neptune_eq", {}):
            row["of_ceiling"] = row["impls"]["neptune_eq"]["of_ceiling"]
    del xs, ref
    _free(device)
    return row


def select_peers(names: list[str] | None, dry: bool) -> dict[str, Builder]:
    chosen = names if names is not None else (DRY_PEERS if dry else list(PEERS))
    unknown = set(chosen) - set(PEERS)
    if unknown:
        raise SystemExit(f"unknown peer(s) {sorted(unknown)}; known: {', '.join(PEERS)}")
    return {n: PEERS[n] for n in chosen}


def meta_of(dry: bool) -> dict:
    import triton

    return {"device": "CPU (dry run)" if dry else torch.cuda.get_device_name(), "date": str(date.today()),
            "torch": torch.__version__, "triton": triton.__version__, "dry": dry}


def run_all(todo: list[Case], opts: RunOptions, peers: Mapping[str, Builder], out: Path,
            measure: Timer | None = None, on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Every case in order; results written under `out` after each (a cut-off run keeps what it measured)."""
    measure = measure or timer(opts.dry)
    meta = meta_of(opts.dry)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t_start = time.perf_counter()
    for n, case in enumerate(todo):
        log(f"[{n + 1}/{len(todo)}] {case.label}")
        t0 = time.perf_counter()
        try:
            row = run_case(case, opts, peers, measure)
        except Exception as e:  # e.g. out of memory building the inputs: the next program still runs
            traceback.print_exc()
            row = {"program": case.name, "dims": dict(case.dims), "shape": case.shape, "kind": case.program.kind,
                   "impls": {"neptune_eq": {"error": describe(e, 300)}}, "alternatives": []}
            _free(opts.device)
        rows.append(row)
        times = {name: f"{e['ms'] * 1e3:.0f}µs" for name, e in row["impls"].items() if "ms" in e}
        log(f"[{n + 1}/{len(todo)}] {case.label}: {times} ({time.perf_counter() - t0:.0f}s, "
            f"total {time.perf_counter() - t_start:.0f}s)")
        write_results(out, rows, meta)
        if on_row:
            on_row(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", nargs="*", help="programs to run (default: all; see programs.py)")
    ap.add_argument("--peers", nargs="*", help=f"peers to run (default: all; with --dry: {' '.join(DRY_PEERS)})")
    ap.add_argument("--out", help="results folder (default: $OUT, else bench/beyond/results, with --dry its dry/)")
    ap.add_argument("--alternatives", type=int, default=4, help="the model's top plans timed besides the chosen one")
    ap.add_argument("--no-tune", action="store_true", help="time neptune_eq's plan without prog.tune")
    ap.add_argument("--cache-dir", help="neptune_eq's compile and tuning cache (default: its own)")
    ap.add_argument("--dry", action="store_true", help="CPU smoke test: tiny sizes, interpreter, numbers mean nothing")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--merge", nargs="+", metavar="RESULTS_JSON",
                    help="measure nothing: write one report to --out from these runs (rows whole)")
    args = ap.parse_args(argv)
    out = Path(args.out or os.environ.get("OUT") or HERE / "results" / ("dry" if args.dry else ""))
    if args.merge:
        print(merge(out, [Path(p) for p in args.merge]))
        _plot(out)
        return 0
    opts = RunOptions(dry=args.dry, tune=not args.no_tune, alternatives=args.alternatives, verbose=args.verbose,
                      cache_dir=args.cache_dir)
    if not args.dry and not torch.cuda.is_available():
        raise SystemExit("bench/beyond needs a CUDA GPU (or --dry for the CPU smoke test)")
    todo = cases(args.programs, dry=args.dry)
    rows = run_all(todo, opts, select_peers(args.peers, args.dry), out)
    print((out / "results.md").read_text())
    _plot(out)
    return 0 if rows else 1


def _plot(out: Path) -> None:
    try:
        plot(out / "results.json", out / "results.png")
    except Exception as e:  # matplotlib missing, or nothing measured
        log(f"no plot ({type(e).__name__}: {e}); results.json and results.md are written")


if __name__ == "__main__":
    sys.exit(main())
