"""The benchmark cases: the ten Neptune operators at the sizes of the issue, their inputs, their
work (useful FLOPs, bytes) and a float64 reference.

Useful TF/s counts 4·head_dim FLOPs per head per unmasked (query, key) pair; decode is also
reported in GB/s of Q + K + V + O. The reference is the operator's own program (captured from
the plain PyTorch function) evaluated in float64 — on every query row up to 4096 rows, on a fixed
random sample of 256 rows beyond (the full float64 score matrix of L = 16384 would not fit).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import neptune_ops  # noqa: E402

PF_SIZES = (1024, 4096, 16384)
DC_SIZES = (4096, 16384, 32768)
HEADS = neptune_ops.HEADS  # (query heads, kv heads) per operator, in the paper's order
WINDOW = 4096
# the float64 check an implementation must pass before it is timed (normwise relative error)
TOLERANCE = {"neptune_eq": 2e-3, "peer": 1e-2}


@dataclass
class Case:
    op: str
    L: int
    head_dim: int = 128
    dtype: torch.dtype = torch.float16
    batch: int = 1
    heads: tuple[int, int] | None = None
    _inputs: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        return self.op.rsplit("_", 1)[1]

    @property
    def label(self) -> str:
        return f"{self.op} L={self.L}"

    @property
    def hq_hkv(self) -> tuple[int, int]:
        return self.heads or HEADS[self.op]

    @property
    def fn(self):
        return getattr(neptune_ops, self.op)

    def inputs(self, device: str = "cuda", seed: int = 0) -> tuple[torch.Tensor, ...]:
        if self._inputs is None or self._inputs[0].device.type != torch.device(device).type:
            self._inputs = neptune_ops.example_inputs(self.op, self.L, dtype=self.dtype, device=device,
                                                      batch=self.batch, head_dim=self.head_dim,
                                                      heads=self.hq_hkv, seed=seed)
        return self._inputs

    def pairs(self) -> int:
        """Unmasked (query, key) pairs per head."""
        L = self.L
        if self.kind == "dc":
            return L
        if self.op == "global_pf":
            return L * L
        if self.op == "window_pf":
            return sum(min(i + 1, WINDOW) for i in range(L))
        return L * (L + 1) // 2

    def useful_flops(self) -> float:
        return 4.0 * self.hq_hkv[0] * self.batch * self.head_dim * self.pairs()

    def io_bytes(self) -> float:
        hq, hkv = self.hq_hkv
        lq = 1 if self.kind == "dc" else self.L
        el = torch.finfo(self.dtype).bits // 8
        return el * self.batch * self.head_dim * (2 * hq * lq + 2 * hkv * self.L)


def all_cases(ops=None, sizes=None) -> list[Case]:
    out = []
    for op in HEADS:
        if ops and op not in ops:
            continue
        for L in (DC_SIZES if op.endswith("_dc") else PF_SIZES):
            if sizes and L not in sizes:
                continue
            out.append(Case(op, L))
    return out


def warm_in_parallel(script: str, ops, lengths) -> None:
    """Run `script --one OP L` for every (operator, length) in its own process at once (compiling is
    single-threaded Python; the compile cache on disk then holds every plan), reporting each end."""
    import subprocess
    import time

    t0 = time.time()
    procs = {(op, L): subprocess.Popen([sys.executable, script, "--ops", op, "--L", str(L), "--one", op, str(L)])
             for op in ops for L in lengths}
    for key, p in procs.items():
        p.wait()
        print(f"warm {key}: rc {p.returncode} at {time.time() - t0:.0f} s", flush=True)


def reference_rows(case: Case, device) -> torch.Tensor | None:
    """Query rows the float64 check looks at (None: all of them)."""
    if case.kind == "dc" or case.L <= 4096:
        return None
    g = torch.Generator(device="cpu").manual_seed(1234)
    return torch.randperm(case.L, generator=g)[:256].sort().values.to(device)


def reference(case: Case, captured, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(float64 output on the checked rows, the rows) from the operator's captured program."""
    from neptune_eq.reference import evaluate

    rows = reference_rows(case, device)
    restrict = {} if rows is None else {captured.program.inputs["q"].axes[-2]: rows}
    # evaluate() itself widens the inputs to float64
    ref = evaluate(captured.program, captured.inputs(*case.inputs(device)), restrict=restrict)["out0"]
    b, hq = case.batch, case.hq_hkv[0]
    return ref.reshape(b, hq, -1, case.head_dim), rows


def rel_err_rows(out: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor | None) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 on the checked query rows (dim 2 of [B, H, L, D]); inf when any
    output there is not finite."""
    from neptune_eq.verify import rel_err

    err, nonfinite = rel_err(out if rows is None else out.index_select(2, rows), ref)
    return math.inf if nonfinite else err


def record(rows: list, row: dict, out: str | None, meta: dict) -> None:
    """Append a bench row, print it, and rewrite the results file (a crash later keeps what ran)."""
    import json

    rows.append(row)
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


def saved_backward(fn, *inputs):
    """(backward program, its compiled plans) of `fn`'s saved backward (what the forward saves, read by
    the backward: the log-sum-exp of attention), captured on `inputs` (CPU tensors)."""
    from neptune_eq.frontend import capture
    from neptune_eq.grad import backward_program
    from neptune_eq.pipeline import Options
    from neptune_eq.runtime import compile_ir

    back = backward_program(capture(fn, *inputs).program, saved=True).program
    return back, compile_ir(back, Options())
