"""Bad input gets a clear error naming the cause."""

import pytest
import torch

import neptune_eq
from neptune_eq import dsl as ne
from neptune_eq.frontend import CaptureError
from neptune_eq.ir import NeptuneError, ProgramError
from neptune_eq.runtime import compile_ir


def test_unknown_axis_in_reduction():
    P = ne.program("p")
    i, j = P.axes(i=4, j=5)
    x = P.input("x", i, j)
    with pytest.raises(ProgramError, match=r"unknown axis 'k'.*declared: i, j"):
        ne.sum(x, "k")


def test_unknown_axis_in_input():
    P = ne.program("p")
    P.axes(i=4)
    with pytest.raises(ProgramError, match="unknown axis 'q'"):
        P.input("x", "i", "q")


def test_axis_from_another_program():
    P, Q = ne.program("p"), ne.program("q")
    (i,) = P.axes(i=4)
    (j,) = Q.axes(j=4)
    x = P.input("x", i)
    with pytest.raises(ProgramError, match="axis 'j' belongs to program 'q'"):
        ne.sum(x, j)


def test_reduction_over_axis_the_body_lacks():
    P = ne.program("p")
    i, j = P.axes(i=4, j=5)
    x = P.input("x", i)
    with pytest.raises(ProgramError, match=r"sum over axis 'j' but the body does not depend on 'j'.*axes: i"):
        ne.sum(x, j)


def test_output_axes_must_cover_expression():
    P = ne.program("p")
    i, j = P.axes(i=4, j=5)
    x = P.input("x", i, j)
    P.output("y", x, axes=(i,))
    with pytest.raises(ProgramError, match="varies over \\['j'\\]"):
        P.build()


def test_bad_extent():
    P = ne.program("p")
    with pytest.raises(ProgramError, match="extent >= 1"):
        P.axis("i", 0)


def test_shape_mismatch_at_call_names_input_and_axes():
    P = ne.program("p")
    i, j = P.axes(i=4, j=5)
    x = P.input("x", i, j)
    P.output("y", ne.sum(x, j))
    prog = compile_ir(P.build())
    with pytest.raises(NeptuneError, match=r"input 'x' has shape \(4, 6\); expected \(4, 5\) \(i=4, j=5\)"):
        prog(torch.zeros(4, 6))


def test_missing_input():
    P = ne.program("p")
    i, j = P.axes(i=4, j=5)
    x = P.input("x", i, j)
    y = P.input("y", i, j)
    P.output("z", ne.sum(x * y, j))
    prog = compile_ir(P.build())
    with pytest.raises(NeptuneError, match="missing input 'y'"):
        prog(torch.zeros(4, 5))


def test_python_truth_value_of_expression():
    P = ne.program("p")
    i, j = P.axes(i=4, j=5)
    with pytest.raises(ProgramError, match="use where"):
        if j.index < i.index:
            pass


def test_conflicting_reshapes_name_their_lines():
    """Reshapes that relate an axis to others in two ways are refused naming the lines (hunt8: none)."""
    def fn(x):
        return x.flatten().unflatten(0, (7, 5)).softmax(0)

    with pytest.raises(CaptureError, match=r"incompatible ways \(the reshapes .*test_errors.py:\d+: return x.flatten"):
        neptune_eq.compile(fn, torch.randn(5, 7))
