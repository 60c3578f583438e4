"""The float64 check every implementation passes before it is timed, and the timing itself.

The reference is the program's function (or its cast-free `reference_fn`) evaluated in float64 on
the case's own inputs — not neptune_eq's capture of it, so a wrong capture cannot hide. Where the
program allows it (`Program.check`), only a seeded sample of output rows is computed and compared:
the float64 scores of a full attention or the logits of a full vocabulary would not fit.
The error is normwise, ‖out − ref‖ / ‖ref‖ over the checked rows; a non-finite output where the
reference is finite fails (error inf).
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
from cases import TOLERANCE  # bench/cases.py (bench/ is on the path: __init__.py)

from neptune_eq.verify import default_tolerance, rel_err

from .programs import Case

Timer = Callable[[Callable[[], object]], float]  # milliseconds


@dataclass(frozen=True)
class Reference:
    value: torch.Tensor  # float64, on the checked rows
    rows: torch.Tensor | None  # the checked indices along the output's dimension 0 (None: all)

    def error(self, out: torch.Tensor) -> float:
        if self.rows is not None:
            out = out.index_select(0, self.rows.to(out.device))
        err, nonfinite = rel_err(out, self.value)
        return math.inf if nonfinite else err


def sample_rows(extent: int, count: int, seed: int = 1234) -> torch.Tensor | None:
    """`count` sorted indices below `extent` (None: every index, when there are no more than count)."""
    if extent <= count:
        return None
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randperm(extent, generator=g)[:count].sort().values


def reference(case: Case, xs: tuple) -> Reference:
    p = case.program
    rows = None
    if p.check is not None:
        extent = next(x.shape[d] for x, d in zip(xs, p.check.input_dims) if d is not None)
        rows = sample_rows(extent, p.check.count)
    args = []
    for i, x in enumerate(xs):
        dim = p.check.input_dims[i] if p.check is not None else None
        if rows is not None and dim is not None:
            x = x.index_select(dim, rows.to(x.device))
        args.append(x.to(torch.float64) if x.is_floating_point() else x)
    with torch.no_grad():
        value = (p.reference_fn or p.fn)(*args)
    return Reference(value, rows)


def tolerance(case: Case, impl: str) -> float:
    """neptune_eq: the library's own default for the program's dtype (verify.default_tolerance:
    1.95e-3 for fp16, 1.56e-2 for bf16); a peer: that, and never below bench's peer tolerance."""
    ours = default_tolerance(case.program.dtype, (case.program.dtype,))
    return ours if impl == "neptune_eq" else max(ours, TOLERANCE["peer"])


def checked_time(thunk: Callable[[], torch.Tensor], ref: Reference, tol: float, measure: Timer, *,
                 verbose: bool = False) -> dict:
    """{"rel_err", "ms"} when the thunk's output passes the float64 check, else {"rel_err", "error"}
    (a failed check is recorded and not timed); an exception is recorded as the error."""
    entry: dict = {}
    try:
        with torch.no_grad():
            err = ref.error(thunk())
            entry["rel_err"] = err
            entry["tolerance"] = tol
            if not err <= tol:
                entry["error"] = f"failed the float64 check: rel err {err:.2e} > {tol:g}"
                return entry
            entry["ms"] = measure(thunk)
    except Exception as e:
        entry["error"] = describe(e)
        if verbose:
            traceback.print_exc()
    return entry


def describe(e: BaseException, limit: int = 200) -> str:
    """'Type: first line of the message' (cut to `limit` characters)."""
    lines = str(e).splitlines()
    return f"{type(e).__name__}: {lines[0][:limit] if lines else ''}"
