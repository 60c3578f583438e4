"""neptune_eq.compile / neptune_eq.attention: the public contract of issue 3."""

import json
import math
import sys
import threading

import pytest
import torch
import torch.nn.functional as F
from helpers import EXAMPLES

import neptune_eq
import neptune_eq.frontend as frontend
from neptune_eq.cache import CompileCache
from neptune_eq.cachedir import CacheWarning

sys.path.insert(0, str(EXAMPLES))
import neptune_ops


def causal(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    L, S = s.shape[-2:]
    keep = torch.arange(S)[None, :] <= torch.arange(L)[:, None]
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


def inputs(L=40, S=None, D=16, H=2, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = S or L
    return (torch.randn(1, H, L, D, generator=g).to(dtype), torch.randn(1, H, S, D, generator=g).to(dtype),
            torch.randn(1, H, S, D, generator=g).to(dtype))


def rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def test_compile_matches_the_function_and_exposes_the_plan(tmp_path):
    args = inputs(37)
    prog = neptune_eq.compile(causal, *args, cache_dir=tmp_path)
    ref = causal(*(a.double() for a in args))
    assert rel(prog(*args), ref) < 1e-4
    assert len(prog.kernels) == 1 and "@triton.jit" in prog.kernels[0].source
    assert len(prog.alternatives) > 1 and prog.alternatives[0].predicted_time > 0
    text = prog.explain()
    assert "rolling_update" in text and "predicted" in text


def test_same_signature_does_not_retrace_other_shapes_respecialise(tmp_path, monkeypatch):
    args = inputs(24)
    prog = neptune_eq.compile(causal, *args, cache_dir=tmp_path)
    calls = []
    real = frontend.capture
    monkeypatch.setattr(frontend, "capture", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    prog(*inputs(24, seed=1))
    assert calls == []
    other = inputs(33, seed=2)
    out = prog(*other)
    assert len(calls) == 1
    assert rel(out, causal(*(a.double() for a in other))) < 1e-4


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_half_precision_in_same_dtype_out(tmp_path, dtype, tol):
    args = inputs(30, dtype=dtype)
    prog = neptune_eq.compile(causal, *args, cache_dir=tmp_path)
    out = prog(*args)
    assert out.dtype == dtype
    assert rel(out, causal(*(a.double() for a in args))) < tol


def test_non_contiguous_inputs(tmp_path):
    q, k, v = inputs(29, D=16)
    kt = k.transpose(-2, -1).contiguous().transpose(-2, -1)  # same values, other strides
    assert not kt.is_contiguous()
    prog = neptune_eq.compile(causal, q, kt, v, cache_dir=tmp_path)
    assert rel(prog(q, kt, v), causal(q.double(), k.double(), v.double())) < 1e-4


def test_fully_masked_rows_are_zero(tmp_path):
    def shifted(q, k, v):
        s = q @ k.transpose(-2, -1)
        keep = torch.arange(s.shape[-1])[None, :] < torch.arange(s.shape[-2])[:, None] - 3
        return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v

    args = inputs(20)
    out = neptune_eq.compile(shifted, *args, cache_dir=tmp_path)(*args)
    assert torch.all(out[:, :, :4] == 0) and torch.isfinite(out).all()


def test_memory_and_disk_cache(tmp_path):
    args = inputs(21)
    neptune_eq.compile(causal, *args, cache_dir=tmp_path)
    from neptune_eq.api import _cache_for

    cache = _cache_for(tmp_path)
    misses = cache.misses
    neptune_eq.compile(causal, *args, cache_dir=tmp_path)
    assert cache.hits >= 1 and cache.misses == misses  # same program: no new search
    fresh = CompileCache(tmp_path)  # another process: only the disk
    key = next(iter(cache.memory))
    assert fresh.get(key) is not None and fresh.disk_hits == 1


def test_corrupt_cache_entry_is_a_miss_and_is_rewritten(tmp_path):
    args = inputs(22)
    neptune_eq.compile(causal, *args, cache_dir=tmp_path)
    entry = next((tmp_path / "programs").glob("*.json"))
    key = entry.stem
    entry.write_bytes(b"not a cache entry")
    cache = CompileCache(tmp_path)
    with pytest.warns(CacheWarning, match="not a neptune_eq cache entry"):
        assert cache.get(key) is None
    neptune_eq.api._CACHES.pop(str(tmp_path), None)
    neptune_eq.compile(causal, *args, cache_dir=tmp_path)
    assert CompileCache(tmp_path).get(key) is not None


def test_concurrent_writers_leave_a_loadable_entry(tmp_path):
    args = inputs(23)
    neptune_eq.compile(causal, *args, cache_dir=tmp_path)
    from neptune_eq.api import _cache_for

    value = next(iter(_cache_for(tmp_path).memory.values()))
    writers = [CompileCache(tmp_path) for _ in range(4)]
    threads = [threading.Thread(target=w.put, args=("shared", value)) for w in writers for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert CompileCache(tmp_path).get("shared") is not None
    assert not list((tmp_path / "programs").glob("*.tmp"))
    head = (tmp_path / "programs" / "shared.json").read_bytes().split(b"\n", 1)[0]
    assert json.loads(head)["key"] == "shared"


def test_inside_torch_compile(tmp_path):
    args = inputs(26)
    prog = neptune_eq.compile(causal, *args, cache_dir=tmp_path)

    def model(q, k, v):
        return prog(q * 2.0, k, v) + 1.0

    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = compiled(*args)
    ref = causal(*(a.double() for a in (args[0] * 2.0, args[1], args[2]))) + 1.0
    assert rel(out, ref) < 1e-4


def test_flex_compatible_attention(tmp_path):
    q, k, v = inputs(35, D=16, H=2)
    slopes = torch.tensor([0.5, 0.25])

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def causal_mask(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    out = neptune_eq.attention(q, k, v, score_mod=alibi, mask_mod=causal_mask, cache_dir=tmp_path)
    qd, kd, vd = (x.double() for x in (q, k, v))
    s = qd @ kd.transpose(-2, -1) / 4.0
    i, j = torch.arange(35)[:, None], torch.arange(35)[None, :]
    s = s + slopes.double().view(1, 2, 1, 1) * (j - i)
    ref = torch.softmax(s.masked_fill(j > i, float("-inf")), -1) @ vd
    assert rel(out, ref) < 1e-4
    again = neptune_eq.attention(q, k, v, score_mod=alibi, mask_mod=causal_mask, cache_dir=tmp_path)
    assert torch.equal(out, again)


def test_gqa_through_flex_entry(tmp_path):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 1, 16, generator=g)
    k, v = torch.randn(1, 2, 50, 16, generator=g), torch.randn(1, 2, 50, 16, generator=g)
    out = neptune_eq.attention(q, k, v, enable_gqa=True, cache_dir=tmp_path)
    kr, vr = k.repeat_interleave(2, 1).double(), v.repeat_interleave(2, 1).double()
    ref = torch.softmax(q.double() @ kr.transpose(-2, -1) / 4.0, -1) @ vr
    assert rel(out, ref) < 1e-4


@pytest.mark.parametrize("op", sorted(neptune_ops.OPS))
def test_every_neptune_op_end_to_end(tmp_path, op):
    heads = (4, 2) if op in ("gqa_pf", "gqa_dc", "softcap_pf", "softcap_dc", "window_pf") else (2, 2)
    args = neptune_ops.example_inputs(op, 48, head_dim=16, heads=heads)
    fn = neptune_ops.OPS[op][0]
    if op == "window_pf":
        def fn(q, k, v):
            return neptune_ops.window_pf(q, k, v, window=12)
    prog = neptune_eq.compile(fn, *args, cache_dir=tmp_path)
    out = prog(*args)
    ref = fn(*(a.double() for a in args))
    assert rel(out, ref) < 1e-4, op


def test_unknown_option_is_a_clear_error(tmp_path):
    with pytest.raises(neptune_eq.ir.NeptuneError, match="unknown option"):
        neptune_eq.compile(causal, *inputs(8), cache_dir=tmp_path, tile_size=7)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_tune_without_a_gpu_is_a_clear_error(tmp_path):
    args = inputs(8)
    prog = neptune_eq.compile(causal, *args, cache_dir=tmp_path)
    with pytest.raises(neptune_eq.ir.NeptuneError, match="GPU"):
        prog.tune(*args)
    assert rel(prog(*args), causal(*(a.double() for a in args))) < 1e-4  # still usable


def test_a_dropped_compilation_frees_its_egraphs_at_once():
    """An e-graph must be freed on the thread that made it (egglog's are unsendable; freed on
    another it prints a panic). A compilation left in a reference cycle waits for the cyclic
    collector, which runs on whichever thread allocates next — autograd's backward thread among
    them. A dropped compilation frees its e-graphs by reference counting, the collector off."""
    import gc

    from egglog import EGraph

    from neptune_eq.grad import backward_program
    from neptune_eq.pipeline import compile_program

    def causal(q, k, v):
        L = q.shape[-2]
        keep = torch.arange(L)[:, None] >= torch.arange(L)[None]
        return torch.softmax((q @ k.transpose(-1, -2) / 4).masked_fill(~keep, float("-inf")), -1) @ v

    prog = frontend.capture(causal, *[torch.randn(1, 2, 24, 16) for _ in range(3)]).program

    def egraphs() -> int:
        return sum(isinstance(o, EGraph) for o in gc.get_objects())

    for p in (prog, backward_program(prog, saved=True).program):
        gc.collect()
        before = egraphs()
        gc.disable()
        try:
            c = compile_program(p)
            assert egraphs() > before
            del c
            assert egraphs() == before, p.name
        finally:
            gc.enable()


def test_arguments_given_by_keyword_take_their_positions(tmp_path):
    """`prog(q, k, v=v)` raised a plain TypeError: keywords now bind to fn's parameters; a default
    given by keyword is a new static argument (another capture); an unknown keyword is refused by name."""
    def attend(q, k, v, scale=0.5):
        return torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v

    q, k, v = inputs(L=8)
    prog = neptune_eq.compile(attend, q, k, v, cache_dir=tmp_path)
    want = attend(q, k, v)
    assert torch.allclose(prog(q, k, v=v), want, atol=1e-6)
    assert torch.allclose(prog(q=q, k=k, v=v), want, atol=1e-6)
    assert torch.allclose(prog(q, k, v, scale=0.3), attend(q, k, v, 0.3), atol=1e-6)
    with pytest.raises(neptune_eq.NeptuneError, match="'w'"):
        prog(q, k, w=v)

    def loss(x, t, smoothing=0.1, reduction="mean"):  # (a later default by keyword, an earlier one left out)
        return F.cross_entropy(x, t, label_smoothing=smoothing, reduction=reduction)
    x, t = torch.randn(4, 10), torch.randint(0, 10, (4,))
    lp = neptune_eq.compile(loss, x, t, cache_dir=tmp_path)
    assert torch.allclose(lp(x, t, reduction="none"), loss(x, t, reduction="none"), atol=1e-6)

    def tempered(x, *, T=1.0):
        return torch.softmax(x / T, -1)
    with pytest.raises(neptune_eq.NeptuneError, match=r"keyword-only.*functools\.partial"):
        neptune_eq.compile(tempered, x)(x, T=0.5)
