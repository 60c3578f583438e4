"""Sums that share a factor and are only used added run as one contraction (extract/merge.py):
Σᵢ aᵢⱼ·hᵢd + Σᵢ [tᵢ = j]·cᵢ·hᵢd, two gradient contributions to one weight, is one GEMM of
(a + [t = j]·c) with h. Plans run in the interpreter on ragged sizes against float64."""

import pytest
import torch

from neptune_eq import dsl as ne
from neptune_eq.runtime import compile_ir


def _two_contributions(m=37, n=40, k=24, dtype="bfloat16", shared=True, reused=False):
    """o[j, d] = Σᵢ p[i, j]·h[i, d] + Σᵢ where(t[i] = j, c[i]·h[i, d], 0) (with `shared` False, the second
    reads g, not h; with `reused`, a second output is the first sum alone)."""
    P = ne.program("two_contributions")
    i, j, d = P.axes(i=m, j=n, d=k)
    p, h, g = P.input("p", i, j, dtype=dtype), P.input("h", i, d, dtype=dtype), P.input("g", i, d, dtype=dtype)
    t, c = P.input("t", i, dtype="int64"), P.input("c", i, dtype="float32")
    first = ne.sum(p * h, i)
    second = ne.sum(ne.where(t == j, c * (h if shared else g), 0.0), i)
    P.output("o", first + second, (j, d), dtype="float32")
    if reused:
        P.output("o2", first, (j, d), dtype="float32")
    return P.build()


def _inputs(program, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in program.inputs.items():
        shape = tuple(program.axes[a] for a in spec.axes)
        if spec.dtype == "int64":
            out[name] = torch.randint(0, program.axes["j"], shape, generator=gen)
        else:
            out[name] = torch.randn(*shape, generator=gen).to(getattr(torch, spec.dtype))
    return out


def _reference(x):
    p, h, c = (x[n].double() for n in "phc")
    onehot = torch.nn.functional.one_hot(x["t"], p.shape[1]).double()
    return p.T @ h + (onehot * c[:, None]).T @ h


def _merged(alt) -> bool:
    return any(line.startswith("merge_sums") for line in alt.plan.derivation)


@pytest.fixture(scope="module")
def prog():
    return compile_ir(_two_contributions())


def test_two_contributions_to_one_weight_are_one_contraction(prog):
    assert _merged(prog.alternative), prog.explain()
    (comp,) = [c for k in prog.plan.kernels for p in k.passes() if p.axis == "i" for c in p.comps]
    assert comp.op == "sum" and not comp.producers
    # the plan with the merge runs one pass over i; the model prices it below any plan that keeps two
    best_unmerged = min((a.cost.time for a in prog.alternatives if not _merged(a)), default=float("inf"))
    assert prog.alternative.cost.time < best_unmerged


def test_merged_plans_match_float64_on_ragged_sizes(prog):
    x = _inputs(prog.program)
    ref = _reference(x)
    merged = [a for a in prog.alternatives if _merged(a)]
    written = [a for a in merged if any(b.operand for b in a.plan.buffers.values())]
    plain = [a for a in merged if a not in written]
    assert written and plain
    for a in (*written[:2], *plain[:2]):
        out = prog.pin(a.id).run(x)["o"].double()
        err = float((out - ref).norm() / ref.norm())
        assert err < 1e-2, (a.structure, err)


def test_sums_without_a_shared_factor_or_used_alone_stay_two():
    for program in (_two_contributions(shared=False), _two_contributions(reused=True)):
        compiled = compile_ir(program)
        assert not any(_merged(a) for a in compiled.alternatives), program.name


def test_a_sum_reading_a_state_is_not_merged_into_that_states_pass():
    """s9 = Σⱼ b·h and s10 = Σⱼ tanh(a − s7)·h share h and are only used added, but s10 reads s7 = Σⱼ a,
    which a plan sums in s9's own pass: merged there, s10's body would read a final value that pass
    has not computed (fuzz seed 1541, a layer norm's gradient: KeyError writing the kernel). Every
    plan lowers, and runs right."""
    P = ne.program("reads_a_state")
    j, d = P.axes(j=37, d=6)
    a, b, h = (P.input(n, j, d, dtype="float32") for n in "abh")
    s7 = ne.sum(a, j)
    P.output("o", ne.sum(b * h, j) + ne.sum(ne.tanh(a - s7 * 0.05) * h, j), (d,), dtype="float32")
    prog = compile_ir(P.build())
    x = {n: torch.randn(37, 6, generator=torch.Generator().manual_seed(k)) for k, n in enumerate("abh")}
    a64, b64, h64 = (x[n].double() for n in "abh")
    want = (b64 * h64).sum(0) + (torch.tanh(a64 - a64.sum(0) * 0.05) * h64).sum(0)
    for alt in prog.alternatives:
        prog.pin(alt.id).lowered("cuda")
    together = [alt for alt in prog.alternatives if any(  # (s7 beside another sum, and a later pass)
        len(k.passes()) > 1 and len(k.passes()[0].comps) > 1 for k in alt.plan.kernels)]
    assert together
    for alt in [*together[:2], prog.alternatives[0]]:
        got = prog.pin(alt.id).run(x)["o"]
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
