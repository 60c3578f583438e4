"""Autotuning: time schedule variants of each kernel of a plan on the GPU and keep the fastest.

Candidates vary the row tile, the loop tile, warps and pipeline stages around the default
schedule, fast special functions where the kernel uses tanh, and (asked for) tensor-descriptor
(TMA) loads for the three fastest; every fast-math or TMA variant is verified against float64
before it may win. Results are cached on disk per (program, plan, kernel, device, triton version)
so a shape is tuned once; the cache file is plain JSON, every entry checked when read (cachedir.py
says which files are trusted), merged and written atomically under a file lock.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from . import ir
from .block_bounds import next_pow2
from .cachedir import cache_dir as cache_dir_at
from .cachedir import default_cache_dir
from .kernel_terms import inner_axes, kernel_exprs, loop_loads
from .schedule import KernelSchedule, row_axes
from .space import GEMM_TILES, RESIDENT_MAX, Variant, fma_tiles, gemm_axes, gemm_tiles, ieee_tiled


@dataclass
class Trial:
    schedule: KernelSchedule
    ms: float | None
    error: str | None = None


def _candidates(k, program: ir.Program, plan, base: KernelSchedule, limit: int = 8) -> list[KernelSchedule]:
    """Variants of `base` within its schedule kind (neptune_eq.space): a resident row keeps its row
    whole, a GEMM keeps its 2-D tiles and grouped order; tiles, warps and stages vary."""
    if base.resident:
        return _resident_candidates(k, program, base)
    if base.group > 1 and gemm_axes(k, program) is not None:
        return _gemm_candidates(k, program, base)
    return _streamed_candidates(k, program, plan, base, limit)


def _resident_candidates(k, program: ir.Program, base: KernelSchedule) -> list[KernelSchedule]:
    out = [base]
    loop = next(p.axis for p in k.passes())
    rows = [a for a in k.grid if base.tiles.get(a, 1) > 1 and a != loop][:1]
    r0 = base.tiles.get(rows[0], 1) if rows else 1
    for r in {r0, r0 * 2, max(1, r0 // 2)}:
        if r * base.tiles[loop] > RESIDENT_MAX or (rows and r > next_pow2(program.axes[rows[0]])):
            continue
        for w in (base.num_warps // 2, base.num_warps, base.num_warps * 2):
            if 1 <= w <= 32:
                cand = replace(base, tiles={**base.tiles, **({rows[0]: r} if rows else {})}, num_warps=w)
                if cand.key() not in {c.key() for c in out}:
                    out.append(cand)
    return out


def _gemm_candidates(k, program: ir.Program, base: KernelSchedule) -> list[KernelSchedule]:
    m, n, kk = gemm_axes(k, program)
    out = [base]
    for bm, bn, bk, warps, stages in GEMM_TILES:
        for st in (stages, stages + 1):
            tiles = {**base.tiles, **gemm_tiles(program, (m, n, kk), (bm, bn, bk))}
            cand = replace(base, tiles=tiles, num_warps=warps, num_stages=st)
            if cand.key() not in {c.key() for c in out}:
                out.append(cand)
    return out


def _streamed_candidates(k, program: ir.Program, plan, base: KernelSchedule, limit: int) -> list[KernelSchedule]:
    if base.input_precision == "ieee" and ieee_tiled(k, plan, program):
        # float32 IEEE products: the larger tiles below spill under ptxas (schedule.FMA_*); those within
        # its bounds, in two and three stages
        fitted = [v.schedule for v in fma_tiles(k, plan, program, [Variant("streamed", base)])]
        out = [base] + [replace(s, num_stages=st) for s in fitted for st in (2, 3)]
        return list({s.key(): s for s in out}.values())
    # vary the query-like row tile only (not the value dimension, not a padded single/grouped row)
    loads = loop_loads(k, plan)
    rows = [a for a in row_axes(k, program, plan) if base.tiles.get(a, 1) > 1 and a not in base.steps
            and all(a not in ld.axes for ld in loads)][:1]
    loops = list(dict.fromkeys(p.axis for p in k.passes()))
    has_dot = bool(inner_axes(k, plan))
    out = [base]
    row_opts = [128, 64] if rows and program.axes[rows[0]] >= 64 else [None]
    loop_opts = ([64, 128, 32] if has_dot else [256, 1024, 2048, 4096]) if loops else [None]
    warp_opts = [8, 4]
    stage_opts = [3, 2, 4] if has_dot else [2, 3]
    for r, lt, w, s in itertools.product(row_opts, loop_opts, warp_opts, stage_opts):
        if has_dot and r is not None and lt is not None and r * lt > 128 * 128:
            continue
        tiles = dict(base.tiles)
        if r is not None:
            tiles[rows[0]] = r
        if lt is not None:
            tiles.update({a: lt for a in loops if program.axes[a] >= lt // 2})
        cand = replace(base, tiles=tiles, num_warps=w, num_stages=s)
        if cand.key() not in {c.key() for c in out}:
            out.append(cand)
    out = out[:limit]
    if has_dot and rows and loops and program.axes[rows[0]] >= 256:
        # 256 rows over 8 warps: each warp group owns 128 rows (a full-height wgmma on Hopper)
        for s in (3, 2):
            tiles = {**base.tiles, rows[0]: 256, **{a: 64 for a in loops if program.axes[a] >= 32}}
            out.append(replace(base, tiles=tiles, num_warps=8, num_stages=s))
    kloops = [a for a in inner_axes(k, plan) if base.tiles.get(a, program.axes[a]) < program.axes[a]]
    if kloops and rows and loops:
        # a K-loop nested in the pass is a GEMM per loop tile: wider loop tiles, longer K steps
        for lt, kt, w, s in ((128, 64, 8, 3), (256, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (256, 32, 8, 4)):
            tiles = {**base.tiles, rows[0]: 128, **{a: lt for a in loops}, **{a: kt for a in kloops}}
            cand = replace(base, tiles=tiles, num_warps=w, num_stages=s)
            if cand.key() not in {c.key() for c in out}:
                out.append(cand)
    return out


def cache_path(cache_dir: Path | None) -> Path:
    return (cache_dir or default_cache_dir()) / "tuning.json"


def _key(program: ir.Program, alt_structure: str, k_index: int, device: str) -> str:
    import triton

    # v3: group and resident kept
    text = f"v3|{program.text(exact=True)}|{alt_structure}|{k_index}|{device}|{triton.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


MAX_TUNING_BYTES = 16 << 20


def load_tuning(path: Path) -> dict[str, KernelSchedule]:
    """The schedules stored in tuning file `path`, each checked (see _schedule_from). A file that is
    missing, refused (see cachedir.py: not this user's, writable by others, a link) or corrupt gives
    {}; an entry that does not check out is dropped. Both warn (CacheWarning), naming the file."""
    disk = cache_dir_at(path.parent)
    data = disk.read(path.name, MAX_TUNING_BYTES)
    if data is None:
        return {}
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        disk.warn(f"ignoring tuning cache {path}: not JSON ({e})")
        return {}
    if not isinstance(doc, dict):
        disk.warn(f"ignoring tuning cache {path}: not a JSON object")
        return {}
    out, bad = {}, []
    for key, entry in doc.items():
        try:
            out[key] = _schedule_from(entry)
        except ValueError as e:
            bad.append(f"{key[:30]!r}: {e}")
    if bad:
        disk.warn(f"ignoring {len(bad)} entries of tuning cache {path}: {'; '.join(bad[:3])}")
    return out


def store_tuning(path: Path, entries: dict[str, KernelSchedule]) -> None:
    """Add `entries` to tuning file `path`: read, merge and write under a file lock, so concurrent
    tuners do not drop each other's results (a directory that cannot be written: not stored)."""
    disk = cache_dir_at(path.parent)
    if not entries or disk.write_error is not None:
        return
    with disk.locked(path.name + ".lock"):
        merged = {**load_tuning(path), **entries}
        text = json.dumps({k: _schedule_to(s) for k, s in merged.items()}, indent=1, sort_keys=True)
        disk.write(path.name, text.encode())


def _logger(progress: bool):
    return (lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None)


def _median_ms(launcher, inputs: dict, rep_ms: int) -> float:
    import triton.testing

    return triton.testing.do_bench(lambda: launcher(inputs), warmup=20, rep=rep_ms, return_mode="median")


_SCHEDULE_KEYS = {"tiles", "num_warps", "num_stages", "input_precision", "fast_math", "tma", "warp_specialize",
                  "steps", "group", "resident", "data_bounds", "library"}
_PRECISIONS = ("ieee", "tf32", "tf32x3")
_MAX_TILE = 1 << 20  # Triton's largest block (elements)


def _schedule_from(d) -> KernelSchedule:
    """The schedule a tuning-cache entry describes; ValueError unless every field has its type and a
    value Triton accepts: tiles powers of two up to 2^20, warps a power of two up to 32, 1-16
    stages, a known fp32 dot precision, steps between 1 and their axis's tile."""
    if not isinstance(d, dict) or not {"tiles", "num_warps", "num_stages"} <= set(d) <= _SCHEDULE_KEYS:
        raise ValueError("not a schedule")
    tiles, steps = d["tiles"], d.get("steps", {})
    if not (isinstance(tiles, dict) and all(isinstance(a, str) and _pow2(t, _MAX_TILE) for a, t in tiles.items())):
        raise ValueError(f"bad tiles {str(tiles)[:60]}")
    if not (isinstance(steps, dict) and all(a in tiles and _int(n) and 1 <= n <= tiles[a] for a, n in steps.items())):
        raise ValueError(f"bad steps {str(steps)[:60]}")
    if not _pow2(d["num_warps"], 32):
        raise ValueError(f"bad num_warps {str(d['num_warps'])[:20]}")
    if not (_int(d["num_stages"]) and 1 <= d["num_stages"] <= 16):
        raise ValueError(f"bad num_stages {str(d['num_stages'])[:20]}")
    precision = d.get("input_precision", "ieee")
    if precision not in _PRECISIONS:
        raise ValueError(f"bad input_precision {str(precision)[:20]}")
    flags = {f: d.get(f, False) for f in ("fast_math", "tma", "warp_specialize")}
    if not all(type(v) is bool for v in flags.values()):
        raise ValueError("fast_math, tma and warp_specialize must be true or false")
    group = d.get("group", 1)
    if not (_int(group) and 1 <= group <= 64):
        raise ValueError(f"bad group {str(group)[:20]}")
    if any(type(d.get(f, v)) is not bool for f, v in (("resident", False), ("data_bounds", True), ("library", False))):
        raise ValueError("resident, data_bounds and library must be true or false")
    return KernelSchedule(dict(tiles), d["num_warps"], d["num_stages"], precision, steps=dict(steps), group=group,
                          resident=d.get("resident", False), data_bounds=d.get("data_bounds", True),
                          library=d.get("library", False), **flags)


def _int(v) -> bool:
    return type(v) is int


def _pow2(v, limit: int) -> bool:
    return _int(v) and 1 <= v <= limit and v & (v - 1) == 0


def _fits(s: KernelSchedule, base: KernelSchedule) -> bool:
    """Does cached schedule `s` tile the axes the kernel's default schedule `base` tiles, and run as the
    vendor's GEMM exactly where `base` does (a cache entry never turns a kernel into one)?"""
    return set(s.tiles) == set(base.tiles) and s.library == base.library


def _schedule_to(s: KernelSchedule) -> dict:
    return {"tiles": s.tiles, "num_warps": s.num_warps, "num_stages": s.num_stages,
            "input_precision": s.input_precision, "fast_math": s.fast_math, "steps": s.steps, "tma": s.tma,
            "warp_specialize": s.warp_specialize, "group": s.group, "resident": s.resident,
            "data_bounds": s.data_bounds, "library": s.library}


def sample_rows(program: ir.Program, limit: int = 2**27, rows: int = 256) -> dict:
    """{axis: indices} restricting a float64 check of a large program to `rows` fixed random indices
    of the longest axis every output has and no reduction runs over (the query rows of attention,
    the rows of a softmax — never its columns, which every output value sums over): the reference
    of a 16K-token attention would hold 64 GiB of float64 scores. A gathered operand the reference
    materialises over its axes (a paged cache's K read at block_table[b, j // P]: 34 GB in float64 for
    32 requests of 32K keys) restricts further such axes until it holds at most `limit` values. Empty
    where the whole program is small enough."""
    import torch

    if math.prod(program.axes.values()) <= limit or not program.outputs:
        return {}
    reduced = {n.axis for o in program.outputs for n in ir.walk(o.expr) if isinstance(n, ir.Reduce)}
    common = set.intersection(*(set(o.axes) for o in program.outputs)) - reduced
    gen = torch.Generator().manual_seed(0)
    out = {}

    def keep(a: str, n: int) -> None:
        out[a] = torch.randperm(program.axes[a], generator=gen)[:n].sort().values

    axis = max(common, key=lambda a: program.axes[a], default=None)
    if axis is not None and program.axes[axis] > rows:
        keep(axis, rows)
    gathers = {n for o in program.outputs for n in ir.walk(o.expr)
               if isinstance(n, ir.Load) and not all(isinstance(e, ir.Index) for e in n.index)}
    for ld in sorted(gathers, key=str):
        for a in sorted((common & set(ld.axes)) - set(out), key=lambda a: (-program.axes[a], a)):
            held = math.prod(len(out[b]) if b in out else program.axes[b] for b in ld.axes)
            if held <= limit:
                break
            n = max(2, math.ceil(program.axes[a] * limit / held))
            if n < program.axes[a]:
                keep(a, n)
    return out


@dataclass
class _Tuner:
    """Times one schedule variant of one kernel of a plan (the other kernels as they stand)."""

    program: ir.Program
    plan: object
    inputs: dict
    cache_dir: Path | None
    rep_ms: int
    tolerance: float
    log: object
    ref: dict | None = None

    def rel_err(self, out: dict) -> float:
        """Largest normwise relative error of `out` against float64 (on sampled rows of a large program)."""
        from .reference import evaluate
        from .verify import rel_err, restricted

        if self.ref is None:
            restrict = sample_rows(self.program)
            self.ref = restrict, evaluate(self.program, {a: t.double() if t.is_floating_point() else t
                                                         for a, t in self.inputs.items()}, restrict=restrict)
        restrict, ref = self.ref
        err = 0.0
        for o in self.program.outputs:
            err = max(err, rel_err(restricted(out[o.name], o.axes, restrict), ref[o.name])[0])
        return err

    def trial(self, current: list[KernelSchedule], ki: int, cand: KernelSchedule, label: str) -> Trial | None:
        """Time `cand` for kernel ki (None: it reads nothing through descriptors though asked to)."""
        from .lower.launch import Launcher, load_module
        from .lower.triton import write_module
        from .lower.values import _ident

        name = self.plan.kernels[ki].name
        scheds = list(current)
        scheds[ki] = cand
        try:
            src, ks = write_module(self.plan, self.program, scheds, "cuda", "tune_" + _ident(f"{ki}_{label}"))
            if cand.tma and not ks[ki].descriptors:
                return None
            launcher = Launcher(self.program, self.plan, ks, load_module(src, self.cache_dir))
            out = launcher(self.inputs)
            if cand.fast_math or cand.tma:  # checked against float64 before it may win
                err = self.rel_err(out)
                if not err < self.tolerance:
                    self.log(f"  tune {name} [{label}] rejected: rel err {err:.2e}")
                    return Trial(cand, None, f"rel err {err:.2e}")
            ms = _median_ms(launcher, self.inputs, self.rep_ms)
            self.log(f"  tune {name} [{label}] {cand.tiles} w{cand.num_warps} s{cand.num_stages}"
                     f"{' fast' if cand.fast_math else ''}{' tma' if cand.tma else ''}: {ms * 1e3:.1f} µs")
            return Trial(cand, ms)
        except Exception as e:  # a variant that does not compile (e.g. out of shared memory) just loses
            self.log(f"  tune {name} [{label}] failed: {repr(e)[:120]}")
            return Trial(cand, None, repr(e)[:200])


def fast_variant_tolerance(program: ir.Program) -> float:
    """The loosest dtype-aware verification tolerance of the program's outputs (neptune_eq.verify),
    and at least 2e-3 for float32 programs (tanh.approx's relative error is 2^-11): a bf16 attention's own rounding is
    ~5e-3, so a fixed 2e-3 rejected every fast variant of it."""
    from .numeric import compute_dtype
    from .verify import default_tolerance, rounded_dtypes

    ins = [s.dtype for s in program.inputs.values()]
    compute = compute_dtype(program)
    tols = [default_tolerance(o.dtype or "float32", ins + rounded_dtypes(o.expr), compute=compute)
            for o in program.outputs]
    return max(tols) if compute == "float64" else max([2e-3, *tols])  # no approximations in float64


def autotune(compiled, inputs: dict, *, cache_dir: Path | None = None, progress=True, rep_ms: int = 60,
             max_candidates: int = 8, tolerance: float | None = None, cache_file: Path | None = None,
             tma: bool = False) -> list[KernelSchedule]:
    """Tune every kernel of `compiled`'s plan on CUDA `inputs`; installs and returns the schedules.
    With tma=True the three fastest are also tried with tensor-descriptor loads (off by default: on
    an H100 with triton 3.6 they were slower for every benchmark kernel, see README.md)."""
    import torch

    if compiled.chunking is not None:  # the kernels that run are the chunk program's, at a chunk
        from .chunked import first_chunk

        return autotune(compiled.chunk_compiled, first_chunk(compiled.chunking, inputs, compiled.program),
                        cache_dir=cache_dir, progress=progress, rep_ms=rep_ms, max_candidates=max_candidates,
                        tolerance=tolerance, cache_file=cache_file, tma=tma)
    log = _logger(progress)
    program, plan = compiled.program, compiled.plan
    device = torch.cuda.get_device_name()
    cache_dir = cache_dir or compiled.compilation.options.cache_dir  # kernel modules beside the compile's cache
    path = cache_file or cache_path(cache_dir)
    cache = load_tuning(path)
    found = {}
    current = list(compiled._schedules("cuda"))
    if tolerance is None:  # fast math / TMA variants are held to the dtype-aware verification bound
        tolerance = fast_variant_tolerance(program)
    tuner = _Tuner(program, plan, inputs, cache_dir, rep_ms, tolerance, log)
    uses_tanh = any(isinstance(n, ir.Call) and n.op == "tanh"
                    for k in plan.kernels for e in kernel_exprs(k, plan) for n in ir.walk(e))
    for ki, k in enumerate(plan.kernels):
        key = _key(program, compiled.alternative.structure, ki, device)
        if key in cache and _fits(cache[key], current[ki]):
            current[ki] = cache[key]
            log(f"  tune {k.name}: cached {current[ki].tiles} w{current[ki].num_warps} s{current[ki].num_stages}"
                f"{' tma' if current[ki].tma else ''}")
            continue
        if current[ki].library:  # (the vendor's GEMM picks its own tiles)
            log(f"  tune {k.name}: library GEMM, nothing to tune")
            continue
        cands = _candidates(k, program, plan, current[ki], max_candidates)
        if uses_tanh:  # fast tanh first (verified against float64), the plain default as a fallback
            cands = [replace(c, fast_math=True) for c in cands] + [cands[0]]
        trials = [tuner.trial(current, ki, c, f"{n + 1}/{len(cands)}") for n, c in enumerate(cands)]
        # tensor descriptors (TMA) for the three fastest, where the kernel's tiles allow them; always
        # for a GEMM of 2-D tiles (grouped), whose operands a descriptor copies straight to shared
        # memory (a plain bf16 GEMM measured 3 % faster so, bench/results/h100_2026-11-24/issue11/
        # probe_gemm_operand.txt)
        top = sorted((t for t in trials if t.ms is not None), key=lambda t: t.ms)[:3] \
            if tma or current[ki].group > 1 else []
        trials += [tuner.trial(current, ki, replace(t.schedule, tma=True), f"tma {n + 1}/{len(top)}")
                   for n, t in enumerate(top)]
        trials = [t for t in trials if t is not None]
        ok = [t for t in trials if t.ms is not None]
        if ok:
            best = min(ok, key=lambda t: t.ms)
            current[ki] = found[key] = best.schedule
    store_tuning(path, found)
    compiled.schedules["cuda"] = current
    compiled._modules.clear()
    return current


def tuning_candidates(alternatives: list, top: int, splits: int = 6) -> list:
    """The model's `top` best alternatives, then the best-ranked one of each other way of splitting the
    passes (split-K factors per loop group), the first `splits` of those in the model's order. The model
    is least sure of parallelism: on 512 rows of 262144 (H100, 2026-11-24) it ranked the one-pass
    variance's split-K 8 plan twelfth (149 µs predicted, 107 µs measured) behind plans without a split,
    of 4 rows per program (291 µs) or one (147 µs). Bounded: a program of five reductions has some
    forty split choices, and each timed plan is compiled and checked on the stress sets first."""
    picked = list(alternatives[:top])
    seen = {_splits(a) for a in picked}
    for a in alternatives[top:]:
        if len(picked) >= top + splits:
            break
        if _splits(a) not in seen:
            seen.add(_splits(a))
            picked.append(a)
    return picked


def _splits(alt) -> tuple[int, ...]:
    return tuple(split for _axis, _names, split in alt.plan.groups)


def stress_report(compiled, device: str):
    """`compiled`'s plan on every input set of neptune_eq.verify (normal, offset 50, scale 30) against
    float64, at its own shapes (sampled rows of a large program), each output held to its dtype's
    default tolerance."""
    from .numeric import compute_dtype
    from .verify import STRESS_SETS, verify

    program = compiled.program
    return verify(compiled.run, program, device=device, sets=tuple(STRESS_SETS), seed=0,
                  compute=compute_dtype(program), restrict=sample_rows(program))


def choose_plan(compiled, inputs: dict, *, candidates: int = 3, progress=True, rep_ms: int = 40,
                margin: float = 0.05, timer=None):
    """Time the cost model's `candidates` best alternatives and the best of each other split (default
    schedules; tuning_candidates) on the GPU and return the compiled program pinned to the fastest.
    The model ranks; a lower-ranked plan replaces a higher-ranked one only when it measures faster by
    more than `margin` (timings within one process on an H100 moved by several per cent, so a closer
    call is noise, and the tuning that follows the choice moves times by more than that).

    Before it is timed, each plan runs the stress sets (stress_report): one whose error exceeds the
    tolerance is never chosen while a plan within it exists. When every timed candidate fails, the
    other alternatives are checked in the model's order and the first that passes is taken; when none
    does, the model's choice stays and the log says so. `timer(launcher, inputs, rep_ms) -> ms`
    replaces do_bench's median (tests)."""
    log = _logger(progress)
    timer = timer or _median_ms
    device = next(iter(inputs.values())).device.type
    target = "cuda" if device == "cuda" else "interpreter"
    best, tried = None, set()
    order = tuning_candidates(compiled.alternatives, candidates)
    own = compiled.alternatives[compiled.choice]  # the incumbent (a dynamic bucket's range may hold another)
    for alt in [own, *(a for a in order if a is not own)]:
        p = compiled.pin(alt.id)
        tried.add(alt.id)
        try:
            report = stress_report(p, device)
            if not report.passed:
                log(f"  plan #{alt.id} {alt.structure} rejected: {report}")
                continue
            launcher = p.launcher(target)
            launcher(inputs)
            ms = timer(launcher, inputs, rep_ms)
        except Exception as e:  # a plan that does not compile on this GPU just loses
            log(f"  plan #{alt.id} failed: {repr(e)[:120]}")
            continue
        log(f"  plan #{alt.id} {alt.structure}: predicted {alt.cost.time * 1e6:.1f} µs, measured {ms * 1e3:.1f} µs")
        if best is None or ms < (1 - margin) * best[0]:
            best = (ms, p)
    if best is not None:
        return best[1]
    for alt in compiled.alternatives[:_STRESS_FALLBACK]:
        if alt.id in tried:
            continue
        p = compiled.pin(alt.id)
        try:
            if stress_report(p, device).passed:
                log(f"  plan #{alt.id} {alt.structure}: the first alternative within the tolerance on the stress sets")
                return p
        except Exception as e:
            log(f"  plan #{alt.id} failed: {repr(e)[:120]}")
    log(f"  no plan among the model's first {_STRESS_FALLBACK} passed the stress sets: keeping #{compiled.choice} "
        "(see prog.verify(sets=...) for its errors)")
    return compiled


_STRESS_FALLBACK = 16  # alternatives checked, in the model's order, when every timed candidate fails
