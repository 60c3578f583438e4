"""One compile for every length (issue 14): dynamic axes through capture, e-graph, lowering and the
launch; buckets; torch.compile(dynamic=True). Interpreter, small shapes, float64 references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq.frontend.dynamic import NotDynamic, bucket
from neptune_eq.ir import NeptuneError
from neptune_eq.reference import evaluate
from neptune_eq.runtime import compile_ir


def causal(q, k, v):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    L, S = q.shape[-2], k.shape[-2]
    keep = torch.arange(L)[:, None] >= torch.arange(S)[None, :]
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def tied(q, k, v):  # the mask is built [L, L] from q's length: q and k must keep one length
    L = q.shape[-2]
    s = (q @ k.transpose(-1, -2)).masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


def _close(out, ref, tol=2e-5):
    assert out.shape == ref.shape
    assert (out.double() - ref).abs().max().item() < tol


def _qkv(L, S=None, d=8, heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = S or L
    return [torch.randn(1, heads, n, d, generator=g) for n in (L, S, S)]


def test_buckets():
    assert [bucket(n) for n in (2, 16, 17, 32, 33, 3000, 4096, 4097)] == [16, 16, 32, 32, 64, 4096, 4096, 8192]


def test_one_compile_serves_every_length_of_its_bucket():
    # lengths below one tile (5), not tile multiples (17, 23, 31), query and key lengths apart
    prog = neptune_eq.compile(causal, *_qkv(24), dynamic=True)
    groups = prog.family.lengths.groups
    assert ("i",) in groups and ("j",) in groups  # q and k lengths are free of each other
    for L, S in ((17, 17), (31, 23), (20, 32)):  # all in the bucket of 32
        before = prog.stats()
        xs = _qkv(L, S, seed=L)
        _close(prog(*xs), causal(*[x.double() for x in xs]))
        after = prog.stats()
        assert (after["captures"], after["compiles"] + after["cache_hits"]) == \
               (before["captures"], before["compiles"] + before["cache_hits"])
    xs = _qkv(5, 3)  # another bucket (16): one compile, no capture
    captures = prog.stats()["captures"]
    _close(prog(*xs), causal(*[x.double() for x in xs]))
    assert prog.stats()["captures"] == captures and len(prog.family.programs) == 2


def test_tied_lengths_move_together_and_untied_calls_compile_their_own():
    prog = neptune_eq.compile(tied, *_qkv(20), dynamic=True)
    assert ("i", "j") in prog.family.lengths.groups
    xs = _qkv(27)
    _close(prog(*xs), tied(*[x.double() for x in xs]))
    xs = _qkv(6)
    _close(prog(*xs), tied(*[x.double() for x in xs]))
    assert prog.stats()["signatures"] == 0  # both served by the dynamic function


def test_a_length_read_as_a_number_is_refused_or_kept_static():
    def mid(x):  # x[:, L // 2] reads the column at a number computed from the length: it depends on it
        return x - x[:, x.shape[1] // 2, None]

    def last(x):  # x[:, -1:] reads the column at len(axis) − 1 (session 53): the same at every length
        return x - x[:, -1:]

    x = torch.randn(4, 6, dtype=torch.float64)
    with pytest.raises(NotDynamic, match=r"dimension 1 of argument 'x'.*cannot change length: the function tests"):
        neptune_eq.compile(mid, x, dynamic={0: [1]})  # (the trace specialises L // 2 == 3)
    prog = neptune_eq.compile(mid, torch.randn(4, 6), dynamic={0: [0]})  # the rows may change
    for n in (3, 9):
        y = torch.randn(n, 6)
        _close(prog(y), mid(y.double()))
    assert prog.stats()["signatures"] == 0
    y = torch.randn(4, 7)  # another row length: a compile of its own (correct, counted)
    _close(prog(y), mid(y.double()))
    assert prog.stats()["signatures"] == 1
    prog = neptune_eq.compile(last, torch.randn(4, 6), dynamic={0: [1]})
    for n in (2, 7, 20):
        y = torch.randn(4, n)
        _close(prog(y), last(y.double()))
    assert prog.stats()["signatures"] == 0


def test_a_length_computed_from_a_size_is_written_with_it():
    """x.shape[1] in a division (session 51: it had kept the axis static) and L − 1 in an index offset
    are expressions of len(axis), from a second trace with symbolic sizes: one compile serves them."""
    def centred(x):
        return x - x.sum(1, keepdim=True) / x.shape[1]

    def ramp(x):
        L = x.shape[1]
        return x * (torch.arange(L) - (L - 1))

    for fn in (centred, ramp):
        prog = neptune_eq.compile(fn, torch.randn(4, 6, dtype=torch.float64), dynamic={0: [1]})
        for n in (5, 9, 31):
            y = torch.randn(4, n, dtype=torch.float64)
            _close(prog(y), fn(y), tol=1e-12)
        assert prog.stats()["signatures"] == 0
    # a square example: the divisor is the columns' length, not the rows' (one symbol per dimension)
    prog = neptune_eq.compile(centred, torch.randn(6, 6, dtype=torch.float64), dynamic={0: [0]})
    y = torch.randn(11, 6, dtype=torch.float64)
    _close(prog(y), centred(y), tol=1e-12)
    assert prog.stats()["signatures"] == 0


def _kept_static(fn, example: int, call: int, why: str, tol: float = 1e-12) -> None:
    """fn's rows, named dynamic, are refused saying `why`; with dynamic=True they stay static and a
    call at `call` rows (example: `example` rows) matches fn in float64."""
    x = torch.randn(example, 3, dtype=torch.float64)
    with pytest.raises(NotDynamic, match=why):
        neptune_eq.compile(fn, x, dynamic={0: [0]})
    prog = neptune_eq.compile(fn, x, dynamic=True)
    y = torch.randn(call, 3, dtype=torch.float64)
    _close(prog(y), fn(y), tol=tol)


def test_a_function_that_tests_its_length_keeps_it_static():
    """`if n > 1000:` holds at the example and the probes' lengths: the axis had been made dynamic and
    a call at 2000 ran the example's branch, silently wrong. The symbolic trace's guard keeps it static."""
    def branchy(x):
        s = x.sum(0)
        if x.shape[0] > 1000:
            s = s * 2
        return s

    _kept_static(branchy, 40, 2000, r"tests its length \(n <= 1000;", tol=1e-10)


def test_a_test_true_at_every_probe_length_but_one_keeps_it_static():
    """`L == 20` (and `math.sqrt(L) > 5`, which specialises L in the symbolic trace) had not counted
    as tests of L: compiled at 17 (at 20 for the sqrt), a call at 20 (32) ran the example's branch,
    silently wrong. Such tests are not proved for every length (test_a_length_test_is_proved_...)."""
    def at20(x):
        return x.sum(0) if x.shape[0] == 20 else x.mean(0)

    def rooted(x):
        return x * 2 if math.sqrt(x.shape[0]) > 5 else x

    for fn, n, m in ((at20, 17, 20), (rooted, 20, 32)):
        prog = neptune_eq.compile(fn, torch.randn(n, 3, dtype=torch.float64), dynamic=True)
        y = torch.randn(m, 3, dtype=torch.float64)
        _close(prog(y), fn(y), tol=1e-12)


def test_a_length_test_is_proved_for_every_length_not_sampled():
    """`L // 3 == 400` is false at the example, at every fixed probe length and next to the numbers it
    names (399–401, 2–4), and true at 1200–1202 only: the sampled check made L dynamic and a call at
    1200 took the example's branch (silently wrong). A dimension now changes length only where each
    test of it is proved for every length ≥ 2."""
    def thirds(x):
        y = torch.softmax(x, 0)
        return y * 2 if x.shape[0] // 3 == 400 else y

    _kept_static(thirds, 20, 1200, "not proved for every length")


def test_a_traced_call_at_length_1_does_not_take_the_dynamic_op():
    """The symbolic trace takes every length ≥ 2: `L > 1` is decided there without a test. A call
    torch.compile traced at length 1 had taken the dynamic op (x.sum(0) · 2 where fn gives x.sum(0));
    it now takes a signature of its own (here outside the graph: an eager call compiles it)."""
    def doubled(x):
        return x.sum(0) * 2 if x.shape[0] > 1 else x.sum(0)

    prog = neptune_eq.compile(doubled, torch.randn(20, 3, dtype=torch.float64), dynamic=True)
    run = torch.compile(lambda x: prog(x), dynamic=True, backend="eager")
    for n in (7, 1):
        y = torch.randn(n, 3, dtype=torch.float64)
        _close(run(y), doubled(y), tol=1e-12)


def test_a_number_of_a_length_held_as_a_constant_keeps_it_static():
    """(L // 8) ** 1.5 is no len(axis) expression: the program held it as a number, the same at the
    example (20) and the probe (23) lengths, and L was made dynamic: at 24 the result was off by 14.
    Such a number (the same at the probe's length, which then cannot see its part) keeps L static."""
    def powered(x):
        return x.sum(0) * (x.shape[0] // 8) ** 1.5

    _kept_static(powered, 20, 24, r"computes .*n//8.* from its length")


def test_an_axis_tested_by_the_function_does_not_move_in_another_axis_group():
    """Sliding-window attention whose window depends on the length (HF style: `window = 64 if L > 24
    else 4`): the query axis was kept static for its test, then made dynamic as part of the key axis's
    group of equal extent (only the group's first axis was tested): at 30 the window stayed 4 (error
    1.7 on the sweep's row). Every axis of a group is tested now."""
    def sliding(q, k, v):
        L = q.shape[2]
        window = 64 if L > 24 else 4
        i = torch.arange(L)
        keep = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    prog = neptune_eq.compile(sliding, *_qkv(12), dynamic=True)
    xs = _qkv(30, seed=3)
    _close(prog(*xs), sliding(*[x.double() for x in xs]))


def test_tests_that_hold_at_every_length_keep_it_dynamic():
    """Tests true at every length ≥ 2 do not cost the dimension its symbol: `L > 1`, `L * L + 7 > 5 * L`
    (no real root), `2 * L != 7` (its root is no integer), `max(L, 1) == L`."""
    def fine(x):
        n = x.shape[0]
        ok = n > 1 and n * n + 7 > 5 * n and 2 * n != 7 and max(n, 1) == n
        return x.sum(0) / n if ok else x.sum(0)

    prog = neptune_eq.compile(fine, torch.randn(20, 3, dtype=torch.float64), dynamic={0: [0]})
    for m in (2, 17, 33):
        y = torch.randn(m, 3, dtype=torch.float64)
        _close(prog(y), fine(y), tol=1e-12)
    assert prog.stats()["signatures"] == 0 and prog.stats()["captures"] == 1 + 2  # (the probes at other lengths)


def test_the_length_proof_unit():
    """symsizes.proved: interval bounds, exact univariate solutions, every size moving jointly."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Max, PythonMod

    from neptune_eq.frontend.symsizes import proved

    a, b = sympy.symbols("s0 s1", integer=True, positive=True)
    yes = [a > 1, sympy.Ne(a, 1), sympy.Eq(Max(1, a), a), FloorDiv(a, 64) >= 0, a**2 - 5 * a + 7 > 0,
           sympy.Ne(2 * a, 7), a + b > 3,
           FloorDiv(a, 2) <= a, FloorDiv(a, 2) >= 1, FloorDiv(a, 2) < a, PythonMod(a, 4) < 4]  # (floors: session 54)
    no = [a <= 1000, sympy.Eq(a, 20), sympy.Ne(PythonMod(a, 1009), 0), sympy.Ne(FloorDiv(a, 3), 400),
          a**2 - 5 * a + 5 > 0, sympy.Ne(a * a, 49), a + b < 1000, sympy.Ne(a, b),
          sympy.Eq(2 * FloorDiv(a, 2), a), FloorDiv(a, 2) >= 2, PythonMod(a, 4) < 3]
    for g in yes:
        assert proved(g, [{a}, {b}], {}), g
    for g in no:
        assert not proved(g, [{a}, {b}], {}), g
    assert proved(b > a, [{b}], {a: 1})  # (a fixed at its example's length)
    assert not proved(b > a, [{a}, {b}], {})


def test_sizes_of_one_length_are_proved_on_the_diagonal():
    """`2a − b > 0` holds wherever a = b (the sizes of one group, or tied by `Eq(a, b)`), not with b
    held at its example's 20 while a moves: restricting proves it on the lengths the sizes take."""
    import sympy

    from neptune_eq.frontend.symsizes import SizeTrace, restricting

    a, b = sympy.symbols("s0 s1", integer=True, positive=True)
    test = 2 * a - b > 0
    trace = SizeTrace({}, {a: (0, 0), b: (1, 0)}, (test,), {a: 20, b: 20})
    assert restricting(trace, a, moving=[]) == "2*n - s1 > 0"
    assert restricting(trace, a, moving=[], together={b}) is None
    assert restricting(SizeTrace({}, trace.sizes, (sympy.Eq(a, b), test), trace.example), a, moving=[]) is None


def test_unknown_length_tests_keep_every_dimension_static(monkeypatch):
    """Where fn does not trace with symbolic sizes its tests of them are unknown: no dimension is made
    dynamic on the strength of a probe at one other length (a named one is refused, saying why)."""
    import sys

    monkeypatch.setattr(sys.modules["neptune_eq.frontend.capture"], "trace_sizes", lambda *a, **k: None)
    x = torch.randn(20, 3, dtype=torch.float64)
    with pytest.raises(NotDynamic, match="does not trace with symbolic lengths"):
        neptune_eq.compile(lambda x: torch.softmax(x, 0), x, dynamic={0: [0]})
    prog = neptune_eq.compile(lambda x: torch.softmax(x, 0), x, dynamic=True)
    prog(x)
    assert prog.family is None


def test_a_function_with_no_dynamic_dimension_is_not_captured_again_per_call():
    """A dynamic=True function whose lengths all stay static had been captured (and its lengths
    resolved) again on every call, however often its signature was seen."""
    prog = neptune_eq.compile(lambda x: x[: x.shape[0] // 2].sum(0), torch.randn(6, 3), dynamic=True)
    captures = prog.stats()["captures"]
    for _ in range(2):
        prog(torch.randn(6, 3))
    assert prog.stats()["captures"] == captures


def test_a_size_of_an_argument_the_program_never_reads():
    """y only gives its length (x.sum() / (len(x) · len(y))): the capture had crashed with a KeyError;
    y's length stays specialised, x's changes."""
    def f(x, y):
        return x.sum() / (x.shape[0] * y.shape[0])

    y = torch.randn(5, 3, dtype=torch.float64)
    prog = neptune_eq.compile(f, torch.randn(8, 3, dtype=torch.float64), y, dynamic=True)
    for n in (3, 11):
        x = torch.randn(n, 3, dtype=torch.float64)
        _close(prog(x, y), f(x, y), tol=1e-12)
    assert prog.stats()["signatures"] == 0


def test_an_index_proved_in_range_at_the_example_length_only_keeps_it_static():
    """x[arange(L) + 5] of x's 30 rows is in range at L = 20 and at the probes' lengths: the capture
    dropped its check, the axis was made dynamic, and a call at L = 26 read past x's end silently
    (torch raises IndexError). A check proved at the example's lengths only keeps its axes static."""
    def fn(x, y):
        return x[torch.arange(y.shape[0]) + 5] * y

    x = torch.randn(30, 3, dtype=torch.float64)
    prog = neptune_eq.compile(fn, x, torch.randn(20, 3, dtype=torch.float64), dynamic=True)
    y = torch.randn(25, 3, dtype=torch.float64)
    _close(prog(x, y), fn(x, y), tol=1e-12)
    with pytest.raises(NeptuneError, match="out of range"):
        prog(x, torch.randn(26, 3, dtype=torch.float64))


def test_an_index_of_axes_alone_proved_at_every_length_needs_no_check():
    """CLIP's loss: cross-entropy of a @ bᵀ against arange(N). The target arange(N) is within the N
    classes at every N, the class axis moving with the rows; proved from the index's bounds as
    expressions of the lengths, the check is dropped and N stays dynamic (a check kept for it had
    made N static)."""
    def clip(a, b):
        logits = a @ b.T
        labels = torch.arange(a.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2

    g = torch.Generator().manual_seed(0)
    prog = neptune_eq.compile(clip, *(torch.randn(12, 8, generator=g, dtype=torch.float64) for _ in range(2)),
                              dynamic=True)
    assert prog.family is not None and prog.family.lengths.groups
    for n in (20, 33):
        xs = [torch.randn(n, 8, generator=g, dtype=torch.float64) for _ in range(2)]
        _close(prog(*xs), clip(*xs), tol=1e-12)
    assert prog.stats()["signatures"] == 0


def test_the_egraph_holds_no_extent_for_a_dynamic_axis():
    # Σⱼ (3·x[i] − y[i, j]): with a known extent the algebra writes 3n·x[i] − Σⱼ y; a dynamic j must not
    def f(x, y):
        return (x[:, None] * 3.0 - y).sum(1)

    prog = neptune_eq.compile(f, torch.randn(3), torch.randn(3, 20), dynamic={1: [1]})
    for n in (2, 7, 32):
        x, y = torch.randn(3), torch.randn(3, n)
        _close(prog(x, y), f(x.double(), y.double()))


def test_program_level_dynamic_axes_and_the_bucket_bound():
    prog = neptune_eq.compile(causal, *_qkv(8))
    p = prog.captured.program.with_extents({"i": 16, "j": 16}).with_dynamic({"i", "j"})
    assert "i<=16" in p.text()
    cp = compile_ir(p)
    assert "do_not_specialize" in cp.source
    for n in (1, 9, 16):
        xs = {k: torch.randn(2, n, 8) for k in "qkv"}
        ref = evaluate(p.with_extents({"i": n, "j": n}), {k: x.double() for k, x in xs.items()})["out0"]
        _close(cp.run(xs)["out0"], ref)
    with pytest.raises(NeptuneError, match="axis 'i' has length 17 in this call"):
        cp.run({k: torch.randn(2, 17, 8) for k in "qkv"})


def test_cross_entropy_sum_over_dynamic_tokens():
    def loss(logits, target):
        return F.cross_entropy(logits, target, reduction="sum")

    prog = neptune_eq.compile(loss, torch.randn(12, 10), torch.randint(0, 10, (12,)), dynamic=True)
    for n in (3, 13):
        x, t = torch.randn(n, 10), torch.randint(0, 10, (n,))
        _close(prog(x, t), loss(x.double(), t))


def test_torch_compile_dynamic_across_three_lengths_without_a_new_capture():
    from torch._dynamo.testing import CompileCounter

    prog = neptune_eq.compile(causal, *_qkv(20), dynamic=True)

    def model(q, k, v):
        return prog(q * 2, k, v) + 1

    counter = CompileCounter()
    run = torch.compile(model, dynamic=True, fullgraph=True, backend=counter)
    captures = prog.stats()["captures"]
    for L in (18, 25, 29):
        q, k, v = _qkv(L, seed=L)
        _close(run(q, k, v), causal(q.double() * 2, k.double(), v.double()) + 1)
    assert counter.frame_count == 1  # one dynamo graph for the three lengths
    assert prog.stats()["captures"] == captures


def test_torch_compile_fullgraph_runs_the_index_checks_of_cpu_tensors():
    """cross_entropy's target check had branched on the values (bool(ok.all())): under
    torch.compile(fullgraph=True) on CPU tensors dynamo refused it (data-dependent guard). Traced, the
    check asserts like on CUDA; a bad target still raises, naming the op."""
    def loss(x, t):
        return F.cross_entropy(x, t)

    prog = neptune_eq.compile(loss, torch.randn(12, 6), torch.randint(0, 6, (12,)), dynamic=True)
    run = torch.compile(lambda x, t: prog(x, t), dynamic=True, fullgraph=True, backend="eager")
    for n in (9, 13):
        x, t = torch.randn(n, 6), torch.randint(0, 6, (n,))
        _close(run(x, t), loss(x.double(), t))
    t[2] = 6
    with pytest.raises(RuntimeError, match=r"cross_entropy / nll_loss target: valid indices are \[0, 6\)"):
        run(x, t)


def test_torch_compile_with_another_value_of_a_baked_in_argument():
    """fn(x, scale, flag) bakes scale and flag in; inside torch.compile the dynamic function had run
    the example's program whatever their values (x·2 for a call with 3.0: silently wrong). Such a call
    now leaves the graph and compiles its own (which a later traced call with that value takes);
    fullgraph=True refuses a value nothing compiled, saying why."""
    def fn(x, scale, flag):
        y = torch.softmax(x, 0) * scale
        return y + 1 if flag else y

    prog = neptune_eq.compile(fn, torch.randn(20, 3), 2.0, True, dynamic=True)
    run = torch.compile(lambda x, s, f: prog(x, s, f), dynamic=True, backend="eager")
    x = torch.randn(17, 3)
    for s, f in ((2.0, True), (3.0, True), (2.0, False)):
        _close(run(x, s, f), fn(x.double(), s, f))
    strict = torch.compile(lambda x, s, f: prog(x, s, f), dynamic=True, fullgraph=True, backend="eager")
    _close(strict(x, 3.0, True), fn(x.double(), 3.0, True))  # (the eager call above compiled it)
    with pytest.raises(Exception, match="static value"):
        strict(x, 4.0, True)


def test_torch_compile_at_another_specialised_dimension_is_refused_by_name():
    """dynamic=True keeps a matrix's innermost dimension specialised; under torch.compile a call that
    changes it had crashed in dynamo (a reshape to the old size, hunt8): the traced call refuses it
    naming the dimension (where dynamo falls back to running the frame eagerly instead, the eager call
    compiles that shape: the right answer either way)."""
    prog = neptune_eq.compile(lambda x: torch.softmax(x, -1), torch.randn(3, 20), dynamic=True)
    x = torch.randn(3, 7)
    assert torch.allclose(prog(x), torch.softmax(x, -1), atol=1e-6)
    with pytest.raises(NeptuneError, match="dimension 1 of argument 0 is 7, specialised at 20"):
        prog.family.traced((x,), None)  # what dynamo runs (the check comes before the op)
    try:
        got = torch.compile(lambda x: prog(x) * 2, dynamic=True, backend="eager")(x)
    except NeptuneError as e:
        assert "dimension 1 of argument 0 is 7, specialised at 20" in str(e)
    else:
        assert torch.allclose(got, torch.softmax(x, -1) * 2, atol=1e-6)


def test_a_tensor_read_along_two_axes_ties_them():
    def self_attention(x):  # x is both the queries (axis i) and the keys (axis j)
        return torch.softmax(x @ x.T, -1) @ x

    prog = neptune_eq.compile(self_attention, torch.randn(20, 8), dynamic=True)
    assert [g for g in prog.family.lengths.groups if len(g) == 2]  # i and j move together
    for n in (7, 26):
        x = torch.randn(n, 8)
        _close(prog(x), self_attention(x.double()))
    assert prog.stats()["signatures"] == 0


def test_a_changed_global_captures_the_dynamic_function_again():
    scale = {"s": 2.0}

    def f(x):
        return torch.softmax(x * scale["s"], -1)

    prog = neptune_eq.compile(f, torch.randn(20, 8), dynamic={0: [0]})
    x = torch.randn(9, 8)
    _close(prog(x), f(x.double()))
    scale["s"] = 3.0  # read from the environment: guarded
    _close(prog(x), f(x.double()))
    with pytest.raises(NeptuneError, match="expected True or a dict"):
        neptune_eq.compile(f, x, dynamic="yes")


def test_an_index_that_reads_a_whole_table_only_at_its_length_keeps_that_axis_static():
    """idx[:, j % 4] reaches every column of idx when j has 4 or more values: checked as the whole
    table there. Below 4 it would not, so j cannot be dynamic (the check of a whole table would
    refuse entries the call never reads)."""
    def f(x, idx, y):
        j = torch.arange(y.shape[1])
        return (x[idx[:, j % 4]] * y).sum(1)

    x, idx, y = torch.randn(10), torch.randint(0, 10, (3, 4)), torch.randn(3, 8)
    with pytest.raises(NotDynamic, match=r"dimension 1 of argument 'y'.*an index check depends on it"):
        neptune_eq.compile(f, x, idx, y, dynamic={2: [1]})
    prog = neptune_eq.compile(f, x, idx, y, dynamic={1: [0], 2: [0]})  # the rows may change
    for n in (2, 5):
        idx, y = torch.randint(0, 10, (n, 4)), torch.randn(n, 8)
        _close(prog(x, idx, y), f(x.double(), idx, y.double()))
    assert prog.stats()["signatures"] == 0


def test_a_buckets_lengths_fall_in_ranges_each_priced_at_its_middle():
    from neptune_eq.frontend.buckets import RANGES, length_range, range_middle

    for b in (16, 64, 4096):
        got = [length_range(n, b) for n in range(2, b + 1)]
        assert got == sorted(got) and set(got) == set(range(RANGES))  # in order, every range used
        for r in range(RANGES):
            assert length_range(range_middle(b, r), b) == r


def decode(q, k, v):  # one query row per head against a key length that changes call to call (grouped heads)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(30.0 * torch.tanh(s / 30.0), -1) @ v


def test_each_range_of_a_bucket_runs_the_plan_priced_best_at_its_middle():
    """The alternative is chosen per call from the lengths' range, among the bucket's compiled
    alternatives (no new search), each the cheapest the cost model finds at the range's middle. (Until
    the model priced a loop's chain of steps, this decode bucketed at 4096 ran split-K 4 at 3000 and a
    wider split near 4096; it now prices split-K 8 cheapest across the bucket, as the tuned H100 runs
    of gqa_dc at 4096 found.)"""
    from neptune_eq.extract.cost import plan_cost

    from neptune_eq.frontend.buckets import RANGED_ALTERNATIVES, RANGES, range_middle

    q, k, v = (torch.randn(1, h, n, 128, dtype=torch.float16) for h, n in ((32, 1), (16, 2993), (16, 2993)))
    prog = neptune_eq.compile(decode, q, k, v, dynamic={1: [2], 2: [2]})
    fam = prog.family
    (axis,), = fam.lengths.groups
    chosen = [fam.program_for((range_middle(4096, r),)) for r in range(RANGES)]
    base = fam.programs[(4096,)]
    for r, p in enumerate(chosen):
        assert p.compilation is base.compilation
        at = p.program.with_extents({axis: range_middle(4096, r)})
        price = {a.id: plan_cost(a.plan, at, a.schedules, base.compilation.device).time
                 for a in base.alternatives[:RANGED_ALTERNATIVES]}
        assert price[p.choice] == min(price.values())
    stats = prog.stats()
    assert stats["compiles"] + stats["cache_hits"] == 1  # one bucket compiled (or found in the cache) once


def test_every_alternative_of_a_bucket_serves_each_of_its_lengths():
    """What per-call choice relies on: any alternative of a bucket's compile is exact at every
    length of the bucket, not only at the range it was chosen for."""
    q, k, v = (torch.randn(1, h, n, 16) for h, n in ((4, 1), (2, 40), (2, 40)))
    prog = neptune_eq.compile(decode, q, k, v, dynamic={1: [2], 2: [2]})
    fam = prog.family
    fam.program_for((40,))
    base = fam.programs[(64,)]
    structures = set()
    for alt in base.alternatives[:6]:
        p = base.pin(alt.id)
        structures.add(alt.structure)
        for n in (33, 64):
            xs = (q, torch.randn(1, 2, n, 16), torch.randn(1, 2, n, 16))
            out = p.run(fam.inputs(xs, (n,)))["out0"]
            _close(out.reshape(1, 4, 1, 16), decode(*[x.double() for x in xs]), 1e-4)
    assert len(structures) > 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_a_buckets_first_cuda_call_compiles_every_plan_its_ranges_choose():
    q, k, v = (torch.randn(1, h, n, 128, device="cuda", dtype=torch.float16)
               for h, n in ((32, 1), (16, 2993), (16, 2993)))
    prog = neptune_eq.compile(decode, q, k, v, dynamic={1: [2], 2: [2]})
    prog(q, k, v)
    ranged = prog.family._ranged[(4096,)]
    assert all(p.launcher("cuda")._runners for p in ranged.values())
    for n in (2100, 2600, 3500, 4000):  # one length in each range: every kernel already compiled
        xs = (q, *(torch.randn(1, 16, n, 128, device="cuda", dtype=torch.float16) for _ in range(2)))
        keys = {id(p): len(p.launcher("cuda")._runners) for p in ranged.values()}
        ref = decode(*[x.double() for x in xs])
        assert (prog(*xs).double() - ref).abs().max().item() < 2e-3
        assert {id(p): len(p.launcher("cuda")._runners) for p in ranged.values()} == keys


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_tuning_a_dynamic_compile_fills_the_range_it_measured():
    """prog.tune() at a length of a dynamic compile times the plans of that length's range of its
    bucket and tunes the winner's kernels; that range runs it from then on, the others keep theirs."""
    from neptune_eq.frontend.buckets import RANGES, range_middle

    q, k, v = (torch.randn(1, h, n, 128, device="cuda", dtype=torch.float16)
               for h, n in ((32, 1), (16, 2993), (16, 2993)))
    prog = neptune_eq.compile(decode, q, k, v, dynamic={1: [2], 2: [2]})
    prog(q, k, v)
    fam = prog.family
    before = [fam.program_for((range_middle(4096, r),)) for r in range(RANGES)]
    prog.tune(q, k, v, progress=False)
    after = [fam.program_for((range_middle(4096, r),)) for r in range(RANGES)]
    tuned = fam.program_for((2993,))
    assert tuned.schedules.get("cuda") and tuned not in before
    assert [a is b for a, b in zip(before, after)].count(False) == 1  # only 2993's range changed
    ref = decode(*[x.double() for x in (q, k, v)])
    assert (prog(q, k, v).double() - ref).abs().max().item() < 2e-3
    assert prog.stats()["signatures"] == 0  # no static variant was captured for the tuning


def test_a_bucket_is_ranked_at_the_mean_of_its_lengths():
    from neptune_eq.extract.cost import priced_at

    p = neptune_eq.compile(causal, *_qkv(8)).captured.program
    assert priced_at(p) is p
    d = p.with_extents({"i": 64, "j": 64}).with_dynamic({"j"})
    assert priced_at(d).axes == {**d.axes, "j": 48}


def test_a_row_tile_under_a_runtime_length_is_read_clamped_not_masked():
    """The query tile under a runtime query length reads its tail rows at the last row instead of a
    mask (a masked load under a runtime bound ran 1.2-1.27× slower on the GPU); the output's store
    stays masked, and lengths that leave a tail match float64."""
    prog = neptune_eq.compile(causal, *_qkv(24), dynamic=True)
    xs = _qkv(19, 23, seed=3)
    _close(prog(*xs), causal(*[x.double() for x in xs]))
    fam = prog.family
    src, _ = fam.program_for(fam.serves(xs)).lowered("cuda")
    loads = [ln for ln in src.splitlines() if "tl.load(q_ptr" in ln]
    stores = [ln for ln in src.splitlines() if "tl.store(" in ln]
    assert loads and all("offs_i < n_i" not in ln and "tl.minimum(offs_i, n_i - 1)" in ln for ln in loads), loads
    assert stores and all("(offs_i < n_i)" in ln for ln in stores), stores


def test_alibi_decode_serves_every_key_length():
    """alibi_dc's query sits at S − 1 and its slopes divide by H: both are len(axis) expressions now
    (the key axis had stayed static), so one compile serves each bucket of key lengths."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from neptune_ops import alibi_dc

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1, 16, generator=g)
    prog = neptune_eq.compile(alibi_dc, q, *(torch.randn(1, 4, 40, 16, generator=g) for _ in range(2)), dynamic=True)
    assert any("j" in group for group in prog.family.lengths.groups)
    for S in (40, 33, 57):
        k, v = (torch.randn(1, 4, S, 16, generator=g) for _ in range(2))
        _close(prog(q, k, v), alibi_dc(q.double(), k.double(), v.double()))
    assert prog.stats()["signatures"] == 0


def test_with_more_groups_than_ranged_the_longest_pick_ranges_and_explain_says_which_plan_runs():
    """dynamic=True on a decode makes batch, heads and keys three groups of lengths, which had left each
    bucket one plan (its split-K factor fixed at the bound). The two longest groups (the later one on a
    tie) now pick ranges, the others priced at their bucket's middle; every range runs the alternative
    priced best there, and explain() lists them."""
    from neptune_eq.extract.cost import plan_cost

    from neptune_eq.frontend.buckets import RANGED_ALTERNATIVES, range_extents, ranged_groups, ranges_of

    assert ranged_groups((16, 16, 4096)) == (1, 2) and ranged_groups((64, 16, 16)) == (0, 2)
    assert ranged_groups((32,)) == (0,)
    q, k, v = (torch.randn(2, 4, n, 16) for n in (1, 2993, 2993))
    prog = neptune_eq.compile(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2), -1) @ v, q, k, v,
                              dynamic=True)
    fam = prog.family
    assert len(fam.lengths.groups) == 3
    out = prog(q, k, v)
    assert torch.allclose(out.double(), torch.softmax(q.double() @ k.double().transpose(-1, -2), -1) @ v.double(),
                          atol=1e-5)
    key = (16, 16, 4096)
    base = fam.programs[key]
    for ns in ((2, 3, 2100), (2, 3, 4000), (3, 14, 2100), (3, 14, 4000)):
        run = fam.program_for(ns)
        assert run.compilation is base.compilation
        at = base.program.with_extents(range_extents(fam.lengths.groups, key, ranges_of(ns, key)))
        price = {a.id: plan_cost(a.plan, at, a.schedules, base.compilation.device).time
                 for a in base.alternatives[:RANGED_ALTERNATIVES]}
        assert price[run.choice] == min(price.values())
    text = prog.explain()
    assert "dynamic lengths:" in text and "group 2 (axes " in text and "bucket of lengths 1–16, 1–16, 2049–4096" in text


def test_a_view_as_the_example_makes_its_lengths_dynamic_too():
    """An example that is a slice of a longer buffer (a KV cache's k_cache[:, :, :S]) gave the symbolic
    trace tests of its strides against its sizes, which no length proof holds: the key axis stayed
    static and every new length captured and compiled again. The symbolic trace now runs on contiguous
    copies (the program reads strides at the call anyway)."""
    def decode(q, k, v):
        return (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1) @ v

    kc, vc, q = torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8), torch.randn(1, 2, 1, 8)
    prog = neptune_eq.compile(decode, q, kc[:, :, :20], vc[:, :, :20], dynamic=True)
    assert prog.family is not None and any(len(g) for g in prog.family.lengths.groups)
    before = prog.stats()
    for s in (21, 27, 31):
        k, v = kc[:, :, :s], vc[:, :, :s]
        assert torch.allclose(prog(q, k, v).double(), decode(q.double(), k.double(), v.double()), atol=1e-5)
    after = prog.stats()
    assert after["signatures"] == before["signatures"] and after["captures"] == before["captures"]


def test_a_map_over_a_dynamic_axis_stores_whole_tiles_unmasked_and_one_masked_tail():
    """A streamed softmax over rows of dynamic length: its normalised store (a map pass) runs whole tiles
    unmasked and one masked tail — masked whole, every access along the row ran scalar on the GPU (the
    length is no constexpr, `offs < n` proves no alignment; softmax of rows 2–3.6× slower than static,
    H100, bench/probe_dynamic_vectorise.py). Every length against float64, below a tile and not a
    multiple of one; the static compile keeps its one masked loop."""
    from neptune_eq.frontend import capture

    base = capture(lambda x: torch.softmax(x, -1), torch.randn(6, 256, dtype=torch.float16)).program
    (row,) = [a for a, n in base.axes.items() if n == 256]
    for program, dynamic in ((base.with_dynamic({row}), True), (base, False)):
        c = compile_ir(program)
        streamed = next(a for a in c.alternatives if "map over" in a.structure and a.kind.startswith("streamed"))
        p = c.pin(streamed.id)
        src = p.source
        assert (f"fhi_{row} = (n_{row} // " in src) == dynamic
        stores = [line.strip() for line in src.splitlines() if "tl.store(out0_ptr" in line]
        assert (len(stores) == 2 and sum("mask=" in s for s in stores) == 1) if dynamic else len(stores) == 1
        for n in (1, 7, 100, 256) if dynamic else (256,):
            x = torch.randn(6, n, dtype=torch.float16)
            got = p.run({"x": x})["out0"]
            _close(got.double(), torch.softmax(x.double(), -1), tol=2e-3)


def test_a_row_held_whole_over_a_dynamic_contiguous_axis_is_priced_scalar():
    """A resident row over a dynamic axis that its tensors are contiguous along runs its accesses
    scalar (3.3× the static kernel at 32768 × 8192, H100): the cost model prices it so, and the
    dynamic softmax of such rows streams them (its whole tiles unmasked); the same softmax over the
    first dimension (rows strided, contiguous along the other axis) is not penalised (compile only)."""
    from extract.cost import _scalar_row
    from neptune_eq.frontend import capture

    x = torch.empty(32768, 8192, dtype=torch.float16)
    for dim, penalised in ((-1, True), (0, False)):
        base = capture(lambda t, dim=dim: torch.softmax(t, dim), x).program
        row = next(a for a, n in base.axes.items() if n == (8192 if dim == -1 else 32768))
        c = compile_ir(base.with_dynamic({row}))
        resident = [a for a in c.alternatives if a.kind.startswith("resident")]
        assert all(_scalar_row(k, s, c.program) == penalised
                   for a in resident for k, s in zip(a.plan.kernels, a.schedules) if s.resident)
        if penalised:
            assert not c.alternative.kind.startswith("resident"), c.alternative.kind
