"""Float64 evaluation of IR programs with torch (CPU or GPU): the oracle every plan is checked against."""

from __future__ import annotations

import math

import torch

from . import ir
from .contraction import opened
from .ir import ProgramError
from .ops import MONOIDS

_TORCH_OPS = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"), "mod": torch.remainder,
    "neg": torch.neg, "exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2,
    "log1p": torch.log1p, "expm1": torch.expm1, "erf": torch.erf,
    "tanh": torch.tanh, "sin": torch.sin, "cos": torch.cos, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "abs": torch.abs,
    "max2": torch.maximum, "min2": torch.minimum, "where": torch.where,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne,
    "and": torch.logical_and, "or": torch.logical_or, "not": torch.logical_not,
    "float": lambda x: x.to(torch.float64),
    "round_bf16": lambda x: x.to(torch.bfloat16).to(x.dtype), "round_f16": lambda x: x.to(torch.float16).to(x.dtype),
    "round_f32": lambda x: x.to(torch.float32).to(x.dtype),
    "pow": torch.pow, "hypot": torch.hypot,
    "stopgrad": lambda x: x,  # (x.detach(): its value; a captured program's reference may hold one)
    "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "rint": torch.round,
}


_NARROW_INTS = (torch.uint8, torch.int8, torch.int16)


def _finite_constant(n: ir.Node) -> bool:
    return isinstance(n, ir.Const) and math.isfinite(float(n.value))


class _Val:
    __slots__ = ("dims", "t")

    def __init__(self, t: torch.Tensor, dims: tuple[str, ...]):
        self.t, self.dims = t, dims


def evaluate(program: ir.Program, inputs: dict[str, torch.Tensor], *, nodes: list[ir.Node] | None = None,
             dtype=torch.float64, restrict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Evaluate every output (or the given nodes) in `dtype`. Tensors come back in output axis order.

    `restrict` evaluates only some indices of an axis (e.g. 256 query rows of a long attention):
    outputs then have len(indices) entries along it.
    """
    restrict = {a: t.to(torch.long) for a, t in (restrict or {}).items()}
    order = list(program.axes)
    device = next(iter(inputs.values())).device if inputs else torch.device("cpu")
    for name, spec in program.inputs.items():
        if name not in inputs:
            raise ProgramError(f"missing input '{name}'")
        want = program.input_shape(name)
        if tuple(inputs[name].shape) != want:
            raise ProgramError(f"input '{name}' has shape {tuple(inputs[name].shape)}, expected {want} for axes "
                               f"{spec.axes}")
    env: dict[str, torch.Tensor] = {}  # the inputs a load reads, converted on first use
    memo: dict[ir.Node, _Val] = {}

    def tensor(name: str) -> torch.Tensor:
        t = env.get(name)
        if t is None:
            t = inputs[name]
            # (narrow integers as int64, as the kernels load them: the program's arithmetic on them is exact)
            t = env[name] = t.to(device=device, dtype=dtype) if t.is_floating_point() else \
                t.to(device=device, dtype=torch.int64 if t.dtype in _NARROW_INTS else t.dtype)
        return t

    def canon(dims) -> tuple[str, ...]:
        return tuple(sorted(set(dims), key=order.index))

    def size(d: str) -> int:
        return len(restrict[d]) if d in restrict else program.axes[d]

    def expand(v: _Val, dims: tuple[str, ...]) -> torch.Tensor:
        t = v.t
        if v.dims == dims:
            return t
        perm = [v.dims.index(d) for d in dims if d in v.dims]
        t = t.permute(perm) if perm != list(range(len(perm))) else t
        shape = [size(d) if d in v.dims else 1 for d in dims]
        return t.reshape(shape)

    def arange(ax: str) -> _Val:
        if ax in restrict:
            return _Val(restrict[ax].to(device), (ax,))
        return _Val(torch.arange(program.axes[ax], device=device), (ax,))

    def go(n: ir.Node) -> _Val:
        # (keyed by the node, which the memo keeps alive: selected_product evaluates factors it builds
        # itself, and keyed by id() a later node reusing a freed one's id read its value, dims and all)
        hit = memo.get(n)
        if hit is not None:
            return hit
        memo[n] = out = compute(n)
        return out

    def compute(n: ir.Node) -> _Val:
        if isinstance(n, ir.Const):
            # (filled on the device: torch.tensor(v, device=cuda) copies from the host and waits for the
            # stream, a synchronisation per call of the index checks and data bounds that evaluate here)
            return _Val(torch.full((), n.value, dtype=dtype, device=device), ())
        if isinstance(n, ir.Length):  # (the axis's length, also where `restrict` evaluates a few of its indices)
            return _Val(torch.full((), program.axes[n.axis], dtype=torch.int64, device=device), ())
        if isinstance(n, ir.Index):
            return arange(n.axis)
        if isinstance(n, ir.Load):
            t = tensor(n.tensor)
            if all(isinstance(e, ir.Index) for e in n.index) and len({e.axis for e in n.index}) == len(n.index):
                return go_plain(t, tuple(e.axis for e in n.index))
            idx = [go(e) for e in n.index]
            dims = canon(d for v in idx for d in v.dims)
            return _Val(t[tuple(expand(v, dims).long() for v in idx)], dims)
        if isinstance(n, ir.Call):
            args = [go(a) for a in n.args]
            dims = canon(d for v in args for d in v.dims)
            return _Val(_TORCH_OPS[n.op](*(expand(v, dims) for v in args)), dims)
        if isinstance(n, ir.Reduce):
            body = n.body
            if n.op == "sum":  # (a product of three factors or more, or under conditions: one einsum)
                got = selected_product(n)
                if got is not None:
                    return got
            if n.op == "sum" and isinstance(body, ir.Call) and body.op == "mul":
                a, b = go(body.args[0]), go(body.args[1])
                dims = canon((*a.dims, *b.dims))
                out_dims = tuple(d for d in dims if d != n.axis)
                letters = {d: chr(97 + k) for k, d in enumerate(dims)}
                spec = "".join(letters[d] for d in a.dims) + "," + "".join(letters[d] for d in b.dims)
                spec += "->" + "".join(letters[d] for d in out_dims)
                return _Val(torch.einsum(spec, a.t.to(dtype), b.t.to(dtype)), out_dims)
            v = go(body)
            k = v.dims.index(n.axis)
            t = v.t.to(dtype) if not v.t.is_floating_point() else v.t
            if n.op == "sum":
                r = t.sum(dim=k)
            elif n.op == "max":
                r = t.amax(dim=k)
            else:
                r = t.amin(dim=k)
            return _Val(r, v.dims[:k] + v.dims[k + 1:])
        if isinstance(n, ir.StateRef):
            raise ProgramError(f"cannot evaluate symbol '{n.key}' without a binding")
        raise TypeError(type(n))

    def selected_product(n: ir.Reduce) -> _Val | None:
        """Σ over n.axis of a product under conditions (Σ_i [t_i = j]·c_i·h[i, d], the gradient of a
        gather), or of three factors or more (Σ_d x̂[i, d]·ŵ[j, d]·s, a backward's scaled product), as
        one einsum of its factors and 0/1 conditions, each over its own axes: the body's full [i, j, d]
        block would not fit (CosFace's backward at 8192 × 32768 × 512: 1 TiB). Exact only where every
        factor is finite (0·x is then 0, as the select gives); otherwise None, and the body is
        evaluated whole."""
        parts = opened(n.body)
        if not parts.conditions and len(parts.factors) < 3:
            return None
        vals = [go(f) for f in parts.factors]
        # (a finite constant needs no look: Σ_l [cu[l] <= i]·1, a token's document counted from its
        # offsets per call, had synchronised the host here on every call, which also kept the per-call
        # loop bounds out of their CUDA graph: 4.1 ms of host a packed-prefill call, H100)
        if not all(bool(torch.isfinite(v.t).all()) for f, v in zip(parts.factors, vals)
                   if v.t.is_floating_point() and not _finite_constant(f)):
            return None
        vals += [_Val(v.t.to(dtype), v.dims) for v in map(go, parts.conditions)]
        # an operand over a subset of another's axes is multiplied into it first, so that no pairwise
        # step of the einsum holds more than its largest operand
        # (by position: a factor repeated, (x − μ)·r·(x − μ)·r for a squared norm, is one memoised value
        # twice, and removing it by identity had dropped both copies — Σ_d of a layer norm's square
        # evaluated as 0, fuzz seed 1651)
        merged = True
        while merged and len(vals) > 2:
            merged = False
            for i in sorted(range(len(vals)), key=lambda k: len(vals[k].dims)):
                x = vals[i]
                j = next((k for k, y in enumerate(vals) if k != i and set(x.dims) <= set(y.dims)), None)
                if j is not None:
                    into = vals[j]
                    vals = [v for k, v in enumerate(vals) if k not in (i, j)]
                    vals.append(_Val(into.t.to(dtype) * expand(_Val(x.t.to(dtype), x.dims), into.dims), into.dims))
                    merged = True
                    break
        dims = canon(d for v in vals for d in v.dims)
        if n.axis not in dims:
            return None
        out_dims = tuple(d for d in dims if d != n.axis)
        letters = {d: chr(97 + k) for k, d in enumerate(dims)}
        spec = ",".join("".join(letters[d] for d in v.dims) for v in vals)
        spec += "->" + "".join(letters[d] for d in out_dims)
        return _Val(torch.einsum(spec, *(v.t.to(dtype) for v in vals)), out_dims)

    def go_plain(t: torch.Tensor, axes: tuple[str, ...]) -> _Val:
        for k, a in enumerate(axes):
            if a in restrict:
                t = t.index_select(k, restrict[a].to(t.device))
        dims = canon(axes)
        perm = [axes.index(d) for d in dims]
        return _Val(t.permute(perm) if perm != list(range(len(perm))) else t, dims)

    results: dict[str, torch.Tensor] = {}
    if nodes is not None:
        return {str(k): go(nd).t for k, nd in enumerate(nodes)}
    for out in program.outputs:
        v = go(out.expr)
        dims = canon(out.axes)
        t = expand(v, dims)
        t = t.expand([size(d) for d in dims])
        perm = [dims.index(a) for a in out.axes]
        results[out.name] = t.permute(perm).to(dtype)
    return results


def random_inputs(program: ir.Program, *, seed: int | None = None, device="cpu", scale: float = 1.0,
                  offset: float = 0.0, dtypes: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Fresh random inputs: floats ~ offset + scale·N(0,1), integers uniform in the indexed axis' range.
    Drawn on `device` itself (a seed gives the same values on every run of one kind of device, not
    across kinds): the stress check of a 4096 × 65536 program drew 2 GB of float64 on the host per
    input set, some ten seconds each on the GPU machine. On a GPU a 16-bit or float32 input is drawn
    in float32 (linear cross-entropy's 128256 × 4096 weight in float64 took 4 GB of device memory
    beside the benchmark's own tensors); the host keeps its float64 draw."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(torch.seed() if seed is None else seed)
    out = {}
    for name, spec in program.inputs.items():
        shape = program.input_shape(name)
        dt = (dtypes or {}).get(name, spec.dtype)
        if dt in ir.FLOAT_DTYPES:
            draw = torch.float64 if device.type == "cpu" or dt == "float64" else torch.float32
            t = torch.randn(shape, generator=gen, dtype=draw, device=device).mul_(scale).add_(offset)
            out[name] = t.to(getattr(torch, dt))
            del t
        elif dt == "bool":
            out[name] = torch.rand(shape, generator=gen, device=device) < 0.5
        else:
            hi = _int_range(program, name)
            out[name] = torch.randint(0, hi, shape, generator=gen, dtype=getattr(torch, dt), device=device)
    return out


def _int_range(program: ir.Program, tensor: str) -> int:
    """Integer inputs used as gather indices must stay in range of the axis they index."""
    for out in program.outputs:
        for n in ir.walk(out.expr):
            if isinstance(n, ir.Load):
                for k, e in enumerate(n.index):
                    if isinstance(e, ir.Load) and e.tensor == tensor:
                        return program.axes[program.inputs[n.tensor].axes[k]]
    return 4


__all__ = ["MONOIDS", "evaluate", "random_inputs"]
