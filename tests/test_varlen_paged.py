"""Packed variable-length batches and paged-KV decode, written in plain PyTorch (issue 14, items 2-3).

A document-id mask or a per-request length compares values of the inputs, so it cannot bound a loop
at compile time; the launcher works the bounds out per call (lower/databounds.py) and the kernels
visit only the key tiles each program can need. Every output is checked against float64, every
bound against the tiles the mask really keeps."""

from __future__ import annotations

import math
import re

import pytest
import torch

import neptune_eq as ne
from neptune_eq import ir
from neptune_eq.device import H100
from neptune_eq.frontend import capture
from neptune_eq.lower.databounds import bound_tensor
from neptune_eq.pipeline import Options
from neptune_eq.plan import Combine
from neptune_eq.runtime import compile_ir

# the cost model prices a loop bound worked out per call at what it costs a call on an H100 (device.py
# data_bound_call_s), more than these small shapes' kernels take: priced free here, the plans keep the
# bounds these tests check (test_a_per_call_bound_is_taken_where_it_pays checks the pricing itself)
BOUNDED = Options(device=H100.scaled(data_bound_call_s=0.0))


def varlen_attention(q, k, v, doc):
    """q, k, v [H, T, D] packed along T; doc [T] the document of each token; causal within documents."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[1])
    keep = (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def documents(lengths: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def packed(lengths: list[int], heads: int = 2, dim: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    return (*(torch.randn(heads, total, dim, generator=g) for _ in range(3)), documents(lengths))


def err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.double() - ref).abs().max().item()


def test_packed_documents_match_float64_with_empty_and_length_one_documents_from_one_compile():
    """One dynamic compile serves packings of different totals and layouts (empty documents,
    length-1 documents, a document longer than a tile): no new capture or compile."""
    prog = ne.compile(varlen_attention, *packed([40, 0, 1, 90, 0, 2]), dynamic={0: [1], 1: [1], 2: [1], 3: [0]},
                      device=BOUNDED.device)
    before = prog.stats()
    for lengths in ([40, 0, 1, 90, 0, 2], [1, 1, 1, 160, 0, 35], [200, 0, 3], [0, 177, 1, 0, 1]):  # one bucket
        q, k, v, doc = packed(lengths, seed=len(lengths))
        ref = varlen_attention(q.double(), k.double(), v.double(), doc)
        assert err(prog(q, k, v, doc), ref) < 1e-5, lengths
    after = prog.stats()
    assert (after["captures"], after["compiles"]) == (before["captures"], before["compiles"])


def test_packed_documents_at_head_dim_128_step_128_keys_and_match_float64():
    """The packed forward streams the key documents' ids beside K and V: with head dim 128 its 128-key
    steps in three stages need 231424 bytes of shared memory under Triton 3.6 (227 KiB is Hopper's
    limit; bench/ptxas_check.py), which the schedule's estimate (exact for the dot tiles, a row of ids
    held before the loop in registers) now admits, as it does for causal attention's forward. Run in
    fp16 at a total that is not a tile multiple, against float64."""
    from neptune_eq.shared_memory import SHARED_BUDGET, shared_bytes

    lengths = [70, 1, 0, 150, 79]
    q, k, v, doc = packed(lengths, heads=1, dim=128, seed=3)
    q, k, v = (x.half() for x in (q, k, v))
    compiled = ne.compile(varlen_attention, q, k, v, doc)
    prog = compiled.program
    alt = prog.alternative
    (sched,) = prog._schedules("cuda")
    assert (sched.tiles["j"], sched.num_stages) == (128, 3), sched
    assert shared_bytes(alt.plan.kernels[0], prog.program, alt.plan, sched) <= SHARED_BUDGET
    ref = varlen_attention(q.double(), k.double(), v.double(), doc)
    assert err(compiled(q, k, v, doc), ref) < 2e-3


def _bounds(program, inputs):
    """The data bounds of a compiled program's kernels, evaluated for `inputs`."""
    _, kernels = compile_ir(program, BOUNDED).lowered("interpreter")
    return [(db, bound_tensor(db, program, inputs)) for ks in kernels for db in ks.data_bounds]


def test_the_loop_visits_only_the_key_tiles_of_its_documents():
    """Per query tile the key range runs from the first key tile of its first document to the last
    key tile it can see (causal): fewer keys than the causal mask alone leaves (a range per query tile,
    so a tile that starts in one document also visits that document's earlier keys; 128-row query
    tiles and 128-key steps round each document up)."""
    lengths = [1200, 20, 844, 2000]
    q, k, v, doc = packed(lengths)
    program = capture(varlen_attention, q, k, v, doc).program
    bounds = _bounds(program, {"q": q, "k": k, "v": v, "doc": doc})
    assert bounds, "the document mask bounds the key loop per call"
    db, b = bounds[0]
    assert db.grid and db.grid[-1][0] != db.axis and b.shape[-1] == 4
    step = dict(db.grid)[program.inputs["doc"].axes[0]]
    starts = torch.cumsum(torch.tensor([0, *lengths]), 0)
    visited = causal = 0
    for t in range(b.shape[0]):
        rows = torch.arange(t * step, min((t + 1) * step, doc.numel()))
        first_doc_start = starts[doc[rows[0]]].item()
        lo, hi, flo, fhi = b[t].tolist()
        assert lo <= first_doc_start and lo > first_doc_start - db.tile  # the first key its rows can see
        assert hi >= rows[-1].item() + 1  # and the last one
        if doc[rows[0]] == doc[rows[-1]] and fhi > flo:  # one document: its own whole key tiles, unmasked
            assert starts[doc[rows[0]]] <= flo and fhi <= starts[doc[rows[0]] + 1]
        visited += (hi - lo) * len(rows)
        causal += (rows[-1].item() + 1) * len(rows)  # the keys a causal mask alone would leave
    # 0.41 of the square of the total against the causal mask's 0.52 (the sum of squares is 0.37)
    assert visited < 0.85 * causal, (visited / doc.numel() ** 2, causal / doc.numel() ** 2)


def test_unsorted_document_ids_stay_exact():
    """Ids out of order only widen the ranges (interval arithmetic is sound for any layout)."""
    q, k, v, doc = packed([30, 1, 0, 50])
    doc = doc[torch.randperm(doc.numel(), generator=torch.Generator().manual_seed(3))]
    prog = ne.compile(varlen_attention, q, k, v, doc, device=BOUNDED.device)
    assert err(prog(q, k, v, doc), varlen_attention(q.double(), k.double(), v.double(), doc)) < 1e-5


def test_packed_documents_gradients_match_float64():
    """The backward's loops (dQ over keys, dK/dV over queries) are bounded by the same mask.
    (Once silently wrong: the mask analysis sampled doc[i] and doc[j] apart and never equal.)"""
    q, k, v, doc = packed([20, 0, 1, 43], heads=1)
    prog = ne.compile(varlen_attention, q, k, v, doc, device=BOUNDED.device)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = prog(*xs, doc)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    ds = [x.double().requires_grad_() for x in (q, k, v)]
    (varlen_attention(*ds, doc) * g.double()).sum().backward()
    for x, d in zip(xs, ds):
        assert err(x.grad, d.grad) < 1e-4


def varlen_offsets(q, k, v, cu_seqlens):
    """The packed documents given as FlashAttention's offsets: each token's document by searchsorted."""
    i = torch.arange(q.shape[1])
    doc = torch.searchsorted(cu_seqlens, i, right=True) - 1
    keep = (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def offsets(lengths: list[int]) -> torch.Tensor:
    return torch.cumsum(torch.tensor([0, *lengths]), 0)


def test_documents_given_as_offsets_bound_the_loop_per_call_and_match_float64():
    """cu_seqlens instead of document ids: the document of a token is a count over the offsets (an
    integer reduction), which the launcher evaluates per call as it does the ids, so the key loop
    visits each query tile's documents only (it had run over every key, the mask per element). One
    dynamic compile serves packings of other totals and document counts, empty and length-1 ones too."""
    lengths = [1200, 20, 844, 2000]
    q, k, v, _ = packed(lengths)
    cu = offsets(lengths)
    program = capture(varlen_offsets, q, k, v, cu).program
    (db, b), = _bounds(program, {"q": q, "k": k, "v": v, "cu_seqlens": cu})
    step = dict(db.grid)[program.inputs["q"].axes[1]]
    for t in range(b.shape[0]):
        first, last = t * step, min((t + 1) * step, int(cu[-1])) - 1
        start = cu[torch.searchsorted(cu, torch.tensor(first), right=True) - 1].item()
        lo, hi = b[t, :2].tolist()
        assert start - db.tile < lo <= start and hi >= last + 1, (t, lo, hi, start)
    prog = ne.compile(varlen_offsets, *packed([9, 0, 1, 30], heads=2)[:3], offsets([9, 0, 1, 30]),
                      dynamic={0: [1], 1: [1], 2: [1], 3: [0]}, device=BOUNDED.device)
    before = prog.stats()
    for lengths in ([9, 0, 1, 30], [1, 1, 40, 0, 2, 3], [60]):
        q, k, v, _ = packed(lengths, seed=len(lengths))
        cu = offsets(lengths)
        assert err(prog(q, k, v, cu), varlen_offsets(q.double(), k.double(), v.double(), cu)) < 1e-5, lengths
    assert prog.stats()["compiles"] == before["compiles"]
    xs = [x.clone().requires_grad_() for x in packed([20, 0, 1, 43], heads=1)[:3]]
    out = ne.compile(varlen_offsets, *xs, offsets([20, 0, 1, 43]), device=BOUNDED.device)(*xs, offsets([20, 0, 1, 43]))
    g = torch.randn_like(out)
    (out * g).sum().backward()
    ds = [x.detach().double().requires_grad_() for x in xs]
    (varlen_offsets(*ds, offsets([20, 0, 1, 43])) * g.double()).sum().backward()
    assert max(err(x.grad, d.grad) for x, d in zip(xs, ds)) < 1e-4


def test_the_per_call_bounds_of_offsets_never_read_a_value_back_to_the_host(monkeypatch):
    """The launcher replays a call's loop-bound work from a CUDA graph, which records only work that
    never waits on the device: the count Σ_l [cu[l] <= i] had checked its factor (the constant 1) for
    infinities with bool(), a host synchronisation on every call that also failed the recording — 4.1
    ms of host a packed-prefill call on an H100, the kernel's 3.3. No tensor is read back now."""
    lengths = [9, 0, 1, 30, 57]
    q, k, v, _ = packed(lengths, heads=2)
    cu = offsets(lengths)
    program = capture(varlen_offsets, q, k, v, cu).program
    c = compile_ir(program, BOUNDED)
    alt = next(a for a in c.alternatives
               if a.structure.startswith("1 kernel") and all(s.data_bounds for s in a.schedules))
    _, kernels = c.pin(alt.id).lowered("interpreter")
    dbs = [db for ks in kernels for db in ks.data_bounds]
    assert dbs, alt.structure

    def read_back(self, *args):
        raise AssertionError("a tensor read back to the host during the per-call bound evaluation")

    for name in ("__bool__", "item", "tolist", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, read_back)
    tables = [bound_tensor(db, program, {"q": q, "k": k, "v": v, "cu_seqlens": cu}) for db in dbs]
    monkeypatch.undo()
    assert all(t.shape[-1] == 4 for t in tables)


def test_documents_counted_once_per_token_still_bound_the_attention_loop():
    """A plan that counts each token's document once, in kernels of its own, and stores the counts
    (buf[i] = Σ_l [cu[l] <= i]) compares buffer values in the attention kernel: that comparison had
    not been recognised as data, so its key loop visited every causal key (the plan the cost model
    picked at 32 heads × 32768 tokens: 22.3 ms against 3.2 for document ids, H100). The integer buffer
    is read as the term it holds, so the loop is bounded per call; every such plan matches float64."""
    lengths = [9, 0, 1, 30, 57]
    q, k, v, _ = packed(lengths, heads=2)
    cu = offsets(lengths)
    c = capture(varlen_offsets, q, k, v, cu)
    p = compile_ir(c.program, BOUNDED)
    stored = [a.id for a in p.alternatives if "pass over" in a.structure and "rolling over" in a.structure
              and not a.structure.startswith("1 kernel")]
    assert stored, [a.structure for a in p.alternatives]
    want = varlen_offsets(q.double(), k.double(), v.double(), cu)
    for i in stored[:2]:
        run = p.pin(i)
        assert any(b.dtype == "int64" for b in run.plan.buffers.values())  # (the documents, stored)
        _, kernels = run.lowered("interpreter")
        attention = [ks for ks in kernels if "tl.dot" in ks.source]
        assert attention and all(ks.data_bounds for ks in attention), p.alternatives[i].structure
        assert err(c.call_with(run.run, (q, k, v, cu)), want) < 1e-5, p.alternatives[i].structure


def _per_call_kernels(alt, program) -> list[bool]:
    """Per kernel of alternative `alt` with a loop the launcher would bound per call: whether its
    schedule keeps that bound."""
    from neptune_eq.lower.databounds import kernel_data_bounds

    return [s.data_bounds for kp, s in zip(alt.plan.kernels, alt.schedules)
            if kernel_data_bounds(kp, alt.plan, program)[1]]


def test_a_per_call_bound_is_taken_where_it_pays():
    """A loop bounded by a table worked out per call costs the call that work whatever the data leave
    out (device.py data_bound_call_s): the cost model keeps the bound for packed documents at 32 heads ×
    32768 tokens (the kernel takes milliseconds), visits every tile at 2 heads × 133 tokens; both plans
    are exact (the mask is evaluated per element wherever the loop runs)."""
    q, k, v, doc = packed([40, 0, 1, 90, 0, 2])
    q, k, v = (x.half() for x in (q, k, v))
    small = capture(varlen_attention, q, k, v, doc).program
    big = small.with_extents({"b": 32, "i": 32768, "j": 32768, "d": 128, "e": 128})
    assert _per_call_kernels(compile_ir(big).alternatives[0], big) == [True]
    c = compile_ir(small)
    best = c.alternatives[0]
    assert _per_call_kernels(best, small) == [False] and "every tile" in best.kind, best.kind
    bounded = next(a for a in c.alternatives if _per_call_kernels(a, small) == [True])
    ref = varlen_attention(q.double(), k.double(), v.double(), doc)
    cap = capture(varlen_attention, q, k, v, doc)
    for alt in (best, bounded):
        run = c.pin(alt.id)
        _, kernels = run.lowered("interpreter")
        assert any(ks.data_bounds for ks in kernels) == (alt is bounded)
        assert err(cap.call_with(run.run, (q, k, v, doc)), ref) < 2e-3, alt.kind


def one_hot_share(logits, selected):
    """Mixtral's load-balancing term: the share of tokens routed to each expert (a one-hot count of the
    chosen ids) times the mean router probability."""
    e = logits.shape[-1]
    hits = torch.nn.functional.one_hot(selected, e).float().mean(0)
    return (hits * torch.softmax(logits, -1).mean(0)).sum() * e


def test_a_one_hot_count_over_random_ids_visits_every_tile_and_matches_float64():
    """Σ_t [selected[t, k] == e] compares input values along the loop over tokens, so a table could
    bound it per call; over random ids every tile holds every expert, and the MoE router losses' step
    spent ~300 µs of device time a call working that table out for kernels of 82 µs (H100). The model
    visits every tile at the real size, and the count matches float64."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(301, 13, generator=g)
    selected = torch.topk(logits + torch.randn(301, 13, generator=g), 2, -1).indices
    program = capture(one_hot_share, logits, selected).program
    big = program.with_extents({a: 65536 if n == 301 else (64 if n == 13 else n) for a, n in program.axes.items()})
    assert _per_call_kernels(compile_ir(big).alternatives[0], big) == [False]
    prog = ne.compile(one_hot_share, logits, selected)
    assert err(prog(logits, selected), one_hot_share(logits.double(), selected)) < 1e-6


# ---------------------------------------------------------------- paged KV


def paged_decode(q, k_cache, v_cache, block_table, lens):
    """One query per request and head against its pages: q [B, Hq, D], caches [pages, P, Hkv, D],
    block_table [B, pages per request], lens [B] the tokens of each request."""
    B, Hq, D = q.shape
    P, Hkv = k_cache.shape[1], k_cache.shape[2]
    j = torch.arange(block_table.shape[1] * P)
    page = block_table[:, j // P]
    k, v = k_cache[page, j % P], v_cache[page, j % P]  # [B, S, Hkv, D], read in place
    s = torch.einsum("bhgd,bshd->bhgs", q.view(B, Hkv, Hq // Hkv, D), k) * D ** -0.5
    s = s.masked_fill(j >= lens[:, None, None, None], float("-inf"))
    return torch.einsum("bhgs,bshd->bhgd", torch.softmax(s, -1), v).reshape(B, Hq, D)


def paged(lens: list[int], page: int, heads=(4, 2), dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    per = math.ceil(max(lens) / page) + 1  # a spare page per request: entries past its length unused
    n_pages = len(lens) * per + 3
    table = torch.randperm(n_pages, generator=g)[: len(lens) * per].view(len(lens), per).to(torch.int32)
    q = torch.randn(len(lens), heads[0], dim, generator=g)
    kc, vc = (torch.randn(n_pages, page, heads[1], dim, generator=g) for _ in range(2))
    return q, kc, vc, table, torch.tensor(lens)


def ends_at_length(src: str) -> bool:
    """Does the kernel's key loop end at its request's length, read by the program itself (no table
    of bounds worked out per call: `j < lens[b]` compares the loop index with one value per program)?"""
    head = src[:src.index("for start_")]
    length = re.search(r"(x\d+) = tl\.load\(lens_ptr", head)
    return "db0_ptr" not in src and length is not None and \
        re.search(rf"(ntiles|hi)_\w+ = .*\b{length.group(1)}\b", head) is not None


def paged_ref(q, kc, vc, table, lens):
    return paged_decode(q.double(), kc.double(), vc.double(), table, lens)


@pytest.mark.parametrize("page", [16, 8])
def test_paged_decode_reads_pages_in_place_with_ragged_last_pages(page):
    """Requests of different lengths (1, a page multiple, ragged last pages) from one compile; new
    block tables and lengths are data, never a recompile."""
    q, kc, vc, table, lens = paged([1, 2 * page, 37, 3 * page - 1], page)
    prog = ne.compile(paged_decode, q, kc, vc, table, lens)
    before = prog.stats()["compiles"]
    assert err(prog(q, kc, vc, table, lens), paged_ref(q, kc, vc, table, lens)) < 1e-5
    lens2 = torch.tensor([3 * page, 1, 2, page + 1])
    table2 = table[torch.tensor([2, 0, 3, 1])]
    assert err(prog(q, kc, vc, table2, lens2), paged_ref(q, kc, vc, table2, lens2)) < 1e-5
    assert prog.stats()["compiles"] == before
    assert ends_at_length(prog.source)


def test_paged_decode_split_k_bounds_each_request():
    """Split-K divides each request's own key range among the chunks (the combine sees empty chunks
    for short requests)."""
    q, kc, vc, table, lens = paged([1, 130, 37, 200], 16)
    program = capture(paged_decode, q, kc, vc, table, lens).program
    compiled = compile_ir(program, Options(split_factors=(4,), min_chunk=16))
    ids = [a.id for a in compiled.alternatives
           if any(isinstance(ph, Combine) for k in a.plan.kernels for ph in k.phases)]
    assert ids, "split-K is offered"
    split = compiled.pin(ids[0])
    assert ends_at_length(split.source)
    out = split.run({"q": q, "k_cache": kc, "v_cache": vc, "block_table": table, "lens": lens})
    assert err(out["out0"], paged_ref(q, kc, vc, table, lens)) < 1e-5


def test_the_page_table_is_range_checked_as_a_whole_tensor():
    """`block_table[b, j // P]` reads every entry of the table: its check reads the table's values
    (one per page), not a gathered value per key, and still refuses an entry out of range, as eager's
    indexing does (even in a request's unused spare page, which eager reads too)."""
    from neptune_eq.frontend.checks import IndexOutOfRange

    q, kc, vc, table, lens = paged([5, 19], 4)
    cap = capture(paged_decode, q, kc, vc, table, lens)
    (check,) = [c for c in cap.index_checks if c.index.tensor == "block_table"]
    assert check.program is None
    prog = ne.compile(paged_decode, q, kc, vc, table, lens)
    bad = table.clone()
    bad[1, -1] = kc.shape[0]
    with pytest.raises(IndexOutOfRange, match=rf"index {kc.shape[0]} is out of range"):
        prog(q, kc, vc, bad, lens)


def test_a_page_table_read_in_part_is_checked_on_the_entries_read():
    """Keys that stop a page short of the table's columns never read its last column: an entry
    out of range there is no error (eager reads only the entries it gathers)."""
    def first_pages(q, k_cache, v_cache, block_table, lens):
        P = k_cache.shape[1]
        j = torch.arange((block_table.shape[1] - 1) * P)
        page = block_table[:, j // P]
        k, v = k_cache[page, j % P], v_cache[page, j % P]
        s = torch.einsum("bhd,bshd->bhs", q, k).masked_fill(j >= lens[:, None, None], float("-inf"))
        return torch.einsum("bhs,bshd->bhd", torch.softmax(s, -1), v)

    q, kc, vc, table, lens = paged([5, 7], 4, heads=(2, 2))
    cap = capture(first_pages, q, kc, vc, table, lens)
    assert all(c.program is not None for c in cap.index_checks if "block_table" in str(c.index))
    prog = ne.compile(first_pages, q, kc, vc, table, lens)
    spare = table.clone()
    spare[:, -1] = kc.shape[0] + 5  # never read
    ref = first_pages(q.double(), kc.double(), vc.double(), spare, lens)
    assert err(prog(q, kc, vc, spare, lens), ref) < 1e-5


def _window(op_lo, op_hi):
    def attend(q, k, v, lo, hi):  # each request's keys from lo[b] to hi[b] (per-request data)
        s = torch.einsum("bhd,bshd->bhs", q, k)
        j = torch.arange(k.shape[1])
        keep = op_lo(j, lo[:, None, None]) & op_hi(j, hi[:, None, None])
        return torch.einsum("bhs,bshd->bhd", torch.softmax(s.masked_fill(~keep, float("-inf")), -1), v)
    return attend


@pytest.mark.parametrize("ops", [(torch.ge, torch.le), (torch.gt, torch.lt), (torch.eq, torch.le)])
def test_a_loop_bounded_by_per_request_values_visits_each_range_exactly(ops):
    """`lo[b] <= j <= hi[b]` and the other comparisons of the loop index with one value per program:
    the kernel reads the values and bounds its own loop (ranges inside one tile, across tiles, at
    the ends, empty: a request with no key gives 0, as FlexAttention does)."""
    fn = _window(*ops)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 2, 16, generator=g)
    k, v = torch.randn(5, 70, 2, 16, generator=g), torch.randn(5, 70, 2, 16, generator=g)
    lo, hi = torch.tensor([0, 3, 40, 69, 30]), torch.tensor([69, 9, 65, 69, 10])  # the last is empty
    prog = ne.compile(fn, q, k, v, lo, hi)
    assert "db0_ptr" not in prog.source
    ref = torch.nan_to_num(fn(q.double(), k.double(), v.double(), lo, hi), nan=0.0)
    assert err(prog(q, k, v, lo, hi), ref) < 1e-5
    lo2, hi2 = torch.tensor([5, 0, 0, 12, 68]), torch.tensor([5, 0, 31, 60, 69])
    ref = torch.nan_to_num(fn(q.double(), k.double(), v.double(), lo2, hi2), nan=0.0)
    assert err(prog(q, k, v, lo2, hi2), ref) < 1e-5


def test_the_float64_check_of_a_large_paged_decode_samples_requests_and_heads():
    """At 32 requests of up to 32K keys, 32 heads, d 128, the reference gathers K and V over
    (request, key, head, d): 34 GB in float64 (prog.tune()'s stress sets ran out of memory on the
    H100 and no plan could be checked). The check samples requests and heads until each gathered
    operand holds at most the limit, and stays exact on what it keeps."""
    from neptune_eq.reference import evaluate
    from neptune_eq.tune import sample_rows

    q, kc, vc, table, lens = paged([5, 40, 33], 16, heads=(4, 2))
    program = capture(paged_decode, q, kc, vc, table, lens).program
    b, i, d = program.inputs["q"].axes
    kv_heads = program.inputs["k_cache"].axes[2]
    (o,) = program.outputs
    reduced = {n.axis for n in ir.walk(o.expr) if isinstance(n, ir.Reduce)}
    (key,) = reduced - {d}
    big = program.with_extents({b: 32, i: 32, kv_heads: 8, d: 128, o.axes[-1]: 128, key: 32768})
    limit = 2**27
    restrict = sample_rows(big, limit=limit)
    gathers = [n for n in ir.walk(big.outputs[0].expr) if isinstance(n, ir.Load) and n.tensor == "k_cache"]
    assert gathers and all(math.prod(len(restrict[a]) if a in restrict else big.axes[a] for a in g.axes) <= limit
                           for g in gathers)
    assert set(restrict) <= {b, i} and all(len(ix) >= 2 for ix in restrict.values())
    # on the small program the same restriction (by hand) evaluates exactly the kept rows
    small = {b: torch.tensor([0, 2])}
    full = evaluate(program, {"q": q, "k_cache": kc, "v_cache": vc, "block_table": table, "lens": lens})["out0"]
    part = evaluate(program, {"q": q, "k_cache": kc, "v_cache": vc, "block_table": table, "lens": lens},
                    restrict=small)["out0"]
    assert torch.allclose(part, full[small["b"]])


def test_per_request_bounds_at_the_ends_of_the_integer_range():
    """lo[b] <= j <= hi[b] with hi = 2^31 − 1 (every key) and j > lo[b] with lo = 2^31 − 1 (none): the
    kernel's bound adds 1 to a value cut to the loop's length first, so it never wraps around."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 2, 16, generator=g)
    k, v = torch.randn(2, 70, 2, 16, generator=g), torch.randn(2, 70, 2, 16, generator=g)
    big = 2**31 - 1
    fn = _window(torch.ge, torch.le)
    lo, hi = torch.tensor([-5, 3], dtype=torch.int32), torch.tensor([big, big], dtype=torch.int32)
    prog = ne.compile(fn, q, k, v, lo, hi)
    assert "db0_ptr" not in prog.source
    ref = fn(q.double(), k.double(), v.double(), lo, hi)
    assert err(prog(q, k, v, lo, hi), ref) < 1e-5
    fn = _window(torch.gt, torch.lt)
    lo, hi = torch.tensor([big, 10], dtype=torch.int32), torch.tensor([big, big], dtype=torch.int32)
    prog = ne.compile(fn, q, k, v, lo, hi)
    out = prog(q, k, v, lo, hi)
    ref = torch.nan_to_num(fn(q.double(), k.double(), v.double(), lo, hi), nan=0.0)
    assert out[0].abs().max() == 0 and err(out, ref) < 1e-5
