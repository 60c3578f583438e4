"""Memory traffic of one kernel (extract/cost.py prices it): how many bytes a tensor holds, which tiles
the programs running together touch, and the bytes read from HBM once L2 serves what they share."""

from __future__ import annotations

import math

from neptune_eq import ir
from neptune_eq.device import DeviceSpec
from neptune_eq.plan import KernelPlan, Plan
from neptune_eq.schedule import KernelSchedule, grouped_pair

_BYTES = ir.DTYPE_BYTES


def footprint(program: ir.Program, plan: Plan, tensor: str, axes, k: KernelPlan) -> float:
    if tensor in program.inputs:
        spec = program.inputs[tensor]
        return math.prod(program.axes[a] for a in spec.axes) * _BYTES[spec.dtype]
    if tensor in plan.buffers:
        buf = plan.buffers[tensor]
        n = 1.0
        for a in buf.axes:
            n *= k.chunks if a is ir.CHUNK else program.axes.get(a, 1)
        if ir.CHUNK in buf.axes and k.chunks == 1:
            n *= next((kk.chunks for kk in plan.kernels if kk.chunks > 1), 1)
        return n * _BYTES[buf.dtype]
    out = next((o for o in program.outputs if o.name == tensor), None)
    if out is not None:
        return math.prod(program.axes[a] for a in out.axes) * _BYTES.get(out.dtype or "float32", 4)
    return 0.0


def wave_extents(k: KernelPlan, sched: KernelSchedule, program: ir.Program, concurrent: int) -> dict[str, int]:
    """How many different tiles of each grid axis (and split-K chunks, key ir.CHUNK) the
    `concurrent` programs running together touch: programs are numbered chunk fastest, then the
    last grid axis, or a grouped pair innermost (groups of sched.group tiles of its first axis)."""
    ntiles = {a: math.ceil(program.axes[a] / sched.step(a)) for a in k.grid}
    out: dict = {ir.CHUNK: min(k.chunks, max(1, concurrent))}
    left = math.ceil(max(1, concurrent) / k.chunks)
    order = list(reversed(k.grid))
    pair = grouped_pair(k, sched)
    if pair is not None:
        m, n = pair
        if left >= ntiles[m] * ntiles[n]:  # the wave spans whole (m, n) planes
            out[m], out[n] = ntiles[m], ntiles[n]
        else:
            out[m] = min(ntiles[m], sched.group, left)
            out[n] = min(ntiles[n], math.ceil(left / out[m]))
        left = math.ceil(left / (ntiles[m] * ntiles[n]))
        order = [a for a in order if a not in pair]
    for a in order:
        out[a] = min(ntiles[a], left)
        left = math.ceil(left / ntiles[a])
    return out


def slice_bytes(t: str, program, plan, k: KernelPlan, sched: KernelSchedule) -> float:
    """Distinct bytes of tensor t one program reads: its tile of each grid axis, its chunk of a
    split loop axis, the whole extent of the others."""
    spec = program.inputs.get(t) or plan.buffers.get(t)
    if spec is None:
        return 0.0
    split = {p.axis: p.split for p in k.passes()}
    n = 1.0
    for a in spec.axes:
        if a in k.grid:
            n *= min(sched.step(a), program.axes[a])
        elif a != ir.CHUNK:  # (one chunk's state per program)
            n *= program.axes.get(a, 1) / split.get(a, 1)
    return n * _BYTES[spec.dtype]


def hbm_reads(loaded: dict[str, float], program, plan, k, sched, programs: int, concurrent: int,
               dev: DeviceSpec, iters: dict[str, float], written: float = 0.0,
               sectors: dict[str, float] | None = None, kept: frozenset[str] = frozenset()) -> float:
    """Bytes read from HBM. A program's repeated reads of its own slice of a tensor (a K-loop
    re-reading its rows for every column tile) hit L2 while the slices of the programs running
    together fit in it; each wave of concurrent programs then reads the distinct slices it touches
    once (a 2-D tiled GEMM reads A once per column group of tiles and B once per row group;
    grouping the program order shrinks both), and a tensor that fits in its share of L2 is read
    once in all. Past L2, re-reads miss in proportion. What the wave writes (`written` bytes a
    program) passes through L2 too and takes its share — unless the tensors a later pass reads again
    are `kept` (lower/eviction.py: loaded evict_last, the writes evict_first), when the writes stream
    past them."""
    waves = max(1.0, programs / concurrent)
    touched = wave_extents(k, sched, program, concurrent)
    split_axes = {p.axis for p in k.passes() if p.split > 1}
    per_wave: dict[str, float] = {}
    for t in loaded:
        spec = program.inputs.get(t) or plan.buffers.get(t)
        axes = set(spec.axes) if spec else set()
        slices = math.prod(touched[a] for a in k.grid if a in axes)
        if axes & split_axes:
            slices *= touched[ir.CHUNK]
        per_wave[t] = min(loaded[t], slice_bytes(t, program, plan, k, sched)) * slices
    # what must stay in L2 at once: a tensor streamed along a loop axis only its current tiles
    # (the programs of a wave move through the loop together), the others their whole slices
    # (a slice a program reads again, in a later pass or per K-loop, stays live whole)
    working = 0.0
    for t, b in per_wave.items():
        spec = program.inputs.get(t) or plan.buffers.get(t)
        streamed = [iters.get(a, 1.0) for a in (spec.axes if spec else ())]
        again = loaded[t] > 1.5 * slice_bytes(t, program, plan, k, sched)
        working += b if again else b / max(1.0, math.prod(streamed))
    if not kept:  # (kept tensors: the lowering writes evict_first past them)
        working += written * min(programs, concurrent)
    total = 0.0
    for t, per_program in loaded.items():
        # never more than the programs request (a gather reads only the rows it indexes)
        foot = min(footprint(program, plan, t, None, k), per_program * programs)
        if foot <= 0.5 * dev.l2_bytes / len(loaded):
            moved = foot  # stays in L2 for the whole kernel
        elif working <= 0.5 * dev.l2_bytes:
            moved = max(foot, per_wave[t] * waves)
        else:  # the wave's slices do not fit either: re-reads miss in proportion
            unique = max(foot, per_wave[t] * waves)
            moved = unique + max(0.0, per_program * programs - unique) * (1 - 0.5 * dev.l2_bytes / working)
        total += moved * (sectors or {}).get(t, 1.0)  # whole sectors for short strided runs
    return total


def l2_time(requested: float, bytes_loaded: float, ksteps: dict[str, int], sched: KernelSchedule,
            iters_total: float, active: int, dev: DeviceSpec) -> float:
    """Seconds for L2 to deliver every byte the programs load (HBM's share passes through it too). A
    K-loop, or a GEMM's pass over K tiles (a grouped 2-D schedule), keeps `num_stages − 1` K steps in
    flight per program (the software pipeline's prefetch); the programs running together then pull at
    most that per memory latency. H200, linear cross-entropy's K-loop kernel
    (bench/results/h200_2026-11-27/kloop_tiles.json): 64 rows × 256 × 64, 168 GB requested, 31.1 ms at
    2 stages (one 40 KB step in flight: 5.3 TB/s) and 17.4 at 3 (the 8.5 TB/s roof: 19.8); 128 rows,
    101 GB: 16.5 and 13.4 ms. Other kernels stream their loop tiles as the HBM term prices them (its
    latency model), under L2's rate alone."""
    if not (ksteps or sched.group > 1) or requested <= 0:
        return requested / dev.l2_read_bytes_per_s
    steps = max(1.0, iters_total) * math.prod(ksteps.values())
    step_bytes = bytes_loaded / steps
    per_program = max(step_bytes * max(1, sched.num_stages - 1) / dev.mem_latency_s, dev.sm_stream_bytes_per_s)
    return requested / min(dev.l2_read_bytes_per_s, active * per_program)
