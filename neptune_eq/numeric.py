"""What kind of number a value is: an integer computed exactly, or a float in the program's precision.

The IR is untyped (every value is a real number); the kernels are not. Integers read from integer
tensors, indices, predicates (0/1) and the integer-closed operations on them (+, −, ·, //, %, neg,
abs, max, min, where) are computed in integer arithmetic, and their sum/max/min reductions
accumulate in int64 like torch's: an int64 row sum of values near 2^44 is exact, not rounded
through float32. Everything else is a float in the program's compute precision: float64 when the
program reads or writes float64 tensors (torch computes those in float64), else float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from . import ir

INTEGER_DTYPES = ("int32", "int64", "bool", "uint8", "int8", "int16")
# operations that map integers to integers (exactly, up to int64 wrap-around like torch's)
INTEGER_CLOSED = frozenset({"add", "sub", "mul", "floordiv", "mod", "neg", "abs", "max2", "min2"})
PREDICATES = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not"})
# the identities of integer reductions (int64): max over nothing is the smallest int64
INT_IDENTITY = {"sum": 0, "max": -(2**63), "min": 2**63 - 1}


# the longest axis of static length whose reductions the kernels write out term by term, in index order
SHORT_AXIS = 8


def written_out(r: ir.Reduce, program: ir.Program) -> bool:
    """Is `r` a reduction every kernel computes term by term in index order (lower/kernel.py:
    KernelWriter.unrolled): over a short axis of static length, of an elementwise body (no reduction or
    state inside)? Computed in kernels that do not contract a multiply and an add into one FMA (their
    KernelSource.exact_arith), it has the same bits wherever it is computed, so a value holding it may
    be compared with its own max recomputed in another kernel (extract/exact_tests.py)."""
    n = program.axes.get(r.axis)
    return r.op in ("sum", "max", "min") and r.axis not in program.dynamic and n is not None and \
        1 <= n <= SHORT_AXIS and not any(isinstance(x, ir.Reduce | ir.StateRef) for x in ir.walk(r.body))


def compute_dtype(program: ir.Program) -> str:
    """float64 when any input or output of the program is float64, else float32."""
    dts = [s.dtype for s in program.inputs.values()] + [o.dtype or "float32" for o in program.outputs]
    return "float64" if "float64" in dts else "float32"


def integral(node: ir.Node, int_leaf: Callable[[ir.Node], bool]) -> bool:
    """Is `node` an integer computed exactly by integer arithmetic? `int_leaf(n)` answers for the
    leaves that are loads and symbols (an integer tensor, the state of an integer reduction)."""
    memo: dict[int, bool] = {}
    for n in ir.walk(node):
        memo[id(n)] = _integral_here(n, memo, int_leaf)
    return memo[id(node)]


def _integral_here(n: ir.Node, memo: dict[int, bool], int_leaf) -> bool:
    if isinstance(n, ir.Const):
        return math.isfinite(n.value) and float(n.value).is_integer() and abs(n.value) < 2**63
    if isinstance(n, ir.Index):
        return True
    if isinstance(n, ir.Length):  # (the kernel's integer length argument)
        return True
    if isinstance(n, ir.Load | ir.StateRef):
        return int_leaf(n)
    if isinstance(n, ir.Reduce):
        return memo[id(n.body)]
    assert isinstance(n, ir.Call)
    if n.op in PREDICATES:
        return True
    if n.op == "where":
        return memo[id(n.args[1])] and memo[id(n.args[2])]
    return n.op in INTEGER_CLOSED and all(memo[id(a)] for a in n.args)


def input_leaf(program: ir.Program, buffers: dict | None = None, int_syms: set[str] = frozenset()):
    """`int_leaf` for integral(): integer input tensors, int64 buffers, states named in `int_syms`."""
    buffers = buffers or {}

    def leaf(n: ir.Node) -> bool:
        if isinstance(n, ir.Load):
            spec = program.inputs.get(n.tensor) or buffers.get(n.tensor)
            return spec is not None and spec.dtype in INTEGER_DTYPES
        return isinstance(n, ir.StateRef) and n.name in int_syms

    return leaf


def bounds(n: ir.Node, extents: dict[str, int], dtypes: dict[str, str] | None = None) -> tuple[float, float]:
    """[lo, hi] of an integer expression over the axes' ranges (±inf where unknown): a load of a
    bool tensor (named in `dtypes`) is 0 or 1, of any other tensor unbounded. One interval
    arithmetic for the lowering (is an index within its tensor?) and the frontend's index checks."""
    if isinstance(n, ir.Const):
        return (n.value, n.value) if math.isfinite(n.value) else (-math.inf, math.inf)
    if isinstance(n, ir.Index):
        return (0, extents[n.axis] - 1) if n.axis in extents else (-math.inf, math.inf)
    if isinstance(n, ir.Load):
        return (0, 1) if (dtypes or {}).get(n.tensor) == "bool" else (-math.inf, math.inf)
    if isinstance(n, ir.Length):
        return 1, extents.get(n.axis, math.inf)
    if not isinstance(n, ir.Call):
        return -math.inf, math.inf
    args = [bounds(a, extents, dtypes) for a in n.args]
    op = n.op
    if op in PREDICATES:
        return 0, 1
    if op == "where":
        return min(args[1][0], args[2][0]), max(args[1][1], args[2][1])
    if op == "add":
        return args[0][0] + args[1][0], args[0][1] + args[1][1]
    if op == "sub":
        return args[0][0] - args[1][1], args[0][1] - args[1][0]
    if op == "neg":
        return -args[0][1], -args[0][0]
    if op in ("max2", "min2"):
        f = max if op == "max2" else min
        return f(args[0][0], args[1][0]), f(args[0][1], args[1][1])
    if op == "mod" and args[1][0] == args[1][1] and args[1][0] > 0:
        return 0, args[1][0] - 1  # floored remainder: the sign of the divisor
    if any(math.isinf(b) for a in args for b in a):
        return -math.inf, math.inf
    if op == "mul":
        products = [a * b for a in args[0] for b in args[1]]
        return min(products), max(products)
    if op == "floordiv" and args[1][0] == args[1][1] and args[1][0] > 0:
        d = args[1][0]
        return _floor_div(args[0][0], d), _floor_div(args[0][1], d)
    return -math.inf, math.inf


def _floor_div(a: float, d: float) -> float:
    """⌊a / d⌋, exact for integers however large (a / d in floats is not)."""
    if float(a).is_integer() and float(d).is_integer():
        return int(a) // int(d)
    return math.floor(a / d)


def index_range(e: ir.Node, extents: dict[str, int]) -> tuple[float, float] | None:
    """[lo, hi] of an integer index expression over the axes' ranges, or None where it depends on
    data (a gather) or on operations this interval arithmetic does not follow."""
    lo, hi = bounds(e, extents)
    return None if math.isinf(lo) or math.isinf(hi) else (lo, hi)


def index_within(e: ir.Node, extents: dict[str, int], n: int) -> bool:
    """Does index expression `e` stay within [0, n) for every index of the axes it uses?"""
    r = index_range(e, extents)
    return r is not None and r[0] >= 0 and r[1] <= n - 1


def shifted_exp_sum(node: ir.Node) -> str | None:
    """How `node` is Σⱼ e^{a − shift} (or 2^…) with shift the row max of a: "plain" (a − maxⱼ a) or
    "guarded" (torch's a − (maxⱼ a = −∞ ? c : maxⱼ a)); None for anything else.

    The term at the max is e⁰ = 1 and none is negative, so the plain sum is ≥ 1 where maxⱼ a is
    finite and NaN where it is ±∞ or NaN (∞ − ∞ in a term): never 0. The guarded sum is also 0, on
    a row of −∞ (or where the max is +∞ and no term is NaN)."""
    if not (isinstance(node, ir.Reduce) and node.op == "sum" and isinstance(node.body, ir.Call)
            and node.body.op in ("exp", "exp2")):
        return None
    x = node.body.args[0]
    if not (isinstance(x, ir.Call) and x.op == "sub"):
        return None
    a, shift = x.args
    top = ir.Reduce("max", node.axis, a)
    if shift == top:
        return "plain"
    if (isinstance(shift, ir.Call) and shift.op == "where" and shift.args[2] == top
            and shift.args[0] == ir.Call("eq", (top, ir.Const(-math.inf)))
            and isinstance(shift.args[1], ir.Const) and math.isfinite(shift.args[1].value)):
        return "guarded"
    return None


def reciprocal_exact(b: ir.Node, inputs: dict[str, ir.TensorSpec]) -> bool:
    """Is a·(1/b) a/b within rounding wherever the program computes it? It is where 1/b is normal or
    ±∞, i.e. b is 0, ±∞, NaN or |b| in [2⁻¹²⁶, 2¹²⁶]: a·(1/0) is ±∞ or NaN as a/0 is. A subnormal b
    makes 1/b overflow to ∞ where a/b is finite: a wrong answer, so only what is proven qualifies —
    a normal constant, a sum of shifted exponentials (0, NaN or in [1, n]), or an input that holds
    one (a statistic the forward saved)."""
    if isinstance(b, ir.Const):
        return b.value == 0 or not math.isfinite(b.value) or 2.0**-126 <= abs(b.value) <= 2.0**126
    if isinstance(b, ir.Load):
        spec = inputs.get(b.tensor)
        b = spec.holds if spec is not None and spec.holds is not None else b
    return shifted_exp_sum(b) is not None


_ROUNDED = {"round_bf16": "bfloat16", "round_f16": "float16", "round_f32": "float32"}


def held_wide(factors: list[ir.Node]) -> bool:
    """Does torch hold a computed operand in float32: a `.float()` value of 16-bit data that the frontend
    marks (`round_f32`, frontend/ops_reduce.py `_held`)? Beside a 16-bit load it is then multiplied in
    float32, as torch's float32 matmul does, not rounded to the load's 16 bits: linear attention's
    Σ_e ∂kv[d, e]·v[j, e] (∂kv a float32 gradient whose terms largely cancel in ∂k) had 4.5e-3 relative
    error in fp16 against eager's 2e-4. (Float32 data alone does not count: a float32 loss's upstream
    gradient scales a 16-bit gradient that torch holds in the 16 bits of the value it flows to.)"""
    return any(isinstance(n, ir.Call) and n.op == "round_f32" for f in factors for n in ir.walk(f))


def held_dtypes(node: ir.Node, dtype_of) -> set[str]:
    """The floating dtypes torch holds `node`'s data in: those of the tensors it loads, except below a
    rounding (`round_f32(q / ‖q‖)`: a float32 value of bf16 loads; the frontend marks a float32 matmul
    operand so), which stands for its own dtype."""
    out: set[str] = set()
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, ir.Call) and n.op in _ROUNDED:
            out.add(_ROUNDED[n.op])
        elif isinstance(n, ir.Load):
            if (dt := dtype_of(n.tensor)) in ir.FLOAT_DTYPES:
                out.add(dt)
        else:
            stack.extend(n.children())
    return out
