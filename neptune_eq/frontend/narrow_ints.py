"""uint8 / int8 / int16 tensors: their values are read exactly (int64 in the kernels and the reference),
but torch's arithmetic whose result keeps such a dtype wraps around (uint8 255 + 1 is 0), which the
program's int64 arithmetic does not. An op with such a result is refused unless it only moves values
(views, indexing, torch.cat, clone) or converts a bool; converting to float or int64, comparing and
reducing into int64 (a sum) are exact and captured."""

from __future__ import annotations

import torch

from .source import CaptureError

NARROW = (torch.uint8, torch.int8, torch.int16)
_COPY = torch.ops.aten._to_copy.default


class NarrowGuard:
    """`handler`, refusing a result of a narrow integer dtype where the op computes it (see above)."""

    def __init__(self, handler, moves_values: bool):
        self.handler, self.moves_values = handler, moves_values

    def infer(self, tx, c):
        if not self.moves_values:
            outs = c.out if isinstance(c.out, tuple | list) else (c.out,)
            narrow = [t.dtype for t in outs if isinstance(t, torch.Tensor) and t.dtype in NARROW]
            if narrow and not _exact_copy(c, narrow[0]):
                dt = str(narrow[0]).removeprefix("torch.")
                raise CaptureError(f"{c.op_name} with a {dt} result is not supported: torch's {dt} arithmetic wraps "
                                   f"around (as 255 + 1 = 0 in uint8); convert first (.float(), .long())")
        return self.handler.infer(tx, c)

    def build(self, tx, c):
        return self.handler.build(tx, c)


def _exact_copy(c, dt: torch.dtype) -> bool:
    """A cast to `dt` from bool or from `dt` itself: no value changes."""
    src = c.args[0] if c.args else None
    return c.node.target is _COPY and getattr(src, "dtype", None) in (torch.bool, dt)


def guard_narrow(handlers: dict, value_moving) -> dict:
    """Every handler guarded; those in `value_moving` let a narrow result through."""
    return {op: NarrowGuard(h, op in value_moving) for op, h in handlers.items()}
