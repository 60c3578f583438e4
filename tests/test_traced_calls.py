"""Calls of a compiled function that torch.compile traces (session 51's hunt): every call is served
or refused by name, never answered by another signature's op. Interpreter, tiny shapes."""

import pytest
import torch
import torch.nn.functional as F
from helpers import Annealed

import neptune_eq


def softmax(x):
    return torch.softmax(x, -1)


def tempered(x, t):
    return torch.softmax(x / t, -1)


def test_a_new_shape_inside_torch_compile_is_compiled_outside_the_graph(tmp_path):
    """A static compile called at another shape inside torch.compile was refused ("capture again for
    other shapes"); under fullgraph=True dynamo crashed building that error. It now runs outside the
    graph, eagerly (which compiles that shape), or in the graph once an eager call compiled it; under
    fullgraph=True an uncompiled shape is refused by dynamo naming neptune_eq's reason."""
    prog = neptune_eq.compile(softmax, torch.randn(4, 8), cache_dir=tmp_path)
    x = torch.randn(6, 8)
    out = torch.compile(lambda x: prog(x) * 2, backend="aot_eager")(x)
    assert torch.allclose(out, softmax(x) * 2, atol=1e-6)
    torch._dynamo.reset()
    y = torch.randn(5, 8)
    with pytest.raises(Exception, match="nothing compiled serves this call"):
        torch.compile(lambda x: prog(x) * 2, backend="aot_eager", fullgraph=True)(y)
    torch._dynamo.reset()
    prog(y)  # compiled eagerly: now its op serves the traced call
    out = torch.compile(lambda x: prog(x) * 2, backend="aot_eager", fullgraph=True)(y)
    assert torch.allclose(out, softmax(y) * 2, atol=1e-6)
    torch._dynamo.reset()


def test_a_dynamic_compile_inside_torch_compile_keeps_the_call_s_static_value(tmp_path):
    """A dynamic compile's traced call took its op without comparing the static arguments: a
    temperature of 0.25 ran with the example's 0.5 baked in (silently wrong, error 0.29)."""
    x = torch.randn(20, 8)
    prog = neptune_eq.compile(tempered, x, 0.5, dynamic=True, cache_dir=tmp_path)
    out = torch.compile(lambda x: prog(x, 0.25), backend="aot_eager")(x)
    assert torch.allclose(out, tempered(x, 0.25), atol=1e-6)
    torch._dynamo.reset()


def test_a_dynamic_compile_trains_inside_torch_compile(tmp_path):
    """A dynamic compile's op has no backward: a traced call needing gradients crashed in AOTAutograd
    ("no autograd formula was registered"). It takes a static signature (eagerly, outside the graph)."""
    prog = neptune_eq.compile(softmax, torch.randn(20, 8), dynamic=True, cache_dir=tmp_path)
    x = torch.randn(7, 8, requires_grad=True)
    c = torch.randn(7, 8)
    (torch.compile(lambda x: prog(x) * 2, backend="aot_eager")(x) * c).sum().backward()
    want = x.detach().double().requires_grad_()
    (softmax(want) * 2 * c.double()).sum().backward()
    assert torch.allclose(x.grad.double(), want.grad, atol=1e-6)
    torch._dynamo.reset()


def test_index_checks_inside_fullgraph_on_the_cpu(tmp_path):
    """Cross-entropy's target check tested its values on the host: a data-dependent branch that
    fullgraph=True refused ("Could not guard on data-dependent expression"). Traced, it is an
    assertion, whose message (the user's line, with its quotes) inductor compiles as a literal."""
    def loss(x, t):
        return F.cross_entropy(x, t, reduction="mean")

    x, t = torch.randn(4, 8), torch.tensor([0, 7, 2, 3])
    prog = neptune_eq.compile(loss, x, t, cache_dir=tmp_path)
    run = torch.compile(lambda x, t: prog(x, t) + 1, fullgraph=True)
    assert torch.allclose(run(x, t), loss(x, t) + 1, atol=1e-6)
    with pytest.raises(RuntimeError, match=r"cross_entropy / nll_loss target: valid indices are \[0, 8\)"):
        run(x, torch.tensor([0, 8, 2, 3]))
    torch._dynamo.reset()


def test_an_index_check_s_message_is_traced_as_a_constant(tmp_path):
    """dynamo(dynamic=True) reads the int fields of a check as symbolic lengths, which it cannot
    format (BUILD_STRING): the traced assertion's message is written when the check is made."""
    prog = neptune_eq.compile(lambda x, t: x[torch.arange(4), t].sum(), torch.randn(4, 8),
                              torch.tensor([1, 2, 3, 4]), cache_dir=tmp_path)
    check = prog.captured.index_checks[0]
    assert check.traced_message == check.message() and '"' not in check.traced_message


def test_the_backward_ops_are_registered_with_the_training_op(tmp_path):
    """The backward op was registered when AOTAutograd traced the backward. A warm inductor cache (any
    process after the first) replays a compiled backward without tracing it, calling its op by name:
    torch.compile training failed there (AttributeError: no attribute '..._saved_backward'). The
    training op now registers every backward op its graphs may name with it."""
    prog = neptune_eq.compile(lambda x: torch.softmax(x, -1).pow(2).sum(-1), torch.randn(4, 8), cache_dir=tmp_path)
    train = prog.library_ops()["training"].name()  # registers the training op; no backward has run
    lib, name = train.split("::")
    base = name.removesuffix("_train")
    assert all(hasattr(getattr(torch.ops, lib), f"{base}_{mode}_backward") for mode in ("saved", "recompute"))


def test_a_capture_under_an_active_torch_compile_runs_outside_dynamo(tmp_path):
    """After dynamo gave up on Compiled.__call__ (a module's temperature changed under torch.compile),
    it ran that call eagerly and converted the capture's frames one by one (a functorch internal
    assert, in the full suite). Capturing and compiling a signature now run with dynamo disabled."""
    x = torch.randn(3, 8)
    m = Annealed()
    run = torch.compile(m, backend="aot_eager")
    with torch.no_grad():
        run(x)
        m.tau = 0.4
        assert torch.allclose(run(x), m.core(x), atol=1e-6)
    prog = neptune_eq.compile(softmax, torch.randn(4, 8), cache_dir=tmp_path)
    y = torch.randn(6, 8)
    out = torch.compile(lambda x: prog(x) * 2, backend="aot_eager")(y)
    assert torch.allclose(out, softmax(y) * 2, atol=1e-6)
    torch._dynamo.reset()


def test_a_training_call_after_the_environment_changed_captures_again_outside_dynamo(tmp_path):
    """The same with gradients: a torch.compile'd training step after the module's temperature changed
    (model.eval() toggling a branch does the same) stopped in a functorch internal assert, since the
    re-capture of a call needing gradients was not dynamo-disabled. It captures again and trains."""
    m = Annealed()
    run = torch.compile(m, backend="aot_eager")
    x = torch.randn(3, 8)
    run(x.clone().requires_grad_()).sum().backward()
    m.tau = 0.4
    xx = x.clone().requires_grad_()
    out = run(xx)
    out.sum().backward()
    xd = x.double().requires_grad_()
    ref = torch.logsumexp(xd / 0.4, -1)
    ref.sum().backward()
    assert torch.allclose(out.double(), ref, atol=1e-5) and torch.allclose(xx.grad.double(), xd.grad, atol=1e-5)
    torch._dynamo.reset()
