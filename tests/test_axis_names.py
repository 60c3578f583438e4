"""A program's axes may be named like the compiler's own: split-K's chunk axis is a typed value
(ir.CHUNK), not the string "chunk", and generated identifiers (pid, pid_chunk, t_x, n_x, offs_x,
BLOCK_x, ...) never meet a user axis. Each program here is forced through split-K and verified."""

import math

import pytest

from neptune_eq import dsl as ne
from neptune_eq import ir
from neptune_eq.library import attention
from neptune_eq.pipeline import Options
from neptune_eq.plan import Combine
from neptune_eq.runtime import compile_ir

SPLIT = Options(split_factors=(2,), min_chunk=64)


def decode(heads: str, keys: str, dims: str = "d"):
    """One query row per head against 256 keys, with the head, key and feature axes named as given."""
    P = ne.program(f"decode_{heads}_{keys}_{dims}")
    b, h, i, j, d, e = P.axes(**{"b": 1, heads: 3, "i": 1, keys: 256, dims: 16, "e": 16})
    q = P.input("q", b, h, i, d)
    k = P.input("k", b, h, j, d)
    v = P.input("v", b, h, j, e)
    P.output("o", attention(q, k, v, key_axis=j, dim_axis=d, scale=1 / math.sqrt(16)), (b, h, i, e))
    return P.build()


def split_k(program):
    prog = compile_ir(program, SPLIT)
    ids = [a.id for a in prog.alternatives
           if any(isinstance(ph, Combine) for k in a.plan.kernels for ph in k.phases)]
    assert ids, "split-K is offered"
    return prog.pin(ids[0])


@pytest.mark.slow
@pytest.mark.parametrize(("heads", "keys", "dims"), [("h", "chunk", "d"), ("chunk", "j", "d"), ("pid", "chunk", "d"),
                                                     ("h", "j", "chunk"), ("pid_chunk", "pid", "CHUNKS")])
def test_axes_named_like_internal_ones_compile_and_verify_through_split_k(heads, keys, dims):
    prog = split_k(decode(heads, keys, dims))
    part = next(b for b in prog.plan.buffers.values() if b.name.startswith("part_"))
    assert part.axes[0] is ir.CHUNK and part.axes[1:] == ("b", heads, "i")
    report = prog.verify(seed=7)
    assert report.passed, str(report)


def test_the_chunk_axis_is_not_a_string():
    assert ir.CHUNK != "chunk" and "chunk" not in (ir.CHUNK,)
    assert ir.Index(ir.CHUNK) != ir.Index("chunk")
    assert ir.show(ir.Index(ir.CHUNK)) == "chunk"


def test_the_chunk_axis_round_trips_through_the_cache_format():
    from neptune_eq.datafile import decode as load
    from neptune_eq.datafile import encode
    from neptune_eq.plan import BufferSpec

    buf = BufferSpec("part_max_j", (ir.CHUNK, "chunk", "i"))
    back = load(encode(buf, (BufferSpec,)), (BufferSpec,))
    assert back == buf and back.axes[0] is ir.CHUNK and back.axes[1] == "chunk"


def test_reductions_over_axes_whose_names_share_a_stem_are_told_apart():
    """sum over j (twice) and over j2: the binding names sum_j, sum_j2, ... stay distinct."""
    P = ne.program("stems")
    i, j, j2 = P.axes(i=4, j=8, j2=8)
    x = P.input("x", i, j)
    y = P.input("y", i, j2)
    P.output("o", ne.sum(x, j) + ne.sum(x * x, j) + ne.sum(y, j2), (i,))
    prog = compile_ir(P.build())
    names = [c.name for k in prog.plan.kernels for p in k.passes() for c in p.comps]
    assert len(names) == len(set(names)) == 3
    assert prog.verify(seed=3).passed


def _rowsum(axes: dict, tensor: str = "x"):
    P = ne.program("rowsum")
    rows, cols = P.axes(**axes)
    x = P.input(tensor, rows, cols)
    P.output("y", ne.sum(x, cols), (rows,))
    return P.build()


@pytest.mark.parametrize(("axes", "tensor", "named"), [
    ({"a.b": 4, "a_b": 8}, "x", ["axis 'a_b'", "axis 'a.b'", "'t_a_b'"]),  # one identifier for two axes
    ({"i": 4, "ptr": 8}, "n", ["axis 'ptr'", "tensor 'n'", "'n_ptr'"]),  # the extent of ptr, the pointer of n
    ({"i": 4, "s0": 8}, "BLOCK", ["axis 's0'", "tensor 'BLOCK'", "'BLOCK_s0'"]),  # a tile size, a stride
    ({"i": 4, "desc1": 8}, "t", ["axis 'desc1'", "tensor 't'"]),  # t's descriptor temporaries t_desc<n>
    ({"i": 4, "j": 8}, "buf_sum_j", ["tensor 'buf_sum_j'", "intermediate buffer"]),
    ({"i": 4, "j_ptr": 8}, "st_sum_j", ["tensor 'st_sum_j'", "'st_sum_j_ptr'"]),
])
def test_names_that_would_meet_in_the_kernels_are_refused(axes, tensor, named):
    with pytest.raises(ir.ProgramError) as e:
        compile_ir(_rowsum(axes, tensor))
    assert all(n in str(e.value) for n in named), str(e.value)


@pytest.mark.slow
def test_names_that_only_look_internal_compile():
    """pid, CHUNKS and a tensor called pid_chunk are ordinary names: nothing generated meets them."""
    prog = compile_ir(_rowsum({"pid": 4, "CHUNKS": 8}, "pid_chunk"))
    assert prog.verify(seed=1).passed
