"""Plans run in chunks of one axis when their scratch would pass the limit (neptune_eq/chunked.py):
which programs can be cut and why not, the chunk program, and chunked runs against float64 (the
Triton interpreter, sizes that are not chunk or tile multiples)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq import chunked
from neptune_eq import dsl as ne
from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program
from neptune_eq.runtime import Options, compile_ir


def linear_ce(h, W, target):
    return F.cross_entropy((h @ W.T).float(), target)


def _lce_inputs(T=100, H=24, V=70, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, H, generator=g)
    W = torch.randn(V, H, generator=g) * 0.3
    t = torch.randint(0, V, (T,), generator=g)
    t[5] = -100  # an ignored token
    return h, W, t


def _lce_backward():
    return backward_program(capture(linear_ce, *_lce_inputs()).program, saved=True)


def test_linear_cross_entropy_backward_is_cut_along_the_tokens_or_the_vocabulary():
    prog = _lce_backward().program
    assert chunked.why_not(prog, "i") is None
    # the vocabulary: the one-hot of the targets needs the chunk's offset, and grad_h's gather of the
    # target's row W[t_i] becomes a gather of the chunk's slice where t_i falls in it
    assert chunked.why_not(prog, "j") is None
    assert "reduces over 'd' and varies over it" in chunked.why_not(prog, "d")


def _one_output(build):
    P = ne.program("p")
    i, j = P.axis("i", 8), P.axis("j", 8)
    x, y = P.input("x", i, j), P.input("y", i)
    name, expr = build(i, j, x, y)
    P.output(name, expr)
    return P.build()


@pytest.mark.parametrize("build, axis, why", [
    (lambda i, j, x, y: ("o", ne.sum(ne.where(j.index <= i.index, x, 0.0), j)), "j",
     "index of 'j' as a number"),
    (lambda i, j, x, y: ("o", ne.sum(ne.where(ne.eq(i.index // 2, j.index), x, 0.0), i)), "i",
     "index of 'i' as a number"),
    (lambda i, j, x, y: ("o", ne.max(x, i)), "i", "a max over 'i'"),
    (lambda i, j, x, y: ("o", x + x.builder.gather("x", i.index, 0)), "j",
     "reads 'x' along 'j' at other dimensions"),
    (lambda i, j, x, y: ("o", ne.sum(x, i) + 1.0), "i", "does not vary over 'i'"),
    (lambda i, j, x, y: ("o", ne.sum(x, i) * ne.sum(y, i)), "i", "product of two values that vary over 'i'"),
    (lambda i, j, x, y: ("o", ne.sum(x - ne.sum(y, i), i)), "i", "a reduction over 'i' inside a sum over it"),
    (lambda i, j, x, y: ("o", x / ne.sum(x, i)), "i", "reduces over 'i' and varies over it"),
])
def test_what_cannot_be_cut_is_named(build, axis, why):
    assert why in chunked.why_not(_one_output(build), axis)


def _one_hot_program(T=37, V=23, D=5):
    """o[i, d] = Σ_j where(t_i = j, 2, 1)·x[j, d] + 3·x[t_i, d] (a one-hot and a gather of the vocabulary),
    p[j, d] = Σ_i where(t_i = j, 1, ½)·y[i, d]: cut along j, the first needs the chunk's offset and a
    gather of its slice, the second the offset."""
    P = ne.program("one_hot")
    i, j, d = P.axes(i=T, j=V, d=D)
    x, y, t = P.input("x", j, d), P.input("y", i, d), P.input("t", i, dtype="int64")
    hit = ne.eq(t, j.index)
    P.output("o", ne.sum(ne.where(hit, 2.0, 1.0) * x, j) + 3.0 * P.gather("x", t, d.index), (i, d))
    P.output("p", ne.sum(ne.where(hit, 1.0, 0.5) * y, i), (j, d))
    return P.build()


def test_a_one_hot_and_a_gather_of_the_cut_axis_run_in_chunks_against_float64():
    prog = _one_hot_program()
    chunk, accs, (off, end) = chunked.chunk_program(prog, "j", 7)  # 23 = 7 + 7 + 7 + 2
    assert accs == {"o": "acc_o"} and off and end
    c = chunked.Chunking("j", 7, 4, chunk, accs, "test", off, end)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(23, 5, generator=g), torch.randn(37, 5, generator=g)
    t = torch.randint(0, 23, (37,), generator=g)
    t[:4] = torch.tensor([0, 6, 7, 22])  # the first and last index of a chunk, and of the axis
    compiled = compile_ir(chunk, Options())
    got = chunked.run_chunked(c, compiled.run, {"x": x, "y": y, "t": t}, prog)
    hit = (t[:, None] == torch.arange(23)).double()
    o = (hit + 1) @ x.double() + 3 * x.double()[t]
    p = (0.5 + hit / 2).T @ y.double()
    torch.testing.assert_close(got["o"].double(), o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["p"].double(), p, rtol=1e-5, atol=1e-5)
    # an index outside the axis reads nothing (NaN) in chunks as in the whole plan, not 0
    t[4], t[5] = 23, -1
    got = chunked.run_chunked(c, compiled.run, {"x": x, "y": y, "t": t}, prog)
    whole = compile_ir(prog, Options()).run({"x": x, "y": y, "t": t})
    assert got["o"][4:6].isnan().all()
    torch.testing.assert_close(got["o"], whole["o"], rtol=1e-5, atol=1e-5, equal_nan=True)


def test_a_sum_of_scaled_sums_can_be_cut():
    prog = _one_output(lambda i, j, x, y: ("o", 2.0 * ne.sum(x, i) - ne.sum(x * y, i) / 3.0))
    assert chunked.why_not(prog, "i") is None
    # a one-hot of the cut axis's index: each chunk compares its indices plus its offset
    one_hot = _one_output(lambda i, j, x, y: ("o", ne.sum(ne.where(ne.eq(j.index, i.index), x, 0.0), j)))
    assert chunked.why_not(one_hot, "j") is None
    assert chunked.chunk_program(one_hot, "j", 3)[2][0] == "off_j"


def test_the_chunk_program_accumulates_sums_and_drops_statistics_over_the_whole_axis():
    back = _lce_backward().program
    chunk, accs, places = chunked.chunk_program(back, "i", 32)
    assert accs == {"grad_W": "acc_grad_W"} and places == (None, None)  # nothing reads the chunk's place
    assert chunk.axes["i"] == 32 and "i" in chunk.dynamic
    assert chunk.inputs["acc_grad_W"].axes == ("j", "d")
    by = {o.name: o for o in chunk.outputs}
    assert by["grad_W"].dtype == "float32" and by["grad_h"].dtype == back.outputs[0].dtype
    # the count of the tokens that are not ignored is a sum over all of them, not over a chunk's
    holds = {n: s.holds for n, s in chunk.inputs.items()}
    counts = [n for n, s in back.inputs.items() if s.holds is not None and "sum_i" in str(s.holds)]
    rows = [n for n, s in back.inputs.items() if s.holds is not None and "sum_i" not in str(s.holds)]
    assert counts and rows
    assert all(holds[n] is None for n in counts) and all(holds[n] is not None for n in rows)


def test_a_plan_over_its_scratch_limit_runs_in_chunks_and_matches_the_whole():
    # (101 tokens: a prime, so that whatever chunk size the cost model's choice of plan leaves, the last
    # chunk is a tail)
    h, W, t = _lce_inputs(T=101)
    back = backward_program(capture(linear_ce, h, W, t).program, saved=True)
    fwd = compile_ir(back.saved.forward, Options())
    st = fwd.run({"h": h, "W": W, "target": t})
    inputs = {"h": h, "W": W, "target": t, "grad_out0": torch.tensor(0.7)}
    inputs |= {k: st[k] for k in back.program.inputs if k not in inputs}
    whole = compile_ir(back.program, Options())
    assert whole.chunking is None  # (the default limit: at least a GiB)
    limit = 12_000  # bytes: the logits' buffer, 101 × 70 fp32, is 28 280
    compiled = compile_ir(back.program, Options(scratch_limit=limit))
    # at this size the cost model recomputes the logits; an alternative that writes them is pinned
    writes = next(a.id for a in compiled.alternatives
                  if any({"i", "j"} <= set(b.axes) for b in a.plan.buffers.values()))
    cut = compiled.pin(writes)
    c = cut.chunking
    assert c is not None and c.axis == "i" and c.count >= 3 and 101 % c.size != 0
    assert chunked.plan_scratch(cut.chunk_compiled.plan, cut.chunk_compiled.program) <= limit
    assert "chunks of" in cut.explain()
    # the chunk axis is dynamic (the last chunk is shorter) but its length may be specialised by Triton on
    # its divisibility (every chunk but the last a tile multiple): masked accesses along it vectorise
    assert c.program.specialised == {"i"} and "n_i" in cut.chunk_compiled.source
    assert "do_not_specialize=['n_i'" not in cut.chunk_compiled.source.replace(" ", "")
    # so a kernel compiled for one class of the length (1, a multiple of 16, other) is never launched at
    # another: the last chunk's runner is keyed apart
    launcher = cut.chunk_compiled.launcher("interpreter")
    xs = [torch.empty(4)]
    key = {n: launcher._key(0, torch.device("cpu"), xs, {"i": n}) for n in (128, 256, 232, 17, 1)}
    assert key[128] == key[256] and key[232] == key[17] and len({key[128], key[232], key[1]}) == 3
    # grad_W accumulates over the chunks in place: its one store reads the accumulator at its element
    assert chunked.aliasable(cut.chunk_compiled.plan, c.program, "grad_W", c.accumulators["grad_W"])
    got, ref = cut.run(inputs), whole.run(inputs)
    for name in ("grad_h", "grad_W"):
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6)


def test_an_accumulator_read_anywhere_but_its_own_store_is_not_overwritten():
    """out[j] = acc[j] + Σ_i x[i, j]: the store reads acc at the element it writes (in place is exact);
    where a second output also reads acc, writing out over it would change what that one reads."""
    for shared in (False, True):
        P = ne.program("acc_sum")
        i, j = P.axes(i=40, j=24)
        x, acc = P.input("x", i, j), P.input("acc", j)
        P.output("out", acc + ne.sum(x, i), (j,))
        if shared:
            P.output("twice", acc * 2.0, (j,))
        prog = compile_ir(P.build(), Options())
        assert chunked.aliasable(prog.plan, prog.program, "out", "acc") is not shared
    x, acc = torch.randn(40, 24), torch.randn(24)
    ref = acc.double() + x.double().sum(0)
    into = acc.clone()
    got = compile_ir(_acc_sum(), Options()).run({"x": x, "acc": into}, into={"out": into})["out"]
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    assert got.data_ptr() == into.data_ptr()


def _acc_sum():
    P = ne.program("acc_sum")
    i, j = P.axes(i=40, j=24)
    x, acc = P.input("x", i, j), P.input("acc", j)
    P.output("out", acc + ne.sum(x, i), (j,))
    return P.build()


def test_attention_gradients_with_a_backward_in_chunks_match_float64():
    """Through neptune_eq.compile and autograd: the saved backward writes D = rowsum(dO∘O) per query row
    (800 bytes here; at head dims 16 and 64 the model recomputes it per key tile instead); a limit of 200
    cuts it into chunks of query rows, dK and dV summed over them. (fp16: in float32 the products run
    on the FMA pipe, and at this size the cost model writes the scores once instead.)"""
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 100, 128, generator=g).half() for _ in range(3))
    dO = torch.randn(2, 100, 128, generator=g).half()
    f = neptune_eq.compile(attention, q, k, v, scratch_limit=200)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    f(*leaves).backward(dO)
    assert "chunks of ≤ 25 along 'i'" in f.explain()
    ref = [x.double().requires_grad_() for x in (q, k, v)]
    attention(*ref).backward(dO.double())
    for got, want in zip(leaves, ref):  # (fp16 gradients: 3e-4 measured)
        assert float((got.grad.double() - want.grad).norm() / want.grad.norm()) < 2e-3


def test_linear_cross_entropy_backward_at_scale_never_holds_all_the_logits():
    """Compile only (no run): 8192 tokens, hidden 4096, vocabulary 128256, bf16. The backward the cost
    model prefers writes the fp32 logits, 3.9 GiB; the default limit (the weight, 1 GiB) cuts the tokens."""
    h = torch.empty(8192, 4096, dtype=torch.bfloat16)
    W = torch.empty(128256, 4096, dtype=torch.bfloat16)
    t = torch.zeros(8192, dtype=torch.int64)
    back = backward_program(capture(linear_ce, h, W, t).program, saved=True).program
    compiled = compile_ir(back, Options())
    assert chunked.plan_scratch(compiled.plan, back) >= 8192 * 128256 * 4  # the fp32 logits, whole
    c = compiled.chunking
    # both axes need 8 or 9 chunks (the logits and the two gradient GEMMs' operands, 7.95 GiB, since the
    # products run as library GEMMs: extract/gemm_split.py); cutting the vocabulary keeps grad_h's running
    # sum (tokens × hidden, 128 MiB fp32), cutting the tokens grad_W's (vocabulary × hidden, 2 GiB), read
    # and written by every chunk
    assert c is not None and c.axis == "j" and c.count * c.size >= 128256 and c.size % 128 == 0
    assert set(c.accumulators) == {"grad_h"} and c.offset and c.end
    assert "running sums (fp32, read and written by each chunk) 128.0 MiB (rather than along 'i': 8 chunks, " \
           "running sums 1.96 GiB)" in c.describe()
    chunk_plan = compiled.chunk_compiled.plan
    assert chunked.plan_scratch(chunk_plan, c.program) <= chunked.default_limit(back)
    # the gather of the target's row is a gather of the chunk's slice, not a one-hot product
    over_j = [c for k in chunk_plan.kernels for ph in k.passes() if ph.axis == "j" for c in ph.comps]
    assert len(over_j) == 1


@pytest.mark.parametrize("bad", [True, 1.5, 0])
def test_a_bad_scratch_limit_is_named(bad):
    with pytest.raises(neptune_eq.NeptuneError, match="scratch_limit"):
        Options(scratch_limit=bad)


def test_a_chunked_backward_compiles_its_chunk_program_on_the_forward_thread(monkeypatch, tmp_path):
    """Autograd runs a CUDA backward on a thread of its own, and egglog's e-graphs cannot be freed on
    another thread than the one that made them: every compile, the chunk program's too, happens at the
    forward call. Here the backward runs on a second thread, as autograd's would."""
    import threading

    import egglog

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v

    made = []
    init = egglog.EGraph.__init__

    def recording(self, *a, **kw):
        made.append(threading.current_thread())
        init(self, *a, **kw)

    monkeypatch.setattr(egglog.EGraph, "__init__", recording)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 40, 64, generator=g, requires_grad=True) for _ in range(3))
    f = neptune_eq.compile(attention, q, k, v, scratch_limit=100, cache_dir=tmp_path)  # (compiled, not cached)
    out = f(q, k, v)
    worker = threading.Thread(target=lambda: out.sum().backward())
    worker.start()
    worker.join()
    assert "chunks of" in f.explain() and q.grad is not None
    assert made and all(t is threading.main_thread() for t in made)


def test_linear_cross_entropy_backward_in_chunks_of_the_vocabulary_matches_the_whole():
    """dW's one-hot reads the chunk's offset, dH's gather of the target's row W[t_i] the chunk's slice
    (targets at the first and last word of a chunk and of the vocabulary, an ignored token)."""
    back = _lce_backward()
    h, W, t = _lce_inputs()
    t[7], t[8], t[9], t[10] = 69, 0, 32, 31  # chunks of 32 over 70 words: [0, 32), [32, 64), [64, 70)
    st = compile_ir(back.saved.forward, Options()).run({"h": h, "W": W, "target": t})
    inputs = {"h": h, "W": W, "target": t, "grad_out0": torch.tensor(0.7)}
    inputs |= {k: st[k] for k in back.program.inputs if k not in inputs}
    prog, accs, (off, end) = chunked.chunk_program(back.program, "j", 32)
    assert accs == {"grad_h": "acc_grad_h"} and off and end
    cut = chunked.Chunking("j", 32, 3, prog, accs, "test", off, end)
    got = chunked.run_chunked(cut, compile_ir(prog, Options()).run, inputs, back.program)
    ref = compile_ir(back.program, Options()).run(inputs)
    for name in ("grad_h", "grad_W"):
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton's specialisation of a length: CUDA")
def test_a_chunked_run_whose_last_chunk_is_of_another_length_class_matches_float64():
    """A chunk axis's length is specialised by Triton (divisible by 16 or not): a vocabulary of 1000 in
    chunks of 256 leaves a last chunk of 232 (a multiple of 8, not of 16) along the contiguous axis of
    the logits; both run kernels compiled for their own class and the gradients match float64."""
    h, W, t = (x.cuda() for x in _lce_inputs(T=64, H=32, V=1000))
    back = backward_program(capture(linear_ce, h, W, t).program, saved=True)
    fwd = compile_ir(back.saved.forward, Options())
    st = fwd.run({"h": h, "W": W, "target": t})
    inputs = {"h": h, "W": W, "target": t, "grad_out0": torch.tensor(0.7, device="cuda")}
    inputs |= {k: st[k] for k in back.program.inputs if k not in inputs}
    compiled = compile_ir(back.program, Options(scratch_limit=131072))
    writes = next(a.id for a in compiled.alternatives
                  if any({"i", "j"} <= set(b.axes) for b in a.plan.buffers.values()))
    cut = compiled.pin(writes)
    c = cut.chunking
    assert c is not None and c.axis == "j" and c.size % 16 == 0 and (1000 - (c.count - 1) * c.size) % 16, c
    got = cut.run(inputs)
    hd, Wd = h.double().requires_grad_(), W.double().requires_grad_()
    (linear_ce(hd, Wd, t) * 0.7).backward()
    for name, want in (("grad_h", hd.grad), ("grad_W", Wd.grad)):
        err = float((got[name].double() - want).norm() / want.norm())
        assert err < 1e-4, (name, err)
