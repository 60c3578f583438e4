"""A call's signature — what a static compile of a function is specialised to — and what a call that
torch.compile traces does when no compile serves it.

    signature(args)          (shape, dtype, device type) of each tensor, ("static", repr, type) of the rest,
                             and the active autocast regions' (device, dtype) where there are any
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
    sig = tuple((tuple(a.shape), a.dtype, a.device.type) if isinstance(a, torch.Tensor)
                else ("static", repr(a), type(a).__name__) for a in args)
    cast = autocast_state(args)
    return (*sig, ("autocast", cast)) if cast else sig


def autocast_state(args) -> tuple:
    """The (device type, dtype) of each autocast region active for the devices of the tensors in `args`:
    a capture records its casts, so a call under another autocast state is another function (a compile
    made under bf16 autocast and called outside it had run in bf16, silently; one made outside and
    called inside had run in float32)."""
    types = {a.device.type for a in args if isinstance(a, torch.Tensor)}
    return tuple((t, torch.get_autocast_dtype(t)) for t in sorted(types)
                 if t in ("cpu", "cuda") and torch.is_autocast_enabled(t))


def matches(sig: tuple, args) -> bool:
    """Does a call with `args` have signature `sig`?"""
    if len(sig) != len(args):
        return False
    for s, a in zip(sig, args):
        if traced_number(a):
            if s[0] != "static" or s[2] != type(a).__name__ or not same_traced_number(a, _number(s[1], type(a))):
                return False
        elif not isinstance(a, torch.Tensor):
            if s != ("static", repr(a), type(a).__name__):
                return False
        elif (s[0] == "static" or (a.dtype, a.device.type) != s[1:] or a.dim() != len(s[0])
              or any(n != m for n, m in zip(a.shape, s[0]))):
            return False
    return True


def traced_number(a) -> bool:
    """A number argument of a call dynamo traces (with dynamic=True a symbolic one: its repr cannot be
    traced, its value is compared)."""
    return type(a) in (int, float, bool) and torch.compiler.is_compiling()


def same_traced_number(a, value) -> bool:
    """Is a number dynamo traces the baked-in `value`? Compared by value (dynamo keeps the comparison
    as a guard: another value re-traces); a zero is never the same (0.0 and -0.0 compare equal, and
    x / scale tells them apart), nor is a NaN."""
    return type(value) is type(a) and value != 0 and bool(a == value)


def _number(text: str, kind: type):
    """The number of type `kind` whose repr is `text` (str methods and float/int of a constant:
    dynamo traces them)."""
    return text == "True" if kind is bool else kind(text)


NOT_IN_GRAPH = ("neptune_eq: nothing compiled serves this call inside torch.compile (a new shape, dtype or "
                "static value, or gradients through a dynamic compile); it runs eagerly, outside the graph, "
                "where it is compiled. Call the compiled function once outside torch.compile with such "
                "arguments first (or compile with dynamic=) to keep it in the graph")


def _eager_call(compiled, args):
    return compiled(*args)


outside_the_graph = (torch.compiler.disable(_eager_call, reason=NOT_IN_GRAPH)
                     if "reason" in inspect.signature(torch.compiler.disable).parameters  # (torch ≥ 2.7)
                     else torch.compiler.disable(_eager_call))
