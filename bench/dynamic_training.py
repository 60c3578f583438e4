"""Issues 13 and 14: training steps (forward + backward) at lengths never compiled before, served by
one dynamic compile, against a static compile at that very length and torch.compile(dynamic=True) —
each checked against float64 first (gradients too), timed in one process (do_bench medians).

The causal-LM loss (session 53) shifts its labels by one: its token axis is padded to the
sequence (frontend/offsets.py). For each (program, length L) the dynamic function is compiled and
trained once at L − 7 (the same bucket), then stepped at L: the host time of that first step (its
stats must show no capture or compile), the step time beside a static compile's and torch.compile's.

    python bench/dynamic_training.py --out dyn_train.json            # GPU
    TRITON_INTERPRET=1 python bench/dynamic_training.py --dry        # CPU: tiny sizes, every code path
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

import neptune_eq

OFFSET = 7


def causal(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    L = s.shape[-1]
    keep = torch.arange(L, device=q.device)[None, :] <= torch.arange(L, device=q.device)[:, None]
    return torch.softmax(s.float().masked_fill(~keep, float("-inf")), -1).to(v.dtype) @ v


def rms_matmul(x, w, W):
    xf = x.float()
    return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w) @ W


def cross_entropy(x, t):
    return F.cross_entropy(x.float(), t)


def causal_lm_loss(logits, labels):
    """The causal language model's loss as written in training loops: next-token labels, shifted by one."""
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def programs(dry: bool):
    """name → (fn, inputs at length L on `device`, the inputs that require grad, lengths)."""
    bf = torch.float32 if dry else torch.bfloat16
    H, D, hid, V = (2, 16, 32, 48) if dry else (16, 64, 4096, 32000)
    B = 2 if dry else 4  # (the causal-LM loss's batch)

    def randn(*shape, device, seed):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device, bf)

    return {
        "causal_attention": (causal, lambda L, dev: [randn(1, H, L, D, device=dev, seed=L + s) for s in range(3)],
                             (0, 1, 2), (40, 57) if dry else (3000, 5000)),  # (12000 did not fit a 10-minute call)
        "rms_matmul": (rms_matmul, lambda L, dev: [randn(L, hid, device=dev, seed=L), randn(hid, device=dev, seed=1),
                                                   randn(hid, hid, device=dev, seed=2)],
                       (0, 1, 2), (40, 57) if dry else (3000, 5000, 12000)),
        "cross_entropy": (cross_entropy, lambda L, dev: [randn(L, V, device=dev, seed=L), torch.randint(
            0, V, (L,), generator=torch.Generator().manual_seed(L)).to(dev)], (0,), (40, 57) if dry else (3000, 6000)),
        "causal_lm_loss": (causal_lm_loss, lambda L, dev: [
            randn(B, L, V, device=dev, seed=L),
            torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(L)).to(dev)],
            (0,), (40, 57) if dry else (1500, 3000)),
    }


def step(fn, xs, wrt):
    """One training step: fn's output summed (scaled, so the cotangent is not all ones) and its gradients."""
    xs = [x.detach().requires_grad_(k in wrt) for k, x in enumerate(xs)]
    out = fn(*xs)
    return torch.autograd.grad(out.float().sum() * 0.5, [xs[k] for k in wrt])


def rel_err(got, want) -> float:
    return max(((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(got, want))


def measure(name, fn, make, wrt, L, device, dry) -> dict:
    import triton.testing as tt

    dyn = neptune_eq.compile(fn, *make(L - OFFSET, device), dynamic=True)
    step(dyn, make(L - OFFSET, device), wrt)  # (the bucket's training derived and compiled)
    xs = make(L, device)
    before = dyn.stats()
    t0 = time.perf_counter()
    step(dyn, xs, wrt)
    if device == "cuda":
        torch.cuda.synchronize()
    row = {"program": name, "L": L, "first_step_ms": (time.perf_counter() - t0) * 1e3}
    after = dyn.stats()
    row["new_length_recompiled"] = {k: after[k] - before[k] for k in ("captures", "compiles", "cache_hits")}
    static = neptune_eq.compile(fn, *xs)
    peers = {"dynamic": dyn, "static": static}
    if not dry:
        peers["torch.compile"] = torch.compile(fn, dynamic=True)
    want = step(fn, [x.double() if x.is_floating_point() else x for x in xs], wrt)
    for peer, f in peers.items():
        err = rel_err(step(f, xs, wrt), want)
        row[f"{peer}_rel_err"] = err
        if err > (1e-5 if dry else 2e-2):  # (float32 in the dry run, bf16 on the GPU)
            row[f"{peer}_ms"] = None
            continue
        row[f"{peer}_ms"] = None if dry else tt.do_bench(lambda f=f: step(f, xs, wrt), warmup=25, rep=200,
                                                          return_mode="median")
    if row.get("dynamic_ms") and row.get("static_ms"):
        row["dynamic_over_static"] = row["dynamic_ms"] / row["static_ms"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry", action="store_true", help="CPU, tiny sizes, Triton's interpreter")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--out")
    args = ap.parse_args()
    device = "cpu" if args.dry else "cuda"
    rows = []
    for name, (fn, make, wrt, lengths) in programs(args.dry).items():
        if args.only and name not in args.only:
            continue
        for L in lengths:
            row = measure(name, fn, make, wrt, L, device, args.dry)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
    bad = [r for r in rows if sum(r["new_length_recompiled"].values()) or any(
        r.get(f"{p}_rel_err", 0) > (1e-5 if args.dry else 2e-2) for p in ("dynamic", "static"))]
    print(f"\n{'program':>18} {'L':>6} {'dynamic':>9} {'static':>9} {'compile':>9} {'dyn/st':>7} {'recompiled':>11}")
    for r in rows:
        ms = [r.get(k) for k in ("dynamic_ms", "static_ms", "torch.compile_ms")]
        cells = " ".join(f"{m:9.3f}" if m else f"{'-':>9}" for m in ms)
        print(f"{r['program']:>18} {r['L']:>6} {cells} {r.get('dynamic_over_static', 0):7.3f} "
              f"{sum(r['new_length_recompiled'].values()):>11}")
    if bad:
        raise SystemExit(f"{len(bad)} rows recompiled at a new length or failed their float64 check")


if __name__ == "__main__":
    main()
