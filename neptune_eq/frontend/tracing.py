"""How capture() traces a function: make_fx on fake tensors with in-place updates functionalised, the
decompositions that turn fused kernels and activations into their math, and the checks of the traced
graph — a user's line named where tracing fails, a zero-size value refused, a closure or module tensor
the function's Python wrote in place refused (and restored)."""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch._decomp import get_decompositions
from torch.func import functionalize
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from .source import CaptureError, describe, is_internal, location

# fused kernels (SDPA on CPU, layer/RMS norm), activations and elementwise losses are traced as their math
_aten = torch.ops.aten
_DECOMPOSITIONS = get_decompositions([
    _aten._scaled_dot_product_flash_attention_for_cpu.default, _aten.native_layer_norm.default,
    _aten._fused_rms_norm.default, _aten.silu.default, _aten.gelu.default,
    _aten.mse_loss.default, _aten.huber_loss.default, _aten.smooth_l1_loss.default,
    _aten.binary_cross_entropy.default, _aten.soft_margin_loss.default, _aten.nll_loss2d_forward.default,
    _aten.softplus.default, _aten.log_sigmoid_forward.default, _aten.glu.default, _aten.mish.default,
    _aten.leaky_relu.default,
    _aten.elu.default, _aten.celu.default, _aten.selu.default,
    _aten.hardshrink.default, _aten.softshrink.default, _aten.threshold.default,
    _aten.xlogy.Tensor, _aten.logaddexp.default, _aten.lerp.Scalar, _aten.addcmul.default,
    _aten.addcdiv.default, _aten.native_group_norm.default, _aten.norm.ScalarOpt_dim,
    _aten.native_batch_norm.default, _aten._native_batch_norm_legit.default, _aten._native_batch_norm_legit.no_stats,
    _aten._native_batch_norm_legit_no_training.default,
])


@contextlib.contextmanager
def no_warnings():
    """Python's warnings off: for traces at sizes the compiler chose (a dynamic compile's probes, the
    symbolic trace), whose torch warnings are not the user's to read — the example's own trace says
    what torch would."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class ZeroSizeCapture(CaptureError):
    """An argument or intermediate value has a zero-size dimension: nothing to compile."""


def trace(traced, tensors, mode: str = "fake") -> torch.fx.GraphModule:
    """`traced(*tensors)` as an aten graph, on fake tensors of the same sizes (or, with mode "symbolic",
    of symbolic sizes: frontend/symsizes.py)."""
    try:
        with fx_traceback.preserve_node_meta():
            # functionalize: in-place updates (s.masked_fill_(...), s += b) become value semantics;
            # writes into arguments are replayed as copy_(argument, new value) at the end
            return make_fx(functionalize(traced, remove="mutations"), tracing_mode=mode,
                           decomposition_table=_DECOMPOSITIONS, _allow_non_fake_inputs=True)(*tensors)
    except CaptureError:
        raise
    except Exception as e:  # tracing runs user code: say where it failed
        where = _failure_location(e)
        first = (str(e).strip().splitlines() or [""])[0]
        if "data-dependent" in str(e) or "DataDependent" in type(e).__name__:
            inside = _library_frame(e)
            raise CaptureError("control flow or shapes that depend on tensor values are not supported (the "
                               "function is traced once, on fake tensors)"
                               + (f"; {inside[0]} branches on tensor values at {inside[1]} —" if inside else ":")
                               + f" {first}", where) from e
        if "mutating a non-functional tensor" in str(e):
            raise CaptureError("writing in place into a tensor the function does not take as an argument (a "
                               "global, closure or module tensor) is not supported; pass it as an argument",
                               where) from e
        raise CaptureError(f"tracing failed: {type(e).__name__}: {first}", where) from e


RESTORED = 1 << 16  # closure tensors up to this many elements are restored if the trace writes them


def untouched(guarded, small: dict[int, torch.Tensor]) -> None:
    """Refuse a function whose Python code wrote a closure or module tensor in place while it was traced
    (BatchNorm's num_batches_tracked += 1 in training mode): the compiled call would not repeat the
    write. The tensor is put back as it was (if small) so that capturing changes nothing."""
    for g in guarded:
        if g.tensor._version != g.version:
            back = small.get(id(g.tensor))
            if back is not None:
                with torch.no_grad():
                    g.tensor.copy_(back)
            raise CaptureError(f"{g.source} is written in place by the function (a module buffer or closure "
                               "tensor, such as BatchNorm's running statistics in training mode); the compiled "
                               "function would not write it: call the module in eval() mode, or pass the tensor "
                               "as an argument" + ("" if back is not None else
                                                   " (it was changed by this capture and could not be restored)"))


def check_sizes(gm: torch.fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if node.op == "call_function" and not node.users and not node.is_impure():
            continue  # (nothing reads it: F.instance_norm's empty cuDNN reserve of shape (0,))
        val = node.meta.get("val")
        for v in val if isinstance(val, tuple | list) else (val,):
            # (a data-dependent size is a symbol: the translator reports that operation)
            if isinstance(v, torch.Tensor) and any(type(n) is int and n == 0 for n in v.shape):
                raise ZeroSizeCapture(f"a value of shape {tuple(v.shape)} has a zero-size dimension: nothing to "
                                      "compute", location(node))


def _library_frame(e: BaseException) -> tuple[str, str] | None:
    """(function, `file.py:line: code`) of the library function the user's last line called, at the
    deepest line the traceback reaches in that file: the check that read a tensor's value (F.gaussian_nll_loss's
    `torch.any(var < 0)`), where the user's own line only names the call. None if no such frame."""
    frames = _frames(e)
    user = [k for k, f in enumerate(frames) if not is_internal(f.tb_frame.f_code.co_filename)]
    if not user or user[-1] + 1 >= len(frames):
        return None
    entry = frames[user[-1] + 1]
    filename = entry.tb_frame.f_code.co_filename
    if not filename.endswith(".py") or any(part in filename for part in ("_dynamo", "/fx/", "_subclasses")):
        return None
    # (the deepest line in that file: a function that dispatches through a torch function mode
    # re-enters itself, the first frame stopping at its handle_torch_function)
    deepest = [f for f in frames[user[-1] + 1:] if f.tb_frame.f_code.co_filename == filename][-1]
    return entry.tb_frame.f_code.co_name, describe(filename, deepest.tb_lineno)


def _frames(e: BaseException) -> list:
    """The traceback entries of `e`, outermost first."""
    out, tb = [], e.__traceback__
    while tb is not None:
        out.append(tb)
        tb = tb.tb_next
    return out


def _failure_location(e: BaseException) -> str | None:
    user = [f for f in _frames(e) if not is_internal(f.tb_frame.f_code.co_filename)]
    return describe(user[-1].tb_frame.f_code.co_filename, user[-1].tb_lineno) if user else None
