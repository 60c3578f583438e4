"""The compiled programs of training ops, by key, and their runs: each compiled at its first use, a
backward's one-hot sums onto a table taken out as a scatter of rows (neptune_eq.scatter); later calls at
an input layout launch its kernels bound to the addresses (lower/bound.BoundCall)."""

from __future__ import annotations

import torch

from . import ir, scatter
from .training import lengths_of

_RUNNERS: dict[str, object] = {}  # program key → its compiled program (on first use)


def _compiled(key: str, program: ir.Program, compile_fn):
    run = _RUNNERS.get(key)
    if run is None:
        # (compiled outside any fake-tensor mode: dynamo and AOTAutograd run setup_context under one,
        # and the compile computes with real tensors — the float64 checks of the derivation and search)
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            # (one-hot sums of a gathered table's gradient leave as a scatter of rows: neptune_eq.scatter)
            run = _RUNNERS[key] = scatter.compiled(program, compile_fn)
    return run


_BOUND: dict[tuple, tuple] = {}  # (program key, input layout) → (launcher, BoundCall, output names, shapes)


def _run(key: str, run, inputs: dict[str, torch.Tensor], dtypes=None) -> dict[str, torch.Tensor]:
    """`run.run(inputs, dtypes)`, the first time for a layout of the inputs (shapes, dtypes, strides,
    16-byte alignment, device); later calls at that layout launch its kernels bound to the addresses
    (lower/bound.BoundCall), as a compiled function's own calls do: a training step's forward and
    backward had spent 300 and 800 µs of host time each in the checked path (H100, attention at
    L 3000 and RMSNorm, bench/probe_step_host.py), more than their kernels."""
    if isinstance(run, scatter.ScatterRun):
        names = {o.name for o in run.split.inner.outputs}
        res = _run(key, run.inner, inputs, {n: d for n, d in (dtypes or {}).items() if n in names})
        return run.split.finish(res, lengths_of(run.split.program, inputs), dtypes)
    order = run._input_order
    ts = [inputs[n] for n in order]
    fast = run.chunking is None and all(t.is_cuda for t in ts)
    if fast:
        layout = (key, tuple((t.shape, t.dtype, t.device, t.stride(), t.data_ptr() % 16 == 0) for t in ts))
        launcher = run.launcher("cuda")
        hit = _BOUND.get(layout)
        if hit is not None and hit[0] is launcher:
            _, bound, names, shapes = hit
            return dict(zip(names, bound([t.data_ptr() for t in ts], shapes, ts)))
    res = run.run(inputs, dtypes)
    if fast:
        from .frontend.compiled import bind_after

        names = [o.name for o in run.program.outputs]
        bound = bind_after(launcher, {n: inputs[n] for n in order}, order, [t.data_ptr() for t in ts],
                           dtypes or {})
        if bound is not None:
            _BOUND[layout] = (launcher, bound, names, [tuple(res[n].shape) for n in names])
    return res
