"""PyTorch frontend: ordinary PyTorch functions (and FlexAttention-style score/mask modifiers)
translated to the reduction IR.

    from neptune_eq.frontend import capture
    captured = capture(my_attention, q, k, v)   # traced once, at these shapes
    captured.program                            # ir.Program: inputs q, k, v; outputs out0, ...
"""

from .capture import ArgBinding, Captured, CompiledFunction, StaleCapture, ZeroSizeCapture, capture
from .checks import IndexOutOfRange
from .compiled import ZeroSizeError
from .flex import attention_capture, attention_program
from .source import CaptureError

__all__ = ["ArgBinding", "CaptureError", "Captured", "CompiledFunction", "IndexOutOfRange", "StaleCapture",
           "ZeroSizeCapture", "ZeroSizeError", "attention_capture", "attention_program", "capture"]
