"""Typed JSON for cache files: dataclasses of an allowlist and IR nodes, decoded without running code.

`encode(value, classes)` turns a value built of None, bool, int, float, str, lists, tuples, dicts,
frozensets, IR nodes, members of ir's enums ({"enum": ["RefKind", "CURRENT"]}) and instances of the
dataclasses in `classes` into plain JSON data: a table of objects (each node or dataclass instance
once, children before parents, so shared nodes stay shared) and a root. `decode(data, classes)`
rebuilds it. Decoding calls nothing but the IR node constructors and the allowlisted dataclasses'
generated `__init__`, and only with arguments that match their declared field types (checked
against the type hints, e.g. `tuple[str, ...]`, `Node | None`); a reference may only point to an
earlier object, so the data cannot be cyclic. Anything else — an unknown class, a field of the
wrong type, a malformed tag — raises FormatError. Unlike pickle, there is no way for the data to
name a function to call.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing

from . import ir
from .ops import MONOIDS, OPS


class FormatError(ValueError):
    """The data is not a well-formed encoding of allowlisted types."""


# the IR node kinds and the types of their constructor arguments (Node._args order)
_NODES: dict[str, tuple[type, tuple]] = {
    "Const": (ir.Const, (float,)),
    "Index": (ir.Index, (ir.Axis,)),
    "Length": (ir.Length, (str,)),
    "Load": (ir.Load, (str, tuple[ir.Node, ...])),
    "Call": (ir.Call, (str, tuple[ir.Node, ...])),
    "Reduce": (ir.Reduce, (str, str, ir.Node)),
    "StateRef": (ir.StateRef, (ir.RefKind, str, tuple[str, ...])),
}
_NODE_NAMES = {cls: name for name, (cls, _) in _NODES.items()}
_ENUMS = {cls.__name__: cls for cls in (ir.RefKind, ir.InternalAxis)}  # typed atoms: a member by its name
_TAGS = ("tuple", "dict", "frozenset", "ref", "enum")


def encode(value, classes: tuple[type, ...]) -> dict:
    """`value` as JSON data (see the module docstring); TypeError for a type it cannot hold."""
    enc = _Encoder({c.__name__: c for c in classes})
    root = enc.value(value)
    return {"objects": enc.table, "root": root}


def decode(data, classes: tuple[type, ...]):
    """The value `data` encodes; FormatError if it is anything but a well-formed encoding."""
    try:
        if not (isinstance(data, dict) and set(data) == {"objects", "root"} and isinstance(data["objects"], list)):
            raise FormatError("expected an object table and a root")
        dec = _Decoder({c.__name__: c for c in classes})
        for entry in data["objects"]:
            dec.objects.append(dec.entry(entry))
        return dec.value(data["root"])
    except FormatError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
        raise FormatError(f"{type(e).__name__}: {e}") from None


_PLAIN = (type(None), bool, int, float, str)  # exact types: a subclass may carry behaviour


class _Encoder:
    def __init__(self, classes: dict[str, type]):
        self.classes, self.table, self.index, self.open = classes, [], {}, set()
        self.keep = []  # encoded objects stay alive, so their ids stay unique

    def value(self, v):
        t = type(v)
        if t in _PLAIN:
            return v
        if t is list:
            return [self.value(x) for x in v]
        if t is tuple:
            return {"tuple": [self.value(x) for x in v]}
        if t is frozenset:
            return {"frozenset": [self.value(x) for x in v]}
        if t is dict:
            return {"dict": [[self.value(k), self.value(x)] for k, x in v.items()]}
        if _ENUMS.get(t.__name__) is t:
            return {"enum": [t.__name__, v.name]}
        if t in _NODE_NAMES or self.classes.get(t.__name__) is t:
            return {"ref": self.ref(v)}
        raise TypeError(f"cannot encode a {t.__name__}")

    def ref(self, obj) -> int:
        got = self.index.get(id(obj))
        if got is not None:
            return got
        if id(obj) in self.open:
            raise TypeError(f"cannot encode a cycle through a {type(obj).__name__}")
        self.open.add(id(obj))
        if isinstance(obj, ir.Node):
            entry = {"node": _NODE_NAMES[type(obj)], "args": [self.value(a) for a in obj._args()]}
        else:
            entry = {"class": type(obj).__name__,
                     "fields": {f.name: self.value(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}}
        self.open.discard(id(obj))
        self.keep.append(obj)
        self.index[id(obj)] = len(self.table)
        self.table.append(entry)
        return self.index[id(obj)]


class _Decoder:
    def __init__(self, classes: dict[str, type]):
        self.classes, self.objects = classes, []

    def value(self, v):
        t = type(v)
        if t in _PLAIN:
            return v
        if t is list:
            return [self.value(x) for x in v]
        if not (isinstance(v, dict) and len(v) == 1 and next(iter(v)) in _TAGS):
            raise FormatError(f"unexpected {type(v).__name__} {str(v)[:60]}")
        tag, body = next(iter(v.items()))
        if tag == "ref":
            if not (type(body) is int and 0 <= body < len(self.objects)):  # earlier objects only: no cycles
                raise FormatError(f"bad reference {body!r}")
            return self.objects[body]
        if tag == "enum":
            cls = _ENUMS.get(body[0]) if type(body) is list and len(body) == 2 and type(body[0]) is str else None
            if cls is None or not (type(body[1]) is str and body[1] in cls.__members__):
                raise FormatError(f"unknown enum member {str(body)[:60]}")
            return cls[body[1]]
        if not isinstance(body, list):
            raise FormatError(f"{tag} needs a list")
        if tag == "tuple":
            return tuple(self.value(x) for x in body)
        if tag == "frozenset":
            return frozenset(self.value(x) for x in body)
        if not all(isinstance(kv, list) and len(kv) == 2 for kv in body):
            raise FormatError("dict needs [key, value] pairs")
        return {self.value(k): self.value(x) for k, x in body}

    def entry(self, e):
        if isinstance(e, dict) and set(e) == {"node", "args"}:
            return self.node(e["node"], e["args"])
        if not (isinstance(e, dict) and set(e) == {"class", "fields"} and isinstance(e["fields"], dict)):
            raise FormatError("an object is a node or a class instance")
        cls = self.classes.get(e["class"]) if isinstance(e["class"], str) else None
        if cls is None:
            raise FormatError(f"class {str(e['class'])[:60]!r} is not allowed")
        spec = _fields(cls)
        kw = {}
        for name, raw in e["fields"].items():
            if name not in spec:
                raise FormatError(f"{cls.__name__} has no field {str(name)[:60]!r}")
            hint, default = spec[name]
            v = self.value(raw)
            if not (conforms(v, hint) or (default is not dataclasses.MISSING and _same(v, default))):
                raise FormatError(f"{cls.__name__}.{name}: {type(v).__name__} does not match {hint}")
            kw[name] = v
        missing = [n for n, (_, d) in spec.items() if n not in kw and d is dataclasses.MISSING]
        if missing:
            raise FormatError(f"{cls.__name__} lacks {missing}")
        return cls(**kw)

    def node(self, kind, args):
        got = _NODES.get(kind) if isinstance(kind, str) else None
        if got is None or not isinstance(args, list):
            raise FormatError(f"unknown node {str(kind)[:60]!r}")
        cls, hints = got
        vals = [self.value(a) for a in args]
        if len(vals) != len(hints) or not all(conforms(v, h) for v, h in zip(vals, hints)):
            raise FormatError(f"bad arguments for {kind}")
        if kind == "Call" and (vals[0] not in OPS or OPS[vals[0]].arity != len(vals[1])):
            raise FormatError(f"unknown operator {vals[0][:60]!r}/{len(vals[1])}")
        if kind == "Reduce" and vals[0] not in MONOIDS:
            raise FormatError(f"unknown reduction {vals[0][:60]!r}")
        return cls(*vals)


@functools.cache
def _fields(cls: type) -> dict[str, tuple[object, object]]:
    """{field: (type hint, default or MISSING)} of a dataclass's constructor arguments."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.init:
            default = f.default
            if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            out[f.name] = (hints[f.name], default)
    return out


def _same(v, default) -> bool:
    return type(v) is type(default) and v == default


def conforms(v, hint) -> bool:
    """Does the decoded value `v` have type `hint` (a class, X | Y, list[X], tuple[X, ...],
    tuple[X, Y], dict[K, V], frozenset[X])? Unknown hints (callables, ...) admit nothing."""
    return _checker(hint)(v)


@functools.cache
def _checker(hint):
    """conforms(·, hint) as a function, built once per hint."""
    if hint is object or hint is typing.Any:
        return lambda v: True
    if hint is None or hint is type(None):
        return lambda v: v is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        alts = [_checker(a) for a in args]
        return lambda v: any(c(v) for c in alts)
    if hint is float:
        return lambda v: type(v) is float or type(v) is int  # an int is a float's value, a bool is not
    if hint in (int, str, bool, list, tuple, dict, frozenset):
        return lambda v: type(v) is hint
    if origin in (list, frozenset) or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        item = _checker(args[0])
        return lambda v: type(v) is origin and all(item(x) for x in v)
    if origin is tuple:
        items = [_checker(a) for a in args]
        return lambda v: type(v) is tuple and len(v) == len(items) and all(c(x) for c, x in zip(items, v))
    if origin is dict:
        key, val = _checker(args[0]), _checker(args[1])
        return lambda v: type(v) is dict and all(key(k) and val(x) for k, x in v.items())
    if isinstance(hint, type) and origin is None:
        return lambda v: isinstance(v, hint)  # decoded values are only allowlisted types
    return lambda v: False
