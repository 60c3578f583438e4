"""A user function's arguments given by keyword, put in their positions (a compiled function is
captured, and its calls served, on positional arguments)."""

from __future__ import annotations

import inspect

from ..ir import NeptuneError


def positional_args(fn, args: tuple, kwargs: dict) -> tuple:
    """fn's arguments given by keyword (`prog(q, k, v=v)`) in their positions: the compiled function is
    captured on positional arguments, the first len(args) + len(kwargs) of fn's parameters."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise NeptuneError(f"keyword arguments {sorted(kwargs)}: the signature of {fn!r} cannot be read; "
                           "pass them by position") from None
    n = len(args) + len(kwargs)
    names = [p.name for p in params[:n] if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names[len(args):]:
            raise NeptuneError(f"keyword argument '{k}' is not one of the function's first {n} positional "
                               f"parameters ({', '.join(names)}) after the {len(args)} given by position")
        given[k] = v
    if len(names) != n:
        raise NeptuneError(f"the function's first {n} parameters ({', '.join(p.name for p in params[:n])}) "
                           "must all be positional to be given by keyword")
    return tuple(given[k] for k in names)
