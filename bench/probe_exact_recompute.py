"""On the GPU: a short reduction written out in index order (numeric.written_out) has the same bits in
every kernel that computes it — the kernels run without FMA contraction (KernelSource.exact_arith) — so
a value compared with its own min recomputed in another kernel finds its ties. Every alternative that
computes the squared distance per element, with the min and the comparison in different passes, must
count torch's ties exactly (duplicated points planted), fp32 and bf16 clouds. The kernels compute a bf16
cloud's distances in float32, so its ties are torch's on the clouds widened to float32 (torch in bf16
rounds every difference and square to bf16: other ties, 16 rows apart on the H100, session 76); the
rows apart from float64's ties are said too.

Then Chamfer's joint training program (loss and gradients in one, sweep 8's shape): the chosen plan and
the best plans that compute the distances per element (no 1 GiB distance matrix written), each checked
against torch's float64 gradients, timed beside each other with their predictions.

    python bench/probe_exact_recompute.py [--joint-only | --ties-only]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_eighth import chamfer

from neptune_eq.frontend import capture
from neptune_eq.runtime import compile_ir
from neptune_eq.training import _derive
from neptune_eq.verify import rel_err


def nearest_ties(p, q):
    d = ((p[:, :, None, :] - q[:, None, :, :]) ** 2).sum(-1)
    return (d == d.amin(2, keepdim=True)).sum(2)


def joint_alternatives(most: int = 4) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    p, q = (torch.randn(16, 4096, 3, generator=g, device="cuda") for _ in range(2))
    c = capture(chamfer, p.cpu(), q.cpu())
    joint = _derive(c.program, list(c.program.inputs)).joint
    prog = compile_ir(joint.program)
    ref = [x.double().requires_grad_() for x in (p, q)]
    loss = chamfer(*ref)
    loss.backward()
    want = {joint.output: loss.detach(), **{joint.grads[n]: x.grad for n, x in zip(("p", "q"), ref)}}
    per_element = [a.id for a in prog.alternatives if a.plan.inline][:most]
    print(f"chamfer joint 16x4096x4096: chose #0 ({'per element' if 0 in per_element else 'distances written'})")
    inputs = dict(zip(c.program.inputs, (p, q)))
    for i in [0, *[j for j in per_element if j]]:
        run = prog.pin(i)
        got = run.run(inputs)
        errs = [rel_err(got[n], want[n])[0] for n in want]
        ms = triton.testing.do_bench(lambda run=run: run.run(inputs), warmup=5, rep=50)
        a = prog.alternatives[i]
        print(f"  #{i:4d} {ms:8.3f} ms (predicted {a.predicted_time * 1e3:7.3f})  rel_err {max(errs):.2e}  "
              f"{'per element' if a.plan.inline else 'distances written'}: {a.plan.groups}")


def main() -> None:
    if "--joint-only" not in sys.argv:
        ties()
    if "--ties-only" not in sys.argv:
        joint_alternatives()


def ties() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    bad = 0
    for dtype in (torch.float32, torch.bfloat16):
        p = torch.randn(4, 1000, 3, generator=g, device="cuda").to(dtype)
        q = torch.randn(4, 20000, 3, generator=g, device="cuda").to(dtype)
        q[:, 15000:15100] = q[:, 100:200]  # exact duplicates: ties across tiles and chunks
        p[:, :100] = q[:, 100:200]  # points sitting on a duplicated point (distance 0, two of them)
        c = capture(nearest_ties, p.cpu(), q.cpu())
        prog = compile_ir(c.program)
        apart = [a.id for a in prog.alternatives if a.plan.inline]
        want = nearest_ties(p.float(), q.float())
        exact = nearest_ties(p.double(), q.double())
        print(f"{dtype}: {len(apart)} alternatives compute the distance per element; torch's ties (float32) on "
              f"{int((want > 1).sum())} rows, {int((want != exact).sum())} rows apart from float64's")
        for i in apart:
            got = next(iter(prog.pin(i).run(dict(zip(c.program.inputs, (p, q)))).values()))
            groups = "; ".join(f"{ax}:{'+'.join(cs)}/{n}" for ax, cs, n in prog.alternatives[i].plan.groups)
            ok = torch.equal(got.to(want.dtype), want)
            bad += not ok
            print(f"  #{i:3d} {'ok ' if ok else 'WRONG'} {groups}  (rows differing: {int((got != want).sum())})")
    print("all exact" if not bad else f"{bad} alternatives miscounted")


if __name__ == "__main__":
    main()
