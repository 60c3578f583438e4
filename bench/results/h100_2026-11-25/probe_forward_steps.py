"""Attention forwards: the default schedule (rolling passes step 128 keys where three stages fit)
against the same schedule stepping 64 keys, in one process. The Neptune prefill operators at
L = 16384 are checked against float64 on 256 sampled rows; bench/beyond's attention programs against
SDPA (timed beside them). Run from the repository root on the GPU:
    python <this file> out.json causal_pf alibi_pf ...     # Neptune operators
    python <this file> out.json --beyond                   # bench/beyond's attention programs"""

import json
import sys
import time

import torch.nn.functional as F
import triton.testing as tt

sys.path.insert(0, "bench")
from beyond.programs import PROGRAMS
from beyond.programs import Case as BeyondCase
from cases import Case, reference, rel_err_rows

from neptune_eq.frontend import capture
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir


def bench(f) -> float:
    return tt.do_bench(f, warmup=10, rep=100, return_mode="median")


def a_b(label: str, fn, xs, check) -> dict:
    """Time the default and its 64-key variant; `check(out)` gives the output's error."""
    t = time.time()
    prog = capture(fn, *[x.cpu() for x in xs]).program
    comp = compile_ir(prog, Options())
    feed = {n: x.reshape(tuple(prog.axes[a] for a in prog.inputs[n].axes)) for n, x in zip(prog.inputs, xs)}
    row = {"case": label, "compile_s": time.time() - t, "plan": comp.alternative.structure}
    base = comp.alternative.schedules
    loop = [p.axis for p in comp.alternative.plan.kernels[0].passes()][-1]
    for name, scheds in (("default", base), ("j64", [base[0].with_tiles(**{loop: 64}), *base[1:]])):
        comp.schedules["cuda"] = scheds
        comp._modules.clear()
        out = comp.run(feed)["out0"]
        row[name] = {"tiles": [{a: v for a, v in s.tiles.items() if v > 1} for s in scheds],
                     "stages": scheds[0].num_stages, "err": check(out), "ms": bench(lambda: comp.run(feed))}
    row["default_over_j64"] = row["j64"]["ms"] / row["default"]["ms"]
    print(json.dumps(row), flush=True)
    return row


def neptune_op(op: str, L: int = 16384) -> dict:
    case = Case(op, L)
    xs = case.inputs("cuda")
    ref, rows = reference(case, capture(case.fn, *[x.cpu() for x in xs]), "cuda")
    return a_b(f"{op} L{L}", case.fn, xs, lambda out: rel_err_rows(out.reshape(xs[0].shape), ref, rows))


def beyond(name: str) -> dict:
    p = PROGRAMS[name]
    xs = BeyondCase(p, p.sizes[0]).inputs("cuda")
    if name == "bias_attention":
        q, k, v, bias = xs

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
    else:
        def sdpa():
            return F.scaled_dot_product_attention(*xs, is_causal=True, enable_gqa=True)
    ref = sdpa().float()
    row = a_b(f"beyond {name}", p.fn, xs,
              lambda out: ((out.float() - ref.reshape(out.shape)).norm() / ref.norm()).item())
    row["sdpa_ms"] = bench(sdpa)
    return row


def main() -> None:
    if sys.argv[2:] == ["--beyond"]:
        rows = [beyond(n) for n in ("causal_gqa", "causal_attention", "bias_attention")]
    else:
        rows = [neptune_op(op) for op in sys.argv[2:]]
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
