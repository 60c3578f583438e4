"""Probe (issue 14): why a dynamic compile's prefill kernel runs slower than the static compile at
the same length when their code is the same but for runtime strides and extents (softcap_pf,
window_pf: 1.14–1.27×, H200 2026-11-27). Times, at length L, the kernel of the bucket's plan as
generated (strides and lengths arguments), hand-edited with every stride a constexpr (lengths
still arguments), with each length a constexpr, with the lengths left to the JIT to specialise
(divisibility by 16; "specialised"), and the static compile's kernel; whole-call do_bench medians.

    python bench/probe_dynamic_strides.py softcap_pf 12000
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace

import torch
import triton.testing as tt
from cases import Case

import neptune_eq


def constexpr_strides(src: str) -> str:
    """Every `<name>_s<k>` parameter of the kernels' signatures made a tl.constexpr."""
    def sig(m):
        params = [p if not re.fullmatch(r"\w+_s\d+", p.strip()) else f"{p.strip()}: tl.constexpr"
                  for p in m.group(2).split(",")]
        return f"{m.group(1)}({', '.join(p.strip() for p in params)}):"
    return re.sub(r"(def nq_\w+)\((.*?)\):", sig, src)


def constexpr_lengths(src: str, names: tuple[str, ...] | None = None) -> str:
    """The `n_<axis>` parameters of the kernels' signatures (those in `names`, or all) made
    tl.constexpr (what a static compile has) and taken out of the JIT's do_not_specialize."""
    def dns(m):
        kept = [n for n in re.findall(r"'(\w+)'", m.group(1)) if names is not None and n not in names]
        return f"@triton.jit(do_not_specialize={kept!r})" if kept else "@triton.jit"
    src = re.sub(r"@triton\.jit\(do_not_specialize=(\[.*?\])\)", dns, src)
    pat = r"\b(n_\w+)(?=[,)])" if names is None else rf"\b({'|'.join(names)})(?=[,)])"
    return "\n".join(re.sub(pat, r"\1: tl.constexpr", ln) if ln.startswith("def nq_") else ln
                     for ln in src.splitlines()) + "\n"


# facts about the program-id decomposition of a runtime length's tiles (T its tile count, r the
# remainder, t the tile index), given to the compiler with tl.assume
ASSUMES = {
    "assume index": ("{T} > 0", "{r} >= 0", "{r} < {T}", "{t} >= 0"),
    "assume bounded": ("{T} > 0", "{T} < 65536", "{r} >= 0", "{r} < {T}", "{t} >= 0", "{t} < 65536"),
}


def assume_tiles(src: str, facts: tuple[str, ...]) -> str:
    """Each heavy-first tile index `t_X = ((n_X + T - 1) // T) - 1 - pid % ((n_X + T - 1) // T)` split
    into named steps with `facts` about them as tl.assume statements."""
    pat = re.compile(r"^( +)t_(\w+) = (\(\(n_\w+ \+ (\d+) - 1\) // \4\)) - 1 - pid % \3\n\1pid = pid // \3$", re.M)

    def split(m):
        ind, ax, count = m.group(1), m.group(2), m.group(3)
        T, r, t = f"T_{ax}", f"r_{ax}", f"t_{ax}"
        lines = [f"{T} = {count}", f"{r} = pid % {T}", f"{t} = {T} - 1 - {r}"]
        lines += [f"tl.assume({f.format(T=T, r=r, t=t)})" for f in facts] + [f"pid = pid // {T}"]
        return "\n".join(ind + ln for ln in lines)
    out, n = pat.subn(split, src)
    assert n, "no runtime tile count in the program-id decomposition"
    return out


def main(op: str, L: int) -> None:
    c0 = Case(op, L - 7)
    dyn = neptune_eq.compile(c0.fn, *c0.inputs("cuda"), dynamic=True)
    xs = Case(op, L).inputs("cuda")
    dyn(*xs)
    fam = dyn.family
    ns = fam.serves(xs)
    prog = fam.program_for(ns)
    inputs = fam.inputs(xs, ns)
    static = neptune_eq.compile(Case(op, L).fn, *xs)
    static(*xs)
    src, ks = prog.lowered("cuda")
    edited = prog.pin(prog.choice)
    src2 = constexpr_strides(src)
    edited._modules[("src", "cuda")] = (src2, [replace(k, source=src2) for k in ks])
    def variant(text):
        p = prog.pin(prog.choice)
        p._modules[("src", "cuda")] = (text, [replace(k, source=text) for k in ks])
        return p

    both = variant(constexpr_lengths(src2))
    ref = prog.run(inputs)
    out = edited.run(inputs)
    out3 = both.run(inputs)
    diff = max(diff_of(out, ref), diff_of(out3, ref))
    lengths = [f"n_{a}" for g in fam.lengths.groups for a in g]
    single = {n: variant(constexpr_lengths(src, (n,))) for n in lengths}
    # lengths still arguments, but the JIT left free to specialise them (divisible by 16 or not)
    single["specialised"] = variant(re.sub(r"@triton\.jit\(do_not_specialize=\[.*?\]\)", "@triton.jit", src))
    # n_i's two uses apart, each written as this call's literal value: the program-id decomposition
    # (the tile count cdiv(n_i, T)) and the row masks of the q load and the output store
    n_i = next((n for g, n in zip(fam.lengths.groups, ns) if "i" in g), None)
    if n_i is not None:
        single["order literal"] = variant(re.sub(r"\(\(n_i \+ (\d+) - 1\) // \1\)",
                                                 lambda m: str(-(-n_i // int(m.group(1)))), src))
        single["masks literal"] = variant(src.replace("(offs_i < n_i)", f"(offs_i < {n_i})"))
        # the load's mask alone as a literal; the load's rows clamped into range instead of masked
        load = re.compile(r"(tl\.load\([^\n]*?)offs_i\[:, None\]([^\n]*?), mask=\(offs_i < n_i\)\[:, None\], other=0\)")
        single["load literal"] = variant(load.sub(lambda m: f"{m.group(1)}offs_i[:, None]{m.group(2)}, "
                                                  f"mask=(offs_i < {n_i})[:, None], other=0)", src))
        single["load clamped"] = variant(load.sub(lambda m: f"{m.group(1)}tl.minimum(offs_i, n_i - 1)[:, None]"
                                                  f"{m.group(2)})", src))
        # n_i a runtime value, but what a literal tile count tells the compiler told by tl.assume
        for name, facts in ASSUMES.items():
            single[name] = variant(assume_tiles(src, facts))
    n_j = next((n for g, n in zip(fam.lengths.groups, ns) if "j" in g), None)
    if n_j is not None:  # the key length's uses: the key loads' masks, the loop's last tile
        single["n_j masks literal"] = variant(src.replace("(offs_j < n_j)", f"(offs_j < {n_j})"))
        single["n_j bound literal"] = variant(src.replace("tl.minimum(n_j,", f"tl.minimum({n_j},"))
    rows = {"dynamic": lambda: prog.run(inputs), "dynamic, strides constexpr": lambda: edited.run(inputs),
            "dynamic, strides + lengths constexpr": lambda: both.run(inputs), "static": lambda: static(*xs),
            **{_label(n): (lambda p=p: p.run(inputs)) for n, p in single.items()}}
    print(f"{op} L={L} on {torch.cuda.get_device_name()}; max |edited − dynamic| = {diff:.2e}")
    progs = {"dynamic": prog, "dynamic, strides constexpr": edited, "dynamic, strides + lengths constexpr": both,
             **{_label(n): p for n, p in single.items()}}
    for name, fn in rows.items():
        ms = tt.do_bench(fn, warmup=25, rep=200, return_mode="median")
        ck = [c for c in progs[name].launcher("cuda")._runners.values()] if name in progs else []
        regs = [(getattr(c, "n_regs", None), getattr(c, "n_spills", None)) for c in ck]
        print(f"  {name:28s} {ms * 1e3:9.1f} us  (registers, spills) {regs}", flush=True)


def _label(n: str) -> str:
    if n == "specialised":
        return "dynamic, lengths specialised by the JIT"
    if n == "load clamped":
        return "dynamic, q rows clamped, not masked"
    if n.startswith("n_j "):
        return f"dynamic, n_j's {n.split()[1]} as a literal"
    return f"dynamic, n_i's {n.split()[0]} as a literal" if n.endswith("literal") else f"dynamic, {n} constexpr only"


def diff_of(out, ref) -> float:
    return max(float((out[k].float() - ref[k].float()).abs().max()) for k in ref)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
