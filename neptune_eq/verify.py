"""Verification: run a compiled plan on fresh random inputs and compare with float64.

Error is normwise, ‖out − ref‖ / ‖ref‖ over the entries where the float64 reference is finite
(NaN in the reference means the program is undefined there, e.g. 0/0; such entries refine to
anything). A kernel output that is not finite where the reference is, is an error of its own.
Besides ordinary N(0, 1) inputs, stress sets shift and stretch the values (large offsets, wide
dynamic range) because algebra that is exact over the reals is not always stable in fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from . import ir, reference

STRESS_SETS = {
    "normal": {"scale": 1.0, "offset": 0.0},
    "offset": {"scale": 1.0, "offset": 50.0},
    "wide": {"scale": 30.0, "offset": 0.0},
}


@dataclass
class SetResult:
    name: str
    rel_err: dict[str, float]
    nonfinite: dict[str, int]

    @property
    def max_rel_err(self) -> float:
        return max(self.rel_err.values(), default=0.0)

    @property
    def ok_finite(self) -> bool:
        return not any(self.nonfinite.values())


@dataclass
class VerifyReport:
    sets: list[SetResult] = field(default_factory=list)
    tolerance: float = 1e-3

    @property
    def max_rel_err(self) -> float:
        """The error on ordinary random inputs (the `normal` set)."""
        return next((s.max_rel_err for s in self.sets if s.name == "normal"), float("nan"))

    @property
    def worst(self) -> float:
        return max((s.max_rel_err for s in self.sets), default=float("nan"))

    @property
    def passed(self) -> bool:
        normal = next((s for s in self.sets if s.name == "normal"), None)
        return normal is not None and normal.max_rel_err < self.tolerance and normal.ok_finite

    def __str__(self) -> str:
        rows = []
        for s in self.sets:
            bad = f", {sum(s.nonfinite.values())} non-finite outputs" if not s.ok_finite else ""
            rows.append(f"{s.name}: max rel err {s.max_rel_err:.2e}{bad}")
        verdict = "PASS" if self.passed else "FAIL"
        return f"verification {verdict} (tolerance {self.tolerance:g}): " + "; ".join(rows)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, int]:
    """(normwise relative error over finite reference entries, count of non-finite outputs there)."""
    out = out.detach().to(torch.float64).cpu()
    ref = ref.detach().to(torch.float64).cpu()
    finite = torch.isfinite(ref)
    same_inf = torch.isinf(ref) & (out == ref)
    bad = int((finite & ~torch.isfinite(out)).sum()) + int((torch.isinf(ref) & ~same_inf).sum())
    o, r = out[finite], ref[finite]
    o = torch.where(torch.isfinite(o), o, torch.zeros_like(o))
    denom = r.norm().item()
    num = (o - r).norm().item()
    if denom == 0.0:
        return (0.0 if num == 0.0 else math.inf), bad
    return num / denom, bad


def verify(run, program: ir.Program, *, device="cpu", sets: tuple[str, ...] = ("normal",), seed: int | None = None,
           tolerance: float = 1e-3, dtypes: dict[str, str] | None = None) -> VerifyReport:
    """`run(inputs: dict) -> dict of outputs`; compares each requested input set against float64."""
    report = VerifyReport(tolerance=tolerance)
    gen_seed = seed if seed is not None else torch.seed() % (2**31)
    for k, name in enumerate(sets):
        params = STRESS_SETS[name]
        inputs = reference.random_inputs(program, seed=gen_seed + k, device=device, dtypes=dtypes, **params)
        outs = run(inputs)
        ref = reference.evaluate(program, {n: t.to(torch.float64) if t.is_floating_point() else t
                                           for n, t in inputs.items()})
        errs, nonfin = {}, {}
        for out in program.outputs:
            errs[out.name], nonfin[out.name] = rel_err(outs[out.name], ref[out.name])
        report.sets.append(SetResult(name, errs, nonfin))
    return report
