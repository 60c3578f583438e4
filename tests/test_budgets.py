"""Issue 10, budgets: program size costs polynomial time, every phase respects the budget, a plan
(the unfused one at worst) always exists, and a hit budget is said where users look."""

import time

import pytest
import torch
from helpers import run_cli, small_softmax

import neptune_eq
from neptune_eq.frontend import capture
from neptune_eq.pipeline import Options, compile_program
from neptune_eq.runtime import CompiledProgram, compile_ir
from neptune_eq.saturate import Budget, BudgetError


def _chain(kind: str, n: int):
    def chain(x):
        for _ in range(n):
            x = torch.softmax(x, -1) if kind == "softmax" else torch.nn.functional.layer_norm(x, x.shape[-1:])
        return x

    return chain


def test_program_text_is_polynomial_in_a_chain_of_softmaxes():
    program = capture(_chain("softmax", 10), torch.randn(4, 16)).program
    t0 = time.perf_counter()
    text = str(program)  # the cache key is made from it; it printed the shared DAG as a tree
    assert time.perf_counter() - t0 < 1.0 and len(text) < 20_000 and "%1 = " in text


@pytest.mark.parametrize("kind", ["softmax", "layernorm"])
def test_chain_of_ten_compiles_within_its_budget_and_is_right(kind):
    fn, x = _chain(kind, 10), torch.randn(4, 16)
    budget = Budget(max_seconds=2.0, max_nodes=1000)
    t0 = time.perf_counter()
    prog = neptune_eq.compile(fn, x, budget=budget)
    elapsed = time.perf_counter() - t0
    # did not finish in 600 s before; the budget plus capture, extraction and lowering (generous for CI)
    assert elapsed < 60, elapsed
    assert (prog(x).double() - fn(x.double())).abs().max() < 1e-4
    assert prog.program.compilation.budget_notes and "budget hit" in prog.explain()


def test_six_layer_norms_have_a_plan():
    # more than 8 reductions over one axis had no candidate loop: "no executable plan found"
    fn, x = _chain("layernorm", 6), torch.randn(4, 16)
    prog = neptune_eq.compile(fn, x, budget=Budget(max_seconds=3.0))
    assert (prog(x).double() - fn(x.double())).abs().max() < 1e-4


@pytest.mark.parametrize("budget", [Budget(max_iterations=0), Budget(max_iterations=1), Budget(match_limit=1),
                                    Budget(max_seconds=0.0), Budget(max_nodes=0)])
def test_tiny_budgets_still_give_a_verified_plan(budget):
    prog = compile_ir(small_softmax(), Options(budget=budget))
    assert prog.alternatives and prog.verify().passed


def test_node_budget_is_not_overshot():
    c = compile_program(small_softmax(), Options(budget=Budget(max_nodes=100)))
    algebra = next(r for r in c.saturator.reports if r.name == "algebra")
    assert algebra.nodes <= 100 and "budget" in algebra.stop


def test_same_cut_gives_the_same_plan():
    def compiled():
        c = compile_program(small_softmax(), Options(budget=Budget(max_seconds=0.0)))
        return [a.structure for a in c.alternatives], CompiledProgram(c).source

    assert compiled() == compiled()


@pytest.mark.parametrize("bad", ["fast", 2.0, {"max_secs": 1}])
def test_a_wrong_budget_is_named(bad):
    with pytest.raises(BudgetError, match="budget"):
        neptune_eq.compile(lambda x: x.sum(-1), torch.randn(2, 4), budget=bad)


@pytest.mark.parametrize("field", [{"max_nodes": -1}, {"max_seconds": "2"}, {"match_limit": 0}])
def test_budget_fields_are_checked(field):
    with pytest.raises(BudgetError):
        Budget(**field)


def test_cli_shows_a_hit_budget(tmp_path):
    r = run_cli("compile", "examples/softmax.py", "--max-nodes", "60", "--no-verify", "--json")
    assert r.returncode == 0, r.stderr
    assert "budget hit" in r.stderr  # the report goes to stderr with --json
    import json

    assert json.loads(r.stdout.splitlines()[-1])["budget_notes"]


def _reports(monkeypatch, budget: Budget, plain_nodes: int):
    """Every phase's report of small_softmax's compile (its correction searches' too: none served from
    an earlier search), with iterations up to `plain_nodes` nodes run without the back-off scheduler."""
    from neptune_eq import saturate
    from neptune_eq.fusion import correction
    from neptune_eq.fusion.found import Found

    monkeypatch.setattr(saturate, "PLAIN_NODES", plain_nodes)
    monkeypatch.setattr(correction, "_FOUND", Found())
    c = compile_program(small_softmax(), Options(budget=budget))
    # (the rules that matched: the back-off counts a rule's every match in each run, a plain run its new ones)
    corr = [(r.found, r.iterations, r.nodes, set(r.matches)) for r in c.fusion.corrections.values()]
    return [(r.name, r.iterations, r.nodes, r.stop, set(r.matches)) for r in c.saturator.reports], corr


@pytest.mark.parametrize("budget", [Budget(), Budget(match_limit=1)])
def test_iterations_without_the_back_off_scheduler_match_it(monkeypatch, budget):
    """Small e-graphs' iterations skip the back-off scheduler (saturate.PLAIN_NODES): the same phases,
    iterations, sizes and matching rules as with it; a match limit under ten a node keeps it throughout."""
    phases, corr = _reports(monkeypatch, budget, 2_000)
    assert corr and any(found for found, *_ in corr) == (budget.match_limit > 1)  # (at 1 every rule is banned)
    assert (phases, corr) == _reports(monkeypatch, budget, 0)
