"""Issue 10: the tuning cache (tuning.json) is checked entry by entry, trusted only when this user
wrote it, and updated under a file lock (concurrent tuners keep each other's results)."""

import errno
import json
import os
import threading
import time

import pytest

from neptune_eq import tune
from neptune_eq.cachedir import CacheWarning, cache_dir
from neptune_eq.schedule import KernelSchedule
from neptune_eq.tune import _fits, _schedule_to, load_tuning, store_tuning

GOOD = KernelSchedule({"i": 64, "j": 128}, num_warps=8, num_stages=3, steps={"i": 4}, fast_math=True)

CRAFTED = {
    "warps a string": {**_schedule_to(GOOD), "num_warps": "8; rm -rf ~"},
    "warps a bool": {**_schedule_to(GOOD), "num_warps": True},
    "warps not a power of two": {**_schedule_to(GOOD), "num_warps": 6},
    "too many warps": {**_schedule_to(GOOD), "num_warps": 1024},
    "tile not a power of two": {**_schedule_to(GOOD), "tiles": {"i": 48, "j": 128}},
    "negative tile": {**_schedule_to(GOOD), "tiles": {"i": -64, "j": 128}},
    "huge tile": {**_schedule_to(GOOD), "tiles": {"i": 1 << 40, "j": 128}},
    "tiles a list": {**_schedule_to(GOOD), "tiles": [64, 128]},
    "zero stages": {**_schedule_to(GOOD), "num_stages": 0},
    "stages a float": {**_schedule_to(GOOD), "num_stages": 2.5},
    "unknown precision": {**_schedule_to(GOOD), "input_precision": "__import__('os')"},
    "step beyond its tile": {**_schedule_to(GOOD), "steps": {"i": 65}},
    "step of an untiled axis": {**_schedule_to(GOOD), "steps": {"z": 1}},
    "flag a string": {**_schedule_to(GOOD), "tma": "yes"},
    "unknown field": {**_schedule_to(GOOD), "__class__": "Popen"},
    "missing field": {"tiles": {"i": 64}},
    "not an object": [1, 2, 3],
}


def test_crafted_tuning_entries_are_dropped_and_good_ones_kept(tmp_path):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"good": _schedule_to(GOOD), **CRAFTED}))
    with pytest.warns(CacheWarning, match=f"ignoring {len(CRAFTED)} entries of tuning cache {path}"):
        got = load_tuning(path)
    assert got == {"good": GOOD}


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "[" * 100_000], ids=["corrupt", "a list", "deep"])
def test_malformed_tuning_file_is_ignored(tmp_path, text):
    path = tmp_path / "tuning.json"
    path.write_text(text)
    with pytest.warns(CacheWarning, match=f"ignoring tuning cache {path}"):
        assert load_tuning(path) == {}


def test_group_writable_tuning_file_is_refused(tmp_path):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"good": _schedule_to(GOOD)}))
    path.chmod(0o666)
    with pytest.warns(CacheWarning, match="writable by group or others"):
        assert load_tuning(path) == {}


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_tuning_file_of_another_user_is_refused(tmp_path):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"good": _schedule_to(GOOD)}))
    os.chown(path, 12345, -1)
    with pytest.warns(CacheWarning, match="owned by uid 12345"):
        assert load_tuning(path) == {}


def test_cached_schedule_must_tile_the_kernels_axes():
    assert _fits(GOOD, KernelSchedule({"i": 16, "j": 256}))
    assert not _fits(GOOD, KernelSchedule({"i": 16, "j": 256, "d": 32}))
    assert not _fits(KernelSchedule({"q": 64}), KernelSchedule({"i": 16}))


def test_concurrent_tuners_keep_each_others_results(tmp_path, monkeypatch):
    """Eight tuners each add their kernel's result; a slow read inside the read-modify-write makes
    an unguarded merge lose updates."""
    path = tmp_path / "tuning.json"
    read = tune.load_tuning

    def slow_read(p):
        got = read(p)
        time.sleep(0.05)
        return got

    monkeypatch.setattr(tune, "load_tuning", slow_read)
    threads = [threading.Thread(target=store_tuning, args=(path, {f"k{n}": GOOD})) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.undo()
    assert load_tuning(path) == {f"k{n}": GOOD for n in range(8)}
    assert path.stat().st_mode & 0o777 == 0o600


def test_lock_held_elsewhere_times_out_and_proceeds(tmp_path):
    import fcntl

    disk = cache_dir(tmp_path)
    fd = os.open(tmp_path / "x.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        ran = []
        with pytest.warns(CacheWarning, match="cannot lock .*x.lock .*held by another process"), \
                disk.locked("x.lock", timeout_s=0.2):
            ran.append(True)
        assert ran
    finally:
        os.close(fd)


def test_unsupported_locking_proceeds_unlocked(tmp_path, monkeypatch):
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    path = tmp_path / "tuning.json"
    with pytest.warns(CacheWarning, match="No locks available"):
        store_tuning(path, {"k": GOOD})
    monkeypatch.undo()
    assert load_tuning(path) == {"k": GOOD}


def test_tuning_times_the_best_plan_of_every_split_besides_the_models_top():
    import torch

    from neptune_eq.frontend import capture
    from neptune_eq.runtime import compile_ir
    from neptune_eq.tune import tuning_candidates

    alts = compile_ir(capture(lambda x: x.var(-1), torch.randn(3, 5000)).program).alternatives
    picked = tuning_candidates(alts, 3, splits=100)
    assert picked[:3] == alts[:3]
    splits = lambda a: tuple(s for _, _, s in a.plan.groups)  # noqa: E731
    assert {splits(a) for a in picked} == {splits(a) for a in alts}  # every split is timed once
    for a in picked[3:]:  # each the best-ranked of its split
        assert next(b for b in alts if splits(b) == splits(a)) is a
    few = tuning_candidates(alts, 3, splits=2)
    assert len({splits(a) for a in alts}) > 5 and few == picked[:5]  # bounded, in the model's order


def test_choose_plan_never_takes_a_plan_that_fails_the_stress_sets(monkeypatch):
    """The fastest plan is rejected when its error on a stress set exceeds the tolerance (here its
    outputs are perturbed on the offset set, the one where cancellation shows): the choice is the
    fastest plan that passes; when no timed plan passes, the next alternative that does."""
    import torch

    from neptune_eq.frontend import capture
    from neptune_eq.runtime import CompiledProgram, compile_ir
    from neptune_eq.tune import choose_plan

    torch.manual_seed(0)
    x = torch.randn(3, 300)
    prog = compile_ir(capture(lambda x: torch.softmax(x, -1), x).program)
    assert len(prog.alternatives) >= 4
    bad: set[int] = set()
    run = CompiledProgram.run

    def perturbed(self, inputs, out_dtypes=None):
        outs = run(self, inputs, out_dtypes)
        if self.choice in bad and inputs["x"].mean() > 10:  # the offset set: 50 + N(0, 1)
            outs = {k: v * 1.01 for k, v in outs.items()}
        return outs

    monkeypatch.setattr(CompiledProgram, "run", perturbed)
    timer = lambda launcher, inputs, rep: 1.0 if launcher is fastest[0] else 2.0  # noqa: E731
    fastest = [None]
    orig_launcher = CompiledProgram.launcher

    def launcher(self, target, *a, **kw):
        out = orig_launcher(self, target, *a, **kw)
        if self.choice == 0:
            fastest[0] = out
        return out

    monkeypatch.setattr(CompiledProgram, "launcher", launcher)
    assert choose_plan(prog, {"x": x}, candidates=3, progress=False, timer=timer).choice == 0
    bad.add(0)  # the fastest plan now fails on the offset set
    picked = choose_plan(prog, {"x": x}, candidates=3, progress=False, timer=timer)
    assert picked.choice != 0 and picked.choice in {a.id for a in prog.alternatives[:3]}
    bad.update(a.id for a in prog.alternatives[:3])  # every plan of the top three fails ...
    from neptune_eq.tune import tuning_candidates
    bad.update(a.id for a in tuning_candidates(prog.alternatives, 3))  # ... and every timed one
    picked = choose_plan(prog, {"x": x}, candidates=3, progress=False, timer=timer)
    assert picked.choice not in bad
    assert picked.verify(sets=("normal", "offset", "wide"), seed=1).passed
