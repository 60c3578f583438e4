"""Which part of RoPE inside causal attention costs the kernel its time (H100): the same attention with
the rotation on q alone, on k alone, k·cos alone (a computed key operand, no gather) and rotate_half(k)
alone (a gathered one), each checked against float64 and timed (do_bench median) beside SDPA.

    python bench/probe_rope.py [--L 2048]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_unseen import _rope_make, _rotate_half

import neptune_eq
from neptune_eq.verify import rel_err


def _attn(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


VARIANTS = {
    "plain": lambda q, k, v, c, s: _attn(q, k, v),
    "rope q and k": lambda q, k, v, c, s: _attn(q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s, v),
    "rope q": lambda q, k, v, c, s: _attn(q * c + _rotate_half(q) * s, k, v),
    "rope k": lambda q, k, v, c, s: _attn(q, k * c + _rotate_half(k) * s, v),
    "k*cos": lambda q, k, v, c, s: _attn(q, k * c, v),
    "rotate_half(k)": lambda q, k, v, c, s: _attn(q, _rotate_half(k), v),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--L", type=int, default=2048)
    a = ap.parse_args()
    xs = _rope_make(4, 16, a.L, 128, torch.bfloat16, None)("cuda", torch.Generator(device="cuda").manual_seed(0), False)
    for name, fn in VARIANTS.items():
        want = fn(*(x.double() for x in xs))
        prog = neptune_eq.compile(fn, *xs)
        err, _ = rel_err(prog(*xs), want)
        ms = triton.testing.do_bench(lambda p=prog: p(*xs), warmup=25, rep=100, return_mode="median")
        peer = triton.testing.do_bench(lambda f=fn: f(*xs), warmup=25, rep=100, return_mode="median")
        print(f"{name:16s} neptune_eq {ms:7.3f} ms  eager+SDPA {peer:7.3f} ms  err {err:.1e}  "
              f"{prog.program.alternative.structure}", flush=True)


if __name__ == "__main__":
    main()
