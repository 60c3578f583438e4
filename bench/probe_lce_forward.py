"""Probe: linear cross-entropy forward (8192 tokens, 4096 -> 128256, bf16) per kernel, with and without
programmatic dependent launches, beside torch.compile. GPU only.

    python bench/probe_lce_forward.py
"""
import sys

import torch
import triton.testing as tt

sys.path.insert(0, "bench")
from beyond.programs import linear_ce
from host_profile import kernel_times

import neptune_eq
import neptune_eq.lower.launch as L

g = torch.Generator(device="cuda").manual_seed(0)
h = torch.randn(8192, 4096, generator=g, device="cuda").bfloat16()
W = (torch.randn(128256, 4096, generator=g, device="cuda") * 4096 ** -0.5).bfloat16()
t = torch.randint(0, 128256, (8192,), generator=g, device="cuda")
for pdl in (True, False):
    if not pdl:
        L._has_grid_dependency_control = lambda: False
    prog = neptune_eq.compile(linear_ce, h, W, t)
    prog(h, W, t)
    print("pdl", pdl, "do_bench ms", tt.do_bench(lambda prog=prog: prog(h, W, t), warmup=5, rep=100), flush=True)
    for name, us, n in kernel_times(lambda prog=prog: prog(h, W, t), reps=5)[:8]:
        print(f"   {us:10.1f} us x{n} {name[:90]}")
comp = torch.compile(lambda h, W, t: torch.nn.functional.cross_entropy(h @ W.T, t))
comp(h, W, t)
print("compile do_bench ms", tt.do_bench(lambda: comp(h, W, t), warmup=5, rep=100))
for name, us, n in kernel_times(lambda: comp(h, W, t), reps=5)[:6]:
    print(f"   {us:10.1f} us x{n} {name[:90]}")
