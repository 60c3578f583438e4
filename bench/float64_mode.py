"""A float64 reference that stays float64 through the program's own casts."""

from __future__ import annotations

import torch

_NARROW = (torch.float32, torch.float16, torch.bfloat16)


class KeepFloat64(torch.overrides.TorchFunctionMode):
    """Keeps a float64 reference in float64 where the program casts (`x.float()`, `x.to(torch.float32)`:
    a loss that upcasts its bf16 logits would otherwise be its own float32 reference)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
            if func in (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16):
                return x
            if func is torch.Tensor.to:
                args = tuple(torch.float64 if a in _NARROW else a for a in args)
                kwargs = {k: torch.float64 if v in _NARROW else v for k, v in kwargs.items()}
        return func(*args, **kwargs)
