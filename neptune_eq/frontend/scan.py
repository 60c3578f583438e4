"""Scanning what a captured function reads from its environment into guards (frontend/guards.py
says what each guard checks): fn's closure cells, the globals its code names, its defaults; the
functions, modules, classes and plain objects found there, two levels deep."""

from __future__ import annotations

import dis
import functools
import inspect
import re
import types
from dataclasses import dataclass, field

import torch

from .guards import (
    _ATOMS,
    _GUARDED,
    _MISSING,
    Attr,
    Cell,
    Entry,
    Guards,
    IdentityGuard,
    SnapshotGuard,
    Source,
    TensorGuard,
    ValueGuard,
    _Opaque,
    _snapshot,
)
from .source import in_torch


@dataclass
class Environment:
    """The guards found by `scan`, and a variable name for each tensor found (by id)."""

    guards: Guards = field(default_factory=Guards)
    names: dict[int, str] = field(default_factory=dict)
    opaque: list[str] = field(default_factory=list)  # containers guarded by identity only (their contents not)
    _seen: set[int] = field(default_factory=set)  # ids of the functions, objects and values guarded

    def guard(self, source: Source, value, depth: int, names: frozenset[str] = frozenset()) -> None:
        """Guard `value` read from `source`; look `depth` levels into functions and modules."""
        if isinstance(value, torch.Tensor):
            self.guards.tensors.append(TensorGuard(source, value, value._version))
            return
        if isinstance(value, _ATOMS):
            self.guards.values.append(ValueGuard(source, value))
            return
        if isinstance(value, types.ModuleType):
            if not value.__name__.startswith("torch"):  # torch's attributes are not user settings
                self.attributes(vars(value), f"module {value.__name__}", names, depth)
            return
        if isinstance(value, tuple | list | dict | set | frozenset):
            keep: list = []
            try:
                self.guards.values.append(SnapshotGuard(source, value, _snapshot(value, keep), keep))
                return
            except _Opaque:  # guarded by identity below; say what is not seen
                self.opaque.append(f"{source} ({type(value).__name__} of {len(value)} items, or nested deeper "
                                   f"than 3)")
        self.guards.values.append(IdentityGuard(source, value))
        if id(value) in self._seen:
            return
        self._seen.add(id(value))
        if isinstance(value, type):  # a class: the class attributes fn's code names (Config.scale)
            if _user_defined(value):
                self.attributes(value.__dict__, value.__name__, names, depth)
            return
        if (depth > 0 and callable(value) and hasattr(value, "__dict__") and _user_defined(type(value))
                and not isinstance(value, types.FunctionType | types.MethodType | functools.partial | torch.nn.Module)):
            self.function(value.__call__, depth - 1)  # a callable object (Softcap(cap)): its __call__ and fields
            return
        if isinstance(value, torch.nn.Module):
            self.module(value, depth)
        elif callable(value) and depth > 0:
            self.function(value, depth - 1)
        elif hasattr(value, "__dict__") and not callable(value):
            self.attributes(vars(value), type(value).__name__, names, depth)
            self.methods(value, names, depth)

    def attributes(self, namespace: dict, owner: str, names: frozenset[str], depth: int) -> None:
        """The entries of an object's or module's namespace that fn's code names (`cfg.scale`)."""
        for n in sorted(names & namespace.keys()):
            v = namespace[n]
            if isinstance(v, _GUARDED):
                self.guard(Entry(namespace, n, f"attribute '{n}' of {owner}"), v, depth)
            elif _plain_object(v):  # cfg.inner.s: what fn names inside it too
                self.guard(Entry(namespace, n, f"attribute '{n}' of {owner}"), v, depth, names)

    def methods(self, obj, names: frozenset[str], depth: int) -> None:
        """The methods and properties of a plain object that fn's code names (`sched.temp()`,
        `sched.T`): the attributes they read on it are guarded as fn's own (a temperature schedule
        advanced between calls had kept its first value, silently)."""
        if depth <= 0 or not _user_defined(type(obj)):
            return
        for n in sorted(names - vars(obj).keys()):
            m = inspect.getattr_static(type(obj), n, None)
            f = m.fget if isinstance(m, property) else m
            if isinstance(f, types.FunctionType) and (id(obj), id(f)) not in self._seen:
                self._seen.add((id(obj), id(f)))
                self.function(types.MethodType(f, obj), depth - 1)

    def module(self, m: torch.nn.Module, depth: int) -> None:
        """An nn.Module: every submodule's parameters, buffers, plain attributes and submodules, and
        its forward."""
        for prefix, sub in m.named_modules():
            where = f"'{prefix}'" if prefix else type(m).__name__
            for kind, table in (("parameter", sub._parameters), ("buffer", sub._buffers)):
                for n, t in table.items():
                    if t is None:
                        continue
                    path = f"{prefix}.{n}" if prefix else n
                    name = re.sub(r"\W", "_", path)
                    self.names.setdefault(id(t), f"p{name}" if name[0].isdigit() else name)
                    self.guard(Entry(table, n, f"{kind} '{path}' of {type(m).__name__}"), t, 0)
            for n, v in vars(sub).items():
                if n.startswith("_"):
                    continue
                if isinstance(v, _GUARDED):
                    self.guard(Entry(vars(sub), n, f"attribute '{n}' of {where}"), v, 0)
                elif callable(v):  # self.act = torch.tanh
                    self.guards.values.append(IdentityGuard(Entry(vars(sub), n, f"attribute '{n}' of {where}"), v))
                elif _plain_object(v):  # self.helper = Config(...): its own attributes
                    self.guard(Entry(vars(sub), n, f"attribute '{n}' of {where}"), v, 0, frozenset(vars(v)))
            for n, child in sub._modules.items():  # a submodule replaced by another
                self.guards.values.append(IdentityGuard(Entry(sub._modules, n, f"submodule '{n}' of {where}"), child))
        if depth > 0:
            self.function(m.forward, depth - 1)

    def function(self, f, depth: int) -> None:
        """A Python function: closure cells, named globals, defaults; a partial's arguments; a
        callable object's __call__ and the fields it reads."""
        if (not isinstance(f, types.FunctionType | types.MethodType | functools.partial | type)
                and callable(f) and hasattr(f, "__dict__") and _user_defined(type(f))):
            f = f.__call__
        while isinstance(f, functools.partial):
            label = getattr(f.func, "__qualname__", "partial")
            self.guard(Attr(f, "args", f"arguments of partial({label})"), f.args, depth)
            self.guard(Attr(f, "keywords", f"keywords of partial({label})"), f.keywords, depth)
            f = f.func
        if isinstance(f, types.MethodType):
            owner = f.__self__
            f = f.__func__
            code = getattr(f, "__code__", None)
            if code is not None:
                if isinstance(owner, torch.nn.Module):  # a module's method: its parameters and settings
                    if id(owner) not in self._seen:  # (self.tau read by neptune_eq.compile(self.core) was not)
                        self._seen.add(id(owner))
                        self.module(owner, 0)
                elif hasattr(owner, "__dict__"):
                    self.attributes(vars(owner), type(owner).__name__, _names(code), depth)
                if depth > 0:  # the methods it calls on self (self.helper(x)), one level down
                    for n in sorted(_names(code) - {f.__name__}):
                        m = inspect.getattr_static(type(owner), n, None)
                        if isinstance(m, types.FunctionType) and id(m) not in self._seen:
                            self._seen.add(id(m))
                            self.function(m, depth - 1)
        f = inspect.unwrap(f) if callable(f) else f
        code = getattr(f, "__code__", None)
        if code is None or in_torch(code.co_filename):
            return
        owner = f"{getattr(f, '__qualname__', '?')} ({code.co_filename.rsplit('/', 1)[-1]})"
        names = _names(code)
        for n, cell in zip(code.co_freevars, f.__closure__ or ()):
            v = Cell(cell, n, owner).read()
            if v is not _MISSING:
                self._named(v, n)
                self.guard(Cell(cell, n, owner), v, depth, names)
        g = getattr(f, "__globals__", {})
        for n in sorted(_global_names(code) & g.keys()):
            self._named(g[n], n)
            self.guard(Entry(g, n, f"global '{n}' of {owner}"), g[n], depth, names)
        for attr in ("__defaults__", "__kwdefaults__"):
            v = getattr(f, attr, None)
            if v:
                self.guard(Attr(f, attr, f"default arguments of {owner}"), v, depth)

    def _named(self, value, name: str) -> None:
        if isinstance(value, torch.Tensor):
            self.names.setdefault(id(value), name)


def scan(fn, depth: int = 2) -> Environment:
    """The guards of what `fn` reads from its environment (see the module docstring)."""
    env = Environment()
    if isinstance(fn, torch.nn.Module):
        env._seen.add(id(fn))
        env.module(fn, depth)
    else:
        env.function(fn, depth)
    return env


def _user_defined(cls: type) -> bool:
    """A class from user code (not torch's, not a builtin)."""
    return cls.__module__ != "builtins" and not in_torch(getattr(inspect.getmodule(cls), "__file__", None) or "")


def _plain_object(v) -> bool:
    """An instance of a user class holding settings (not a function, class, module or tensor)."""
    return (hasattr(v, "__dict__") and not callable(v) and not isinstance(v, type | types.ModuleType | torch.Tensor)
            and _user_defined(type(v)))


def _names(code: types.CodeType) -> frozenset[str]:
    """Global and attribute names the code (and code nested in it: lambdas, comprehensions) uses."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return frozenset(out)


_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME"})


def _global_names(code: types.CodeType) -> frozenset[str]:
    """The global names the code (and code nested in it) reads or writes: not an attribute that shares
    a global's name (`F.pad` in a module that also imports a function `pad`)."""
    out = {i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _global_names(c)
    return frozenset(out)
