"""Values a program rounds to a narrower float dtype, read as torch holds them.

The kernels compute in float32 (float64 for float64 programs): a bf16 program's products, sums and
exponentials are not rounded to bf16 between operations — more accurate than torch's per-operation
rounding, invisible at the bf16 precision of its outputs, and what FlashAttention does with a bf16
score. A narrowness the program *introduces* is another matter: `x.bfloat16().float()`, fake
quantisation, a half that overflows to inf, Llama's RMSNorm casting its fp32 row back to the input's
bf16 before an fp32 weight multiplies it. There the rounding is the program's own operation and wider
arithmetic shows it, as do a comparison (`x.half() == inf`) and a cancellation (`x.half() − y.half()`).
So a value is *narrowed* when it has a float dtype narrower than an operand it was computed from (a
cast down, an integer made bf16, and what is computed from that at the narrow dtype); every operation
that reads a narrowed value takes it *exact* — rebuilt from its operands' exact expressions with every
value of a narrow dtype rounded to it (ops.py `round_bf16`, `round_f16`, `round_f32`): torch's
arithmetic, operation by operation, down to the loads — except operations that only move values and
matmuls at the value's own dtype (which round their operands for the tensor cores anyway: a softmax
cast to bf16 before P @ V keeps FlashAttention's delayed normalisation). Narrowness inherited from the
inputs (bf16 scores of bf16 q and k, widened by softmax(dtype=float32)) keeps the unrounded float32
algebra.
"""

from __future__ import annotations

import math
import operator

import torch
from torch import fx

from .. import ir
from ..ops import ROUNDINGS

# which dtype is narrower than which (bf16 and fp16 are not ordered: torch promotes them to fp32)
RANK = {torch.bfloat16: 1, torch.float16: 1, torch.float32: 2, torch.float64: 3}


def _dtypes(val) -> list[torch.dtype]:
    if isinstance(val, tuple | list):
        return [d for v in val for d in _dtypes(v)]
    return [val.dtype] if isinstance(val, torch.Tensor) else []


def computes_in(node: fx.Node, infos: dict) -> int:
    """The rank of the widest float dtype among a call's tensor operands and results; above every
    float's for a call with a bool or integer result (a comparison, isfinite: it reads its operands'
    values exactly, as torch holds them, and nothing rounds its result later)."""
    dts = _dtypes(node.meta.get("val"))
    if any(not d.is_floating_point for d in dts):
        return max(RANK.values()) + 1
    dts += [info.dtype for a in node.all_input_nodes if hasattr(info := infos.get(a), "dtype")]
    return max((RANK.get(d, 0) for d in dts), default=0)


# integers converted to a float: to bf16 or fp16 a narrowing the program chose (img.bfloat16() * 3 is
# rounded in bf16 by torch; 765 is 764), to float32 not (the kernels' conversion of an int64 rounds the
# same way); booleans (a mask made a float) convert exactly
_SOURCE_RANK = {torch.int64: 2, torch.int32: 2, torch.int16: 2, torch.int8: 2, torch.uint8: 2}


def _rank_of(val) -> int:
    return min((RANK.get(d, 0) or 9 for d in _dtypes(val)), default=9)


def narrowed(tx, node: fx.Node) -> bool:
    """`node` holds a float value of a dtype narrower than the program computed it from (module doc):
    a cast down, or an operation at that narrow dtype on such a value (memoised in `tx.narrowed`)."""
    got = tx.narrowed.get(node)
    if got is not None:
        return got
    if node.op != "call_function":
        out = False
    elif node.target is operator.getitem:
        out = narrowed(tx, node.args[0])
    else:
        rank = _rank_of(node.meta.get("val"))
        ins = [tx.infos[a].dtype for a in node.all_input_nodes if hasattr(tx.infos.get(a), "dtype")]
        # (an integer operand of anything but a cast indexes, W[idx], or mixes in small counts: no narrowing)
        cast = node.target is torch.ops.aten._to_copy.default
        out = rank < 9 and (any(max(RANK.get(d, 0), _SOURCE_RANK.get(d, 0) if cast else 0) > rank for d in ins) or any(
            narrowed(tx, a) and RANK.get(tx.infos[a].dtype, 0) >= rank for a in node.all_input_nodes
            if hasattr(tx.infos.get(a), "dtype")))
    tx.narrowed[node] = out
    return out


def narrower(dtype: torch.dtype, rank: int) -> bool:
    """A value of `dtype` read by arithmetic of `rank` is rounded first."""
    return 0 < RANK.get(dtype, 0) < rank


def representable(e: ir.Node, dtype: torch.dtype, input_dtypes: dict[str, torch.dtype]) -> bool:
    """`e` is certainly a number of `dtype` already (a load of such a tensor, a rounded value, a
    constant that converts exactly, a selection or negation of those)."""
    name = str(dtype).removeprefix("torch.")
    if isinstance(e, ir.Load):
        return input_dtypes.get(e.tensor) == dtype
    if isinstance(e, ir.Const):
        v = torch.tensor(e.value, dtype=torch.float64)
        return bool(v.isnan() or v.to(dtype).to(torch.float64) == v)
    if isinstance(e, ir.Call) and e.op == ROUNDINGS.get(name):
        return True
    if isinstance(e, ir.Call) and e.op in ("neg", "abs"):
        return representable(e.args[0], dtype, input_dtypes)
    if isinstance(e, ir.Call) and e.op == "where":
        return all(representable(a, dtype, input_dtypes) for a in e.args[1:])
    if isinstance(e, ir.Call) and e.op == "mul" and dtype == torch.bfloat16:
        # a scale by 2^k only moves the exponent (a score's 1/√64): bf16 has float32's range, so the
        # float32 product overflows where the bf16 one does (not so fp16's), and is exact but in the
        # subnormals, which the GPU's float32 arithmetic flushes to zero anyway
        for x, c in (e.args, e.args[::-1]):
            if isinstance(c, ir.Const) and _power_of_two(c.value):
                return representable(x, dtype, input_dtypes)
    return False


def _power_of_two(v: float) -> bool:
    m, _ = math.frexp(abs(v)) if math.isfinite(v) and v != 0 else (0.0, 0)
    return m == 0.5


def rounded(e: ir.Node, dtype: torch.dtype, compute_rank: int, input_dtypes: dict) -> ir.Node:
    """`e` rounded to `dtype` where the kernels compute wider than it."""
    if not narrower(dtype, compute_rank) or representable(e, dtype, input_dtypes):
        return e
    return ir.Call(ROUNDINGS[str(dtype).removeprefix("torch.")], (e,))


def _round_parts(built, val, compute_rank: int, input_dtypes: dict):
    if isinstance(val, tuple | list):
        return tuple(b if not isinstance(b, ir.Node) else _round_parts(b, v, compute_rank, input_dtypes)
                     for b, v in zip(built, val))
    if isinstance(built, ir.Node) and isinstance(val, torch.Tensor) and val.dtype.is_floating_point:
        return rounded(built, val.dtype, compute_rank, input_dtypes)
    return built


def exact(tx, node: fx.Node):
    """The expression of `node` with every narrow float value rounded to its dtype, as torch holds it
    (memoised in `tx.exact_exprs`; a multi-result operation gives a tuple)."""
    got = tx.exact_exprs.get(node)
    if got is not None:
        return got
    if node.op in ("placeholder", "get_attr"):
        out = tx.exprs[node]  # the data itself: a number of its dtype
    elif node.target is operator.getitem:
        src, k = node.args
        out = exact(tx, src)[k]
    else:
        call = tx._call(node, pass2=True, exact=True)
        out = _round_parts(tx._handler(node).build(tx, call), node.meta.get("val"), tx.compute_rank,
                           tx.input_dtypes)
    tx.exact_exprs[node] = out
    return out
