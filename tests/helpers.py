"""Shared test helpers (tests/ is on sys.path under pytest's default import mode)."""

import runpy
import subprocess
import sys
from pathlib import Path

import torch

import neptune_eq
from neptune_eq import dsl as ne
from neptune_eq.library import softmax

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def assert_gradients_match(fn, xs: list, atol: float) -> None:
    """fn compiled by neptune_eq, every input requiring grad, against float64 torch under one random
    cotangent: each input's gradient within `atol`."""
    import torch

    import neptune_eq

    prog = neptune_eq.compile(fn, *xs)
    a, b = [x.clone().requires_grad_() for x in xs], [x.double().requires_grad_() for x in xs]
    want = fn(*b)
    c = torch.randn(want.shape, dtype=torch.float64)
    prog(*a).backward(c.float())
    want.backward(c)
    for x, y in zip(a, b):
        assert torch.allclose(x.grad.double(), y.grad, atol=atol), (x.grad, y.grad)


def load_example(name: str, attr: str = "program"):
    return runpy.run_path(str(EXAMPLES / f"{name}.py"))[attr]


def small_softmax():
    """softmax over j of an 8 × 256 input: small enough for the interpreter."""
    P = ne.program("softmax")
    i, j = P.axes(i=8, j=256)
    x = P.input("x", i, j)
    P.output("y", softmax(x, j))
    return P.build()


def run_cli(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`neptune-eq ARGS` in a fresh interpreter (text output captured)."""
    return subprocess.run([sys.executable, "-m", "neptune_eq.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=600)



class Annealed(torch.nn.Module):
    """A module whose compiled logsumexp reads a temperature attribute (`tau`, guarded by the capture)."""

    def __init__(self):
        super().__init__()
        self.tau = 0.7
        self.f = neptune_eq.compile(self.core, torch.randn(3, 8))

    def core(self, x):
        return torch.logsumexp(x / self.tau, -1)

    def forward(self, x):
        return self.f(x)


def refuse_dynamic_backwards(monkeypatch) -> None:
    """Make every backward of a dynamic program NoBackward (the per-length training fallback's tests)."""
    from neptune_eq import autograd

    real = autograd._derive

    def refuse(program, wrt):
        if program.dynamic:
            raise autograd.NoBackward(f"{program.name}: (test) no backward at every length")
        return real(program, wrt)

    monkeypatch.setattr(autograd, "_derive", refuse)
