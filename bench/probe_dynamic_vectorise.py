"""Probe: a dynamic length along the contiguous axis — is every masked access scalar?

A dynamic axis's length is a kernel argument Triton is told not to specialise (do_not_specialize), so
that one compile serves every length; its mask `offs < n` then proves no alignment, and loads and
stores masked along that axis are not vectorised. Session 70 found a chunked backward's map at
0.9 TB/s for it (2.6× faster with the chunk axis specialised: neptune_eq.program.Program.specialised).
This times row programs whose reduced, contiguous axis is dynamic: the static compile at the call's
length, the dynamic compile (one kernel for every length of its bucket), and the dynamic compile with
the length specialised (Triton compiles once per divisibility class of the length), each checked
against float64 first.

    python bench/probe_dynamic_vectorise.py [--rows 32768] [--lengths 5000 8192] [--bucket 8192]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from neptune_eq.frontend import capture
from neptune_eq.runtime import compile_ir


def row_softmax(x):
    return torch.softmax(x, -1)


def row_logsumexp(x):
    return torch.logsumexp(x.float(), -1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--lengths", type=int, nargs="+", default=[5000, 8192])
    ap.add_argument("--bucket", type=int, default=8192)
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        import triton.testing
    print({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__})
    for fn in (row_softmax, row_logsumexp):
        example = torch.randn(a.rows, a.bucket, device=device, dtype=torch.float16)
        base = capture(fn, example).program
        (axis,) = [n for n, e in base.axes.items() if e == a.bucket]
        dyn = base.with_dynamic({axis})
        for n in a.lengths:
            x = torch.randn(a.rows, n, device=device, dtype=torch.float16)
            want = fn(x.double())
            name = next(iter(base.inputs))
            for label, p in (("static", capture(fn, x).program), ("dynamic", dyn),
                             ("dynamic, length specialised", replace(dyn, specialised=frozenset({axis})))):
                cp = compile_ir(p)
                inputs = {name: x}
                got = next(iter(cp.run(inputs).values()))
                err = float((got.double() - want).norm() / want.norm())
                assert err < 1e-2, (fn.__name__, n, label, err)
                ms = triton.testing.do_bench(lambda cp=cp, inputs=inputs: cp.run(inputs)) if device == "cuda" else 0
                gbs = 2 * x.numel() * 2 / (ms * 1e-3) / 1e9 if ms else 0
                print(f"{fn.__name__} {a.rows}x{n} {label}: {ms * 1e3:.1f} us ({gbs:.0f} GB/s of the input twice), "
                      f"rel err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
