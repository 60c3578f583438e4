"""On the GPU: a float32 K-loop over a long axis with few output tiles — linear attention's training,
Σᵢ φ(q)ᵢ,d/(zᵢ) · dOᵢ,e per (batch, head): 64 programs of 64 × 64, 4096 steps of i (1217.7 µs on the
H100 in session 76, priced 174). Every schedule of the space for that kernel (IEEE, TF32×3, the vendor's
SGEMM, tile shapes), the other kernels as chosen, each checked against the chosen plan's outputs and
timed beside its prediction.

    python bench/probe_ieee_kloop.py [--kernel k0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_eighth import linear_attention

from extract.cost import kernel_cost, priced_at
from neptune_eq.device import H100
from neptune_eq.frontend import capture
from neptune_eq.pipeline import Options
from neptune_eq.reference import random_inputs
from neptune_eq.runtime import compile_ir
from neptune_eq.schedule import plan_schedules
from neptune_eq.space import kernel_variants
from neptune_eq.training import _derive


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference over the largest value, where the chosen plan's value is finite (random
    statistics may overflow a 16-bit gradient; session 76's first runs compared NaNs)."""
    ok = want.isfinite()
    g, w = got.double()[ok], want.double()[ok]
    return float((g - w).abs().max() / w.abs().max().clamp_min(1e-30)) if ok.any() else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="k0")
    a = ap.parse_args()
    xs = [torch.randn(4, 16, 4096, 64, dtype=torch.float16) for _ in range(3)]
    c = capture(linear_attention, *xs)
    back = _derive(c.program, list(c.program.inputs)).saved.program
    base = compile_ir(back)
    plan, program = base.alternative.plan, base.program
    print(f"{program.name}: {base.alternative.structure}", flush=True)
    inputs = random_inputs(program, seed=0, device="cuda", scale=0.05)  # (fp16 gradients stay finite)
    want = base.run(inputs)
    at = priced_at(program)
    chosen = list(base.alternative.schedules)
    for ki, (k, default) in enumerate(zip(plan.kernels, plan_schedules(plan, program))):
        if k.name != a.kernel:
            continue
        for v in kernel_variants(k, plan, program, default, Options().float32_products):
            run = base.pin(0)
            run.schedules["cuda"] = [*chosen[:ki], v.schedule, *chosen[ki + 1:]]
            try:
                got = run.run(inputs)
                err = max(_rel(got[n], want[n]) for n in want)
                t = triton.testing.do_bench(lambda run=run: run.run(inputs), warmup=10, rep=100,
                                            return_mode="median")
            except Exception as e:  # (a schedule Triton refuses: said, the others still timed)
                print(f"   {k.name} {v.kind}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            cost = kernel_cost(plan, k, at, v.schedule, H100)
            print(f"   {k.name} {v.kind:52s} predicted {cost.time * 1e6:8.1f} us (kernel) measured {t * 1e3:8.1f} "
                  f"us (program) vs chosen {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
