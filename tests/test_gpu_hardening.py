"""Issue 10's lowering cases on CUDA: the compiled Triton (not the interpreter) must give the same
answers — NaN-propagating reductions, int64 and float64 arithmetic, floor division, masked gathers,
64-bit offsets. Skipped without a GPU."""

import math
import sys
from pathlib import Path

import pytest
import torch

import neptune_eq
from neptune_eq import dsl as ne
from neptune_eq.runtime import compile_ir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEV = "cuda"


def _check(fn, *args, exact=False, tol=1e-5):
    got = neptune_eq.compile(fn, *args)(*args)
    want = fn(*(a.double() if a.is_floating_point() and a.dtype != torch.float64 else a for a in args))
    if exact:
        assert torch.equal(got, want.to(got.dtype))
    else:
        assert torch.allclose(got.double(), want.double(), rtol=tol, atol=tol, equal_nan=True)
    return got


def test_rows_emptied_without_the_key_index_cuda():
    q, k, v = (torch.randn(2, 4, n, 64, device=DEV) for n in (200, 256, 256))
    for mod in (lambda b, h, q_idx, kv_idx: q_idx >= 5, lambda b, h, q_idx, kv_idx: h > 0):
        out = neptune_eq.attention(q, k, v, mask_mod=mod)
        keep = mod(0, torch.arange(4, device=DEV)[:, None, None], torch.arange(200, device=DEV)[None, :, None],
                   torch.arange(256, device=DEV)[None, None, :]).expand(4, 200, 256)
        s = (q.double() @ k.double().transpose(-1, -2) / 8).masked_fill(~keep, -math.inf)
        ref = torch.softmax(s, -1).nan_to_num(0.0) @ v.double()
        assert (out.double() - ref).abs().max() < 1e-4


def test_integers_nan_inf_and_constants_cuda():
    _check(lambda x: x.sum(-1), torch.randint(-2**44, 2**44, (64, 3000), dtype=torch.int64, device=DEV), exact=True)
    _check(lambda x: x.amax(-1), torch.randint(2**26 - 9, 2**26, (64, 3000), dtype=torch.int32, device=DEV),
           exact=True)
    x = torch.randn(64, 3000, device=DEV)
    x[3, 17] = math.nan
    assert _check(lambda x: x.amax(-1), x)[3].isnan() and _check(lambda x: x.amin(-1), x)[3].isnan()
    w = torch.randn(64, 3000, device=DEV)
    w[5, 9] = math.inf
    assert _check(lambda w: torch.logsumexp(w, -1), w)[5] == math.inf
    _check(lambda x: (x * 0).sum(-1), torch.randn(64, 300, device=DEV))
    counts = torch.randn(64, 3000, device=DEV)  # integer states of counts: int64 from the first tile
    _check(lambda x: (x > 0).sum(-1), counts, exact=True)
    _check(lambda x: torch.where(x > 0, 2, -3).amax(-1), counts, exact=True)
    _check(lambda x, s: (x * s).sum(-1), torch.randn(64, 300, device=DEV), torch.tensor(3.0, device=DEV))


def test_float64_programs_cuda():
    x = torch.randn(64, 1000, dtype=torch.float64, device=DEV) * 1e-3 + 1e8
    got = neptune_eq.compile(lambda x: x.mean(-1), x)(x)
    assert ((got - x.mean(-1)) / 1e8).abs().max() < 1e-15
    q, k, v = (torch.randn(1, 2, 256, 64, dtype=torch.float64, device=DEV) for _ in range(3))
    attn = lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2), -1) @ v  # noqa: E731
    _check(attn, q, k, v, tol=1e-12)


def test_floor_division_and_gathers_cuda():
    def fn(x):
        rel = torch.arange(64, device=x.device)[:, None] - torch.arange(64, device=x.device)[None, :]
        return x + rel // 2 + rel % 3

    _check(fn, torch.randn(64, 64, device=DEV))
    P = ne.program("gather")
    i, c = P.axes(i=4, c=10)
    P.input("x", i, c)
    t = P.input("t", i, dtype="int64")
    P.output("y", P.gather("x", i, t))
    x = torch.randn(4, 10, device=DEV)
    got = compile_ir(P.build())(x=x, t=torch.tensor([0, 9, 10, -1], device=DEV))
    assert got[0] == x[0, 0] and got[1] == x[1, 9] and got[2:].isnan().all()


def test_view_with_a_stride_past_2_31_cuda():
    base = torch.zeros(2**31 + 64, dtype=torch.bool, device=DEV)
    base[5] = True
    base[2**31 + 3] = True
    view = base.as_strided((2, 8), (2**31, 1))
    prog = neptune_eq.compile(lambda x: x.sum(-1), view)
    assert torch.equal(prog(view), torch.tensor([1, 1], device=DEV))
    assert torch.equal(prog(view), torch.tensor([1, 1], device=DEV))  # again, through the bound fast path


def test_bf16_attention_verifies_with_its_default_tolerance_cuda():
    q, k, v = (torch.randn(1, 4, 512, 64, dtype=torch.bfloat16, device=DEV) for _ in range(3))
    prog = neptune_eq.compile(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v, q, k, v)
    assert prog.verify(device=DEV, sets=("normal", "offset", "wide")).passed


def test_half_gather_into_a_matmul_and_promoted_integers_cuda():
    E, W = torch.randn(50, 32, device=DEV).half(), torch.randn(32, 16, device=DEV).half()
    t = torch.randint(0, 50, (8,), device=DEV)
    fn = lambda E, W, t: torch.softmax((E[t] @ W).float(), -1)  # noqa: E731
    got = neptune_eq.compile(fn, E, W, t)(E, W, t)
    assert (got - fn(E.float(), W.float(), t)).abs().max() < 1e-2
    x = torch.full((2, 8), 2**40, dtype=torch.int64, device=DEV)
    _check(lambda x: (x * 1e10).sum(-1), x, tol=1e-6)


def _paged_decode(q, k_cache, v_cache, block_table, lens):
    D, P = q.shape[-1], k_cache.shape[1]
    j = torch.arange(block_table.shape[1] * P, device=q.device)
    page = block_table[:, j // P]
    k, v = k_cache[page, j % P], v_cache[page, j % P]
    s = torch.einsum("bhd,bshd->bhs", q, k) * D ** -0.5
    s = s.masked_fill(j >= lens[:, None, None], float("-inf"))
    return torch.einsum("bhs,bshd->bhd", torch.softmax(s, -1), v)


def _paged_inputs(B=3, H=2, D=64, P=16, pages=8):
    q = torch.randn(B, H, D, device=DEV)
    kc, vc = (torch.randn(B * pages, P, H, D, device=DEV) for _ in range(2))
    table = torch.randperm(B * pages, device=DEV).view(B, pages)
    return q, kc, vc, table, torch.tensor([5, 128, 77], device=DEV)


def test_a_paged_decode_call_does_not_synchronise_cuda():
    """A call's own work beside the kernels (the page indices' range check, the loop bounds read from
    the lengths) only queues device work: a host synchronisation per call would stall the decode
    (torch's sync debug mode raises on one)."""
    q, kc, vc, table, lens = _paged_inputs()
    prog = neptune_eq.compile(_paged_decode, q, kc, vc, table, lens)
    prog(q, kc, vc, table, lens)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = prog(q, kc, vc, table, lens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = _paged_decode(q.double(), kc.double(), vc.double(), table, lens)
    assert torch.allclose(out.double(), want, atol=1e-4)


def test_paged_decode_bounds_its_loops_in_the_kernel_and_follows_the_lengths():
    """The key loop's bounds come from the lengths the kernel reads itself (no table worked out per
    call); the index check of the page table replays from a CUDA graph recorded on a layout's second
    call: a length changed in place is seen, and a call neither synchronises nor differs from the
    eager float64 answer."""
    q, kc, vc, table, lens = _paged_inputs()
    prog = neptune_eq.compile(_paged_decode, q, kc, vc, table, lens)
    for _ in range(3):  # eager, recorded, replayed
        prog(q, kc, vc, table, lens)
    launcher = next(m for m in prog.program._modules.values() if hasattr(m, "_bounds_replay"))
    (variant,) = prog.variants.values()
    assert not any(k.data_bounds for k in launcher.kernels) and variant.run._checks.recorded == 1
    for new in ([1, 128, 16], [100, 3, 128]):
        lens.copy_(torch.tensor(new))  # in place: same address, new values
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = prog(q, kc, vc, table, lens)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        want = _paged_decode(q.double(), kc.double(), vc.double(), table, lens)
        assert torch.allclose(out.double(), want, atol=1e-4), new


def _packed(q, k, v, doc):  # documents packed along one axis: attention within each, causal
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[1], device=q.device)
    keep = (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def test_packed_document_bounds_replay_from_a_graph_and_follow_the_ids():
    """doc[i] == doc[j] bounds the loop by a table of tiles worked out per call, recorded as a CUDA
    graph on a layout's second call and replayed after (lower/replay.py): ids changed in place are
    seen, and a replayed call neither synchronises nor differs from the eager float64 answer."""
    g = torch.Generator(device=DEV).manual_seed(0)
    q, k, v = (torch.randn(2, 300, 64, device=DEV, generator=g) for _ in range(3))
    doc = torch.repeat_interleave(torch.arange(3, device=DEV), torch.tensor([100, 150, 50], device=DEV))
    prog = neptune_eq.compile(_packed, q, k, v, doc)
    want = _packed(q.double(), k.double(), v.double(), doc)
    for call in ("eager", "recorded", "replayed"):  # (the recording call too: a capture runs nothing)
        assert torch.allclose(prog(q, k, v, doc).double(), want, atol=1e-4), call
    launcher = next(m for m in prog.program._modules.values() if hasattr(m, "_bounds_staged"))
    assert launcher._bounds_staged.recorded == 1  # (the graph reads its own copy of the ids)
    for cuts, fresh in (([10, 280, 10], False), ([0, 299, 1], False), ([150, 0, 150], True), ([1, 1, 298], True)):
        ids = torch.repeat_interleave(torch.arange(3, device=DEV), torch.tensor(cuts, device=DEV))
        if fresh:  # a new tensor every call, as a serving loop passes them: replayed all the same
            doc = ids
        else:
            doc.copy_(ids)
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = prog(q, k, v, doc)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        want = _packed(q.double(), k.double(), v.double(), doc)
        assert torch.allclose(out.double(), want, atol=1e-4), cuts
    assert launcher._bounds_staged.recorded == 1


def test_a_dynamic_function_binds_each_length_it_is_called_at_again():
    """A dynamic compile's call at a length it has run checked once takes bound launches (the
    static fast path), per length: outputs stay right across lengths of a bucket and new values."""
    def causal(q, k, v):
        s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        L, S = q.shape[-2], k.shape[-2]
        keep = torch.arange(L, device=q.device)[:, None] >= torch.arange(S, device=q.device)[None, :]
        return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v

    def qkv(L, seed):
        g = torch.Generator(device=DEV).manual_seed(seed)
        return [torch.randn(1, 2, L, 64, device=DEV, generator=g) for _ in range(3)]

    prog = neptune_eq.compile(causal, *qkv(100, 0), dynamic=True)
    for L in (90, 113, 90, 113, 90):
        xs = qkv(L, L)
        for _ in range(2):
            out = prog(*xs)
            want = causal(*[x.double() for x in xs])
            assert torch.allclose(out.double(), want, atol=1e-4), L
            xs[0].mul_(-1)  # new values at the same addresses
    bound = prog.family._bound
    assert len(bound) == 2 and all(b is not None for _, b in bound.values())


def test_a_min_recomputed_in_other_kernels_keeps_its_gradient_cuda():
    """A value compared with its own min recomputed in other kernels must have the same bits in each:
    the kernels meeting such a min compile without FMA contraction (lower/exact.py). Softmax rows,
    log-softmax over the other axis, the rows' min (fuzz seed 1511's program, larger: the probe's)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from probe_fma_exact import fn

    x = torch.randn(64, 300, 96, device=DEV)
    ins = x.clone().requires_grad_()
    got = torch.autograd.grad(neptune_eq.compile(fn, x)(ins).sum(), ins)[0]
    ref = x.double().requires_grad_()
    want = torch.autograd.grad(fn(ref).sum(), ref)[0]
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_a_layer_norms_amax_keeps_its_gradient_cuda():
    """A layer norm's amax: the backward compares each normalised value with their max recomputed from
    the saved sums, in the max's kernel and in the kernel writing the gradient (reading the max from a
    buffer). Both spell the value alike (extract/exact_tests.py) and neither contracts FMAs (fuzz seed
    1552's program, wider: 20000 rows of 16 features over 64 samples)."""
    import torch.nn.functional as F

    def fn(x):
        return F.layer_norm(x.var(-2, keepdim=True, unbiased=False), (16,)).amax(-1, keepdim=True)

    x = torch.randn(20000, 64, 16, device=DEV)
    ins = x.clone().requires_grad_()
    got = torch.autograd.grad(neptune_eq.compile(fn, x)(ins).sum(), ins)[0]
    ref = x.double().requires_grad_()
    want = torch.autograd.grad(fn(ref).sum(), ref)[0]
    off = ((got.double() - want).abs() > 1e-3 * float(want.abs().max())).any(-1).any(-1)
    assert int(off.sum()) == 0
