"""The cache directory on disk: reads that trust only this user's files, writes that never fail a compile.

Everything neptune_eq caches lives under one directory (`cache_dir=`, else $XDG_CACHE_HOME/neptune_eq
or ~/.cache/neptune_eq): `programs/` (compiled plans, JSON), `kernels/` (copies of the generated
Triton modules, written for tools to read and never read back) and `tuning.json` (autotuning
results, JSON). A user may rely on:

  * Nothing read from the directory is executed: the formats are data, decoded by a parser that
    builds only an allowlist of neptune_eq types (see datafile.py).
  * A file is trusted only if this user owns it and neither group nor others may write it (checked
    on the opened file, so a file swapped between the check and the read is checked itself); a
    symbolic link, a non-regular file or an oversized file is refused. A refused or corrupt file
    is ignored with a CacheWarning naming it and why, and rewritten.
  * A directory that cannot be written (read-only, a regular file, an impossible path, a full disk)
    turns writing off for the rest of the process with one CacheWarning; compiling goes on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .ir import NeptuneWarning


class CacheWarning(NeptuneWarning):
    """The disk cache was bypassed: a file was refused, or the directory cannot be written."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neptune_eq"


@dataclass
class CacheDir:
    """One cache directory. Get it with `cache_dir(path)`: one instance per directory and process,
    so each problem is reported once and a directory that failed a write is not tried again."""

    path: Path
    write_error: str | None = None  # why writing is off (None: on)
    _warned: set[str] = field(default_factory=set)

    def warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"neptune_eq: {message}", CacheWarning, stacklevel=3)

    def read(self, rel: str, limit: int) -> bytes | None:
        """The bytes of file `rel`, if it exists and this user may trust it; else None (a refused
        file warns, naming itself and why; a missing one does not)."""
        path = self.path / rel
        # O_NOFOLLOW: a symbolic link in place of the file is refused; O_NONBLOCK: a FIFO does not hang
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                why = "it is a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
                self.warn(f"ignoring cache file {path}: {why}")
            return None
        try:
            why = untrusted(os.fstat(fd), limit)  # the opened file itself: no window for a swap
            if why is None:
                data = _read_all(fd, limit)
                if len(data) > limit:
                    why = f"larger than {limit} bytes"
        except OSError as e:
            why = e.strerror or str(e)
        finally:
            os.close(fd)
        if why is not None:
            self.warn(f"ignoring cache file {path}: {why}")
            return None
        return data

    def write(self, rel: str, data: bytes) -> bool:
        """Write file `rel` atomically (a temporary file renamed into place, mode 0600), creating
        directories (mode 0700). False where writing is off; the first failure turns it off with
        a CacheWarning saying why."""
        if self.write_error is not None:
            return False
        path = self.path / rel
        try:
            _write_atomic(path, data)
            return True
        except OSError as e:
            self.write_error = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
            self.warn(f"cannot write the cache directory {self.path} ({self.write_error}); compiling without "
                      "caching to disk")
            return False

    @contextlib.contextmanager
    def locked(self, rel: str, timeout_s: float = 10.0) -> Iterator[None]:
        """Hold an exclusive lock on file `rel` (fcntl.flock) while the body runs. Where locking is
        unsupported, the file cannot be created, or another holder keeps it past `timeout_s`, the
        body runs unlocked (warned once): a lost update costs a re-tune, a hang would cost more."""
        fd = self._lock(self.path / rel, timeout_s)
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # closing the last descriptor releases the flock

    def _lock(self, path: Path, timeout_s: float) -> int | None:
        try:
            import fcntl
        except ImportError:  # not POSIX
            self.warn("file locking is unsupported here: concurrent tuning may lose updates")
            return None
        if self.write_error is not None:
            return None  # nothing is written, so nothing to guard
        fd = None
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                         0o600)
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(errno.ETIMEDOUT, f"held by another process for over {timeout_s:g} s",
                                           str(path)) from None
                    time.sleep(0.01)
        except OSError as e:
            if fd is not None:
                os.close(fd)
            self.warn(f"cannot lock {path} ({e.strerror or e}); updating it unlocked")
            return None


def untrusted(st: os.stat_result, limit: int) -> str | None:
    """Why a file with status `st` must not be trusted (None: it may be)."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if hasattr(os, "geteuid"):  # POSIX owners and modes (elsewhere st_mode does not describe who may write)
        if st.st_uid != os.geteuid():
            return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):#o})"
    if st.st_size > limit:
        return f"larger than {limit} bytes"
    return None


def _read_all(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path` and rename it into place: readers and
    concurrent writers never see a half-written file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# One CacheDir per directory and process (not configuration: it remembers what was reported and
# whether writing failed, so a broken directory warns once rather than on every call).
_DIRS: dict[str, CacheDir] = {}


def cache_dir(path: Path | str | None) -> CacheDir:
    """The CacheDir of `path` (None: the default directory)."""
    p = Path(path) if path is not None else default_cache_dir()
    key = os.path.abspath(p)
    got = _DIRS.get(key)
    if got is None:
        got = _DIRS[key] = CacheDir(p)
    return got
