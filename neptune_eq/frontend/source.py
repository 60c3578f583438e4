"""Where in the user's code each traced operation comes from.

While a function is traced, `SourceLocator` (a torch function mode entered inside the traced
function) records the innermost user frame of every torch call as the fx node's `stack_trace`;
`location(node)` turns it back into `file.py:12: the source line` for error messages. Frames of
torch itself and of this package are skipped; the frames of user callables called from here
(FlexAttention score_mod/mask_mod) are kept.
"""

from __future__ import annotations

import linecache
import os
import re
import sys

import torch
from torch.fx import traceback as fx_traceback
from torch.overrides import TorchFunctionMode

from ..ir import NeptuneError

_TORCH_DIR = os.path.dirname(torch.__file__)
# this package (its own torch calls, e.g. neptune_eq.attention's, are located at the user's call of it)
_HERE = os.path.dirname(os.path.dirname(__file__))
_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


class CaptureError(NeptuneError):
    """A PyTorch function could not be translated; the message names the operation and, where
    known, the user's source line (`file.py:12: code`), which is also kept in `where`."""

    def __init__(self, message: str, where: str | None = None):
        super().__init__(message if where is None else f"{message} at {where}")
        self.where = where


def in_torch(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR)


def is_internal(filename: str) -> bool:
    """torch, this package (neptune_eq), and code torch generates with exec (file "<string>")."""
    return filename.startswith((_TORCH_DIR, _HERE)) or filename == "<string>"


_BOUNDARIES: set = set()  # code of the frames that call a captured function (capture_boundary)


def capture_boundary(fn):
    """Mark `fn` as the frame that calls the function being captured: a frame outside it is not the
    function's own code (user_frame stops there)."""
    _BOUNDARIES.add(fn.__code__)
    return fn


def user_frame():
    """The innermost frame outside torch and neptune_eq, within the captured function's call (None if
    there is none: a function no file holds, written by exec, has no line to name)."""
    f = sys._getframe(1)
    while f is not None and is_internal(f.f_code.co_filename):
        if f.f_code in _BOUNDARIES:
            return None
        f = f.f_back
    return f


class SourceLocator(TorchFunctionMode):
    """Stamps every torch call with the user's file and line (needs fx_traceback.preserve_node_meta).
    `grad_off`: where the user's code turned gradients off (torch.no_grad(), set_grad_enabled(False)),
    which the traced graph does not record."""

    grad_off: str | None = None

    def __enter__(self):
        self._inference = torch.is_inference_mode_enabled()
        return super().__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        f = user_frame()
        if f is None:  # (no line of the user's: the node records none, not the last call's)
            fx_traceback.set_stack_trace([])
        else:
            code = f.f_code
            fx_traceback.set_stack_trace([f'  File "{code.co_filename}", line {f.f_lineno}, in {code.co_name}\n'])
            off = (func is torch._C._set_grad_enabled and args and args[0] is False) or (
                torch.is_inference_mode_enabled() and not self._inference)  # (torch.inference_mode())
            if off and self.grad_off is None:
                self.grad_off = describe(code.co_filename, f.f_lineno)
            if getattr(func, "__self__", None) is torch.Tensor.data:  # x.data: x's values, detached (the
                return args[0].detach()                                # trace records the detach)
        return func(*args, **(kwargs or {}))



def describe(filename: str, lineno: int) -> str:
    code = linecache.getline(filename, lineno).strip()
    where = f"{os.path.basename(filename)}:{lineno}"
    return f"{where}: {code}" if code else where


def location(node) -> str | None:
    """`file.py:12: code` for an fx node traced under SourceLocator, else None."""
    trace = node.meta.get("stack_trace") if node is not None else None
    if not trace:
        return None
    found = _FRAME_RE.findall(trace)
    if not found:
        return None
    filename, line = found[-1]
    return describe(filename, int(line))


def located(err: CaptureError, where: str | None) -> CaptureError:
    """`err` with ' at file:line: code' appended, unless it already names a place."""
    if where is None or err.where is not None:
        return err
    return CaptureError(str(err), where)
