"""Compile caches: the ranked plans of a program, in memory and on disk.

The key is a hash of everything that decides the result: the program (axes, extents, dtypes,
expressions), the options that steer the search, the user rules, the device model and the
neptune_eq version. A disk entry holds every alternative's plan, cost and schedules (not the
e-graph), written to a temporary file and renamed into place, so concurrent writers never leave a
half-written entry; an entry that fails to load (corrupt, truncated, another version) is ignored and
rewritten.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import __version__, ir
from .device import DeviceSpec

FORMAT = 1


@dataclass
class CachedCompilation:
    """What a compile decided, without the e-graph: enough to run, pin and explain alternatives."""

    program: ir.Program
    options: object
    device: DeviceSpec
    alternatives: list
    rejected_notes: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)
    nodes: int = 0
    timings: dict = field(default_factory=dict)
    fusion: None = None  # the e-graph's fusion search is not kept

    @property
    def best(self):
        return self.alternatives[0]


def snapshot(c) -> CachedCompilation:
    """The cacheable part of a pipeline.Compilation."""
    options = replace(c.options, rules=(), progress=None)  # user rules are in the key, not the payload
    return CachedCompilation(c.program, options, c.device, list(c.alternatives), c.rejected_notes,
                             [str(r) for r in c.saturator.reports], c.nodes, dict(c.timings))


def key_of(program: ir.Program, options, device: DeviceSpec) -> str:
    rules = ";".join(f"{r.name}:{r.math}" for r in getattr(options, "rules", ()))
    relevant = {k: v for k, v in vars(options).items() if k not in ("rules", "progress", "cache_dir", "device")}
    text = "|".join([__version__, str(FORMAT), str(program), repr(sorted(relevant.items(), key=str)), rules,
                     repr(device)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class CompileCache:
    """Memory cache in front of an on-disk directory (None: memory only)."""

    directory: Path | None = None
    memory: dict = field(default_factory=dict)
    hits: int = 0
    disk_hits: int = 0
    misses: int = 0

    def _path(self, key: str) -> Path | None:
        return None if self.directory is None else Path(self.directory) / "programs" / f"{key}.pkl"

    def get(self, key: str) -> CachedCompilation | None:
        if key in self.memory:
            self.hits += 1
            return self.memory[key]
        path = self._path(key)
        if path is not None and path.exists():
            try:
                with open(path, "rb") as f:
                    fmt, stored_key, value = pickle.load(f)
                if fmt == FORMAT and stored_key == key and isinstance(value, CachedCompilation):
                    self.memory[key] = value
                    self.disk_hits += 1
                    return value
            except Exception:
                pass
        self.misses += 1
        return None

    def put(self, key: str, value: CachedCompilation) -> None:
        self.memory[key] = value
        path = self._path(key)
        if path is not None:
            write_atomic(path, pickle.dumps((FORMAT, key, value)))


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path` and rename it into place: readers and
    concurrent writers never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
