"""A dynamic function's training at the lengths it is called at (session 54).

Its forward and backward plans are chosen where the call's lengths lie, as its inference plan is
(frontend/buckets.py: a bucket's lengths fall in ranges, each priced at its middle), not at the
bucket's bound: on the H200 causal attention at L 3000 (bucket 4096) trained with a split-K key
pass chosen at 4096 (kernels 427 µs against a static compile's 351), and the smallest bucket priced a
batch of 4 as one of 9. A bucket's first training call prepares every range's training (on CUDA it
runs each once too), so no later length of the bucket compiles."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq import autograd as A
from neptune_eq.frontend.buckets import RANGED_ALTERNATIVES, RANGES, bucket, length_range, price_at, range_middle


def causal(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    L = s.shape[-1]
    keep = torch.arange(L)[None, :] <= torch.arange(L)[:, None]
    return torch.softmax(s.float().masked_fill(~keep, float("-inf")), -1).to(v.dtype) @ v


def _runners(call) -> dict[str, object]:
    """The training programs a bucket's training call compiled (forward, then each backward), once
    the backward is chosen (no kernel runs)."""
    names = A._ATTACHED[call.qualname][1]
    key = A._training_key(call.qualname, (True,) * len(names))
    A._PARTS[key].kept()
    return {mode: A._RUNNERS[f"{key}:{mode}"] for mode in ("forward", "saved", "recompute")
            if f"{key}:{mode}" in A._RUNNERS}


def test_a_buckets_training_runs_the_plans_priced_at_the_calls_range():
    """Causal attention, 16 heads at length 3000 (the bucket of 4096): for the range of each length
    trained at, the forward and both backwards run the alternative the cost model prices fastest at
    that range's middle; at 3000 the saved backward is not the bucket bound's own choice (a split-K
    key pass there, none at 3000: if the cost model stops telling them apart, this needs a new case).
    Compiled on the CPU, nothing run."""
    xs = [torch.randn(1, 16, 2993, 64, dtype=torch.bfloat16) for _ in range(3)]
    fam = neptune_eq.compile(causal, *xs, dynamic=True).family
    differs = False
    for L in (2500, 3000):
        ns = tuple(16 if g == ("h",) else L for g in fam.lengths.groups)
        at = {a: range_middle(bucket(n), length_range(n, bucket(n))) for g, n in zip(fam.lengths.groups, ns) for a in g}
        for mode, run in _runners(fam.bucket_training(ns)).items():
            prices = [price_at(run, alt, at) for alt in run.alternatives[:RANGED_ALTERNATIVES]]
            assert price_at(run, run.alternative, at) == min(prices), (L, mode, run.alternative.structure)
            differs |= run.choice != 0
    assert differs, "every range's training took the bucket bound's own plans"


def test_the_smallest_bucket_prices_a_small_batch_near_its_length():
    """Lengths 2…16 share the smallest bucket; its ranges cut (0, 16], so a batch of 4 is priced at 3
    (it had been priced at 9, the middle of (8, 16])."""
    assert [range_middle(16, length_range(n, 16)) for n in (2, 4, 6, 8, 12, 16)] == [3, 3, 7, 7, 11, 15]
    for b in (16, 32, 4096):
        assert {length_range(n, b) for n in range(2, b + 1) if bucket(n) == b} == set(range(RANGES))


def _loss(x, t):
    return F.cross_entropy(x.float(), t)


def test_a_buckets_first_training_call_prepares_every_range_so_no_later_length_compiles():
    """A bucket's first training call derives and compiles every range's training (on CUDA it also runs
    each once); a later call at another range of the bucket then compiles nothing (no capture, compile
    or cache hit) and its gradient matches float64."""
    torch.manual_seed(0)
    x, t = torch.randn(40, 24), torch.randint(0, 24, (40,))
    prog = neptune_eq.compile(_loss, x, t, dynamic={0: [0], 1: [0]})
    leaf = x.clone().requires_grad_()
    prog(leaf, t).backward()
    assert {key[1] for key in prog.family._train} == {(r,) for r in range(RANGES)}
    before = prog.stats()
    for n in (60, 50, 45):  # (the bucket of 64's other ranges)
        assert length_range(n, 64) != length_range(40, 64)
        x2, t2 = torch.randn(n, 24), torch.randint(0, 24, (n,))
        leaf2 = x2.clone().requires_grad_()
        prog(leaf2, t2).backward()
        want = x2.double().requires_grad_()
        _loss(want, t2).backward()
        assert torch.allclose(leaf2.grad.double(), want.grad, rtol=1e-5, atol=1e-7)
    after = prog.stats()
    assert (after["captures"], after["compiles"], after["cache_hits"]) == (
        before["captures"], before["compiles"], before["cache_hits"])
