"""Issue 10: nothing read from a cache directory runs as code, and only this user's entries are used.

A crafted pickle (the old entry format), a crafted JSON entry, another user's or a group-writable
entry, a symbolic link or a FIFO in place of an entry: each is ignored with a CacheWarning naming the
file, the program is recompiled, and the entry is rewritten. A kernel module planted or swapped in
`kernels/` is never executed: the generated source runs from memory.
"""

import hashlib
import json
import linecache
import os
import pickle
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import neptune_eq
from neptune_eq import dsl as ne
from neptune_eq.api import _CACHES, _cache_for
from neptune_eq.cache import CompileCache, dumps, loads
from neptune_eq.cachedir import CacheWarning
from neptune_eq.datafile import FormatError
from neptune_eq.library import softmax
from neptune_eq.lower.launch import Launcher, load_module


def softmax_program(name: str = "softmax"):
    """softmax over j of an 8 × 256 input (its name makes its kernels' source unique)."""
    P = ne.program(name)
    i, j = P.axes(i=8, j=256)
    P.output("y", softmax(P.input("x", i, j), j))
    return P.build()


def check_softmax(out: torch.Tensor, x: torch.Tensor) -> None:
    assert torch.allclose(out.double(), torch.softmax(x.double(), -1), atol=1e-6, rtol=1e-5)


class Planted:
    """Unpickling this calls Path.touch(marker): what a crafted entry could run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def compiled_entry(tmp_path) -> tuple[str, Path]:
    neptune_eq.compile(softmax_program(), cache_dir=tmp_path)
    key = next(iter(_cache_for(tmp_path).memory))
    return key, tmp_path / "programs" / f"{key}.json"


def recompile(tmp_path):
    _CACHES.pop(str(tmp_path), None)  # a new process: only the disk
    return neptune_eq.compile(softmax_program(), cache_dir=tmp_path)


def test_crafted_pickle_in_the_cache_does_not_run(tmp_path):
    key, entry = compiled_entry(tmp_path)
    marker = tmp_path / "pwned"
    payload = pickle.dumps((1, key, Planted(marker)))
    (tmp_path / "programs" / f"{key}.pkl").write_bytes(payload)  # where the pickle cache looked
    entry.write_bytes(payload)
    with pytest.warns(CacheWarning, match=f"ignoring cache file .*{key}.json: not a neptune_eq cache entry"):
        prog = recompile(tmp_path)
    assert not marker.exists()
    x = torch.randn(8, 256)
    check_softmax(prog(x), x)
    assert CompileCache(tmp_path).get(key) is not None  # rewritten as a valid entry


def _rewrite(entry: Path, mutate, rehash: bool = True) -> None:
    """Rewrite an entry's header and body ({"head": ..., "body": ...} for `mutate`), with a matching
    checksum unless rehash=False (what a careful forger would write)."""
    head, body = entry.read_bytes().split(b"\n", 1)
    doc = {"head": json.loads(head), "body": json.loads(body)}
    mutate(doc)
    body = json.dumps(doc["body"]).encode()
    if rehash:
        doc["head"]["sha256"] = hashlib.sha256(body).hexdigest()
    entry.write_bytes(json.dumps(doc["head"]).encode() + b"\n" + body)


def _first(doc, pred) -> dict:
    return next(o for o in doc["body"]["objects"] if pred(o))


def _class(name):
    return lambda doc: _first(doc, lambda o: o.get("class") == name)


CRAFTED = {
    "unknown class": (lambda d: _class("KernelSchedule")(d).update({"class": "Popen"}), "not allowed"),
    "field of the wrong type": (lambda d: _class("KernelSchedule")(d)["fields"].update({"num_warps": "8"}),
                                "does not match"),
    "unknown field": (lambda d: _class("KernelSchedule")(d)["fields"].update({"__class__": 1}), "no field"),
    "unknown operator": (lambda d: _first(d, lambda o: o.get("node") == "Call")["args"].__setitem__(0, "system"),
                         "unknown operator"),
    "forward reference": (lambda d: d["body"].update({"root": {"ref": len(d["body"]["objects"])}}),
                          "bad reference"),
    "unknown tag": (lambda d: _class("KernelSchedule")(d)["fields"].update({"tiles": {"__reduce__": []}}),
                    "unexpected"),
    "not a compilation": (lambda d: d["body"].update({"root": {"ref": 0}}), "not a compilation"),
    "another format": (lambda d: d["head"].update({"format": 1}), "format 1"),
    "another key": (lambda d: d["head"].update({"key": "0" * 32}), "another key"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_json_entry_is_refused_and_rewritten(tmp_path, case):
    mutate, why = CRAFTED[case]
    key, entry = compiled_entry(tmp_path)
    _rewrite(entry, mutate)
    with pytest.warns(CacheWarning, match=why):
        assert CompileCache(tmp_path).get(key) is None
    x = torch.randn(8, 256)
    check_softmax(recompile(tmp_path)(x), x)
    assert CompileCache(tmp_path).get(key) is not None


def test_tampered_entry_fails_its_checksum(tmp_path):
    key, entry = compiled_entry(tmp_path)
    _rewrite(entry, lambda d: _class("KernelSchedule")(d)["fields"].update({"num_warps": 1}), rehash=False)
    with pytest.warns(CacheWarning, match="checksum mismatch"):
        assert CompileCache(tmp_path).get(key) is None


def test_deeply_nested_entry_is_refused_without_crashing(tmp_path):
    key, entry = compiled_entry(tmp_path)
    _rewrite(entry, lambda d: d.update({"body": "@"}))
    head = entry.read_bytes().split(b"\n", 1)[0]
    body = b"[" * 200_000 + b"]" * 200_000
    entry.write_bytes(json.dumps({**json.loads(head), "sha256": hashlib.sha256(body).hexdigest()}).encode()
                      + b"\n" + body)
    with pytest.warns(CacheWarning, match="body is not JSON"):
        assert CompileCache(tmp_path).get(key) is None


def test_group_writable_entry_is_refused_and_rewritten_private(tmp_path):
    key, entry = compiled_entry(tmp_path)
    entry.chmod(0o666)
    with pytest.warns(CacheWarning, match=r"writable by group or others \(mode 0o666\)"):
        recompile(tmp_path)
    assert entry.stat().st_mode & 0o777 == 0o600
    assert CompileCache(tmp_path).get(key) is not None


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_entry_owned_by_another_user_is_refused(tmp_path):
    key, entry = compiled_entry(tmp_path)
    os.chown(entry, 12345, -1)
    with pytest.warns(CacheWarning, match="owned by uid 12345, not by this user"):
        assert CompileCache(tmp_path).get(key) is None


def test_symlinked_entry_is_refused(tmp_path):
    key, entry = compiled_entry(tmp_path)
    elsewhere = tmp_path / "elsewhere.json"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)
    with pytest.warns(CacheWarning, match="symbolic link"):
        assert CompileCache(tmp_path).get(key) is None


def test_fifo_in_place_of_an_entry_does_not_hang(tmp_path):
    key, entry = compiled_entry(tmp_path)
    entry.unlink()
    os.mkfifo(entry)
    with pytest.warns(CacheWarning, match="not a regular file"):
        assert CompileCache(tmp_path).get(key) is None


def test_entries_round_trip_exactly(tmp_path):
    """The decoded entry equals what was stored and lowers to the same kernels (split-K included)."""
    from helpers import load_example

    from neptune_eq.lower.triton import write_module

    for program in (softmax_program(), load_example("decode_attention")):
        prog = neptune_eq.compile(program, cache_dir=tmp_path)
        value = prog.compilation
        back = loads("k", dumps("k", value))
        assert back == replace(value, options=replace(value.options, cache_dir=None))  # where it lives is not stored
        for a, b in zip(value.alternatives, back.alternatives):
            assert (write_module(a.plan, value.program, a.schedules, "cuda", "p")
                    == write_module(b.plan, back.program, b.schedules, "cuda", "p"))
    with pytest.raises(FormatError):
        loads("k", b"\x80\x04K\x01.")  # a pickle is not an entry


# ---------------------------------------------------------------- kernel modules


def unique_lowering(tmp_path):
    """A compiled softmax and its interpreter module's source, made unique to this test (so it is
    not already loaded in this process)."""
    prog = neptune_eq.compile(softmax_program(), cache_dir=tmp_path)
    src, ks = prog.lowered("interpreter")
    return prog, src + f"\n# {uuid.uuid4().hex}\n", ks


def planted(src: str, marker: Path) -> str:
    """`src` with a statement creating `marker` at the top of the softmax kernel's body and at the end of
    the module (the lines before the kernel keep their numbers, as a careful attacker would keep them)."""
    line = "    pid = tl.program_id(0)\n"
    assert line in src
    evil = f"open({str(marker)!r}, 'w').write('ran')"
    return src.replace(line, f"{line}    {evil}\n", 1) + f"\n{evil}\n"


def run(prog, ks, mod, x):
    return Launcher(prog.program, prog.plan, ks, mod)({"x": x})["y"]


def test_kernel_file_swapped_after_writing_is_not_executed(tmp_path, monkeypatch):
    """An attacker replacing kernels/nq_<hash>.py between our write and its use wins nothing."""
    prog, src, ks = unique_lowering(tmp_path)
    marker = tmp_path / "pwned"
    real_replace = os.replace

    def replace_then_swap(a, b, **kw):
        real_replace(a, b, **kw)
        if str(b).endswith(".py"):
            Path(b).write_text(planted(src, marker))

    monkeypatch.setattr(os, "replace", replace_then_swap)
    mod = load_module(src, tmp_path)
    monkeypatch.undo()
    x = torch.randn(8, 256)
    check_softmax(run(prog, ks, mod, x), x)
    assert not marker.exists()


def test_kernel_source_is_not_reread_from_disk_after_linecache_is_cleared(tmp_path):
    """The interpreter reads a kernel's source on its first launch; by then the file may be
    another's, and linecache may have been cleared."""
    prog, src, ks = unique_lowering(tmp_path)
    mod = load_module(src, tmp_path)
    marker = tmp_path / "pwned"
    Path(mod.__file__).write_text(planted(src, marker))
    linecache.clearcache()
    x = torch.randn(8, 256)
    check_softmax(run(prog, ks, mod, x), x)
    assert not marker.exists()


def test_kernel_module_written_where_it_cannot_be_runs_from_memory(tmp_path, monkeypatch):
    prog, src, ks = unique_lowering(tmp_path)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a directory")
    with pytest.warns(CacheWarning, match="cannot write the cache directory"):
        mod = load_module(src, blocked)
    x = torch.randn(8, 256)
    check_softmax(run(prog, ks, mod, x), x)


def test_the_compiler_fingerprint_covers_every_subpackage():
    """A cached plan is keyed by a hash of the compiler's sources; the fusion package (where rolling
    corrections are searched and checked) was left out of it, so a fix there kept serving the plans
    the old code made from the disk cache."""
    from neptune_eq.cache import fingerprinted_sources

    names = {name.split("/", 1)[1] for name, _ in fingerprinted_sources()}
    for module in ("fusion/correction.py", "fusion/search.py", "lower/launch.py", "frontend/capture.py",
                   "explorer/__init__.py", "pipeline.py"):
        assert module in names, module
