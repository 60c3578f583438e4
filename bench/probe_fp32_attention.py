"""Probe (session 65): float32 attention, where the products run on the FMA pipe (IEEE, torch's default
float32 precision). Once float32 dots were priced there (extract/cost.py `_dot_precision`), the cost
model ranks writing the scores with the vendor's SGEMM against the one fused kernel nearly even
(examples/decode_attention.py's prefill, 1 × 32 heads × 4096², d 128: 7.50 against 7.68 ms predicted).
This times both, and the chosen plan of CLIP's forward, beside SDPA and eager, each checked first.

    python bench/probe_fp32_attention.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import triton
import triton.testing

from neptune_eq.runtime import compile_ir

ROOT = Path(__file__).resolve().parent.parent


def _example(name: str, attr: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, attr)


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    program = _example("decode_attention", "prefill")
    prog = compile_ir(program)
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = {n: torch.randn(*(program.axes[a] for a in s.axes), device="cuda", generator=g)
          for n, s in program.inputs.items()}
    q, k, v = xs["q"], xs["k"], xs["v"]
    scale = 1 / 32 ** 0.5  # (the example's own scale, written for its decode head dim of 32)
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) * scale, -1) @ v.double()
    fused = min((a for a in prog.alternatives if len(a.plan.kernels) == 1), key=lambda a: a.cost.time)
    impls = {f"chosen: {prog.alternative.structure[:60]}": (prog, prog.alternative.cost.time)}
    if fused.id != prog.alternative.id:
        impls["best one-kernel"] = (prog.pin(fused.id), fused.cost.time)
    for label, (p, predicted) in impls.items():
        f = lambda p=p: p.run(xs)["o"]  # noqa: E731
        err = float((f().double() - ref).norm() / ref.norm())
        ms = triton.testing.do_bench(f, warmup=5, rep=100, return_mode="median")
        print(f"{label:72s} {ms:8.3f} ms (predicted {predicted * 1e3:.3f})  rel err {err:.1e}", flush=True)
    for label, f in (("SDPA", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)),
                     ("eager", lambda: torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v)):
        err = float((f().double() - ref).norm() / ref.norm())
        ms = triton.testing.do_bench(f, warmup=5, rep=100, return_mode="median")
        print(f"{label:72s} {ms:8.3f} ms  rel err {err:.1e}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
