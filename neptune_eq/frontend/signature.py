"""A user function's arguments given by keyword, put in their positions (a compiled function is
captured, and its calls served, on positional arguments)."""

from __future__ import annotations

import inspect

from ..ir import NeptuneError


def positional_args(fn, args: tuple, kwargs: dict) -> tuple:
    """fn's arguments given by keyword (`prog(q, k, v=v)`, `loss(x, t, reduction="none")`) in their
    positions: the compiled function is captured on positional arguments, fn's parameters up to the last
    one given, a parameter left out before it at its default (it had been refused)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise NeptuneError(f"keyword arguments {sorted(kwargs)}: the signature of {fn!r} cannot be read; "
                           "pass them by position") from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name: k for k, p in enumerate(positional)}
    for k in kwargs:
        at = by_name.get(k)
        if at is None or at < len(args) or positional[at].kind is inspect.Parameter.POSITIONAL_ONLY:
            kind = next((p.kind.description for p in params if p.name == k), None)
            raise NeptuneError(f"keyword argument '{k}' is not a positional parameter of the function after the "
                               f"{len(args)} given by position ({', '.join(by_name)})"
                               + (f"; it is {kind}, which compiled functions do not take: make it positional, "
                                  "or bind it with functools.partial before compiling" if kind else ""))
    given = {p.name: a for p, a in zip(positional, args)} | kwargs
    last = max(by_name[k] for k in given)
    out = []
    for p in positional[:last + 1]:
        if p.name in given:
            out.append(given[p.name])
        elif p.default is not p.empty:
            out.append(p.default)
        else:
            raise NeptuneError(f"missing argument '{p.name}' (given by keyword: {', '.join(sorted(kwargs))})")
    return tuple(out)
