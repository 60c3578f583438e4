"""Forward + backward of matmul-fed losses beside their peers, with peak memory (issue 13). GPU only.

Each implementation's gradients are checked against float64 (the linear cross-entropy reference runs in
chunks of tokens: its float64 logits would take 8 GB), then one fwd+bwd step is timed (median of
triton.testing.do_bench) and its peak memory measured (torch.cuda.max_memory_allocated during a step,
less what was allocated before it, over its first two steps: buffers kept between calls count), all in
one process.

    python bench/grad_memory.py [--only linear_ce rmsnorm_mm] [--out results.json] [--profile]

--profile adds, per implementation, the CUDA kernels of one step by total time (torch.profiler);
--tune runs neptune_eq's prog.tune() (plans, then tiles, warps and stages of the training forward and
backward kernels) before timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))

from beyond.programs import EPS, linear_ce, rmsnorm_matmul

import neptune_eq


def _linear_ce_inputs(g):
    h = torch.randn(8192, 4096, generator=g, device="cuda").bfloat16()
    W = (torch.randn(128256, 4096, generator=g, device="cuda") * 4096 ** -0.5).bfloat16()
    t = torch.randint(0, 128256, (8192,), generator=g, device="cuda")
    t[::97] = -100  # ignored tokens
    return (h, W, t), (0, 1)


def _linear_ce_ref(h, W, t, chunk=1024):
    """Float64 gradients of the mean cross-entropy, by autograd on chunks of tokens."""
    W64 = W.double().requires_grad_()
    n = (t != -100).sum()
    gh = torch.empty_like(h, dtype=torch.float64)
    for s in range(0, h.shape[0], chunk):
        hc = h[s:s + chunk].double().requires_grad_()
        (F.cross_entropy(hc @ W64.T, t[s:s + chunk], reduction="sum") / n).backward()
        gh[s:s + chunk] = hc.grad
    return [gh, W64.grad]


def _rmsnorm_inputs(g):
    x = torch.randn(4096, 8192, generator=g, device="cuda").bfloat16()
    w = (1 + 0.1 * torch.randn(8192, generator=g, device="cuda")).bfloat16()
    W = (torch.randn(8192, 8192, generator=g, device="cuda") * 8192 ** -0.5).bfloat16()
    return (x, w, W), (0, 1, 2)


def _rmsnorm_ref(x, w, W, dy):
    leaves = [a.double().requires_grad_() for a in (x, w, W)]
    rmsnorm_matmul(*leaves).backward(dy.double())
    return [a.grad for a in leaves]


def _liger(name):
    from liger_kernel.transformers import functional as lf

    if name == "linear_ce":
        return lambda h, W, t: lf.liger_fused_linear_cross_entropy(h, W, t)
    return lambda x, w, W: torch.mm(lf.liger_rms_norm(x, w, EPS, in_place=False), W)


CASES = {"linear_ce": (linear_ce, _linear_ce_inputs), "rmsnorm_mm": (rmsnorm_matmul, _rmsnorm_inputs)}


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def _profile(step, top: int = 12) -> None:
    """The CUDA kernels of one warm step, by total time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows)
    print(f"    kernels: {total / 1e3:.2f} ms in all", flush=True)
    for e in rows[:top]:
        print(f"    {e.device_time_total / 1e3:9.3f} ms  x{e.count:<3d} {e.key[:110]}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=list(CASES))
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--impls", nargs="*", default=None, help="only these (neptune_eq eager compile liger)")
    args = ap.parse_args()
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(env, flush=True)
    rows = []
    for name in args.only:
        fn, make = CASES[name]
        t_ref = time.time()
        xs, diff = make(torch.Generator(device="cuda").manual_seed(0))
        out = fn(*xs)
        dy = torch.randn(out.shape, device="cuda", dtype=out.dtype)
        ref = _linear_ce_ref(*xs) if name == "linear_ce" else _rmsnorm_ref(*xs, dy)
        ref = [r * (dy.double() if name == "linear_ce" else 1) for r in ref]
        del out
        torch.cuda.synchronize()
        print(f"{name}: float64 reference {time.time() - t_ref:.1f} s", flush=True)
        t0 = time.time()
        prog = neptune_eq.compile(fn, *xs)
        print(f"{name}: neptune_eq forward compiled in {time.time() - t0:.1f} s", flush=True)
        if args.tune:
            t1 = time.time()
            prog.tune(*[x.detach().clone().requires_grad_() if k in diff else x for k, x in enumerate(xs)])
            print(f"{name}: neptune_eq tuned in {time.time() - t1:.0f} s", flush=True)
        peers = {"neptune_eq": prog, "eager": fn, "compile": torch.compile(fn)}
        try:
            peers["liger"] = _liger(name)
        except Exception as e:  # no Liger here
            print(f"{name} liger: not available ({e!r})", flush=True)
        for label, f in peers.items():
            if args.impls is not None and label not in args.impls:
                continue
            try:
                leaves = [x.detach().clone().requires_grad_() if k in diff else x for k, x in enumerate(xs)]

                def step(f=f, leaves=leaves, diff=diff, dy=dy):
                    for k in diff:
                        leaves[k].grad = None
                    f(*leaves).backward(dy)

                # peak of a warm step above what was allocated before it, plus what the implementation
                # kept from its first calls (a buffer kept between calls counts too; memory the first
                # calls freed, such as a tuner's, does not make it negative)
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                step()
                err = max(rel(leaves[k].grad, r) for k, r in zip(diff, ref))
                first = time.time() - t0
                step()
                torch.cuda.synchronize()
                warm = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                step()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - warm + max(0, warm - base)
                ms = triton.testing.do_bench(step, warmup=5, rep=200, return_mode="median")
                row = {"case": name, "impl": label, "ms": ms, "peak_GiB": peak / 2**30, "grad_rel_err": err}
                rows.append(row)
                extra = f" (first calls incl. compile {first:.0f} s)" if label == "neptune_eq" else ""
                print(f"{name} {label}: fwd+bwd {ms:.2f} ms, peak +{peak / 2**30:.2f} GiB, grad rel err "
                      f"{err:.1e}{extra}", flush=True)
                if args.profile:
                    _profile(step)
                for k in diff:
                    leaves[k].grad = None
            except Exception as e:  # one peer failing does not stop the others
                print(f"{name} {label}: failed {str(e)[-2000:]}", flush=True)
            torch.cuda.empty_cache()
        print("  " + prog.explain().replace("\n", "\n  ")[:4000], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
