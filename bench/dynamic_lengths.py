"""Issue 14: the Neptune operators at lengths never compiled before, served by one dynamic compile
(neptune_eq.compile(..., dynamic=True)), against a static compile at that very length — both
checked against float64 first, timed in one process (medians of triton.testing.do_bench).

For each (operator, length L) the dynamic function is compiled at the example length L − 7 (the
same bucket, a length it never saw), then called at L: the host time of that first call (no
capture, no saturation, no Triton compile: the stats say so) and of a repeated call, beside a
static compile's call.

    python bench/dynamic_lengths.py --warm --ops causal_pf gqa_pf --L 3000 5000   # fill the cache
    python bench/dynamic_lengths.py --ops causal_pf gqa_pf --L 3000 5000 --out dyn.json
"""

from __future__ import annotations

import argparse
import time

import torch

OFFSET = 7  # the example length is L − OFFSET: same bucket, never L itself


def _compile(op: str, L: int):
    from cases import Case

    import neptune_eq

    dyn = neptune_eq.compile(Case(op, L - OFFSET).fn, *Case(op, L - OFFSET).inputs("cuda"), dynamic=True)
    static = neptune_eq.compile(Case(op, L).fn, *Case(op, L).inputs("cuda"))
    return dyn, static


def _host_us(fn, args) -> float:
    from host_profile import one_call_us

    return one_call_us(lambda: fn(*args))


def _kernel_us(fn, args, reps: int = 30) -> float:
    """Device µs per call of the generated kernels (named nq_*), L2 flushed before each call: what
    the GPU spends, apart from how fast the host issues it (decode calls are host-bound under
    do_bench)."""
    from host_profile import kernel_times

    return sum(us for key, us, _ in kernel_times(lambda: fn(*args), reps) if key.startswith("nq_"))


def measure(op: str, L: int) -> dict:
    import triton.testing as tt
    from cases import TOLERANCE, Case, reference, rel_err_rows

    dyn, static = _compile(op, L)
    case = Case(op, L)
    xs = case.inputs("cuda")
    warm = Case(op, L - OFFSET).inputs("cuda")
    for _ in range(3):  # the bucket warm in this process: its kernels loaded and launched at L − 7
        dyn(*warm)
    groups = dyn.family.lengths.groups if dyn.family else ()
    row = {"op": op, "L": L, "example_L": L - OFFSET, "dynamic_axes": [list(g) for g in groups]}
    before = dyn.stats()
    row["host_us_first_call_new_length"] = _host_us(dyn, xs)
    after = dyn.stats()
    row["new_length_recompiled"] = {k: after[k] - before[k] for k in ("captures", "compiles", "cache_hits")}
    row["host_us_repeat_dynamic"] = sorted(_host_us(dyn, xs) for _ in range(21))[10]
    static(*xs)
    row["host_us_repeat_static"] = sorted(_host_us(static, xs) for _ in range(21))[10]
    ref, rows = reference(case, static.captured, "cuda")
    for name, prog in (("dynamic", dyn), ("static", static)):
        err = rel_err_rows(prog(*xs).float(), ref, rows)
        row[f"{name}_rel_err"] = err
        if not err <= TOLERANCE["neptune_eq"]:
            row[f"{name}_ms"] = None
            continue
        row[f"{name}_ms"] = tt.do_bench(lambda p=prog: p(*xs), warmup=25, rep=200, return_mode="median")
        row[f"{name}_kernel_us"] = _kernel_us(prog, xs)
        row[f"{name}_plan"] = (dyn.family.program_for(dyn.family.serves(xs)) if name == "dynamic" and dyn.family
                               else prog.program).alternative.structure
    if row.get("dynamic_ms") and row.get("static_ms"):
        row["dynamic_over_static"] = row["dynamic_ms"] / row["static_ms"]
        row["dynamic_over_static_kernels"] = row["dynamic_kernel_us"] / row["static_kernel_us"]
    return row


def profile(op: str, L: int, calls: int = 300) -> None:
    """Where the host time of dynamic calls goes (cProfile over `calls` calls at alternating lengths)."""
    import cProfile
    import pstats

    from cases import Case

    dyn, _ = _compile(op, L)
    xs = [Case(op, L - OFFSET + k).inputs("cuda") for k in range(4)]
    for x in xs:
        dyn(*x)
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for k in range(calls):
        dyn(*xs[k % 4])
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)


def new_lengths(op: str, L: int, count: int = 40, profile_calls: bool = True) -> dict:
    """Host µs of the first, second and third call at `count` lengths never called before (all in
    the bucket of L − 7, where the function was compiled and warmed), medians; then cProfile over
    the first calls of `count` more lengths."""
    import cProfile
    import io
    import pstats

    from cases import Case

    from neptune_eq.frontend.dynamic import bucket

    dyn, _ = _compile(op, L)
    for _ in range(3):
        dyn(*Case(op, L - OFFSET).inputs("cuda"))
    lengths = [n for n in range(L, L + 4 * count) if bucket(n) == bucket(L - OFFSET)][: 2 * count]
    xs = [Case(op, n).inputs("cuda") for n in lengths]
    before = dyn.stats()
    calls = [[_host_us(dyn, x) for _ in range(3)] for x in xs[:count]]
    after = dyn.stats()
    row = {"op": op, "L": L, "lengths": [lengths[0], lengths[count - 1]], "count": count,
           "recompiled": {k: after[k] - before[k] for k in ("captures", "compiles", "cache_hits")}}
    for k, name in enumerate(("first", "second", "third")):
        us = sorted(c[k] for c in calls)
        row[f"host_us_{name}_call"] = us[count // 2]
        row[f"host_us_{name}_call_p90_max"] = [us[int(0.9 * (count - 1))], us[-1]]
    row["host_us_first_call_beyond_third"] = sorted(c[0] - c[2] for c in calls)[count // 2]
    if profile_calls:
        pr = cProfile.Profile()
        torch.cuda.synchronize()
        pr.enable()
        for x in xs[count:]:
            dyn(*x)
        pr.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(25)
        row["profile_first_calls"] = out.getvalue()
        print(out.getvalue())
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="+", required=True)
    ap.add_argument("--L", nargs="+", type=int, required=True)
    ap.add_argument("--out")
    ap.add_argument("--warm", action="store_true", help="compile every case in parallel processes, then exit")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help="cProfile dynamic calls of the first op and length")
    ap.add_argument("--new-lengths", type=int, default=0, help="host µs of first calls at this many new lengths")
    args = ap.parse_args()
    if args.new_lengths:
        import json

        rows = [new_lengths(op, L, args.new_lengths) for op in args.ops for L in args.L]
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "rows": rows},
                          f, indent=1)
        return
    if args.profile:
        profile(args.ops[0], args.L[0])
        return
    if args.one:
        _compile(args.one[0], int(args.one[1]))
        return
    if args.warm:
        from cases import warm_in_parallel

        warm_in_parallel(__file__, args.ops, args.L)
        return
    import triton
    from cases import record

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d")}
    rows = []
    for op in args.ops:
        for L in args.L:
            try:
                row = measure(op, L)
            except Exception as e:  # one case failing is reported, the rest still run
                row = {"op": op, "L": L, "error": f"{type(e).__name__}: {e}"[:500]}
            record(rows, row, args.out, meta)


if __name__ == "__main__":
    main()
