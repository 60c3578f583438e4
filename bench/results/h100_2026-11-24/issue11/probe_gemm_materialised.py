"""GPU probe: the materialised LayerNorm → matmul plan's GEMM under schedule variants (tma, warp
specialisation, tiles), beside torch.mm, one process."""
import json, os, sys
from dataclasses import replace
import torch, torch.nn.functional as F
import triton
import neptune_eq
from neptune_eq.frontend import capture

def ln(x, g, b, W):
    return F.layer_norm(x, (x.shape[-1],), g, b, eps=1e-6) @ W
M, K, N = 4096, 8192, 8192
dt = torch.bfloat16
torch.manual_seed(0)
x = torch.randn(M, K, dtype=dt, device="cuda"); g = torch.randn(K, dtype=dt, device="cuda")
b = torch.randn(K, dtype=dt, device="cuda"); W = torch.randn(K, N, dtype=dt, device="cuda") / 64
cf = capture(ln, x, g, b, W).compile()
prog = cf.compiled
ref = ln(x.double(), g.double(), b.double(), W.double())
inputs = cf.captured.inputs(x, g, b, W)
res = {}
def bench(label, fn):
    out = fn()
    err = float((out.double() - ref).norm() / ref.norm())
    ms = triton.testing.do_bench(fn, warmup=50, rep=300)
    res[label] = (ms * 1e3, err)
    print(label, f"{ms*1e3:.1f} us err {err:.2e}", flush=True)
a_ = x.clone(); b_ = W.clone()
bench("torch.mm", lambda: a_ @ b_)
bench("layer_norm+mm eager", lambda: ln(x, g, b, W))
print(prog.alternative.structure)
base = list(prog._schedules("cuda"))
print(base[-1])
variants = []
for tiles in ((128, 256, 64), (256, 128, 64), (128, 128, 64), (128, 256, 128)):
    for warps in (8,):
        for stages in (3, 4):
            for tma in (False, True):
                for ws in (False, True):
                    variants.append((tiles, warps, stages, tma, ws))
for tiles, warps, stages, tma, ws in variants:
    s = replace(base[-1].with_tiles(i=tiles[0], e=tiles[1], d=tiles[2]), num_warps=warps, num_stages=stages, tma=tma, warp_specialize=ws)
    p = prog.pin(prog.alternatives.index(prog.alternative))
    p.schedules["cuda"] = [*base[:-1], s]
    label = f"{tiles} w{warps} s{stages}{' tma' if tma else ''}{' ws' if ws else ''}"
    try:
        bench(label, lambda: p.run(inputs)[next(iter(p.program.outputs)).name] if False else p.run(inputs)["out0"])
    except Exception as e:
        print(label, "failed", str(e)[:200], flush=True)
        res[label] = str(e)[:200]
out = os.environ.get("OUT", ".")
json.dump(res, open(f"{out}/gemm_ws.json", "w"), indent=1)
