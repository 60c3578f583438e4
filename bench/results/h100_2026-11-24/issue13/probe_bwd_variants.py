"""Causal attention's derived backward (L = 16384, 32 heads, d 128, fp16) on the GPU: each kernel's
time, variants with a reciprocal in place of the per-element division by l, and tile / warp / stage
variants per kernel, checked against SDPA's gradients. A probe (session 27), not part of the suite:

    python probe_bwd_variants.py [L] [OUT.json]      (run from the repository root, bench/ on sys.path)
"""

import json
import math
import re
import sys
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
import triton
import triton.testing
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "bench")
from cases import Case

from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program
from neptune_eq.lower.launch import Launcher, load_module
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir

DIVISION = re.compile(r"\((d\d+) / (x\d+)\[(None, :|:, None)\]\)")


def log(*a):
    print(*a, flush=True)


def reciprocal(comp):
    """comp's kernels with x / l[row] written x * (1 / l)[row]."""
    src, ks = comp.lowered("cuda")
    mod = load_module(DIVISION.sub(lambda m: f"({m.group(1)} * (1.0 / {m.group(2)})[{m.group(3)}])", src))
    return Launcher(comp.program, comp.plan, ks, mod, None, None)


def main():
    L = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
    case = Case("causal_pf", L)
    q, k, v = case.inputs("cuda")
    D = q.shape[-1]
    t0 = time.time()
    back = backward_program(capture(case.fn, *[x.cpu() for x in (q, k, v)]).program, saved=True)
    comp = compile_ir(back.program, Options())
    log(f"compiled in {time.time() - t0:.0f} s: {comp.alternative.structure}")
    # the row statistics the forward saves, one head's L×L scores at a time
    qs, ks = q.reshape(-1, L, D), k.reshape(-1, L, D)
    m, l = torch.empty(qs.shape[0], L, device="cuda"), torch.empty(qs.shape[0], L, device="cuda")
    keep = torch.ones(L, L, dtype=torch.bool, device="cuda").tril()
    for h in range(qs.shape[0]):
        s = ((qs[h].float() @ ks[h].float().T) / math.sqrt(D)).masked_fill_(~keep, float("-inf"))
        m[h] = s.amax(-1)
        l[h] = torch.exp(s - m[h][:, None]).sum(-1)
        del s
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, is_causal=True)
    dO = torch.randn_like(o)
    o.backward(dO)
    shape = {n: tuple(back.program.axes[a] for a in spec.axes) for n, spec in back.program.inputs.items()}
    feed = {"q": q, "k": k, "v": v, "grad_out0": dO, "out0": o.detach(), "saved_0": m, "saved_1": l}
    feed = {n: t.reshape(shape[n]) for n, t in feed.items()}
    ref = {f"grad_{n}": x.grad.reshape(shape[n]) for n, x in zip("qkv", leaves)}

    def bench(run):
        return triton.testing.do_bench(lambda: run(feed), warmup=5, rep=60, return_mode="median")

    res = {"L": L, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "rows": []}

    def row(name, run):
        outs = run(feed)
        err = max(((outs[n].double() - r.double()).norm() / r.double().norm()).item() for n, r in ref.items())
        ms = bench(run)
        log(f"{name}: {ms:.2f} ms, rel err vs SDPA grads {err:.1e}")
        res["rows"].append({"name": name, "ms": ms, "err": err})

    def sdpa():
        return torch.autograd.grad(F.scaled_dot_product_attention(*leaves, is_causal=True), leaves, dO)

    log(f"sdpa fwd+bwd: {triton.testing.do_bench(sdpa, warmup=5, rep=60, return_mode='median'):.2f} ms")
    row("base", comp.run)
    row("reciprocal", reciprocal(comp))
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            comp.run(feed)
        torch.cuda.synchronize()
    for e in p.key_averages():
        if "nq_" in e.key:
            log(f"  kernel {e.key[:60]}: {e.device_time / 1e3:.2f} ms per call")
    base = list(comp.alternative.schedules)
    best = {}
    for ki, s in enumerate(base):
        for tiles in ({"i": 128, "j": 64}, {"i": 64, "j": 64}, {"i": 64, "j": 128}, {"i": 32, "j": 128},
                      {"i": 128, "j": 128}):
            for warps, stages in ((8, 2), (8, 3), (4, 2), (4, 3)):
                sc = list(base)
                sc[ki] = replace(s.with_tiles(**{a: t for a, t in tiles.items() if a in s.tiles}),
                                 num_warps=warps, num_stages=stages)
                comp.schedules["cuda"] = sc
                comp._modules.clear()
                name = f"k{ki} {sc[ki].tiles} w{warps} s{stages}"
                try:
                    ms = bench(comp.run)
                except Exception as e:  # (shared memory overflows are expected among these)
                    log(f"{name}: failed {str(e)[-300:]}")
                    continue
                log(f"{name}: {ms:.2f} ms")
                res["rows"].append({"name": name, "ms": ms})
                if ki not in best or ms < best[ki][0]:
                    best[ki] = (ms, sc[ki])
    comp.schedules["cuda"] = [best.get(i, (0, s))[1] for i, s in enumerate(base)]
    comp._modules.clear()
    row("best tiles", comp.run)
    row("best tiles + reciprocal", reciprocal(comp))
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
