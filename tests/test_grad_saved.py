"""What the forward saves for its backward (neptune_eq.grad_saved): the hoisting is exact, both
backwards agree with torch's autograd in float64, attention's saved backward is FlashAttention-2's
structure (D = rowsum(dO∘O), one pass per gradient group), and the cost model's choice is shown."""

from __future__ import annotations

import re

import torch

import neptune_eq
from neptune_eq import ir
from neptune_eq.autograd import training_report
from neptune_eq.frontend import capture
from neptune_eq.grad import backward_program
from neptune_eq.grad_saved import hoist
from neptune_eq.ir import Index, Load, Reduce
from neptune_eq.kernel_terms import loads_in
from neptune_eq.reference import evaluate, random_inputs
from neptune_eq.runtime import compile_ir
from neptune_eq.shared_memory import SHARED_BUDGET, shared_bytes


def _causal(q, k, v):
    L = q.shape[-2]
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    keep = torch.arange(L)[:, None] >= torch.arange(L)[None]
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def _masked_rows(q, k, v):  # query rows 0 and 1 see no key: the guarded rows of the softmax
    L = q.shape[-2]
    keep = (torch.arange(L)[:, None] >= torch.arange(L)[None]) & (torch.arange(L)[:, None] > 1)
    s = (q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v  # (captured with the empty rows' softmax guarded to 0)


FAMILIES = {
    "softmax": (lambda x: torch.softmax(x, -1), [(5, 9)]),
    "logsumexp": (lambda x: torch.logsumexp(x, -1), [(5, 9)]),
    "cross_entropy": (lambda x, t: torch.nn.functional.cross_entropy(x, t), [(6, 7), "t"]),
    "layernorm_mm": (lambda x, W: torch.nn.functional.layer_norm(x, (8,)) @ W, [(5, 8), (8, 6)]),
    "rmsnorm_mm": (lambda x, w, W: (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w) @ W,
                   [(5, 8), (8,), (8, 6)]),
    "causal": (_causal, [(1, 2, 6, 4)] * 3),
}


def _args(shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in shapes:
        out.append(torch.randint(0, 7, (6,), generator=gen) if s == "t" else
                   torch.randn(*s, generator=gen, dtype=torch.float64))
    return out


def _saved_feed(back, feed: dict) -> dict:
    """`feed` with the forward's output and statistics as its training forward writes them from the
    inputs in `feed`: a random row max and sum are no such pair (a sum below 1, or negative, is none)."""
    fwd = evaluate(back.saved.forward, {k: feed[k] for k in back.saved.forward.inputs})
    return {**feed, **{k: fwd[k].to(feed[k].dtype) if k in feed else fwd[k]
                       for k in (*back.saved.outputs, *back.saved.stats)}}


def test_hoisting_pulls_a_row_factor_and_guard_out_of_the_sum():
    """Σ_j where(l == 0, 0, p/l)·v = where(l == 0, 0, (Σ_j p·v)/l): the text changes, the value does not
    (also on a row where l = 0)."""
    c = capture(_masked_rows, *_args([(1, 2, 6, 4)] * 3))
    prog = c.program
    hoisted = ir.Program(prog.name, dict(prog.axes), dict(prog.inputs),
                         [ir.Output(o.name, o.axes, hoist(o.expr), o.dtype) for o in prog.outputs]).validate()
    assert ir.show(hoisted.outputs[0].expr) != ir.show(prog.outputs[0].expr)
    top = hoisted.outputs[0].expr
    assert top.op == "where" and top.args[2].op == "div" and isinstance(top.args[2].args[0], Reduce)
    xs = random_inputs(prog, seed=3, dtypes={n: "float64" for n in prog.inputs})
    a, b = evaluate(prog, xs)["out0"], evaluate(hoisted, xs)["out0"]
    assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    assert a[0, :2].abs().max() == 0  # the rows with no key


def test_both_backwards_match_torch_autograd_in_float64():
    """The recompute and the saved backward programs, evaluated in float64 (the saved one on the values
    its training forward writes), give torch's gradients for every family."""
    for name, (fn, shapes) in FAMILIES.items():
        args = _args(shapes)
        leaves = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
        out = fn(*leaves)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        out.backward(g)
        c = capture(fn, *args)
        inputs = c.inputs(*args)
        for saved in (False, True):
            back = backward_program(c.program, saved=saved)
            feed = dict(inputs)
            feed[back.cotangents["out0"]] = g.reshape(c.program.output_shape(c.program.outputs[0]))
            if saved:
                assert back.saved is not None and (back.saved.stats or back.saved.outputs), name
                fwd = evaluate(back.saved.forward, inputs)
                feed.update({k: fwd[k] for k in (*back.saved.outputs, *back.saved.stats)})
            got = evaluate(back.program, feed)
            for leaf, arg_name in zip(leaves, c.program.inputs):
                if not leaf.is_floating_point():
                    continue
                want = leaf.grad.reshape(c.program.input_shape(arg_name))
                have = got[back.grads[arg_name]]
                assert torch.isfinite(have).all(), (name, saved, arg_name)
                assert torch.allclose(have, want, rtol=1e-9, atol=1e-9), (name, saved, arg_name)


def test_saved_attention_backward_is_flashattention2():
    """Causal attention's saved backward reads the output and the log-sum-exp, computes D as
    Σ_e dO·O (no pass over the keys for it), and runs as two fused passes: dQ over key tiles, dK and
    dV together over query tiles, the scores recomputed per tile, nothing of size L² stored (the model's
    choice at a training length; at a few hundred keys it may store the scores instead)."""
    xs = [torch.randn(1, 16, 2048, 64, dtype=torch.float16) for _ in range(3)]
    c = capture(_causal, *xs)
    back = backward_program(c.program, saved=True)
    prog = back.program
    assert set(back.saved.outputs) == {"out0"} and set(back.saved.stats) == {"saved_lse"}
    assert all(prog.inputs[k].holds is not None for k in back.saved.stats)
    d_terms = [n for o in prog.outputs for n in ir.walk(o.expr)
               if isinstance(n, Reduce) and n.axis == "e" and any(isinstance(m, Load) and m.tensor == "out0"
                                                                  for m in ir.walk(n.body))]
    assert d_terms, "D = Σ_e dO·O"
    assert not any(isinstance(n, Reduce) and n.op == "max" for o in prog.outputs for n in ir.walk(o.expr))
    compiled = compile_ir(prog)
    alt = compiled.alternative
    # D = Σ_e dO·O is computed once per query row by a pass over e (FlashAttention-2's preprocessing,
    # in a kernel of its own or before the dQ pass) and read from its [h, i] buffer by the dK/dV pass
    assert re.match(r"[23] kernels, pass over e \(sum_e\); pass over j \(sum_j\); pass over i \(sum_i, sum_i2\)",
                    alt.structure), alt.structure
    assert [b.axes for b in alt.plan.buffers.values()] == [("h", "i")], "D alone is written: nothing of size L²"
    dkdv = next(k for k in alt.plan.kernels if any(p.axis == "i" for p in k.passes()))
    assert not any(ld.tensor == "out0" for ld in loads_in(dkdv, alt.plan)), "D is not recomputed per key tile"
    derivation = "\n".join(alt.plan.derivation)
    assert "horizontal_fusion: sum_i, sum_i2 share one pass over i" in derivation
    for k, s in zip(alt.plan.kernels, alt.schedules):
        assert shared_bytes(k, prog, alt.plan, s) <= SHARED_BUDGET


def test_the_saved_backward_reads_the_log_sum_exp():
    """grad_fold: the forward saves lse = m + log l (∞ on a row with no key) and the backward weighs
    every gradient by one exponential e^{s − lse} — dV = Σ_i dO·P and dS = P·(dP − D), neither under
    a zero-row select (P is 0 on such a row; dO, V and O are loaded: README's finite-operand
    exception) — with nothing divided by l per score. The forward saves lse alone: the backward no
    longer reads l (the masked forward's lse still holds its ∞ for a row with no key)."""
    xs = [torch.randn(1, 2, 64, 16, dtype=torch.float16) for _ in range(3)]
    for fn, guarded in ((_causal, True), (_global, False)):
        back = backward_program(capture(fn, *xs).program, saved=True)
        prog, stats = back.program, back.saved.stats
        assert set(stats) == {"saved_lse"}, (fn.__name__, stats)
        lse = ir.show(stats["saved_lse"])
        assert "log(sum_j(exp(" in lse and ("== 0, inf, log(" in lse) == guarded, lse
        nodes = {n for o in prog.outputs for n in ir.walk(o.expr)}
        weights = {n for n in nodes if isinstance(n, ir.Call) and n.op == "exp" and {"i", "j"} <= n.axes}
        assert len(weights) == 1 and "saved_lse" in ir.show(next(iter(weights))), weights
        assert not any(isinstance(n, ir.Call) and n.op == "div" and isinstance(n.args[1], Load)
                       and n.args[1].tensor in stats for n in nodes), fn.__name__
        zero_row = [n for n in nodes if isinstance(n, ir.Call) and n.op == "where" and n.args[1] == ir.Const(0.0)
                    and isinstance(n.args[0], ir.Call) and n.args[0].op == "eq"]
        assert not zero_row, [ir.show(n)[:80] for n in zero_row]
    # s/4 − lse ≤ 0 is known (rules.analysis, with the ∞ of an empty row): no stabilising max pass
    xs = [torch.randn(2, 100, 64) for _ in range(3)]
    back = backward_program(capture(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v,
                                    *xs).program, saved=True)
    assert "max_" not in compile_ir(back.program).alternative.structure


def test_rows_with_no_key_get_zero_gradients_through_the_saved_log_sum_exp():
    """Rows 0 and 1 see no key (l = 0, lse = ∞): the saved backward, evaluated in float64 on what its
    forward writes, gives the recompute backward's gradients — finite, and 0 for those query rows."""
    args = _args([(1, 2, 6, 4)] * 3, seed=4)
    c = capture(_masked_rows, *args)
    inputs = c.inputs(*args)
    g = torch.randn(c.program.output_shape(c.program.outputs[0]), generator=torch.Generator().manual_seed(9),
                    dtype=torch.float64)
    got = {}
    for saved in (False, True):
        back = backward_program(c.program, saved=saved)
        feed = {**inputs, back.cotangents["out0"]: g}
        if saved:
            assert "where(" in ir.show(back.saved.stats["saved_lse"])
            feed = _saved_feed(back, feed)
        got[saved] = {n: evaluate(back.program, feed)[back.grads[n]] for n in back.grads}
    for n, want in got[False].items():
        assert torch.isfinite(got[True][n]).all(), n
        assert torch.allclose(got[True][n], want, rtol=1e-9, atol=1e-12), n
    assert got[True]["q"].reshape(1, 2, 6, 4)[:, :, :2].abs().max() == 0  # (b, h, i, d)


def _global(q, k, v):  # the softmax written out, the score scale a division (examples/neptune_ops.py)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p @ v) / p.sum(-1, keepdim=True)


def _gqa(q, k, v):  # 8 query heads per kv head, broadcast by repeat_interleave
    k, v = k.repeat_interleave(8, dim=1), v.repeat_interleave(8, dim=1)
    L = q.shape[-2]
    keep = torch.arange(L)[None, :] <= torch.arange(L)[:, None]
    return torch.softmax(torch.where(keep, q @ k.transpose(-1, -2) / 8.0, float("-inf")), -1) @ v


def test_global_and_grouped_attention_backwards_are_two_passes():
    """Two spellings that used to add work to the backward, at a training length (the model's choice):

    - global: the saved max of s/√d also stands for the max of the log₂e-scaled scores, so no
      stabilising max pass is added; 1/l of the unguarded sum (≥ 1) takes no zero-cotangent guard,
      dP = dO·Vᵀ stays on the tensor cores and S is never stored;
    - GQA: the head group h // 8 no longer stops the test that the softmax's shift is invisible to the
      output, so the backward has no max-selection term (and no extra pass over the keys for it); the
      per-head partials its group sum reads are laid out so that no program reads single elements
      of a buffer's contiguous axis (extract/plans._buffer_layout)."""
    for fn, heads in ((_global, (4, 4)), (_gqa, (16, 2))):
        xs = [torch.randn(1, h, 8192, 64, dtype=torch.float16) for h in (heads[0], heads[1], heads[1])]
        back = backward_program(capture(fn, *xs).program, saved=True)
        prog, stats = back.program, set(back.saved.stats)

        def selects_the_max(n, stats=stats):  # s == m: where the max's adjoint would flow
            return isinstance(n, ir.Call) and n.op == "eq" and not any(isinstance(a, ir.Const) for a in n.args) \
                and any(isinstance(a, Load) and a.tensor in stats for a in n.args)

        assert not any(isinstance(n, Reduce) and n.op == "max" for o in prog.outputs for n in ir.walk(o.expr))
        assert not any(selects_the_max(n) for o in prog.outputs for n in ir.walk(o.expr)), fn.__name__
        alt = compile_ir(prog).alternative
        assert "max_j" not in alt.structure, (fn.__name__, alt.structure)
        assert not any({"i", "j"} <= set(b.axes) for b in alt.plan.buffers.values()), "no L² buffer"
        passes = re.sub(r"^\d+ kernels, ", "", alt.structure.split(" [")[0]).replace("pass over e (sum_e); ", "")
        assert passes.startswith("pass over j (sum_j); pass over i (sum_i, sum_i2)"), (fn.__name__, alt.structure)
        for k, s in zip(alt.plan.kernels, alt.schedules):
            for ld in loads_in(k, alt.plan):
                b = alt.plan.buffers.get(ld.tensor)
                assert b is None or not (b.axes[-1] in k.grid and s.tiles.get(b.axes[-1], 1) == 1), (k.name, b)


def test_head_dim_128_backward_schedules_fit_shared_memory():
    """Three head-dim-128 tiles streamed per step at three stages overflow Hopper's shared memory (the
    launch failed on the H100): the default schedules drop to two stages."""
    xs = [torch.randn(1, 2, 512, 128, dtype=torch.float16) for _ in range(3)]
    back = backward_program(capture(_causal, *xs).program, saved=True)
    prog = compile_ir(back.program)
    # (at L = 512 the model may write the probabilities once for GEMMs of their own: those fit too)
    flash = next(a for a in prog.alternatives if not any(b.operand for b in a.plan.buffers.values()))
    for alt in (prog.alternative, flash):
        for k, s in zip(alt.plan.kernels, alt.schedules):
            assert shared_bytes(k, back.program, alt.plan, s) <= SHARED_BUDGET, (k.name, s)
    assert any(s.num_stages == 2 for s in flash.schedules)


def test_a_held_statistic_spares_the_stabilising_max():
    """An input that holds max_j x: the numerics analysis knows x − m ≤ 0, so Σ_j exp(x − m) needs no
    max pass of its own; the same input without `holds` gets one (exp of an unknown exponent)."""
    x = Load("x", (Index("i"), Index("j")))
    body = Reduce("sum", "j", ir.Call("exp", (ir.Call("sub", (x, Load("m", (Index("i"),)))),)))

    def structure(holds):
        prog = ir.Program("held", {"i": 8, "j": 4096},
                          {"x": ir.TensorSpec("x", ("i", "j")), "m": ir.TensorSpec("m", ("i",), holds=holds)},
                          [ir.Output("o", ("i",), body)]).validate()
        return compile_ir(prog).alternative.structure

    assert "max_j" in structure(None)
    assert "max_j" not in structure(Reduce("max", "j", x))


def test_explain_shows_the_ranked_backwards(tmp_path):
    x = torch.randn(4, 33)
    prog = neptune_eq.compile(lambda t: torch.log_softmax(t, -1), x, cache_dir=tmp_path)
    leaf = x.clone().requires_grad_()
    prog(leaf).sum().backward()
    text = prog.explain()
    assert "backward: chose" in text and "recompute:" in text and "saved:" in text
    assert training_report(prog._first().op.qualname) in text
    ref = leaf.detach().clone().requires_grad_()
    torch.log_softmax(ref, -1).sum().backward()
    assert torch.allclose(leaf.grad, ref.grad, atol=1e-5)


def test_backward_plans_with_D_written_once_match_float64_in_the_interpreter():
    """Every plan of causal attention's saved backward that computes D = Σ_e dO·O by a pass over e
    runs right (interpreter, fp32, L = 40: not a tile multiple), against the program in float64:
    D fused before the dQ pass in one kernel (the pass over e, then the keys read e whole again),
    or in a kernel of its own. The dK/dV pass's tiles between the diagonal ones skip the causal mask
    and select nothing (no zero-row guard); the dQ pass loads each key tile once (Kᵀ for QKᵀ is a view);
    dK accumulates as dS·Q, the computed operand on the left."""
    xs = [torch.randn(1, 2, 40, 16) for _ in range(3)]
    back = backward_program(capture(_causal, *xs).program, saved=True)
    prog = back.program
    compiled = compile_ir(prog)
    picks = {}
    for a in compiled.alternatives:
        kinds = len(a.plan.kernels)
        if a.structure.split(", ", 1)[1].startswith("pass over e (sum_e); pass over j (sum_j); pass over i"):
            picks.setdefault(kinds, a.id)
    assert set(picks) >= {2, 3}, [a.structure for a in compiled.alternatives[:8]]
    feed = _saved_feed(back, random_inputs(prog, seed=5))
    want = evaluate(prog, {k: v.double() for k, v in feed.items()})
    for kinds, i in sorted(picks.items()):
        got = compiled.pin(i).run(feed)
        for name, ref in want.items():
            err = ((got[name].double() - ref).norm() / ref.norm()).item()
            assert err < 1e-4, (kinds, name, err)
    fused = compiled.pin(picks[2])
    src = fused.lowered("cuda")[0]
    first = src[src.index("def nq_"):src.index("@triton.jit", src.index("def nq_"))]
    assert "for start_e in" in first and "for start_j in" in first, "D's pass and the dQ pass share a kernel"
    loop = first[first.index("for start_j in"):]
    loop = loop[:loop.index("\n    for ", 1)] if "\n    for " in loop[1:] else loop
    assert loop.count("tl.load(k_ptr") == 1 and "tl.trans(" in loop, loop
    last = src[src.rindex("def nq_"):]
    assert "tl.full([BLOCK_j, BLOCK_d]" in last, "dK laid out [j, d]"
    loops = last.split("\n    for start_i in ")[1:]
    full = [lp for lp in loops if lp.startswith("range(flo_i, fhi_i")]
    assert len(loops) == 3 and len(full) == 1 and "tl.where(" not in full[0] and "saved_1" not in last, loops


def test_a_group_sum_over_many_heads_steps_a_bounded_block_and_matches_float64():
    """GQA's dK and dV sum the query heads of each group, Σ_h [h // 8 = h0]·dK_h: at 64 query heads
    of 8 groups and head dim 64 a program's block would be [8 groups, 64 heads, 64] (it spilled on the
    H100: 57 ms for 1.1 GB of reads); the loop over h steps 32 heads instead, and the gradients still
    match float64 (interpreter, L = 5). At L = 5 the key tile (8) is too small for a dot, so dK's state,
    laid out [j, d] for the tensor cores, is updated by an elementwise sum laid out [d, j]: it is laid
    back out as the state (that update failed to broadcast before)."""
    from neptune_eq.block_bounds import BLOCK_VALUES
    from neptune_eq.kernel_terms import inner_axes

    def gqa(q, k, v):
        k, v = k.repeat_interleave(8, dim=1), v.repeat_interleave(8, dim=1)
        return torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1) @ v

    xs = [torch.randn(1, h, 5, 64) for h in (64, 8, 8)]
    back = backward_program(capture(gqa, *xs).program, saved=True)
    prog = back.program
    compiled = compile_ir(prog)

    def group_sums(alt):  # the kernels summing a group's heads from per-head buffers
        return [(k, s) for k, s in zip(alt.plan.kernels, alt.schedules) if not inner_axes(k, alt.plan)
                and any(c.mask is not None and "//" in ir.show(c.mask) for p in k.passes() for c in p.comps)]

    alt = next(a for a in compiled.alternatives if group_sums(a))
    for k, s in group_sums(alt):
        (p,) = k.passes()
        assert s.tiles[p.axis] < prog.axes[p.axis], s
        assert 8 * s.tiles[p.axis] * 64 <= BLOCK_VALUES, s
    feed = _saved_feed(back, random_inputs(prog, seed=3))
    want = evaluate(prog, {n: x.double() for n, x in feed.items()})
    got = compiled.pin(alt.id).run(feed)
    for name, ref in want.items():
        assert ((got[name].double() - ref).norm() / ref.norm()).item() < 1e-4, name


def test_a_zero_row_select_is_dropped_only_around_values_built_of_loads():
    """grad_fold drops where(l = 0, 0, y·P) when y is finite wherever the loaded inputs are (sums,
    differences, products of loads): P is 0 on those rows. A saved row statistic is not such a load
    (a max or log-sum-exp is ±∞ on exactly those rows), nor is a quotient or a logarithm."""
    from neptune_eq.grad_fold import _Folder

    x, v = Load("x", (Index("i"), Index("j"))), Load("v", (Index("j"),))
    m = Load("saved_m", (Index("i"),))
    folder = _Folder({}, {m: ir.Const(0.0)}, lambda stem: stem)
    def call(op, *args):
        return ir.Call(op, args)

    built = call("sub", Reduce("sum", "j", call("mul", x, v)), call("mul", x, ir.Const(2.0)))
    assert folder.finite_where_loads_are(built)
    assert not folder.finite_where_loads_are(call("sub", x, m))
    assert not folder.finite_where_loads_are(call("div", x, v))
    assert not folder.finite_where_loads_are(call("log", x))
    assert not folder.finite_where_loads_are(call("mul", x, ir.Const(float("inf"))))


def _dpo(logits, labels, ref):
    """DPO over a batch of chosen then rejected sequences (TRL's concatenated forward)."""
    m = labels != -100
    lp = torch.gather(logits.log_softmax(-1), 2, torch.where(m, labels, 0)[..., None]).squeeze(2)
    logps = (lp * m).sum(-1)
    n = logps.shape[0] // 2
    return -torch.nn.functional.logsigmoid(0.1 * ((logps[:n] - ref[:n]) - (logps[n:] - ref[n:]))).mean()


def _dpo_args(dtype=torch.float64):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 5, 11, generator=gen, dtype=dtype)
    labels = torch.randint(0, 11, (4, 5), generator=gen)
    labels[:, :2] = -100
    labels[3, :] = -100  # a sequence with no scored token
    return logits, labels, torch.randn(4, generator=gen, dtype=dtype)


def test_statistics_of_a_batch_half_are_saved_and_read_at_shifted_rows():
    """DPO reads the batch as two halves, logits[k] and logits[k + n]: their row max, row sum and
    sequence log-probabilities are reductions over k, not over the batch, and the gradient of the
    whole batch reads them at max(b − n, 0) and min(b, n − 1). Before, none was saved (their axes are
    no subset of a tensor's) and the recompute backward ran 10 row max/sum pairs over the vocabulary
    (7.7 ms against torch.compile's 1.4 at 8 × 1024 × 32000 on the H200). Now every one is a saved
    statistic read at the shifted rows: the backward has no reduction over the vocabulary or the
    sequence, and matches torch in float64."""
    args = _dpo_args()
    c = capture(_dpo, *args)
    back = backward_program(c.program, saved=True)
    assert len(back.saved.stats) >= 6, back.saved.stats.keys()
    for o in back.program.outputs:  # (nor the one-hot Σ_k over a half's rows: neptune_eq.grad_delta)
        assert not any(isinstance(n, Reduce) for n in ir.walk(o.expr)), o.name
    # each half's term reads the logits at its own row, b, not at a clamped max(b − 2, 0) + 2
    loads = {n for o in back.program.outputs for n in ir.walk(o.expr) if isinstance(n, Load) and n.tensor == "logits"}
    assert loads == {Load("logits", (Index("b"), Index("i"), Index("d")))}, loads
    leaves = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
    _dpo(*leaves).backward()
    inputs = c.inputs(*args)
    feed = _saved_feed(back, {**inputs, back.cotangents["out0"]: torch.ones((), dtype=torch.float64)})
    got = evaluate(back.program, feed)
    for leaf, name in zip(leaves, c.program.inputs):
        if leaf.is_floating_point():
            want = leaf.grad.reshape(c.program.input_shape(name))
            assert torch.allclose(got[back.grads[name]], want, rtol=1e-9, atol=1e-12), name


def test_dpo_trains_through_its_saved_statistics():
    args = _dpo_args(torch.float32)
    want = [a.double().requires_grad_() if a.is_floating_point() else a for a in args]
    _dpo(*want).backward()
    prog = neptune_eq.compile(_dpo, *args)
    got = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
    prog(*got).backward()
    assert "chose saved" in training_report(prog._first().op.qualname)
    for g, w in zip(got, want):
        if g.is_floating_point():
            assert torch.allclose(g.grad.double(), w.grad, rtol=1e-4, atol=1e-6)


def _seq_logps(logits, labels, avg):
    m = labels != -100
    lp = torch.gather(logits.log_softmax(-1), 2, torch.where(m, labels, 0)[..., None]).squeeze(2)
    s = (lp * m).sum(-1)
    return s / m.sum(-1).clamp_min(1) if avg else s


def _simpo(logits, labels):
    lp = _seq_logps(logits, labels, True)
    n = lp.shape[0] // 2
    return -torch.nn.functional.logsigmoid(2.0 * (lp[:n] - lp[n:]) - 0.5).mean()


def _orpo(logits, labels):
    lp = _seq_logps(logits, labels, True)
    c, r = lp[: lp.shape[0] // 2], lp[lp.shape[0] // 2:]
    log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
    return -c.mean() - 0.1 * torch.nn.functional.logsigmoid(log_odds).mean()


def _ipo(logits, labels, ref):
    lp = _seq_logps(logits, labels, False)
    n = lp.shape[0] // 2
    return (((lp[:n] - ref[:n]) - (lp[n:] - ref[n:]) - 5.0) ** 2).mean()


def test_other_preference_losses_save_their_halves_statistics_too():
    """SimPO (length-normalised), ORPO (log-odds of the chosen and rejected halves) and IPO (squared):
    none was benchmarked; each backward reads saved statistics only (no reduction left) and matches
    torch in float64. (No sequence without a scored token here: ORPO's log(1 − e^0) is −inf there, and
    torch's gradient of that row is 0·inf = NaN where ours is the mask's 0.)"""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 5, 11, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 11, (6, 5), generator=gen)
    labels[:, :2] = -100
    ref = torch.randn(6, generator=gen, dtype=torch.float64)
    for fn, args in ((_simpo, (logits, labels)), (_orpo, (logits, labels)), (_ipo, (logits, labels, ref))):
        leaves = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
        fn(*leaves).backward()
        c = capture(fn, *args)
        back = backward_program(c.program, saved=True)
        assert not any(isinstance(n, Reduce) for o in back.program.outputs for n in ir.walk(o.expr)), fn.__name__
        feed = _saved_feed(back, {**c.inputs(*args), back.cotangents["out0"]: torch.ones((), dtype=torch.float64)})
        got = evaluate(back.program, feed)
        for leaf, name in zip(leaves, c.program.inputs):
            if leaf.is_floating_point():
                want = leaf.grad.reshape(c.program.input_shape(name))
                assert torch.allclose(got[back.grads[name]], want, rtol=1e-9, atol=1e-12), (fn.__name__, name)


def test_a_statistic_is_read_at_shifted_rows_only_inside_its_extent():
    """max_d x[k + 4, d] over k < 4 saved: the backward's max_d x[min(max(b − 4, 0), 3) + 4, d] reads it at
    that clamped row; max_d x[(b − 4) + 4, d] over b < 8 would read it at −4..3 and is left alone."""
    from neptune_eq.grad_saved import _shifted_read

    def c(op, *a):
        return ir.Call(op, a)

    k, b, d = Index("k"), Index("b"), Index("d")
    stat = Reduce("max", "d", Load("x", (c("add", k, ir.Const(4)), d)))
    load = Load("saved_0", (k,))
    axes, extents = {"k": 4, "d": 3}, {"k": 4, "d": 3, "b": 8}
    clamped = c("min2", c("max2", c("add", b, ir.Const(-4)), ir.Const(0)), ir.Const(3))
    inside = Reduce("max", "d", Load("x", (c("add", clamped, ir.Const(4)), d)))
    assert _shifted_read(inside, {stat: load}, axes, extents) == Load("saved_0", (clamped,))
    outside = Reduce("max", "d", Load("x", (c("add", c("add", b, ir.Const(-4)), ir.Const(4)), d)))
    assert _shifted_read(outside, {stat: load}, axes, extents) is None


def test_orpo_on_a_sequence_with_no_scored_token_keeps_its_gradient_zero():
    """A deliberate difference from torch. A sequence with no scored token has log-probability 0, so
    ORPO's log(1 − e⁰) is −∞ and its log-odds +∞: the loss is finite and does not depend on that
    sequence's logits at all (each token is masked), so their gradient is 0. torch gives NaN there: its
    chain rule multiplies logsigmoid's derivative at +∞, 0, by log1p(−eᶜ)'s, −∞, and the mask's 0 by
    that NaN, and the NaN would reach every weight in a training step. Ours is the mask's 0 (a select,
    not a product), and agrees with torch everywhere torch's gradient is a number."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 5, 11, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 11, (4, 5), generator=gen)
    labels[:, :2] = -100
    labels[1, :] = -100  # the second chosen sequence scores no token
    leaf = logits.clone().requires_grad_()
    _orpo(leaf, labels).backward()
    c = capture(_orpo, logits, labels)
    back = backward_program(c.program, saved=True)
    feed = _saved_feed(back, {**c.inputs(logits, labels), back.cotangents["out0"]: torch.ones((), dtype=torch.float64)})
    got = evaluate(back.program, feed)[back.grads["logits"]].reshape(leaf.shape)
    want = leaf.grad
    assert want[1].isnan().all() and not want[[0, 2, 3]].isnan().any()
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    assert torch.allclose(got[[0, 2, 3]], want[[0, 2, 3]], rtol=1e-9, atol=1e-12)


def _gated(q, k, v, g):  # Qwen3-Next's gated attention: the attention output times σ(g)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) * torch.sigmoid(g)


def test_a_gated_attention_saves_its_attention_value_and_trains_flashattention2s_way():
    """An output gate σ(g)·U/l (U = Σ_j p·v, the size of the output) hid the attention output from the
    saved backward: it recomputed the whole forward and found D by a pass over the keys. U is saved now
    (an output-sized fused value the output maps) and D = Σ_e dO'·U/l is a pass over e; the dV product
    Σ_i P·(dO·σ(g)), both operands computed, P from the saved log-sum-exp, runs on the tensor cores in
    bf16 (it ran as TF32×3 products: 2.58 ms fwd+bwd on the H100 against 1.09 after both changes)."""
    xs = [torch.randn(2, 16, 2048, 128, dtype=torch.bfloat16) for _ in range(4)]
    back = backward_program(capture(_gated, *xs).program, saved=True)
    stats = {k: ir.show(r) for k, r in back.saved.stats.items()}
    assert any("* v[" in s for s in stats.values()), stats  # U = Σ_j p·v, saved
    compiled = compile_ir(back.program)
    assert re.match(r"[23] kernels, pass over e \(sum_e\); pass over j \(sum_j\); pass over i \(sum_i, sum_i2\)",
                    compiled.alternative.structure), compiled.alternative.structure
    src = compiled.lowered("cuda")[0]
    assert "tl.dot(" in src and "input_precision" not in src, "every product on the 16-bit tensor cores"


def test_a_gated_attentions_saved_backward_matches_float64_in_the_interpreter():
    """The saved backward of the gated attention (U and the log-sum-exp read from the forward) against
    its program in float64, L = 40 (no tile multiple), bf16 inputs."""
    xs = [torch.randn(1, 2, 40, 16, dtype=torch.bfloat16) for _ in range(4)]
    back = backward_program(capture(_gated, *xs).program, saved=True)
    prog = back.program
    compiled = compile_ir(prog)
    feed = _saved_feed(back, random_inputs(prog, seed=7))
    want = evaluate(prog, {k: v.double() for k, v in feed.items()})
    got = compiled.run(feed)
    for name, ref in want.items():
        err = ((got[name].double() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, (name, err)


def _swiglu(x, w1, w3, w2):
    return (torch.nn.functional.silu(x @ w1) * (x @ w3)) @ w2


def test_an_mlps_long_products_are_saved_and_its_saved_backward_matches_float64():
    """x·W1 and x·W3 over a hidden size ≥ SAVE_CONTRACTION feed the product with W2: saved (the
    backward reads them instead of two GEMMs); attention's scores (a 16-long product) and linear
    cross-entropy's logits (a long product feeding a log-sum-exp, not a product) are not. The saved
    backward against its program in float64 (interpreter, no tile multiples)."""
    from neptune_eq.grad_saved import SAVE_CONTRACTION, statistics

    d = SAVE_CONTRACTION
    xs = [torch.randn(5, d), torch.randn(d, 6) / 32, torch.randn(d, 6) / 32, torch.randn(6, 3)]
    back = backward_program(capture(_swiglu, *xs).program, saved=True)
    assert sorted(ir.show(r) for r in back.saved.stats.values()) == [
        "sum_d(x[i, d] * w1[d, e])", "sum_d(x[i, d] * w3[d, e])"], back.saved.stats
    feed = _saved_feed(back, random_inputs(back.program, seed=3))
    want = evaluate(back.program, {k: v.double() for k, v in feed.items()})
    got = compile_ir(back.program).run(feed)
    for name, ref in want.items():
        assert torch.allclose(got[name].double(), ref, rtol=1e-4, atol=1e-5), name

    def lce(h, w, t):
        return torch.nn.functional.cross_entropy(h @ w, t)

    short = capture(_causal, *_args([(1, 2, 6, 16)] * 3)).program
    long_ce = capture(lce, torch.randn(4, d), torch.randn(d, 7), torch.randint(0, 7, (4,))).program
    from neptune_eq.contraction import is_product

    for prog in (short, long_ce):
        products = {n for o in prog.outputs for n in ir.walk(o.expr)
                    if isinstance(n, Reduce) and n.op == "sum" and is_product(n.body) and len(n.axes) >= 2}
        assert products and not products & set(statistics(prog)), [ir.show(r) for r in statistics(prog)]
