"""What a captured function gives back: its return structure (any pytree of tensors and constants:
its tensors are the program's outputs) and the new values of the arguments it writes in place
(extra program outputs after those)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from .source import CaptureError, location

_aten = torch.ops.aten


@dataclass(frozen=True)
class Mutation:
    """fn writes its argument `position` in place; program output number `output` is its new value."""

    position: int
    parameter: str
    output: int


@dataclass(frozen=True)
class Static:
    """A non-tensor value fn returns, returned as it was at capture."""

    value: object


@dataclass(frozen=True)
class OutputStructure:
    """fn's return structure: a pytree whose leaves are program output numbers or Static values."""

    spec: pytree.TreeSpec
    leaves: tuple[int | Static, ...]

    @classmethod
    def of(cls, spec: pytree.TreeSpec, leaves: list) -> OutputStructure:
        """From fn's flattened return value: its tensors are the program's outputs, in order."""
        count = iter(range(len(leaves)))
        return cls(spec, tuple(next(count) if isinstance(x, torch.Tensor) else Static(x) for x in leaves))

    def build(self, outs: list[torch.Tensor]):
        values = [outs[x] if isinstance(x, int) else x.value for x in self.leaves]
        return values[0] if self.spec.is_leaf() else pytree.tree_unflatten(values, self.spec)



def find_mutations(gm: torch.fx.GraphModule, params: list[str], positions: list[int],
               example_inputs) -> tuple[Mutation, ...]:
    """The arguments fn writes in place: functionalize's copy_(placeholder, new value) nodes, whose
    new values become extra outputs after fn's own."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    found = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _aten.copy_.default:
            continue
        if node.args[0] not in placeholders:  # (a lifted closure or module tensor: the call would not write it)
            raise CaptureError("the function writes in place into a tensor it does not take as an argument (a "
                               "module buffer or closure tensor, such as BatchNorm's running statistics in "
                               "training mode); call the module in eval() mode, or pass the tensor as an argument",
                               location(node))
        k = placeholders.index(node.args[0])
        a = example_inputs[positions[k]]
        if any(b is a for j, b in enumerate(example_inputs) if j != positions[k]):
            raise CaptureError(f"argument '{params[k]}' is written in place and also passed as another argument; "
                               "pass separate tensors", location(node))
        found.append(Mutation(positions[k], params[k], len(outs)))
        outs.append(node.args[1])
        gm.graph.erase_node(node)
    if not outs:
        raise CaptureError("the function returns no tensor and writes none of its arguments")
    out_node.args = (outs,)
    gm.recompile()
    return tuple(found)
