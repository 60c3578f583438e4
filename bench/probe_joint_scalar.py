"""Probe (CPU, compile only): the joint forward + backward program of a scalar loss.

The gradient of a scalar output is linear in its upstream gradient, so loss and gradients at upstream 1
can be one program (Liger-Kernel computes linear cross-entropy's gradients in its forward). This builds
that program from the captured forward and its derived recompute backward (the upstream input replaced
by the constant 1), compiles it for the H100 model and prints the plan the cost model picks.

    python bench/probe_joint_scalar.py [T H V]        # linear cross-entropy, tokens × hidden → vocabulary

Session 37 (64 × 48 → 200): the best plan rolls dH = Σⱼ softmax·W into the log-sum-exp pass (a
FlashAttention-like P·W with the running max and sum as corrections) and computes dW in a second pass
over the tokens: four GEMM-sized products, as the forward + saved backward already runs. The three-GEMM
plan (torch.compile's, Liger's) reads the probabilities of a chunk of tokens written once. At the full
size (8192 × 4096 → 128256) the best plan found is predicted 1.6 s (2.2 s with a 30000-node budget),
against ~51 ms measured for forward + saved backward: a pass that accumulates dH = Σⱼ p·W holds a tile of
the 4096-wide hidden axis per program and recomputes the logits for each tile (3 TB of traffic predicted).
Session 70: the joint program is a training alternative (neptune_eq.grad_joint, ranked by
neptune_eq.autograd); with products split from their epilogues (extract/gemm_split.py) and the plan
space ordered cover by cover, its best plan at the full size is three library GEMMs, 41.4 ms predicted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beyond.programs import linear_ce

from neptune_eq import grad_joint, ir
from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program
from neptune_eq.grad_joint import why_no_joint
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir


def joint_program(fwd: ir.Program) -> ir.Program:
    """Outputs of `fwd` (one scalar) and their gradients at upstream 1, as one program (neptune_eq.grad_joint)."""
    why = why_no_joint(fwd)
    if why is not None:
        raise ValueError(f"no joint program: {why}")
    return grad_joint.joint_program(fwd, backward_program(fwd, saved=False)).program


def main():
    T, H, V = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (64, 48, 200)
    h, W, t = torch.randn(T, H).bfloat16(), torch.randn(V, H).bfloat16(), torch.randint(0, V, (T,))
    joint = joint_program(capture(linear_ce, h, W, t).program)
    t0 = time.time()
    comp = compile_ir(joint, Options())
    print(f"compiled in {time.time() - t0:.1f} s")
    print(comp.explain())


if __name__ == "__main__":
    main()
