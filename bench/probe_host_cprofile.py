"""cProfile of a bench/sweep_unseen.py row's fwd+bwd step (50 steps, each synchronised): where the host
time of a training step goes. GPU only.

    python bench/probe_host_cprofile.py "rope_gqa fwd+bwd" "gqa_causal fwd+bwd"
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep_unseen as S

import neptune_eq


def main() -> None:
    for want in sys.argv[1:]:
        row = next(r for r in S.ROWS if r.name.startswith(want))
        g = torch.Generator(device="cuda").manual_seed(0)
        xs = row.make("cuda", g, False)
        prog = neptune_eq.compile(row.fn, *xs)

        def step(prog=prog, xs=xs, buffers=row.buffers):
            leaves = tuple(x.detach().requires_grad_(x.is_floating_point() and k not in buffers)
                           for k, x in enumerate(xs))
            out = prog(*leaves)
            out.backward(torch.ones_like(out))

        for _ in range(5):
            step()
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(50):
            step()
            torch.cuda.synchronize()
        pr.disable()
        print("==", row.name, flush=True)
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
