"""The explorer API on small DSL programs, the attention example and a small PyTorch function."""

import re

import pytest
import torch
from helpers import load_example, small_softmax

import neptune_eq
from neptune_eq.explorer import Explorer, graph
from neptune_eq.explorer.bench import measure
from neptune_eq.ir import NeptuneError
from neptune_eq.runtime import CompiledProgram


@pytest.fixture(scope="module")
def ex() -> Explorer:
    return neptune_eq.explore(small_softmax())


@pytest.fixture(scope="module")
def attention() -> Explorer:
    return neptune_eq.explore(load_example("attention"))


def test_alternatives_table(ex):
    alts = ex.alternatives
    assert len(alts) >= 3
    times = [e.predicted_us for e in alts]
    assert times == sorted(times) and all(t > 0 for t in times)
    first = alts[0]
    # one kernel that reads each row once: the rolling update, or the row held whole on chip
    assert first.id == 0 and first.structure.startswith("1 kernel") and (
        "rolling" in first.structure or "resident" in first.structure)
    assert first.hbm_bytes > 0 and first.flops > 0 and first.kernels == 1
    assert all(e.verified is None for e in alts)  # nothing verified until asked
    text = str(alts)
    assert "predicted µs" in text and "HBM" in text and "FLOPs" in text and "verified" in text
    assert text.count("\n#") == len(alts)
    assert "<table>" in alts._repr_html_()


def test_verify_is_lazy_and_recorded(ex):
    report = ex.verify(1)
    assert report.passed
    assert ex.alternatives[1].verified is True and ex.alternatives[0].verified is None
    row = next(line for line in str(ex.alternatives).splitlines() if line.startswith("#1 "))
    assert "yes" in row


def _rolling(ex) -> int:
    return next(e.id for e in ex.alternatives if "rolling" in e.structure)


def test_show_has_ir_derivation_and_source(ex):
    shown = ex.show(_rolling(ex))
    text = str(shown)
    for section in ("== loop IR ==", "== derivation ==", "== Triton source =="):
        assert section in text
    assert "rolling pass over j" in text and "[repair: sum_j * " in text
    assert "1. algebra:" in text and "rolling_update: sum_j joins the pass over j" in text
    assert "minimal rules that still derive h:" in text and "@triton.jit" in text
    html = shown._repr_html_()
    assert "<h4>derivation</h4>" in html and "<h4>Triton source</h4>" in html
    assert repr(shown) == text  # prints as itself in a terminal


def test_derivation_order_follows_the_pipeline(ex):
    rules = ex.derivation(_rolling(ex), minimal_rules=False).rules()
    assert rules[:3] == ["algebra", "represent", "rolling_update"]
    assert rules[-1] == "kernels"
    two_kernels = next(e.id for e in ex.alternatives if e.kernels == 2)
    d = ex.derivation(two_kernels, minimal_rules=False)
    assert "materialise" in d.rules() or "pass" in d.rules()


def test_diff(ex):
    two_kernels = next(e.id for e in ex.alternatives if e.kernels == 2)
    text = str(ex.diff(0, two_kernels))
    assert f"#0 vs #{two_kernels}" in text and "kernels: 1 vs 2" in text
    assert "cost terms" in text and "time_us" in text and "launches" in text
    assert "--- #0" in text and f"+++ #{two_kernels}" in text
    assert "Triton source (unified diff)" in text


def test_pin_runs_the_chosen_alternative(ex):
    prog = ex.pin(2)
    assert isinstance(prog, CompiledProgram) and prog.choice == 2
    x = torch.randn(8, 256)
    assert torch.allclose(prog(x), torch.softmax(x, -1), atol=1e-5)
    with pytest.raises(NeptuneError, match="no alternative 99"):
        ex.pin(99)


def test_benchmark_on_cpu_gives_a_message_not_numbers(ex):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: benchmark measures")
    report = ex.benchmark([0, 1])
    assert not report.measured and report.times_us() == {}
    assert "no CUDA GPU" in str(report) and "nothing was measured" in str(report)


def test_measure_table_with_an_injected_timer(ex):
    """The measuring loop and its table, with a stand-in timer (the real one is do_bench on a GPU)."""
    calls = []
    alts = [ex.alternatives[k].alternative for k in range(3)]
    report = measure(alts, lambda k: (lambda: calls.append(k)), device="test device",
                     timer=lambda fn: 0.010 * (1 + len(calls)))
    assert report.measured and set(report.times_us()) == {0, 1, 2}
    assert "measured on test device" in str(report) and "Spearman" in str(report)
    # (distinct predictions give a number; alternatives the model prices alike, as small rows held
    # whole are bounded by their chain of steps, say so)
    distinct = len({round(a.predicted_time, 12) for a in alts}) == len(alts)
    assert ("Spearman ρ): undefined" in str(report)) != distinct


needs_dot = pytest.mark.skipif(not graph.have_dot(), reason="graphviz `dot` is not installed")


def test_egraph_dot_highlights_the_plan(ex):
    dot = ex.egraph_dot(0)
    assert dot.startswith("digraph egraph") and "fillcolor=\"#fff4cc\"" in dot and "loop over j" in dot
    assert "highlighted: alternative #0" in dot and "get sum_j" in dot


@needs_dot
def test_egraph_svg_highlights_the_plan(ex):
    svg = ex.egraph_svg(0, max_classes=25)
    assert svg.lstrip().startswith("<?xml") or "<svg" in svg[:500]
    assert "get sum_j" in svg
    html = ex._repr_html_()
    assert "<table>" in html and "<svg" in html


def test_without_dot_the_svg_is_a_clear_error(ex, monkeypatch):
    monkeypatch.setattr(graph.shutil, "which", lambda name: None)
    with pytest.raises(NeptuneError, match="graphviz `dot` is not on PATH"):
        ex.egraph_svg(0)
    html = ex._repr_html_()  # Jupyter still gets the table, and says why there is no picture
    assert "<table>" in html and "no e-graph picture" in html


def _clusters(dot: str) -> set[int]:
    return {int(m) for m in re.findall(r"subgraph cluster_(\d+) ", dot)}


def test_egraph_dot_shows_the_plans_neighbourhood(attention):
    """The issue: a 5,000 pt wide picture, a third of it constant e-classes. By default only the plan's
    e-classes and their direct neighbours are drawn, constants only where the plan uses them."""
    c = attention.compilation
    view, alt = c.view, c.alternatives[0]
    hl = graph.plan_highlight(c, alt)
    consts = graph.constant_classes(view)
    assert consts and consts - hl.classes  # log2(e) and friends: constants the plan does not use
    near = _clusters(attention.egraph_dot(0, max_classes=1000))
    whole = _clusters(attention.egraph_dot(0, whole=True))
    assert whole == set(view.classes)  # whole=True: every e-class, constants included
    assert hl.classes <= near < whole
    assert not near & (consts - hl.classes)
    for cid in near - hl.classes:  # every other class is one edge from a plan class
        kids = {ch for n in view.nodes(cid) for ch in graph._children(n)}
        users = {p for p, ns in view.classes.items() if p in hl.classes
                 for n in ns for ch in graph._children(n) if ch == cid}
        assert kids & hl.classes or users, cid
    assert len(_clusters(attention.egraph_dot(0))) == 60  # the default limit
    assert len(_clusters(attention.egraph_dot(0, max_classes=len(hl.classes)))) == len(hl.classes)


def test_egraph_dot_grows_down_not_wide(attention):
    """What drives a dot picture's width: e-nodes side by side in a cluster and a one-line title."""
    dot = attention.egraph_dot(0)
    title = re.search(r'  label="(.*?)";', dot).group(1)
    assert all(len(part) <= 100 for part in title.split("\\n"))
    for cid in _clusters(dot):
        body = dot.split(f"subgraph cluster_{cid} ")[1].split("\n  }")[0]
        drawn = re.findall(r"^    ([nm]\d+(?:_\d+)?) \[label", body, re.M)
        stacked = re.findall(r"^    \S+ -> \S+ \[style=invis\];", body, re.M)
        assert len(stacked) == len(drawn) - 1, cid  # one under the other


def test_tables_fit_the_width(ex):
    for width in (60, 40):
        for text in (ex.alternatives.text(width), ex.rules(width)):
            assert all(len(line) <= width for line in text.splitlines()), (width, text)
            assert text.count("\n") >= 3
    narrow = ex.alternatives.text(60)
    assert "…" in narrow and "predicted µs" in narrow  # the structure column is cut, not wrapped
    assert narrow.count("\n#") == len(ex.alternatives)  # still one line per alternative
    wide = ex.alternatives.text(200)
    assert all(e.structure in wide for e in ex.alternatives) and "…" not in wide


def test_tables_follow_the_terminal_width(ex, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    assert max(len(line) for line in str(ex.alternatives).splitlines()) <= 60
    assert max(len(line) for line in ex.rules().splitlines()) <= 60


def test_rules_listing(ex):
    text = ex.rules()
    assert "0 user rule(s)" in text and "mul_comm" in text and "exp_sub" in text


def test_attention_derivation_names_rolling_update_and_correction(attention):
    assert attention.alternatives[0].structure.startswith("1 kernel, rolling over j (max_j, sum_j, sum_j2) [")
    d = attention.derivation(0, minimal_rules=False)
    rolling = [s for s in d.steps if s.rule == "rolling_update"]
    assert [s.text for s in rolling] == ["sum_j joins the pass over j that computes max_j",
                                         "sum_j2 joins the pass over j that computes max_j"]
    details = "\n".join(rolling[0].details)
    assert "quotient saturated in a fresh e-graph: exp2(" in details
    assert "correction found: h = exp2(where(old:max_j == -inf, 0, old:max_j) - " in details
    assert "the plan repairs sum_j *= exp2(" in details
    assert "inline" in d.rules()


def test_attention_split_k_derivation(attention):
    split = [e for e in attention.alternatives if "split-K" in e.structure]
    if not split:  # this example's key axis is too short to split; decode_attention is covered in test_explore_cli
        assert all(s != "split_k" for e in attention.alternatives
                   for s in attention.derivation(e.id, minimal_rules=False).rules())
        return
    d = attention.derivation(split[0].id, minimal_rules=False)
    assert "split_k" in d.rules()


def test_pytorch_function():
    def fn(x):
        m = x.amax(dim=-1, keepdim=True)
        e = torch.exp(x - m)
        return e / e.sum(dim=-1, keepdim=True)

    x = torch.randn(4, 128)
    ex = neptune_eq.explore(fn, x)
    assert ex.captured is not None and ex.alternatives[0].kernels == 1
    f = ex.pin(_rolling(ex))
    assert torch.allclose(f(x), fn(x), atol=1e-5)
    assert "rolling_update" in str(ex.show(_rolling(ex), minimal_rules=False, source=False))


def test_explore_argument_errors():
    with pytest.raises(NeptuneError, match="takes no example inputs"):
        neptune_eq.explore(small_softmax(), torch.randn(2))
    with pytest.raises(NeptuneError, match="unknown option"):
        neptune_eq.explore(small_softmax(), max_plan=3)
    with pytest.raises(NeptuneError, match="not int"):
        neptune_eq.explore(3)


def test_progress_printer():
    lines = []
    ex = neptune_eq.explore(small_softmax(), progress=lines.append, max_plans=4)
    assert any("saturate algebra: iteration 1" in m for m in lines)
    assert any("alternatives in" in m for m in lines)
    plans = {e.structure.split(" [")[0] for e in ex.alternatives}
    assert len(plans) <= 4  # max_plans bounds the plans; each is listed with its schedule kinds
