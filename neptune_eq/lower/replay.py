"""Per-call device work replayed from a CUDA graph: loop bounds read from the inputs' values, and
the index range checks (frontend/checks.py).

A program whose loops are bounded by data (per-request lengths, document ids: lower/databounds.py)
works out its bounds on every call with a few dozen small torch operations. On the GPU each costs
a launch from Python (10-20 µs on a slow host), so a decode step whose kernels take 0.7 ms spent
over 1 ms of host time on them, and the GPU waited for the host.

Those operations read the inputs' *values* but their shapes, and so the launches, depend only on
the inputs' layout. `Replayer` records them once as a CUDA graph per layout (addresses, shapes,
strides, dtypes, stream) and replays the graph on later calls: one launch, reading whatever the
inputs hold at that call (a length updated in place is seen, as it is by the eager operations).
The graph is recorded on the second call with a layout (a layout seen once, as in a loop over
fresh tensors, is never recorded); its outputs are the graph's own tensors, rewritten by each
replay, in stream order before the kernels that read them. Off CUDA, under torch's sync debug mode
(recording synchronises the device once), where recording fails, or for work over more than
MAX_ELEMENTS values (a graph keeps its intermediate tensors for good), the work runs eagerly.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

MAX_GRAPHS = 8  # layouts kept per program (least recently used dropped)
# a graph keeps its intermediate tensors for good: work over more elements than this stays eager
MAX_ELEMENTS = 1 << 22
# tensors of at most this many values in all are staged (copied into the graph's own buffers each call)
STAGED_ELEMENTS = 1 << 20


class Replayer:
    """`fn(*args)` (torch operations on CUDA tensors, no host synchronisation) replayed per layout."""

    def __init__(self, fn: Callable[..., Any], limit: int = MAX_GRAPHS):
        self.fn = fn
        self.limit = limit
        # key → (graph, its outputs, its staged input copies or None), None where recording failed
        self._graphs: OrderedDict[tuple, tuple | None] = OrderedDict()
        self._seen: tuple | None = None
        self.recorded = 0  # graphs recorded (for tests and stats)

    def __call__(self, layout: tuple, *args) -> Any:
        return self._run((layout, torch.cuda.current_stream().cuda_stream), args, None)

    def staged(self, layout: tuple, tensors: dict[str, torch.Tensor], *rest) -> Any:
        """`fn(tensors, *rest)` replayed per `layout` of `tensors` whatever their addresses: the graph
        reads copies of them (graph-owned, contiguous), which each call refreshes with one copy a
        tensor before the replay. For small tensors passed fresh every step — a batch's labels, a
        serving step's document ids — which an address-keyed graph never sees twice (a DPO training
        step with fresh labels evaluated its index checks eagerly: 0.37 ms of host a call, H200)."""
        key = ("staged", layout, torch.cuda.current_stream().cuda_stream)
        return self._run(key, (tensors, *rest), tensors)

    def _run(self, key: tuple, args: tuple, staged: dict[str, torch.Tensor] | None) -> Any:
        """The graph of `key` replayed (its staged copies refreshed first), recorded on the key's second
        call in a row, else `fn(*args)`."""
        if key in self._graphs:
            self._graphs.move_to_end(key)
            entry = self._graphs[key]
            if entry is None:
                return self.fn(*args)  # recording failed for this layout: eager
            graph, out, static = entry
            for n, t in (staged or {}).items():
                static[n].copy_(t)
            graph.replay()
            return out
        if key != self._seen or torch.cuda.get_sync_debug_mode() != 0:
            self._seen = key
            return self.fn(*args)
        static = None
        if staged is not None:
            static = {n: t.clone(memory_format=torch.contiguous_format) for n, t in staged.items()}
        got = self._record(*args if static is None else (static, *args[1:]))
        self._graphs[key] = None if got is None else (*got, static)
        while len(self._graphs) > self.limit:
            self._graphs.popitem(last=False)
        if got is None:
            return self.fn(*args)
        got[0].replay()  # (a capture records the work without running it)
        return got[1]

    def _record(self, *args) -> tuple[torch.cuda.CUDAGraph, Any] | None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # a warm-up off the capture (lazy initialisation inside torch)
            self.fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                out = self.fn(*args)
        except Exception:  # an operation that cannot be recorded: this layout stays eager
            torch.cuda.synchronize()
            return None
        self.recorded += 1
        return graph, out


def shapes_of(tensors: dict[str, torch.Tensor]) -> tuple:
    """What a staged graph depends on (Replayer.staged): each tensor's name, shape, dtype and device."""
    return tuple((n, tuple(t.shape), t.dtype, t.device) for n, t in sorted(tensors.items()))


def layout_of(tensors: list[torch.Tensor]) -> tuple:
    """What a recorded graph depends on besides the values: each tensor's address and layout."""
    return tuple((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device) for t in tensors)
