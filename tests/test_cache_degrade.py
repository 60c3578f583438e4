"""Issue 10: `cache_dir=` holds everything written; a cache directory that cannot be written costs
caching, never the compile (one CacheWarning); interpreter runs do not leak numpy warnings."""

import errno
import os
import uuid
import warnings

import numpy as np
import pytest
import torch

import neptune_eq
from neptune_eq import dsl as ne
from neptune_eq.cache import CompileCache
from neptune_eq.cachedir import CacheWarning
from neptune_eq.library import softmax


def fresh_softmax():
    """softmax over j of an 8 × 256 input, named uniquely: its kernel module is not loaded yet."""
    P = ne.program(f"softmax_{uuid.uuid4().hex[:8]}")
    i, j = P.axes(i=8, j=256)
    P.output("y", softmax(P.input("x", i, j), j))
    return P.build()


def check_softmax(out: torch.Tensor, x: torch.Tensor) -> None:
    assert torch.allclose(out.double(), torch.softmax(x.double(), -1), atol=1e-6, rtol=1e-5)


def files_under(d) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if not p.is_dir())


def test_cache_dir_holds_everything_written(tmp_path, monkeypatch):
    """With cache_dir=D nothing appears under $HOME or $XDG_CACHE_HOME (the default location)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    d = tmp_path / "cache"
    program = fresh_softmax()
    x = torch.randn(8, 256)
    check_softmax(neptune_eq.compile(program, cache_dir=d)(x), x)
    fn = neptune_eq.compile(lambda t: torch.softmax(t * 1.5, -1), x, cache_dir=d)
    check_softmax(fn(x / 1.5), x)
    assert files_under(home) == []
    written = files_under(d)
    assert any(f.startswith("programs/") and f.endswith(".json") for f in written)
    assert any(f.startswith("kernels/nq_") and f.endswith(".py") for f in written)


def _file(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    d.write_text("a file where the cache directory should be")
    return d


def _under_a_file(tmp_path, monkeypatch):
    parent = tmp_path / "file"
    parent.write_text("not a directory")
    return parent / "cache"


def _rename_denied(tmp_path, monkeypatch):
    """What a read-only directory does to a writer (works as root too, which ignores modes)."""
    def deny(*a, **kw):
        raise PermissionError(errno.EACCES, "Permission denied", str(a[-1]))

    monkeypatch.setattr(os, "replace", deny)
    return tmp_path / "cache"


def _read_only(tmp_path, monkeypatch):
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root ignores directory modes (_rename_denied covers it)")
    d = tmp_path / "cache"
    d.mkdir()
    d.chmod(0o500)
    return d


@pytest.mark.parametrize("broken", [_file, _under_a_file, _rename_denied, _read_only], ids=lambda f: f.__name__[1:])
def test_unwritable_cache_dir_compiles_with_one_warning(tmp_path, monkeypatch, broken):
    d = broken(tmp_path, monkeypatch)
    program = fresh_softmax()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            for _ in range(2):
                x = torch.randn(8, 256)
                check_softmax(neptune_eq.compile(program, cache_dir=d)(x), x)
            neptune_eq.api._CACHES.pop(str(d), None)  # as in a new compile cache: disk again
    ours = [str(w.message) for w in seen if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1, ours
    assert f"cannot write the cache directory {d}" in ours[0] and "compiling without caching" in ours[0]
    if d.parent.is_dir() and d.is_dir():
        assert not [f for f in files_under(d) if f.endswith(".tmp")]


def test_read_only_cache_still_serves_its_entries(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    program = fresh_softmax()
    neptune_eq.compile(program, cache_dir=d)
    key = next(iter(neptune_eq.api._cache_for(d).memory))
    _rename_denied(tmp_path, monkeypatch)
    fresh = CompileCache(d)
    assert fresh.get(key) is not None and fresh.disk_hits == 1


# ---------------------------------------------------------------- numpy warnings


def exp_sum(x):
    return torch.exp(x).sum(-1) - torch.exp(x).amax(-1)


def test_interpreter_runs_do_not_leak_numpy_warnings(tmp_path):
    """exp overflows to inf and inf - inf is NaN, in float32 as on a GPU: results, not warnings."""
    x = torch.full((4, 16), 100.0)
    x[0] = torch.randn(16)
    prog = neptune_eq.compile(exp_sum, x, cache_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the call
        out = prog(x)
    want = exp_sum(x)  # float32, as the program computes
    assert torch.allclose(out[0].double(), exp_sum(x[0].double()), rtol=1e-5)
    assert torch.isnan(out[1:]).all() and torch.isnan(want[1:]).all()
    with pytest.warns(RuntimeWarning, match="overflow"):  # the user's own numpy warnings still show
        np.exp(np.float32(100.0))
