"""Lowering a kernel plan to Triton source: one @triton.jit function per kernel.

Nothing here knows what a program computes: tiles come from the schedule, loops from the plan's
passes, state updates from the components (body, mask, correction), masks and loop bounds from
the programs' own predicates. Each value is a block whose dimensions are named by axes; ops
broadcast by axis name; a sum over an axis of a product whose factors split into [m, k] and
[k, n] blocks becomes tl.dot with fp32 accumulation.
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from ..masks import affine_part
from ..plan import Combine, KernelPlan, Plan
from ..schedule import KernelSchedule, grouped_pair
from .combine import _combine_phase
from .eviction import pass_hints
from .exact import exact_kernels
from .kernel import KernelWriter
from .library import library_kernel
from .mathlib import math_helpers
from .passes import _PassWriter
from .values import (
    KernelSource,
    _ident,
)

# ---------------------------------------------------------------- kernels and modules


def _work_grows_with(k: KernelPlan) -> set[str]:
    """Grid axes along which the masked loop ranges grow (causal: the key range grows with the query)."""
    out: set[str] = set()
    for ps in k.passes():
        for c in ps.comps:
            cons = affine_part(c.mask) if c.mask is not None else None
            for a in cons or ():
                cj = a.coefficient(ps.axis)
                for x, v in a.coef:
                    if x != ps.axis and cj > 0 and v < 0:  # j <= x + ...: the upper bound grows with x
                        out.add(x)
    return out


def write_kernel(plan: Plan, k: KernelPlan, program: ir.Program, sched: KernelSchedule, target: str,
                 fn_name: str) -> KernelSource:
    w = KernelWriter(plan, k, program, sched, target)
    grid = [(a, sched.tiles.get(a, 1)) for a in k.grid]
    for a, tile in grid:
        if a in w.inner and min(tile, sched.step(a)) < program.axes[a]:
            # an inline reduction over a grid axis (Σ_i x[i, d]·rsqrt(Σ_d x[i, d]²) into [d]) sums the
            # axis where the program's tile holds it: only one program holding it whole sums all of it
            raise ir.NeptuneError(f"kernel {k.name}: the inline reduction over {a} needs the axis whole in one "
                               f"program; the schedule tiles it {sched.step(a)} a program (internal: no kernel "
                               "is written that would sum part of it)")
    w.emit("pid = tl.program_id(0)")
    if k.chunks > 1:
        w.emit("pid_chunk = pid % CHUNKS")
        w.emit("pid = pid // CHUNKS")
    heavy_last = _work_grows_with(k)
    pair = grouped_pair(k, sched, heavy_last)
    if pair is not None:  # the grouped pair varies fastest, in groups of `group` tiles of the first
        (a_m, a_n), g = pair, sched.group
        nm, nn = (f"((n_{_ident(a)} + {sched.step(a)} - 1) // {sched.step(a)})" for a in pair)
        w.extent(a_m), w.extent(a_n)
        w.emit(f"pid_mn = pid % ({nm} * {nn})")
        w.emit(f"pid = pid // ({nm} * {nn})")
        w.emit(f"first_m = (pid_mn // ({g} * {nn})) * {g}")
        w.emit(f"size_m = tl.minimum({nm} - first_m, {g})")
        w.emit(f"t_{_ident(a_m)} = first_m + (pid_mn % ({g} * {nn})) % size_m")
        w.emit(f"t_{_ident(a_n)} = (pid_mn % ({g} * {nn})) // size_m")
    for a, tile in reversed(grid):
        ia = _ident(a)
        n = w.extent(a)
        step = sched.step(a)
        ntiles = f"(({n} + {step} - 1) // {step})"
        if pair is not None and a in pair:
            pass
        elif a in heavy_last:  # the programs with the most loop tiles start first: a shorter tail
            w.emit(f"t_{ia} = {ntiles} - 1 - pid % {ntiles}")
        else:
            w.emit(f"t_{ia} = pid % {ntiles}")
        if sched.wide_index:  # t·step + tile may pass 2^31 on an axis that long
            w.emit(f"t_{ia} = t_{ia}.to(tl.int64)")
        if pair is None or a not in pair:
            w.emit(f"pid = pid // {ntiles}")
        if tile > 1:
            w.emit(f"offs_{ia} = t_{ia} * {step} + tl.arange(0, BLOCK_{ia})")
            w.vector[a] = f"offs_{ia}"
            w.starts[a] = f"t_{ia} * {step}"
            if step < tile:  # a padded tile: rows past the step belong to the next program
                w.row_masks[a] = f"((tl.arange(0, BLOCK_{ia}) < {step}) & (offs_{ia} < {n}))"
            w.tail_masks[a] = not w.tiled_exactly(a, tile) or step < tile  # no mask where tiles divide a known length
        else:
            w.scalar[a] = f"t_{ia}"
    for a in sorted(w.inner - w.kloops):
        if a not in w.vector:
            ia = _ident(a)
            w.emit(f"offs_{ia} = tl.arange(0, BLOCK_{ia})")
            w.vector[a] = f"offs_{ia}"
            w.starts[a] = "0"
            w.tail_masks[a] = not w.one_tile(a, sched.tiles.get(a))
    w.hoist_lines, w.hoist_depth = w.lines, w.depth
    hints = pass_hints(k, plan, sched)
    for i, ph in enumerate(k.phases):
        if isinstance(ph, Combine):
            _combine_phase(w, ph)
        else:
            w.hints, w.hint_axis = hints.get(i, {}), ph.axis
            _PassWriter(w, ph).run()
            w.hints = {}
    for st in k.epilogue:
        w.store(st)
    # signature
    # strides and extents are compile-time constants: a program is compiled per shape anyway, the
    # compiler folds the index arithmetic, and a launch passes only pointers (see lower/launch.py).
    # A dynamic axis's length is an argument, never specialised on (one compile serves every length),
    # and so are the strides of a tensor that has one (Triton specialises those on 1 and on 16 | s)
    dyn = program.dynamic
    params = []
    for t in w.tensors.values():
        params.append(f"{_ident(t.name)}_ptr")
        const = "" if dyn & set(t.axes) else ": tl.constexpr"
        params += [f"{_ident(t.name)}_s{i}{const}" for i in range(len(t.axes))]
    params += [f"n_{_ident(a)}" + ("" if a in dyn else ": tl.constexpr") for a in w.extents]
    bound_strides = [f"db{n}_s{m}" for n, db in enumerate(w.data_bounds) for m in range(len(db.grid))]
    for n, db in enumerate(w.data_bounds):  # per-call loop bounds (lower/databounds.py)
        params += [f"db{n}_ptr", *(f"db{n}_s{m}" for m in range(len(db.grid)))]
    consts = {}
    for a, tile in sched.tiles.items():
        consts[f"BLOCK_{_ident(a)}"] = tile
    if k.chunks > 1 or any(isinstance(ph, Combine) for ph in k.phases):
        chunks = k.chunks if k.chunks > 1 else next(ph.chunks for ph in k.phases if isinstance(ph, Combine))
        consts["CHUNKS"] = chunks
    else:
        chunks = 1
    params += [f"{c}: tl.constexpr" for c in consts]
    # (a length Triton would specialise on its divisibility compiles again for another; a specialised
    # axis's may: program.specialised)
    free = [f"n_{_ident(a)}" for a in w.extents if a in dyn and a not in program.specialised] + bound_strides
    jit = f"@triton.jit(do_not_specialize={free!r})" if free else "@triton.jit"
    header = f"{jit}\ndef {fn_name}({', '.join(params)}):\n"
    src = header + "\n".join(w.lines) + "\n"
    return KernelSource(fn_name, src, list(w.tensors.values()), list(w.extents),
                        [(a, sched.step(a)) for a, _ in grid], k.chunks, consts, sched, dict(w.descriptors),
                        frozenset(w.buffers_read), frozenset(w.buffers_written), data_bounds=tuple(w.data_bounds),
                        exact_arith=w.exact_arith)


def _dependent_launches(kernels: list[KernelSource]) -> list[KernelSource]:
    """A kernel that reads what the kernel just before it wrote (split-K's combine reading the chunk
    states) is launched as a programmatic dependent launch: its programs are scheduled while the
    writer's last programs finish, and its first instruction, gdc_wait, waits for the writer to
    complete and its stores to be visible. The writer signals early (gdc_launch_dependents at its
    start: every one of its programs is then already running, so the waiting ones take no place it
    needs). A decode step saves the launch gap between its two kernels. Both calls sit under the
    constexpr USE_PDL, which the launcher sets where the GPU has grid dependency control (Hopper
    and later; elsewhere the kernels compile without them and launch plainly)."""
    out = list(kernels)
    for i in range(1, len(out)):
        prev, ks = out[i - 1], out[i]
        if not ks.buffers_read & prev.buffers_written or prev.library or ks.library:
            continue
        out[i - 1] = _with_first_line(prev, "tl.extra.cuda.gdc_launch_dependents()")
        out[i] = replace(_with_first_line(ks, "tl.extra.cuda.gdc_wait()"), pdl=True)
    return out


def pdl_supported() -> bool:
    """Does this Triton launch kernels as programmatic dependent launches (launch_pdl) and have
    the grid-dependency intrinsics?"""
    try:
        import dataclasses

        import triton.language.extra.cuda as cuda
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    names = {f.name for f in dataclasses.fields(CUDAOptions)}
    return "launch_pdl" in names and hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


def _with_first_line(ks: KernelSource, line: str) -> KernelSource:
    """`ks` with `if USE_PDL: line` as the first statement of its body (and USE_PDL a parameter)."""
    head, body = ks.source.split("):\n", 1)
    if "USE_PDL" not in ks.constexprs:
        head += ", USE_PDL: tl.constexpr"
    return replace(ks, source=f"{head}):\n    if USE_PDL:\n        {line}\n{body}",
                   constexprs={**ks.constexprs, "USE_PDL": True})


PRELUDE = '''import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))
POS_INF = tl.constexpr(float("inf"))


@triton.jit
def _nan():
    # NaN as a value: a NaN global constexpr never equals itself, and Triton refuses to relaunch a
    # kernel whose globals "changed since it was compiled"
    return tl.full([], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _nan_max(a, b):
    # max/min reductions propagate NaN, like torch's amax/amin (tl.max drops it)
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nan_min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
'''

INTERPRETER_HELPERS = '''

@triton.jit
def _rne_bf16(x):
    # x rounded to bfloat16's precision to nearest, ties to even (what the GPU's conversion does;
    # Triton's interpreter truncates), still fp32: converting it to bfloat16 is then exact. A float64
    # program's value goes through float32 first, as torch converts a double to bfloat16
    x = x.to(tl.float32)
    u = x.to(tl.uint32, bitcast=True)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, r)


@triton.jit
def _nan_amax(x, axis: tl.constexpr):
    # tl.reduce runs its combine function element by element in the interpreter (the NaN-propagating
    # max of a decode kernel's 1M scores: 47 of a test's 56 s); the same result from vectorised reductions
    return tl.where(tl.sum((x != x).to(tl.int32), axis) > 0, _nan(), tl.max(x, axis))


@triton.jit
def _nan_amin(x, axis: tl.constexpr):
    return tl.where(tl.sum((x != x).to(tl.int32), axis) > 0, _nan(), tl.min(x, axis))
'''

# log(1 + x) accurate for small x (Goldberg): u = 1 + x rounded; log(u)·x/(u − 1) corrects the rounding
# of u, and x itself where u rounds to 1. Written in the kernel, not in the IR, so no rewrite folds
# (u − 1) back to x. Exact at x = −1 (−inf), x = inf, and NaN in, NaN out.
LOG1P = '''

@triton.jit
def _log1p(x):
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.where(u == POS_INF, u, tl.log(u) * (x / (u - 1.0))))
'''

# exp(x) − 1 accurate for small x (Kahan): u = eˣ rounded; (u − 1)·x/log(u) corrects the rounding of u,
# and x itself where u rounds to 1. Exact at x = −inf (−1), +inf, and NaN in, NaN out.
EXPM1 = '''

@triton.jit
def _expm1(x):
    u = tl.exp(x)
    return tl.where(u == 1.0, x, tl.where(u - 1.0 == -1.0, -1.0,
                                          tl.where(u == POS_INF, u, (u - 1.0) * (x / tl.log(u)))))
'''

TANH_CUDA = '''

@triton.jit
def _tanh(x):
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)
'''

# exp2 of fp32 as PTX's ex2.approx.ftz.f32 in inline assembly: the instruction Triton 3.6's tl.exp2 ends in
# (libdevice's exp2f under flush-to-zero), but opaque to LLVM, which otherwise moves the ex2s among the
# warp-group MMAs of a masked loop; ptxas then serialises every wgmma of the kernel (its advisory C7515:
# "non wgmma instructions defining accumulator registers ... between start and end of the pipeline
# stage"), as it did in the causal forward and both backward kernels. H100, causal attention's dK/dV
# kernel at L = 16384: 9.6-10.0 ms with tl.exp2, 8.2-8.5 with this (bench/probe_dq_edits.py --kernel dkdv)
EXP2_CUDA = '''

@triton.jit
def _exp2(x):
    if x.dtype == tl.float32:
        y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)
    else:
        y = tl.exp2(x)
    return y
'''

EXP2_PORTABLE = '''

@triton.jit
def _exp2(x):
    return tl.exp2(x)
'''

TANH_PORTABLE = '''

@triton.jit
def _tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1), exact at ±inf and accurate to fp32 rounding elsewhere
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
'''


def write_module(plan: Plan, program: ir.Program, schedules: list[KernelSchedule], target: str,
                 prefix: str) -> tuple[str, list[KernelSource]]:
    kernels = [library_kernel(plan, k, program, s, f"{prefix}_{k.name}") if s.library
               else write_kernel(plan, k, program, s, target, f"{prefix}_{k.name}")
               for k, s in zip(plan.kernels, schedules)]
    exact = exact_kernels(plan)  # (meeting a compared min: no FMA contraction, lower/exact.py)
    kernels = [replace(ks, exact_arith=True) if k.name in exact and not ks.library else ks
               for k, ks in zip(plan.kernels, kernels)]
    if target == "cuda" and pdl_supported():
        kernels = _dependent_launches(kernels)
    fast = target == "cuda" and any(s.fast_math for s in schedules)
    src = PRELUDE + (TANH_CUDA if fast else TANH_PORTABLE) + (EXP2_CUDA if target == "cuda" else EXP2_PORTABLE)
    src += LOG1P if any("_log1p(" in ks.source for ks in kernels) else ""
    src += EXPM1 if any("_expm1(" in ks.source for ks in kernels) else ""
    src += "" if target == "cuda" else INTERPRETER_HELPERS
    src += math_helpers([ks.source for ks in kernels], target)
    for ks in kernels:
        src += "\n\n" + ks.source
    return src, kernels

