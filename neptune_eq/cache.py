"""Compile caches: the ranked plans of a program, in memory and on disk.

The key is a hash of everything that decides the result: the program (axes, extents, dtypes,
expressions), the options that steer the search, the user rules, the device model and the
neptune_eq version. A disk entry, `programs/<key>.json` under the cache directory, holds every
alternative's plan, cost and schedules (not the e-graph) as typed JSON data (datafile.py: decoding
builds only neptune_eq's plan types and IR nodes, never calls anything named by the file) after a
header line with the format, the key and a SHA-256 of that data. It is written to a temporary file
and renamed into place, so concurrent writers never leave a half-written entry. An entry is used
only if this user owns it and no one else may write it (cachedir.py); one that is refused, corrupt,
truncated or of another version is ignored with a CacheWarning and rewritten. A directory that
cannot be written leaves the cache in memory only (one CacheWarning).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import __version__, ir, plan
from .cachedir import CacheDir, cache_dir
from .datafile import FormatError, decode, encode
from .device import DeviceSpec
from .extract.cost import Cost, KernelCost
from .pipeline import Alternative, Options
from .saturate import Budget
from .schedule import KernelSchedule

FORMAT = 3  # 1 was a pickle (never read: unpickling can run code); 2 wrote state references as "cur:x" strings
# and split-K's chunk axis as the string "chunk"
MAX_ENTRY_BYTES = 64 << 20


@dataclass
class CachedCompilation:
    """What a compile decided, without the e-graph: enough to run, pin and explain alternatives."""

    program: ir.Program
    options: Options
    device: DeviceSpec
    alternatives: list[Alternative]
    rejected_notes: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)
    nodes: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    budget_notes: list[str] = field(default_factory=list)
    numerics_notes: list[str] = field(default_factory=list)
    fusion: None = None  # the e-graph's fusion search is not kept

    @property
    def best(self):
        return self.alternatives[0]


# the only classes a disk entry may hold (with IR nodes and plain data)
STORED_CLASSES = (CachedCompilation, ir.Program, ir.TensorSpec, ir.Output, Options, Budget, DeviceSpec, Alternative,
                  plan.Plan, plan.KernelPlan, plan.Pass, plan.Combine, plan.CompPlan, plan.StorePlan, plan.BufferSpec,
                  KernelSchedule, Cost, KernelCost)


def snapshot(c) -> CachedCompilation:
    """The cacheable part of a pipeline.Compilation."""
    options = replace(c.options, rules=(), progress=None)  # user rules are in the key, not the payload
    return CachedCompilation(c.program, options, c.device, list(c.alternatives), c.rejected_notes,
                             [str(r) for r in c.saturator.reports], c.nodes, dict(c.timings), list(c.budget_notes),
                             list(c.numerics_notes))


def key_of(program: ir.Program, options, device: DeviceSpec) -> str:
    rules = ";".join(r.exact for r in getattr(options, "rules", ()))  # exact constants (Rule.math rounded them)
    relevant = {k: v for k, v in vars(options).items() if k not in ("rules", "progress", "cache_dir", "device")}
    text = "|".join([__version__, compiler_fingerprint(), str(FORMAT), program.text(exact=True),
                     repr(sorted(relevant.items(), key=str)), rules, repr(device)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.cache
def compiler_fingerprint() -> str:
    """A hash of this installation's compiler sources (every module of neptune_eq and of its rules and
    extract packages, subpackages included): an entry written by other code (an upgrade, a checkout of
    another commit) is a miss, not a plan that code would not have made. (Packages were once listed
    one by one, and neptune_eq.fusion, where corrections are searched, was missing from the list.)"""
    h = hashlib.sha256()
    for name, f in fingerprinted_sources():
        h.update(name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def fingerprinted_sources() -> list[tuple[str, Path]]:
    """(name, path) of every source compiler_fingerprint hashes."""
    out, seen = [], set()
    for pkg in ("neptune_eq", "neptune_eq.rules", "neptune_eq.extract"):
        root = Path(importlib.import_module(pkg).__file__).parent
        for f in sorted(root.rglob("*.py")) + sorted(root.rglob("*.rules")):
            if f.resolve() not in seen:
                seen.add(f.resolve())
                out.append((f"{pkg}/{f.relative_to(root)}", f))
    return out


def dumps(key: str, value: CachedCompilation) -> bytes:
    """A disk entry: a header line (format, key, SHA-256 of the body) and the value's typed JSON data."""
    stored = replace(value, options=replace(value.options, cache_dir=None))  # where it lives is not part of it
    body = json.dumps(encode(stored, STORED_CLASSES), separators=(",", ":")).encode()
    head = {"format": FORMAT, "key": key, "sha256": hashlib.sha256(body).hexdigest()}
    return json.dumps(head).encode() + b"\n" + body


def loads(key: str, data: bytes) -> CachedCompilation:
    """The value of a disk entry written by dumps(key, ...); FormatError if it is anything else."""
    head, _, body = data.partition(b"\n")
    try:
        head = json.loads(head)
    except ValueError:
        raise FormatError("not a neptune_eq cache entry (its first line is not JSON)") from None
    if not (isinstance(head, dict) and set(head) == {"format", "key", "sha256"}):
        raise FormatError("not a neptune_eq cache entry")
    if head["format"] != FORMAT:
        raise FormatError(f"format {str(head['format'])[:20]}, expected {FORMAT}")
    if head["key"] != key:
        raise FormatError("stored under another key")
    if head["sha256"] != hashlib.sha256(body).hexdigest():
        raise FormatError("checksum mismatch (truncated or altered)")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise FormatError(f"body is not JSON ({e})") from None
    value = decode(doc, STORED_CLASSES)
    if not isinstance(value, CachedCompilation) or not value.alternatives:
        raise FormatError("not a compilation")
    return value


@dataclass
class CompileCache:
    """Memory cache in front of an on-disk directory (None: memory only)."""

    directory: Path | None = None
    memory: dict = field(default_factory=dict)
    hits: int = 0
    disk_hits: int = 0
    misses: int = 0

    @property
    def disk(self) -> CacheDir | None:
        return None if self.directory is None else cache_dir(self.directory)

    @staticmethod
    def entry_name(key: str) -> str:
        return f"programs/{key}.json"

    def get(self, key: str) -> CachedCompilation | None:
        if key in self.memory:
            self.hits += 1
            return self.memory[key]
        disk = self.disk
        data = disk.read(self.entry_name(key), MAX_ENTRY_BYTES) if disk is not None else None
        if data is not None:
            try:
                value = loads(key, data)
            except FormatError as e:
                disk.warn(f"ignoring cache file {disk.path / self.entry_name(key)}: {e}")
            else:
                value = replace(value, options=replace(value.options, cache_dir=self.directory))
                self.memory[key] = value
                self.disk_hits += 1
                return value
        self.misses += 1
        return None

    def put(self, key: str, value: CachedCompilation, durable: bool = True) -> None:
        """Keep `value` in memory and, where `durable` (not cut short by a time budget), on disk."""
        self.memory[key] = value
        disk = self.disk
        if durable and disk is not None and disk.write_error is None:
            try:
                data = dumps(key, value)
            except TypeError as e:  # a value the format cannot hold: kept in memory only
                disk.warn(f"cannot store compilation {key} on disk ({e})")
                return
            disk.write(self.entry_name(key), data)
