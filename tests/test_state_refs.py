"""A loop's carried state and a reduction's final or inline value are typed references
(ir.StateRef with an ir.RefKind), not names with a `cur:` / `old:` / `fin:` / `val:` prefix."""

import pytest

from neptune_eq import ir
from neptune_eq.datafile import FormatError, decode, encode
from neptune_eq.fusion.types import Binding
from neptune_eq.runtime import compile_ir

CUR, OLD = ir.RefKind.CURRENT, ir.RefKind.OLD


def test_refs_are_hash_consed_by_kind_name_and_axes():
    a = ir.StateRef(CUR, "m", ("i",))
    assert a is ir.StateRef(CUR, "m", frozenset({"i"}))
    assert a != ir.StateRef(OLD, "m", ("i",)) and a != ir.StateRef(CUR, "m", ("i", "h"))
    assert a.axes == frozenset({"i"}) and a.running and not ir.StateRef(ir.RefKind.FINAL, "m").running
    assert ir.show(ir.Call("sub", (ir.StateRef(OLD, "m", ("i",)), a))) == "old:m - cur:m"
    assert ir.substitute(ir.Call("exp", (a,)), {a: ir.StateRef(OLD, "m", ("i",))}).args[0].kind is OLD


def test_a_name_that_looks_like_a_prefix_is_only_a_name():
    """A reduction named `cur:x` is not the running value of x."""
    odd = ir.StateRef(ir.RefKind.FINAL, "cur:x")
    assert odd.kind is ir.RefKind.FINAL and odd.name == "cur:x" and not odd.running
    assert odd != ir.StateRef(CUR, "x")


def test_kind_must_be_a_refkind():
    with pytest.raises(TypeError):
        ir.StateRef("cur", "m")


def test_binding_refs():
    b = Binding("max_j", ir.Reduce("max", "j", ir.Load("x", (ir.Index("i"), ir.Index("j")))), 0, ("i",))
    assert b.ref(CUR) is ir.StateRef(CUR, "max_j", ("i",))


def test_refs_round_trip_through_the_cache_format():
    e = ir.Call("mul", (ir.StateRef(ir.RefKind.INLINE, "sum_d", ("i", "j")), ir.StateRef(OLD, "m", ("i",))))
    data = encode(e, ())
    assert {"enum": ["RefKind", "INLINE"]} in [a for o in data["objects"] for a in o.get("args", [])]
    assert decode(data, ()) is e


@pytest.mark.parametrize("kind", [["RefKind", "cur"], ["RefKind", "CURRENTS"], ["RefKind", 3],
                                  ["InternalAxis", "CHUNK"], ["Ops", "CURRENT"], ["RefKind"], "CURRENT", None])
def test_a_bad_ref_kind_in_the_cache_is_refused(kind):
    data = encode(ir.StateRef(CUR, "m", ("i",)), ())
    data["objects"][0]["args"][0] = {"enum": kind}
    with pytest.raises(FormatError):
        decode(data, ())


def test_plans_hold_typed_refs():
    from helpers import small_softmax

    prog = compile_ir(small_softmax())
    rolling = next(a.plan for a in prog.alternatives if "rolling" in a.structure)
    refs = [n for k in rolling.kernels for p in k.passes() for c in p.comps if c.corr is not None
            for n in ir.walk(c.corr) if isinstance(n, ir.StateRef)]
    assert refs and {r.kind for r in refs} <= ir.RUNNING
