"""Random PyTorch reduction programs, compiled and checked against float64: a hunt for silent wrong
answers and crashes on programs nobody wrote by hand.

Each program is a few lines of plain PyTorch drawn from a small grammar (maps, broadcasts, reductions
with and without keepdim, softmax / log-softmax / logsumexp, norms, matmuls, masks, slices, transposes),
printed as source so a finding reproduces by itself. A program's outcome is one of

    ok       the compiled result (and, with --grad, its gradients) matches float64 on fresh inputs
    refused  a NeptuneError naming its cause (allowed: the compiler may refuse what it cannot do)
    WRONG    a result or gradient off float64 beyond tolerance (a silent wrong answer)
    CRASH    any other exception

    python scripts/fuzz_programs.py --seeds 0:40 [--grad] [--dynamic]

Exit status 1 when any program is WRONG or CRASHes. tests/test_fuzz_programs.py runs a few seeds.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
import traceback
from dataclasses import dataclass, field

import torch

import neptune_eq
from neptune_eq.ir import NeptuneError

_SIZES = {"n": 7, "d": 4, "e": 3, "b": 2}  # distinct, so a shape names its axes (a slice makes n − 1 = 6)
# --big: extents whose tiles differ (64, 32, 16): a value laid out transposed in a kernel then fails its
# shapes where 16 × 16 tiles hide it (extended seed 20's gradient was such a case at 4 × 3; at 37 × 20
# another plan is chosen), and plans chosen at larger sizes are drawn
_BIG = {"n": 37, "d": 20, "e": 9, "b": 3}

_UNARY = (
    "torch.exp({a})", "torch.tanh({a})", "torch.sigmoid({a})", "torch.relu({a})", "{a} * {a}",
    "{a}.abs()", "-{a}", "{a} * 0.5 + 1.0", "torch.log1p({a}.abs())", "torch.sqrt({a}.abs() + 1.0)",
    "torch.rsqrt({a} * {a} + 0.5)", "F.silu({a})", "F.softplus({a})", "{a}.clamp(min=-0.5)",
    "F.gelu({a})", "torch.exp2({a}) - 1.0", "{a} / {a}.shape[-1] ** 0.5",
)
_BINARY = ("{a} + {b}", "{a} * {b}", "{a} - {b}", "torch.maximum({a}, {b})", "{a} / ({b}.abs() + 1.0)")
_REDUCE = ("{a}.sum({dim}{kd})", "{a}.mean({dim}{kd})", "{a}.amax({dim}{kd})", "{a}.amin({dim}{kd})",
           "torch.logsumexp({a}, {dim}{kd})", "{a}.var({dim}{kd}, unbiased=False)", "{a}.std({dim}{kd})",
           "{a}.norm(dim={dim}{kd})")
_MASKS = ("torch.arange({a}.shape[-1])[None, :] <= torch.arange({a}.shape[-2])[:, None]",
          "(torch.arange({a}.shape[-1])[None, :] - torch.arange({a}.shape[-2])[:, None]).abs() <= 1",
          "torch.arange({a}.shape[-1])[None, :] >= torch.arange({a}.shape[-2])[:, None]")


@dataclass
class _Value:
    name: str
    shape: tuple[int, ...]
    reduced: bool = False  # a reduction is upstream of it
    integer: bool = False


@dataclass
class Program:
    """A random program: its source (a function `fn`) and the shapes of its arguments."""

    seed: int
    lines: list[str] = field(default_factory=list)
    args: list[_Value] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=lambda: dict(_SIZES))

    @property
    def source(self) -> str:
        params = ", ".join(a.name for a in self.args)
        body = "\n".join("    " + ln for ln in self.lines)
        return f"def fn({params}):\n{body}\n"

    def function(self):
        scope = {"torch": torch, "F": torch.nn.functional}
        exec(compile(self.source, f"<fuzz seed {self.seed}>", "exec"), scope)
        return scope["fn"]

    def inputs(self, seed: int, dtype=torch.float32, sizes: dict[str, int] | None = None) -> list[torch.Tensor]:
        """Random arguments; `sizes` moves the lengths (the n axis) for a dynamic call."""
        g = torch.Generator().manual_seed(seed)
        out = []
        for a in self.args:
            shape = tuple((sizes or {}).get(_name_of(s, self.sizes), s) for s in a.shape)
            if a.integer:
                out.append(torch.randint(0, 1000, shape, generator=g))
            else:
                out.append(torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype))
        return out


def _name_of(extent: int, sizes: dict[str, int]) -> str:
    return next((k for k, v in sizes.items() if v == extent), "")


# --extended 1: losses, comparisons and indexing as model code writes them; --extended 2 adds selections
# by argmax, masked means, pairwise distances and data-scaled softmaxes (each level a draw of its own: the
# lower levels' seeds keep their programs)
_EXTRA_KINDS = ("compare", "normalize", "max_values", "clamp", "pow", "row_scale", "loss", "loss",
                "gather", "logaddexp", "mean_two")
_EXTRA_KINDS_2 = ("argmax_gather", "masked_mean", "pairwise", "temperature", "standardise", "one_hot",
                  "logsigmoid")
_LOSSES = ("F.mse_loss({a}, {b})", "F.smooth_l1_loss({a}, {b}, beta=0.5)", "F.l1_loss({a}, {b})",
           "F.kl_div(F.log_softmax({a}, -1), F.softmax({b}, -1), reduction='batchmean')",
           "F.binary_cross_entropy_with_logits({a}, torch.sigmoid({b}))",
           "F.cosine_similarity({a}, {b}, dim=-1)", "F.huber_loss({a}, {b}, delta=0.7)",
           "F.soft_margin_loss({a}, torch.sign({b}).detach())")


class _Builder:
    def __init__(self, seed: int, extended: int = 0, sizes: dict[str, int] | None = None):
        self.extended = extended
        self.rng = random.Random(seed)
        self.prog = Program(seed, sizes=dict(sizes or _SIZES))
        self.values: list[_Value] = []
        n, d, e, b = (self.prog.sizes[k] for k in "ndeb")
        batch = (b,) if self.rng.random() < 0.3 else ()
        for name, shape in (("x", (*batch, n, d)), ("y", (*batch, n, d)), ("w", (d, e))):
            v = _Value(name, shape)
            self.prog.args.append(v)
            self.values.append(v)
        if self.rng.random() < 0.25:  # class labels for a cross-entropy (taken modulo the classes)
            self.labels = _Value("lab", (*batch, n), integer=True)
            self.prog.args.append(self.labels)
        else:
            self.labels = None

    def _emit(self, expr: str, shape: tuple[int, ...], reduces: bool = False) -> _Value:
        words = set(re.findall(r"\w+", expr))
        used = [v for v in self.values if v.name in words]
        v = _Value(f"t{len(self.prog.lines)}", shape, reduces or any(u.reduced for u in used))
        self.prog.lines.append(f"{v.name} = {expr}")
        self.values.append(v)
        return v

    def _pick(self, pred=lambda v: True) -> _Value | None:
        pool = [v for v in self.values if pred(v)]
        if not pool:
            return None
        recent = pool[-3:]  # favour recent values: deeper chains
        return self.rng.choice(recent if self.rng.random() < 0.7 else pool)

    def step(self) -> None:
        r = self.rng
        last = self.values[-1]
        a = last if r.random() < 0.6 and last.shape else self._pick(lambda v: len(v.shape) >= 1)
        kinds = ("unary", "binary", "reduce", "reduce", "softmax", "norm", "matmul", "mask",
                 "slice", "transpose", "broadcast", "cat", "ce")
        kinds += _EXTRA_KINDS if self.extended >= 1 else ()
        kind = r.choice(kinds + _EXTRA_KINDS_2 if self.extended >= 2 else kinds)
        two = len(a.shape) >= 2
        if kind in _EXTRA_KINDS:
            self._extra(kind, a)
        elif kind in _EXTRA_KINDS_2:
            self._extra_2(kind, a)
        elif kind == "unary":
            self._emit(r.choice(_UNARY).format(a=a.name), a.shape)
        elif kind == "binary":
            b = self._pick(lambda v: v.shape == a.shape and v is not a)
            if b is not None:
                self._emit(r.choice(_BINARY).format(a=a.name, b=b.name), a.shape)
        elif kind == "reduce":
            dim = r.randrange(len(a.shape))
            keep = r.random() < 0.5
            shape = tuple(1 if i == dim else s for i, s in enumerate(a.shape)) if keep else \
                tuple(s for i, s in enumerate(a.shape) if i != dim)
            self._emit(r.choice(_REDUCE).format(a=a.name, dim=dim - len(a.shape), kd=", keepdim=True" if keep else ""),
                       shape, reduces=True)
        elif kind == "softmax" and two:
            fn = r.choice(("torch.softmax", "torch.log_softmax"))
            self._emit(f"{fn}({a.name}, {r.choice((-1, -2))})", a.shape, reduces=True)
        elif kind == "norm" and two and a.shape[-1] > 1:
            if r.random() < 0.5:
                expr = f"{a.name} * torch.rsqrt({a.name}.pow(2).mean(-1, keepdim=True) + 1e-5)"
            else:
                expr = f"F.layer_norm({a.name}, ({a.shape[-1]},))"
            self._emit(expr, a.shape, reduces=True)
        elif kind == "matmul" and two:
            b = self._pick(lambda v: len(v.shape) == 2 and v.shape[0] == a.shape[-1] and min(v.shape) > 1)
            c = self._pick(lambda v: v.shape[:-2] == a.shape[:-2] and len(v.shape) == len(a.shape)
                           and v.shape[-1] == a.shape[-1] and min(v.shape) > 1)
            if b is not None and (c is None or r.random() < 0.5):
                self._emit(f"{a.name} @ {b.name}", (*a.shape[:-1], b.shape[1]), reduces=True)
            elif c is not None:
                self._emit(f"{a.name} @ {c.name}.mT", (*a.shape[:-1], c.shape[-2]), reduces=True)
        elif kind == "mask" and two and min(a.shape[-2:]) > 1:
            k = r.randrange(len(_MASKS))
            cond = _MASKS[k].format(a=a.name)
            if k < 2 and a.shape[-2] <= a.shape[-1] and r.random() < 0.5:  # each row keeps its diagonal: -inf is safe
                self._emit(f"torch.softmax({a.name}.masked_fill(~({cond}), float('-inf')), -1)", a.shape,
                           reduces=True)
            else:
                self._emit(f"torch.where({cond}, {a.name}, {r.choice(('0.0', '-1e4'))})", a.shape)
        elif kind == "slice" and two and a.shape[-2] > 2:
            self._emit(f"{a.name}[..., {r.choice(('1:', ':-1'))}, :]", (*a.shape[:-2], a.shape[-2] - 1, a.shape[-1]))
        elif kind == "transpose" and two:
            self._emit(f"{a.name}.mT", (*a.shape[:-2], a.shape[-1], a.shape[-2]))
        elif kind == "broadcast" and two:
            row = self._pick(lambda v: v.shape in ((*a.shape[:-1], 1), a.shape[-1:], (1, a.shape[-1])))
            if row is not None:
                self._emit(r.choice(_BINARY).format(a=a.name, b=row.name), a.shape)
        elif kind == "cat" and two:
            b = self._pick(lambda v: v.shape[:-1] == a.shape[:-1])
            if b is not None:
                self._emit(f"torch.cat([{a.name}, {b.name}], -1)", (*a.shape[:-1], a.shape[-1] + b.shape[-1]))
        elif kind == "ce" and self.labels is not None and a.shape[:-1] == self.labels.shape and a.shape[-1] > 1:
            red = r.choice(("none", "mean", "sum"))
            logits = a.name if len(a.shape) == 2 else f"{a.name}.flatten(0, -2)"
            labels = f"({self.labels.name} % {a.shape[-1]})" + ("" if len(a.shape) == 2 else ".flatten()")
            smooth = r.choice(("", ", label_smoothing=0.1"))
            shape = (math.prod(a.shape[:-1]),) if red == "none" else ()
            self._emit(f"F.cross_entropy({logits}, {labels}, reduction='{red}'{smooth})", shape, reduces=True)

    def _extra(self, kind: str, a: _Value) -> None:
        r = self.rng
        dim = r.randrange(len(a.shape)) - len(a.shape)
        if kind == "compare":
            b = self._pick(lambda v: v.shape == a.shape and v is not a)
            if b is not None:
                self._emit(r.choice(("torch.where({a} > {b}, {a}, {b} * 0.5)", "({a} > {b}).float() * {a}",
                                     "torch.where({a} >= 0, {a}, torch.exp({a}) - 1.0)")).format(a=a.name, b=b.name),
                           a.shape)
        elif kind == "normalize":
            self._emit(f"F.normalize({a.name}, dim={dim})", a.shape, reduces=True)
        elif kind == "max_values":
            op = r.choice(("max", "min"))
            shape = tuple(s for i, s in enumerate(a.shape) if i != dim + len(a.shape))
            self._emit(f"{a.name}.{op}({dim}).values", shape, reduces=True)
        elif kind == "clamp":
            self._emit(r.choice(("{a}.clamp(-1.0, 1.0)", "torch.clamp({a}, max=0.5)", "{a}.clamp_min(0.1)")
                                ).format(a=a.name), a.shape)
        elif kind == "pow":
            self._emit(r.choice(("{a}.abs().pow(1.5)", "{a}.pow(3)", "{a} ** 2")).format(a=a.name), a.shape)
        elif kind == "row_scale":
            self._emit(f"{a.name} / {a.name}.abs().sum({dim}, keepdim=True).clamp_min(1e-3)", a.shape, reduces=True)
        elif kind == "loss" and len(a.shape) >= 2:
            b = self._pick(lambda v: v.shape == a.shape and v is not a)
            if b is not None:
                form = r.choice(_LOSSES)
                shape = a.shape[:-1] if "cosine" in form else ()
                self._emit(form.format(a=a.name, b=b.name), shape, reduces=True)
        elif kind == "gather" and self.labels is not None and a.shape[:-1] == self.labels.shape:
            idx = f"({self.labels.name} % {a.shape[-1]}).unsqueeze(-1)"
            self._emit(f"torch.gather({a.name}, -1, {idx})", (*a.shape[:-1], 1))
        elif kind == "logaddexp":
            b = self._pick(lambda v: v.shape == a.shape and v is not a)
            if b is not None:
                self._emit(f"torch.logaddexp({a.name}, {b.name})", a.shape)
        elif kind == "mean_two" and len(a.shape) >= 2:
            self._emit(f"{a.name}.mean((-2, -1), keepdim=True)", (*a.shape[:-2], 1, 1), reduces=True)

    def _extra_2(self, kind: str, a: _Value) -> None:
        r = self.rng
        dim = r.randrange(len(a.shape)) - len(a.shape)
        kept = tuple(1 if i == dim + len(a.shape) else n for i, n in enumerate(a.shape))
        if kind == "argmax_gather":
            self._emit(f"torch.gather({a.name}, {dim}, {a.name}.argmax({dim}, keepdim=True))", kept, reduces=True)
        elif kind == "masked_mean":
            b = self._pick(lambda v: v.shape == a.shape and v is not a)
            if b is not None:
                shape = tuple(n for i, n in enumerate(a.shape) if i != dim + len(a.shape))
                self._emit(f"({a.name} * ({b.name} > 0)).sum({dim}) / ({b.name} > 0).sum({dim}).clamp_min(1)",
                           shape, reduces=True)
        elif kind == "pairwise" and len(a.shape) >= 2:
            b = self._pick(lambda v: v.shape == a.shape)
            if b is not None:
                self._emit(f"(({a.name}[..., :, None, :] - {b.name}[..., None, :, :]) ** 2).sum(-1)",
                           (*a.shape[:-1], a.shape[-2]), reduces=True)
        elif kind == "temperature" and len(a.shape) >= 2:
            self._emit(f"torch.softmax({a.name} / {a.name}.std(-1, keepdim=True).clamp_min(0.1), -1)", a.shape,
                       reduces=True)
        elif kind == "standardise":
            self._emit(f"({a.name} - {a.name}.mean({dim}, keepdim=True)) / ({a.name}.std({dim}, keepdim=True) + 1e-5)",
                       a.shape, reduces=True)
        elif kind == "one_hot" and a.shape[-1] > 1:
            self._emit(f"F.one_hot({a.name}.argmax(-1), {a.shape[-1]}).float() * {a.name}", a.shape, reduces=True)
        elif kind == "logsigmoid":
            self._emit(f"F.logsigmoid({a.name})", a.shape)

    def build(self, steps: int) -> Program:
        while len(self.prog.lines) < steps or not self.values[-1].reduced:
            self.step()
            if len(self.prog.lines) > 3 * steps:
                break
        out = self.values[-1]
        other = [v for v in self.values[len(self.prog.args):-1] if v.reduced]
        if other and self.rng.random() < 0.25:  # two outputs
            self.prog.lines.append(f"return {out.name}, {self.rng.choice(other).name}")
        else:
            self.prog.lines.append(f"return {out.name}")
        return self.prog


def random_program(seed: int, steps: int | None = None, extended: int = 0, big: bool = False) -> Program:
    r = random.Random(seed * 7919 + 1)
    return _Builder(seed, extended, _BIG if big else None).build(steps or r.randint(3, 6))


@dataclass
class Outcome:
    verdict: str  # ok | refused | noisy (torch's float32 misses float64 too) | WRONG | CRASH
    detail: str = ""


def _close(got: torch.Tensor, ref: torch.Tensor, tol: float) -> tuple[bool, str]:
    got, ref = got.double(), ref.double()
    if got.shape != ref.shape:
        return False, f"shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    compared = ~torch.isnan(ref)  # NaN in the reference: not compared (README's guarantees)
    fin = torch.isfinite(ref) & compared
    if not torch.equal(torch.isinf(got) & ~fin & compared, torch.isinf(ref) & compared):
        return False, "infinities differ"
    if (torch.isnan(got) & compared).any():
        return False, "NaN where the reference is a number"
    scale = 1.0 + ref[fin].abs().max().item() if fin.any() else 1.0
    err = (got[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0
    return err <= tol * scale, f"max error {err:.3g} (scale {scale:.3g})"


def _tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def _ill_conditioned(fn, fresh: list[torch.Tensor], ref: tuple[torch.Tensor, ...], tol: float) -> Outcome | None:
    """An outcome "noisy" where torch's own float32 result is as far from float64's as the compiled one:
    a program amplifying rounding (F.normalize of a mean that is 0 over the reals: ±1 from noise of 1e-8,
    extended level-2 seed 28) has no float32 answer to match."""
    with torch.no_grad():
        eager = _tuple(fn(*(t.detach() for t in fresh)))
    for k, (a, b) in enumerate(zip(eager, ref)):
        ok, why = _close(a, b.detach(), tol)
        if not ok:
            return Outcome("noisy", f"torch in float32 misses float64 too (output {k}: {why})")
    return None


def _ill_conditioned_grad(fn, fresh, outs: list[int], gouts, k: int, want: torch.Tensor, tol: float) -> Outcome | None:
    """"noisy" where torch's own float32 gradient of argument k (outputs `outs` fed `gouts`) misses
    float64's as far (see _ill_conditioned)."""
    xs = [t.clone().requires_grad_(t.is_floating_point()) for t in fresh]
    got = _tuple(fn(*xs))
    try:
        (g,) = torch.autograd.grad([got[i] for i in outs], [xs[k]], [c.to(got[i].dtype) for i, c in zip(outs, gouts)],
                                   allow_unused=True)
    except RuntimeError:
        return None
    ok, why = _close(g if g is not None else torch.zeros_like(xs[k]), want, tol)
    return None if ok else Outcome("noisy", f"torch in float32 misses float64's gradient too ({why})")


def check(p: Program, grad: bool = False, dynamic: bool = False, tol: float = 2e-4) -> Outcome:
    fn = p.function()
    try:
        prog = neptune_eq.compile(fn, *p.inputs(p.seed), dynamic=True if dynamic else None)
        # a dynamic compile is called at another length of n (the program may keep it static: a recompile)
        fresh = p.inputs(p.seed + 10_000, sizes={"n": p.sizes["n"] + 3} if dynamic else None)
        floating = [t.is_floating_point() and grad for t in fresh]
        leaves = [t.clone().requires_grad_(f) for t, f in zip(fresh, floating)]
        ref_in = [(t.double() if t.is_floating_point() else t).requires_grad_(f) for t, f in zip(fresh, floating)]
        got, ref = _tuple(prog(*leaves)), _tuple(fn(*ref_in))
        for k, (a, b) in enumerate(zip(got, ref, strict=True)):
            ok, why = _close(a, b, tol)
            if not ok:
                return _ill_conditioned(fn, fresh, ref, tol) or Outcome("WRONG", f"output {k}: {why}")
        if grad and any(t.requires_grad for t in ref):
            floats = [t for t in ref_in if t.requires_grad]
            for k, (a, b) in enumerate(zip(got, ref)):
                if b.requires_grad and not a.requires_grad:  # detached: right only where torch's gradient is 0
                    gs = torch.autograd.grad(b, floats, torch.ones_like(b), allow_unused=True, retain_graph=True)
                    if any(g is not None and g.abs().max() > 0 for g in gs):
                        return Outcome("WRONG", f"output {k} has no gradient; float64's is not zero")
            gen = torch.Generator().manual_seed(p.seed + 1)
            live = [(a, b) for a, b in zip(got, ref) if a.requires_grad]
            gouts = [torch.randn(b.shape, generator=gen, dtype=torch.float64) for _, b in live]
            if live:
                torch.autograd.backward([a for a, _ in live], [g.to(a.dtype) for g, (a, _) in zip(gouts, live)])
                torch.autograd.backward([b for _, b in live], gouts)
            for a, b, v in zip(leaves, ref_in, p.args):
                if not v.integer:
                    ga = a.grad if a.grad is not None else torch.zeros_like(a)
                    gb = b.grad if b.grad is not None else torch.zeros_like(b)
                    ok, why = _close(ga, gb, 10 * tol)
                    if not ok:
                        outs = [i for i, a in enumerate(got) if a.requires_grad]
                        return (_ill_conditioned_grad(fn, fresh, outs, gouts, p.args.index(v), gb, 10 * tol)
                                or Outcome("WRONG", f"gradient of {v.name}: {why}"))
        return Outcome("ok")
    except NeptuneError as e:
        return Outcome("refused", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    except Exception as e:  # a fuzzer reports every other failure as a crash
        return Outcome("CRASH", "".join(traceback.format_exception(e)[-3:])[-600:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:20", help="a:b, the seeds to draw")
    ap.add_argument("--grad", action="store_true", help="also check gradients against float64")
    ap.add_argument("--dynamic", action="store_true", help="compile dynamic and call at another length")
    ap.add_argument("--show", action="store_true", help="print every program, not only the failures")
    ap.add_argument("--big", action="store_true", help="extents 37, 20, 9, 3 (tiles that differ) for 7, 4, 3, 2")
    ap.add_argument("--extended", type=int, nargs="?", const=1, default=0,
                    help="1: also draw losses, comparisons, gathers and clamps; 2: also argmax selections, "
                         "masked means, pairwise distances (seeds draw other programs at each level)")
    args = ap.parse_args(argv)
    lo, hi = (int(s) for s in args.seeds.split(":"))
    counts: dict[str, int] = {}
    for seed in range(lo, hi):
        p = random_program(seed, extended=args.extended, big=args.big)
        out = check(p, grad=args.grad, dynamic=args.dynamic)
        counts[out.verdict] = counts.get(out.verdict, 0) + 1
        first = out.detail.splitlines()[0] if out.detail else ""
        print(f"[{seed - lo + 1}/{hi - lo}] seed {seed}: {out.verdict} {first}", flush=True)
        if out.verdict in ("WRONG", "CRASH") or args.show:
            print(p.source + (out.detail if out.verdict == "CRASH" else ""), flush=True)
    print("; ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 1 if counts.get("WRONG") or counts.get("CRASH") else 0


if __name__ == "__main__":
    sys.exit(main())
