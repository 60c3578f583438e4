"""Upper-bound probe (session 30: the saved backward of an op at L=16384 with its dK/dV kernel's full-tile loop
hand-edited (row factor for the l==0 guard, exp2 with the scale folded); whole-backward do_bench.
The saved statistics are random, so the outputs hold NaN (exp of unrelated shifts): timing only.
usage: op variant... (base, row, exp2, row_exp2)"""
import re
import sys
from dataclasses import replace

sys.path.insert(0, "bench")
from cases import Case

from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program
from neptune_eq.pipeline import Options
from neptune_eq.runtime import compile_ir

LOG2E = 1.4426950408889634


def edit_rowfactor(src: str) -> tuple[str, int]:
    n = 0
    # tA = (dB / xC[None, :]) ; tD = tl.where(mE[None, :], 0.0, tA)  ->  rowfactor
    pat = re.compile(r"(\s+)(t\d+) = \((d\d+) / (x\d+)\[None, :\]\)\n"
                     r"\s+(t\d+) = tl\.where\((m\d+)\[None, :\], 0\.0, \2\)\n")
    def f(m):
        nonlocal n
        n += 1
        ind, _, d, x, t2, mm = m.groups()
        return f"{ind}r_{x} = tl.where({mm}, 0.0, 1.0 / {x}){ind}{t2} = {d} * r_{x}[None, :]\n"
    src = pat.sub(f, src)
    # mC = (mE == 0) ; tD = (1.0 / xC) ; tE = tF * tD[None, :] ; pG = tl.where(mC[None, :], tE, 0.0)
    pat2 = re.compile(r"(\s+)(m\d+) = \((m\d+) == 0\)\n\s+(t\d+) = \(1\.0 / (x\d+)\)\n"
                      r"\s+(t\d+) = (t\d+) \* \4\[None, :\]\n\s+(p\d+) = tl\.where\(\2\[None, :\], \6, 0\.0\)\n")
    def g(m):
        nonlocal n
        n += 1
        ind, _, _, _, x, _, tf, pg = m.groups()
        return f"{ind}{pg} = {tf} * r_{x}[None, :]\n"
    src = pat2.sub(g, src)
    pat3 = re.compile(r"(\s+)(t\d+) = \((d\d+) / (x\d+)\[None, :\]\)\n")  # plain row division (l >= 1)
    def h(m):
        nonlocal n
        n += 1
        ind, t, d, x = m.groups()
        return f"{ind}r_{x} = 1.0 / {x}{ind}{t} = {d} * r_{x}[None, :]\n"
    src = pat3.sub(h, src)
    return src, n


def edit_exp2(src: str) -> tuple[str, int]:
    # tA = (dB * c) ; ... tC = (tA - tD[None, :]) ; tE = tl.exp(tC)
    pat = re.compile(r"(\s+)(t\d+) = \((d\d+) \* ([0-9.e-]+)\)\n((?:\s+.*\n){0,4}?)"
                     r"\s+(t\d+) = \(\2 - (t\d+|x\d+)\[None, :\]\)\n\s+(t\d+) = tl\.exp\(\6\)\n")
    n = 0
    def f(m):
        nonlocal n
        n += 1
        ind, ta, d, c, mid, _, td, te = m.groups()
        return (f"{ind}{ta} = 0\n{mid}{ind}{te} = tl.exp2({d} * {float(c) * LOG2E!r} - ({td} * {LOG2E!r})[None, :])\n")
    return pat.sub(f, src), n


def main(op, variants):
    import torch
    import triton
    c = Case(op, 16384)
    cap = capture(c.fn, *c.inputs("cpu"))
    back = backward_program(cap.program, saved=True).program
    comp = compile_ir(back, Options())
    src, ks = comp.lowered("cuda")

    def feed_of(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        out = {}
        for n, s in back.inputs.items():
            shape = tuple(back.axes[a] for a in s.axes)
            t = (torch.randn(shape, device="cuda", generator=g) * (0.1 if n.startswith("saved") else 1)).abs()
            out[n] = t.to(getattr(torch, s.dtype)) + (1 if n == "saved_1" else 0)
        return out
    feed = feed_of(0)
    base = comp.run(feed)
    res = {}
    for name in variants:
        s2, hits = src, []
        if "row" in name:
            s2, k = edit_rowfactor(s2)
            hits.append(("row", k))
        if "exp2" in name:
            s2, k = edit_exp2(s2)
            hits.append(("exp2", k))
        comp._modules.clear()
        comp._modules[("src", "cuda")] = (s2, [replace(k, source=s2) for k in ks])
        out = comp.run(feed)
        err = max(((out[k].double() - base[k].double()).norm() / base[k].double().norm()).item() for k in base)
        torch.cuda.synchronize()
        ms = [triton.testing.do_bench(lambda: comp.run(feed), warmup=50, rep=300, return_mode="median")
              for _ in range(3)]
        res[name] = ms
        print(op, name, hits, "rel diff vs base", f"{err:.2e}", "ms", [round(m, 3) for m in ms], flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
