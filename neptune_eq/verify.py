"""Verification: run a compiled plan on fresh random inputs and compare with float64.

Error is normwise, ‖out − ref‖ / ‖ref‖ over the entries where the float64 reference is finite
(NaN in the reference means the program is undefined there, e.g. 0/0; such entries refine to
anything). A kernel output that is not finite where the reference is, is an error of its own and
fails the verification whatever the tolerance.

Input sets (`sets=`): `normal` draws N(0, 1) inputs. The stress sets shift and stretch the values,
because algebra that is exact over the reals is not always stable in fp32: `offset` is 50 + N(0, 1),
`wide` is 30·N(0, 1). Every set that is run counts in the verdict (`VerifyReport.passed`), and each
set is held to the same tolerance: the random values are drawn in float64 and rounded to the input
dtype *before* the float64 reference sees them, so a stress set carries no extra rounding of its
own; measured on every example (fp32, fp16, bf16) the stress errors stay at the normal set's level.
A stress failure therefore means the program is unstable on such inputs (exp(x) overflowing where
the program never subtracts the max, E[x²] − E[x]² cancelling) — a real loss of accuracy, reported.

Default tolerance (what is guaranteed). Unless `tolerance=` is given, each output is held to a
tolerance derived from the dtypes it involves: its own dtype (as the run returns it) and the dtypes
of the inputs its expression reads (low-precision inputs can stay low precision inside a kernel,
e.g. as tl.dot operands). For each floating dtype d with unit roundoff u_d the bound is
ROUNDING_SAFETY · u_d (ROUNDING_SAFETY = 4: a value may be rounded to d a few times on its way to
the output — a low-precision dot operand, the output store — and the normwise error of one such
rounding is at most u_d). The generated kernels compute in float32 (loads are widened, reductions
accumulate in float32) unless the program reads or writes float64, which is computed in float64
(neptune_eq.numeric.compute_dtype); a float output of a float32-computed program is never held
tighter than COMPUTE_FLOOR["float32"] = 1e-3
≈ 2^14 · 2^-24: the worst-case error bound n·u of float32 accumulation over n = 2^14 terms, and
twice the relative error of the GPU's tanh.approx.f32 (2^-11). The reduction length is not used:
worst-case bounds n·u become uselessly loose for long axes while the observed errors grow like √n·u
and stay far below the floor. The tolerance is the largest of these bounds:

    dtype      unit roundoff u       default tolerance (normwise relative)
    float64    2^-53 ≈ 1.1e-16       1.8e-12 = 2^14·u (float64 programs are computed in float64)
    float32    2^-24 ≈ 6.0e-8        1e-3   (the float32 compute floor)
    float16    2^-11 ≈ 4.9e-4        1.95e-3 (4u)
    bfloat16   2^-8  ≈ 3.9e-3        1.56e-2 (4u)
    integer, bool outputs            0: exact (an integer result has no rounding to forgive)

A value the program itself rounds to a narrower dtype (`x.bfloat16().float()`: ops.py round_*) counts
as a dtype the output involves. Integer and bool inputs (gather indices, masks) are exact and do not
loosen anything. An explicit `tolerance=` overrides the default for every output and set. Observed
errors, for scale: fp32 ≤ 6e-6, fp16 ≤ 2.6e-4, bf16 ≤ 5.6e-3 over the examples (attention, softmax,
norms) on all three sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from . import ir, reference
from .ops import ROUNDINGS

STRESS_SETS = {
    "normal": {"scale": 1.0, "offset": 0.0},
    "offset": {"scale": 1.0, "offset": 50.0},
    "wide": {"scale": 30.0, "offset": 0.0},
}

UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
ROUNDING_SAFETY = 4.0  # roundings into a storage dtype a value may see on its way to the output
# What the arithmetic itself loses, by the dtype it is done in: 2^14·u (float32 additionally covers
# the GPU's approximate transcendentals, tanh.approx.f32 ≈ 2^-11 relative error).
COMPUTE_FLOOR = {"float32": 1e-3, "float64": 2.0**14 * 2.0**-53}


def dtype_name(dt: torch.dtype | str) -> str:
    """'bfloat16' for torch.bfloat16 (names pass through)."""
    return dt if isinstance(dt, str) else str(dt).removeprefix("torch.")


def default_tolerance(output: torch.dtype | str, inputs=(), *, compute: str = "float32") -> float:
    """The normwise tolerance for an output of dtype `output` whose value reads inputs of dtypes
    `inputs`, computed in `compute` (the generated kernels: float32). An integer or bool output is
    exact: 0. See the module docstring for the table and its derivation."""
    out = dtype_name(output)
    if out not in UNIT_ROUNDOFF:
        return 0.0
    if compute not in COMPUTE_FLOOR:
        raise ir.NeptuneError(f"verify: compute dtype must be one of {', '.join(COMPUTE_FLOOR)}, not {compute!r}")
    rounded = [d for d in (out, *map(dtype_name, inputs)) if d in UNIT_ROUNDOFF]
    return max(COMPUTE_FLOOR[compute], *(ROUNDING_SAFETY * UNIT_ROUNDOFF[d] for d in rounded))


@dataclass
class SetResult:
    """One input set: per output, the error, its tolerance and the count of non-finite outputs."""

    name: str
    rel_err: dict[str, float]
    nonfinite: dict[str, int]
    tolerance: dict[str, float] = field(default_factory=dict)

    @property
    def max_rel_err(self) -> float:
        return max(self.rel_err.values(), default=0.0)

    @property
    def ok_finite(self) -> bool:
        return not any(self.nonfinite.values())

    @property
    def passed(self) -> bool:
        """Every output finite where the reference is and within its tolerance (NaN error fails)."""
        return self.ok_finite and all(err <= self.tolerance.get(name, 0.0) for name, err in self.rel_err.items())

    def as_dict(self) -> dict:
        """JSON-ready: the set's verdict and worst error, and each output's error and tolerance."""
        return {"passed": self.passed, "max_rel_err": json_number(self.max_rel_err),
                "nonfinite": sum(self.nonfinite.values()),
                "outputs": {name: {"rel_err": json_number(err), "tolerance": self.tolerance.get(name, 0.0),
                                   "nonfinite": self.nonfinite.get(name, 0)}
                            for name, err in self.rel_err.items()}}


def json_number(x: float) -> float | str:
    """x, or "inf" / "nan" as a string: JSON has no such numbers."""
    return x if math.isfinite(x) else str(x)


@dataclass
class VerifyReport:
    sets: list[SetResult] = field(default_factory=list)
    tolerance: float | None = None  # the explicit override, if any (None: dtype-aware defaults)

    @property
    def max_rel_err(self) -> float:
        """The error on ordinary random inputs (the `normal` set)."""
        return next((s.max_rel_err for s in self.sets if s.name == "normal"), float("nan"))

    @property
    def worst(self) -> float:
        """The largest error over every set that was run."""
        return max((s.max_rel_err for s in self.sets), default=float("nan"))

    @property
    def passed(self) -> bool:
        """Every set that was run (normal and any stress sets) passed."""
        return bool(self.sets) and all(s.passed for s in self.sets)

    def as_dict(self) -> dict[str, dict]:
        return {s.name: s.as_dict() for s in self.sets}

    def __str__(self) -> str:
        rows = []
        for s in self.sets:
            bad = f", {sum(s.nonfinite.values())} non-finite outputs" if not s.ok_finite else ""
            failed = [name for name, err in s.rel_err.items()
                      if not err <= s.tolerance.get(name, 0.0) or s.nonfinite.get(name)]
            fail = f" — FAIL ({', '.join(failed)})" if failed else ""
            rows.append(f"{s.name}: max rel err {s.max_rel_err:.2e}{bad}{fail}")
        verdict = "PASS" if self.passed else "FAIL"
        return f"verification {verdict} (tolerance {self._tolerance_text()}): " + "; ".join(rows)

    def _tolerance_text(self) -> str:
        """'0.001', or per output ('s exact, y 0.0156') when the outputs' tolerances differ."""
        if self.tolerance is not None:
            return f"{self.tolerance:g}"
        tols = self.sets[0].tolerance if self.sets else {}
        if len(set(tols.values())) <= 1:
            return _tol_text(next(iter(tols.values()), 0.0))
        return ", ".join(f"{name} {_tol_text(t)}" for name, t in tols.items())


def _tol_text(t: float) -> str:
    return "exact" if t == 0 else f"{t:.3g}"


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


def restricted(t: torch.Tensor, axes, restrict: dict | None) -> torch.Tensor:
    """Output `t` (over `axes`) at the indices `restrict` keeps ({axis: indices}, tune.sample_rows)."""
    for a, idx in (restrict or {}).items():
        t = t.index_select(tuple(axes).index(a), idx.to(t.device))
    return t


def rounded_dtypes(expr: ir.Node) -> list[str]:
    """The dtypes `expr` rounds a value to (ops.py round_*, a narrowing the program makes): a value
    near a rounding boundary may land one unit of that dtype apart, in the kernel and in float64."""
    names = {op: dt for dt, op in ROUNDINGS.items()}
    return sorted({names[n.op] for n in ir.walk(expr) if isinstance(n, ir.Call) and n.op in names})


def _inputs_read(program: ir.Program) -> dict[str, list[str]]:
    """Per output, the program inputs its expression loads (their dtypes bound its accuracy)."""
    return {o.name: sorted({n.tensor for n in ir.walk(o.expr) if isinstance(n, ir.Load) and n.tensor in program.inputs})
            for o in program.outputs}


def verify(run, program: ir.Program, *, device="cpu", sets: tuple[str, ...] = ("normal",), seed: int | None = None,
           tolerance: float | None = None, dtypes: dict[str, str] | None = None,
           compute: str = "float32", restrict: dict | None = None) -> VerifyReport:
    """`run(inputs: dict) -> dict of outputs`; compares each requested input set against float64.

    tolerance: None (default) holds each output to default_tolerance of its dtypes — the dtype
    `run` returns it in and the dtypes of the inputs it reads (`dtypes=` overrides the program's
    input dtypes for the random inputs) — computed in `compute`; a number overrides that for all.
    Every set in `sets` counts in the verdict. `restrict` ({axis: indices}, tune.sample_rows) checks
    only those indices of an axis, whose float64 reference would be too large whole.
    """
    unknown = [s for s in sets if s not in STRESS_SETS]
    if unknown or not sets:
        raise ir.NeptuneError(f"verify: unknown input set(s) {unknown or '(none given)'}; "
                              f"known: {', '.join(STRESS_SETS)}")
    report = VerifyReport(tolerance=tolerance)
    reads = _inputs_read(program)
    gen_seed = seed if seed is not None else torch.seed() % (2**31)
    for k, name in enumerate(sets):
        params = STRESS_SETS[name]
        inputs = reference.random_inputs(program, seed=gen_seed + k, device=device, dtypes=dtypes, **params)
        outs = run(inputs)
        ref = reference.evaluate(program, {n: t.to(torch.float64) if t.is_floating_point() else t
                                           for n, t in inputs.items()}, restrict=restrict)
        errs, nonfin, tols = {}, {}, {}
        for out in program.outputs:
            got = restricted(outs[out.name], out.axes, restrict)
            want = ref[out.name]
            if not got.is_floating_point() and want.is_floating_point():  # (stored as torch converts:
                want = want != 0 if got.dtype == torch.bool else want.trunc()  # toward 0; a DSL int output)
            errs[out.name], nonfin[out.name] = rel_err(got, want)
            tols[out.name] = tolerance if tolerance is not None else default_tolerance(
                got.dtype, [inputs[n].dtype for n in reads[out.name]] + rounded_dtypes(out.expr), compute=compute)
        report.sets.append(SetResult(name, errs, nonfin, tols))
    return report
