"""In-place operations a decomposition leaves behind functionalization, read as their functional twins."""

from __future__ import annotations

import torch
from torch import fx


def functional_twin(node: fx.Node):
    """The functional overload of an in-place op (aten.clamp_min_.Tensor → aten.clamp_min.Tensor) whose
    written tensor is an intermediate nothing else reads — what a composite's kernel leaves behind
    functionalization (F.cosine_similarity clamps a clone of its norms in place) — else None. The two
    agree there: no one sees the value before the write, and the op's result is the written value."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.arguments or not node.args:
        return None
    first, written = node.args[0], schema.arguments[0].alias_info
    if not (written is not None and written.is_write and isinstance(first, fx.Node)
            and first.op == "call_function" and [u for u in first.users if not _dead(u)] == [node]):
        return None
    name = schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    return getattr(packet, node.target._overloadname, None) if packet is not None else None


def _dead(node: fx.Node) -> bool:
    """A call nothing reads that writes nothing: the unused clone F.margin_ranking_loss's decomposition
    leaves beside its clamp_min_ when its inputs require grad (which then read as used twice)."""
    schema = getattr(node.target, "_schema", None)
    writes = schema is None or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    return node.op == "call_function" and not node.users and not writes
