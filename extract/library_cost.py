"""The price of a plain matrix product run by the vendor's GEMM (neptune_eq/lower/library.py)."""

from __future__ import annotations

import math

from neptune_eq import ir
from neptune_eq.device import DeviceSpec
from neptune_eq.lower.library import library_gemm
from neptune_eq.plan import KernelPlan, Plan
from neptune_eq.schedule import KernelSchedule

from .prices import KernelCost
from .traffic import footprint


def library_cost(plan: Plan, k: KernelPlan, program: ir.Program, sched: KernelSchedule,
                  dev: DeviceSpec) -> KernelCost:
    """A plain matrix product run by the vendor's GEMM (lower/library.py): its products at the rate
    dev.tensor_flops was measured at (torch.mm; float32 at the SGEMM's share of the FMA pipe: torch's
    default IEEE precision), in waves of output tiles as large as the schedule's, each operand read once
    and the output written once, and the host time of a torch.matmul call beyond a bound Triton launch."""
    g = library_gemm(k, plan, program)
    flops = 2.0 * math.prod(program.axes[a] for a in g.out_axes) * program.axes[g.k]
    tiles = 1
    for a in g.out_axes:
        tiles *= math.ceil(program.axes[a] / max(1, sched.tiles.get(a, 1)))
    fill = tiles / (math.ceil(tiles / dev.sms) * dev.sms)
    hbm = sum(footprint(program, plan, t, (), k) for t in (g.a, g.b, g.out))
    rate = dev.tensor_flops if g.dtype != "float32" else 2.0 * dev.fma_per_s * dev.sgemm_efficiency  # (SGEMM)
    t_mem, t_tc = hbm / dev.hbm_bytes_per_s, flops / rate / fill
    work = max(t_mem, t_tc) + dev.overlap * min(t_mem, t_tc)
    time = work + dev.launch_s + dev.library_call_s
    return KernelCost(k.name, tiles, 1.0, hbm, hbm, flops, 0.0, 0.0, t_mem, t_tc, 0.0, 0.0, fill, t_mem, time,
                      work=work)
