"""Session 50 on the GPU (run from bench/): where the time of two training steps goes, each kernel's
device time beside do_bench of the step, and the backward the cost model chose (its training report).

  * dpo_profile: DPO fwd+bwd (sweep_fourth's row, 8 × 1024 × 32000 bf16), now with its batch halves'
    row statistics saved by the forward and read at shifted rows by the backward;
  * siglip_profile: SigLIP fwd+bwd at 8192 × 768 bf16, whose backward now writes the logits once;
  * dpo_host: where the host time of a DPO training step goes (cProfile of 30 steps, after warm-up):
    do_bench of the step exceeds its kernels' device time, so the GPU waits for Python.

    python probe_session50.py [dpo_profile siglip_profile]
"""

from __future__ import annotations

import torch
import triton
from probe_session49 import _kernels, dpo_step  # (run from bench/)

import neptune_eq
from neptune_eq.autograd import training_report


def _report(prog) -> None:
    for line in training_report(prog._first().op.qualname).splitlines():
        print("    " + line[:400], flush=True)


def dpo_profile() -> None:
    prog, step = dpo_step()
    _kernels("dpo fwd+bwd", step, n=5)
    _report(prog)


def siglip_profile() -> None:
    from sweep_fourth import siglip_loss_arange

    x, y = (torch.randn(8192, 768, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    t = torch.tensor(2.3, device="cuda", requires_grad=True)
    b = torch.tensor(-10.0, device="cuda", requires_grad=True)
    prog = neptune_eq.compile(siglip_loss_arange, x, y, t, b)

    def step():
        for a in (x, y, t, b):
            a.grad = None
        prog(x, y, t, b).backward()

    _kernels("siglip fwd+bwd", step, n=5)
    _report(prog)


def dpo_host() -> None:
    import cProfile
    import pstats

    _, step = dpo_step()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(30):
        step()
    torch.cuda.synchronize()
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(25)
    st.sort_stats("cumulative").print_stats(45)


if __name__ == "__main__":
    import sys

    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for part in sys.argv[1:] or ["dpo_profile", "siglip_profile"]:
        globals()[part]()
