"""A call's signature — what a static compile of a function is specialised to — and what a call that
torch.compile traces does when no compile serves it.

    signature(args)          (shape, dtype, device type) of each tensor, ("static", repr) of the rest
    matches(sig, args)       the same test, dimension by dimension: under dynamo a symbolic length is
                             guarded (compared), never hashed
    outside_the_graph(c, a)  c(*a) run eagerly: torch.compiler.disable'd, so dynamo breaks its graph
                             there (the eager call captures and compiles the signature) and, under
                             fullgraph=True, refuses the call naming this reason
"""

from __future__ import annotations

import inspect

import torch


def signature(args) -> tuple:
    return tuple((tuple(a.shape), a.dtype, a.device.type) if isinstance(a, torch.Tensor) else ("static", repr(a))
                 for a in args)


def matches(sig: tuple, args) -> bool:
    """Does a call with `args` have signature `sig`?"""
    if len(sig) != len(args):
        return False
    for s, a in zip(sig, args):
        if not isinstance(a, torch.Tensor):
            if s != ("static", repr(a)):
                return False
        elif (s[0] == "static" or (a.dtype, a.device.type) != s[1:] or a.dim() != len(s[0])
              or any(n != m for n, m in zip(a.shape, s[0]))):
            return False
    return True


NOT_IN_GRAPH = ("neptune_eq: nothing compiled serves this call inside torch.compile (a new shape, dtype or "
                "static value, or gradients through a dynamic compile); it runs eagerly, outside the graph, "
                "where it is compiled. Call the compiled function once outside torch.compile with such "
                "arguments first (or compile with dynamic=) to keep it in the graph")


def _eager_call(compiled, args):
    return compiled(*args)


outside_the_graph = (torch.compiler.disable(_eager_call, reason=NOT_IN_GRAPH)
                     if "reason" in inspect.signature(torch.compiler.disable).parameters  # (torch ≥ 2.7)
                     else torch.compiler.disable(_eager_call))
