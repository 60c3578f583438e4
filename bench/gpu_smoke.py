"""First GPU contact: compile the examples at GPU sizes, check against float64, time beside SDPA.

Usage (on the GPU machine): python bench/gpu_smoke.py  → a table on stdout, JSON in $OUT if set.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

from neptune_eq import reference
from neptune_eq.runtime import compile_ir
from neptune_eq.verify import rel_err

ROOT = Path(__file__).resolve().parent.parent


def example(name, attr="program"):
    return runpy.run_path(str(ROOT / "examples" / f"{name}.py"))[attr]


def bench(fn, ms=200):
    return triton.testing.do_bench(fn, warmup=50, rep=ms, return_mode="median")


def attention_case(name, L, H=32, D=128, causal=False, decode=False):
    prog = example(name)
    ext = {"h": H, "d": D, "e": D, "i": 1 if decode else L, "j": L}
    prog = prog.with_extents(ext).with_dtypes({"q": "float16", "k": "float16", "v": "float16"}, "float16")
    return prog


def run_case(label, prog, sdpa_kwargs=None, alternatives=1):
    t0 = time.perf_counter()
    cp = compile_ir(prog)
    t_compile = time.perf_counter() - t0
    dev = "cuda"
    inputs = reference.random_inputs(prog, seed=0, device=dev)
    rows = []
    for alt in cp.alternatives[:alternatives]:
        p = cp.pin(alt.id)
        try:
            out = p.run(inputs)
            torch.cuda.synchronize()
            ref = reference.evaluate(prog, {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})
            err = max(rel_err(out[o.name], ref[o.name])[0] for o in prog.outputs)
            del ref
            ms = bench(lambda p=p: p.run(inputs))
            rows.append({"case": label, "alt": alt.id, "plan": alt.structure, "predicted_us": alt.cost.time * 1e6,
                         "measured_us": ms * 1e3, "rel_err": err})
        except Exception as e:  # keep going: report what failed
            traceback.print_exc()
            rows.append({"case": label, "alt": alt.id, "plan": alt.structure, "error": repr(e)[:300]})
    if sdpa_kwargs is not None:
        q, k, v = (inputs[n] for n in ("q", "k", "v"))
        ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, **sdpa_kwargs))
        rows.append({"case": label, "alt": "sdpa", "measured_us": ms * 1e3})
    for r in rows:
        r["compile_s"] = t_compile
    return rows


def main():
    torch.manual_seed(0)
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
    rows = []
    cases = [
        ("causal_pf L=4096", attention_case("causal_attention", 4096), {"is_causal": True}, 3),
        ("global_pf L=4096", attention_case("attention", 4096), {}, 2),
        ("decode L=32768", attention_case("decode_attention", 32768, decode=True), {}, 6),
        ("softmax 4096x8192", example("softmax").with_extents({"i": 4096, "j": 8192}), None, 3),
    ]
    for label, prog, sdpa, n_alt in cases:
        print(f"== {label}", flush=True)
        rows += run_case(label, prog, sdpa, n_alt)
        for r in rows[-(n_alt + (1 if sdpa is not None else 0)):]:
            print(json.dumps(r), flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "smoke.json").write_text(json.dumps(rows, indent=1))
    print("\ncase | alt | plan | predicted µs | measured µs | rel err")
    for r in rows:
        print(f"{r['case']} | {r['alt']} | {r.get('plan', '')[:60]} | {r.get('predicted_us', float('nan')):.1f} | "
              f"{r.get('measured_us', float('nan')):.1f} | {r.get('rel_err', r.get('error', ''))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
