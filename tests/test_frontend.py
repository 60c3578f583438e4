"""PyTorch frontend: every supported op family is captured and its program, evaluated in float64 by
neptune_eq.reference, matches the function run in float64; axis inference keeps unrelated axes
apart; unsupported code fails with the op and the user's file:line."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import neptune_eq
from neptune_eq import ir, masks
from neptune_eq.frontend import CaptureError, capture

F64 = torch.float64


# ---------------------------------------------------------------- helpers (imported by test_frontend_*.py)


def randn(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    assert got.shape == want.shape, (got.shape, want.shape)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)), "non-finite entries differ"
    if not finite.any():
        return 0.0
    scale = want[finite].abs().max().clamp_min(1e-300)
    return ((got[finite] - want[finite]).abs().max() / scale).item()


def check_capture(fn, *args, tol: float = 1e-10, **capture_kwargs):
    """capture(fn, *args); assert its float64 reference equals fn(*args) (rel err < tol)."""
    captured = capture(fn, *args, **capture_kwargs)
    want = fn(*args)
    got = captured.reference(*args)
    if isinstance(want, tuple | list):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            assert rel_err(g, w) < tol
    else:
        assert isinstance(got, torch.Tensor)
        assert rel_err(got, want) < tol
    return captured


def nodes(program: ir.Program, kind=ir.Node):
    return [n for o in program.outputs for n in ir.walk(o.expr) if isinstance(n, kind)]


def calls(program: ir.Program, op: str):
    return [n for n in nodes(program, ir.Call) if n.op == op]


# ---------------------------------------------------------------- contractions and views


def test_matmul_family():
    x, y, w, b = randn(2, 3, 5, 4), randn(2, 3, 4, 6, seed=1), randn(4, 7, seed=2), randn(7, seed=3)

    def fn(x, y, w, b):
        return (x @ y, torch.matmul(x, w), torch.bmm(x[0], y[0]), torch.einsum("bhid,bhjd->bhij", x, x),
                F.linear(x[0, 0], w.T, b), torch.einsum("bhid,de->bhie", x, w))

    c = check_capture(fn, x, y, w, b)
    assert [i.name for i in c.program.inputs.values()] == ["x", "y", "w", "b"]
    assert [o.name for o in c.program.outputs] == [f"out{k}" for k in range(6)]


def test_views_and_shapes():
    x = randn(2, 3, 4, 5)

    def fn(x):
        a = x.transpose(1, 2).permute(0, 2, 3, 1)
        b = x.reshape(6, 20).view(2, 3, 4, 5)  # merge, then split back
        c = x.unsqueeze(0).squeeze(0)[:, None].expand(2, 7, 3, 4, 5)
        d = x.flatten(2)  # [2, 3, 20]: merged axes
        e = x.reshape(2, 3, 2, 2, 5).sum(3)  # split, reduce one part
        return a, b, c, d, e, x.contiguous().t() if x.dim() == 2 else x.mT

    check_capture(fn, x)


def test_reshape_that_regroups_axes_raises():
    with pytest.raises(CaptureError, match=r"regroups .* at test_frontend\.py:\d+"):
        capture(lambda x: x.view(2, 3, 4).reshape(3, 2, 4) * 2, randn(6, 4))


def test_repeat_is_an_expand_and_tiling_a_view_of_one():
    """Multi-query attention's one kv head repeated over the query heads: the values of an expand.
    Tiling a dimension of n r times is an expand to [r, n] viewed as [r·n]: k.repeat(1, 1, 2, 1),
    rows and columns tiled beside tensors of the tiled size, F.instance_norm's weights repeated per
    sample. A view that cuts across the copies still raises, naming the reshape."""
    q, k = randn(2, 4, 5, 3), randn(2, 1, 6, 3, seed=1)
    check_capture(lambda q, k: torch.softmax(q @ k.repeat(1, 4, 1, 1).transpose(-1, -2), -1), q, k)
    check_capture(lambda k: k.repeat(3, 1, 1, 1, 1) * 2, k)  # a new leading dimension
    check_capture(lambda k: k.repeat(1, 1, 2, 1).sum(2), k)
    x, y = randn(4, 3), randn(8, 9, seed=2)
    check_capture(lambda x, y: (x.repeat(2, 3) * y).sum(0), x, y)
    x, w, b = randn(2, 3, 5, 7), randn(3, seed=3), randn(3, seed=4)
    check_capture(lambda x, w, b: F.instance_norm(x, weight=w, bias=b, eps=1e-5), x, w, b)
    with pytest.raises(CaptureError, match=r"regroups|incompatible"):
        capture(lambda v: v.repeat(2).view(3, 4) * 2, randn(6))


def test_batch_norm_statistics_are_captured_and_module_buffers_are_not_written():
    """F.batch_norm in training (batch statistics; running statistics passed as arguments are written
    back like any argument written in place) and in eval mode. nn.BatchNorm2d in training writes its
    module buffers (num_batches_tracked += 1, the running statistics): refused, naming the buffer, and
    the capture leaves them as they were; in eval() it compiles."""
    x, w, b = randn(4, 3, 5, 7), randn(3, seed=1), randn(3, seed=2)
    rm, rv = randn(3, seed=3), randn(3, seed=4).abs() + 0.5

    def train(x, rm, rv, w, b):
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)

    mine, theirs = [rm.clone(), rv.clone()], [rm.clone(), rv.clone()]
    got = neptune_eq.compile(train, x, *mine, w, b)(x, *mine, w, b)
    want = train(x.double(), *(t.double() for t in theirs), w.double(), b.double())
    assert rel_err(got, want) < 1e-5
    for a, t in zip(mine, theirs):
        assert not torch.equal(a, rm) and torch.allclose(a.double(), t.double(), atol=1e-6)
    check_capture(lambda x, rm, rv, w, b: F.batch_norm(x, rm, rv, w, b, training=False), x, rm, rv, w, b)
    bn = torch.nn.BatchNorm2d(3, dtype=x.dtype)
    with pytest.raises(CaptureError, match=r"num_batches_tracked.*eval\(\)"):
        neptune_eq.compile(bn, x)
    assert bn.num_batches_tracked.item() == 0 and torch.equal(bn.running_mean, torch.zeros(3, dtype=x.dtype))
    bn.num_batches_tracked = None  # (no counter: the running statistics alone are written)
    with pytest.raises(CaptureError, match=r"does not take as an argument .*BatchNorm"):
        neptune_eq.compile(bn, x)
    bn.eval()
    assert rel_err(neptune_eq.compile(bn, x)(x), bn(x)) < 1e-5


def test_group_norm_with_weights_captures_its_cpu_decomposition():
    """torch's CPU decomposition of group_norm views its weights through as_strided with the
    contiguous strides of an [N, C] size: a reshape. A stride pattern that is not one is refused."""
    x, w, b = randn(2, 12, 5, 7), randn(12, seed=1), randn(12, seed=2)
    check_capture(lambda x, w, b: F.group_norm(x, 4, w, b, eps=1e-5), x, w, b)
    with pytest.raises(CaptureError, match=r"as_strided .*not a reshape"):
        capture(lambda x: torch.as_strided(x, (4, 4), (1, 4)) * 2, randn(16))


def test_multi_head_projection_split_and_merge():
    def mha(x, w):
        B, L, E = x.shape
        y = (x @ w).view(B, L, 2, E // 2).transpose(1, 2)
        o = torch.softmax(y @ y.transpose(-1, -2), -1) @ y
        return o.transpose(1, 2).reshape(B, L, E)

    c = check_capture(mha, randn(2, 5, 8), randn(8, 8, seed=1))
    # the split feature dimension is a program axis pair (h, e): w is read at h * 4 + e
    assert any(isinstance(n.index[1], ir.Call) for n in nodes(c.program, ir.Load) if n.tensor == "w")


# ---------------------------------------------------------------- elementwise


def test_arithmetic_broadcasting_and_scalars():
    def fn(x, y, z):
        return (x + y, x - 2.5 * y, 3 - x, x * z, x / (z + 4), -x + 1, 2 ** y, x.pow(2), x**3,
                torch.maximum(x, y), torch.clamp(x, -0.5, 0.5), torch.sigmoid(x), F.relu(x), x.square())

    check_capture(fn, randn(3, 1, 5), randn(4, 1, seed=1), randn(5, seed=2))


def test_a_composite_writing_a_fresh_tensor_in_place():
    """F.cosine_similarity clamps a clone of its norms in place (aten.clamp_min_.Tensor), which
    functionalization leaves inside the composite: it is read as the functional op; clamp bounds may be
    tensors."""
    def fn(x, y, lo):
        return F.cosine_similarity(x, y, dim=-1), torch.clamp_min(x, lo), torch.clamp_max(y, lo)

    check_capture(fn, randn(4, 6), randn(4, 6, seed=1), randn(6, seed=2))


def test_elementwise_losses_are_traced_as_their_math():
    def fn(x, y, p):
        return (F.mse_loss(x, y), F.mse_loss(x, y, reduction="none"), F.huber_loss(x, y, delta=0.5),
                F.smooth_l1_loss(x, y, beta=0.7, reduction="sum"), F.binary_cross_entropy_with_logits(x, p))

    check_capture(fn, randn(4, 6), randn(4, 6, seed=1), torch.rand(4, 6, dtype=torch.float64))


def test_log1p_is_accurate_where_one_plus_x_rounds():
    """log1p is an op of its own (BCE, soft margin, softplus-like losses): the kernel's helper keeps
    log(1 + x) accurate where 1 + x rounds (x = 1e-10 in fp32), and exact at −1, ±inf and NaN."""
    import neptune_eq

    x = torch.tensor([[1e-10, -1e-7, 3e-4, -0.5, -1.0, 2.0, 1e30, float("inf"), float("nan"), -2.0]])
    got = neptune_eq.compile(lambda x: torch.log1p(x), x)(x)
    want = torch.log1p(x.double())
    finite = torch.isfinite(want)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and got[0, 4] == -math.inf and got[0, 7] == math.inf
    assert ((got.double()[finite] - want[finite]).abs() <= 2e-7 * want[finite].abs()).all()
    check_capture(lambda x, y, s: (F.binary_cross_entropy(torch.sigmoid(x), y), F.soft_margin_loss(x, s)),
                  randn(4, 6), randn(4, 6, seed=1).sigmoid(), randn(4, 6, seed=2).sign())


def test_logsumexp_over_several_dims_and_a_size_one_dim():
    x = randn(3, 4, 5)
    x[0, :, :] = -math.inf  # a slice of -inf: -inf; one +inf: +inf; a NaN: NaN (as torch)
    x[1, 2, 3] = math.inf
    x[2, 0, 1] = math.nan
    check_capture(lambda x: (torch.logsumexp(x, dim=(-2, -1)), torch.logsumexp(x, dim=(0, 2)),
                             torch.logsumexp(x[:, :1], dim=1)), x)


def test_activations_traced_as_their_math():
    def fn(x):
        return (F.softplus(x, beta=2.0, threshold=5.0), F.logsigmoid(x), F.glu(x, -1), F.mish(x),
                F.leaky_relu(x, 0.1), F.hardtanh(x))

    check_capture(fn, 4 * randn(4, 6))


def test_expm1_and_erf_are_accurate_ops():
    """expm1 (ELU, SELU, CELU read it) keeps eˣ − 1 accurate where eˣ rounds to 1; erf (exact GELU)."""
    import neptune_eq

    x = torch.tensor([[1e-10, -1e-7, 3e-4, -0.5, 2.0, 80.0, float("inf"), float("-inf"), float("nan"), -30.0]])
    for fn in (torch.expm1, torch.erf):
        got, want = neptune_eq.compile(fn, x)(x), fn(x.double())
        finite = torch.isfinite(want)
        assert torch.equal(got[~finite].nan_to_num(), want[~finite].float().nan_to_num()), fn
        assert ((got.double()[finite] - want[finite]).abs() <= 4e-7 * want[finite].abs()).all(), fn
    check_capture(lambda x: (F.gelu(x), F.elu(x), F.selu(x), F.celu(x, 0.5), F.hardswish(x), F.hardsigmoid(x),
                             torch.sign(x), torch.log10(x.abs() + 1)), randn(4, 6))


def test_split_chunk_unbind_cat_stack_are_index_maps():
    """Pieces of a tensor (SwiGLU's x.chunk(2, -1)) and tensors put together along an axis: each a
    substitution of indices (cat's pieces clamped into their own ranges and selected by masks)."""
    check_capture(lambda x: (lambda a, b: F.silu(a) * b)(*x.chunk(2, -1)), randn(4, 6))
    check_capture(lambda x: [t.sum(-1) for t in x.split([1, 3, 2], -1)], randn(4, 6))
    check_capture(lambda x: sum(x.unbind(1)) * x.unbind(0)[2].sum(), randn(4, 3, 5))
    check_capture(lambda x, y: torch.cat([x, y, x * 2], 0).softmax(0), randn(4, 6), randn(1, 6, seed=1))
    check_capture(lambda x: torch.cat([-x[..., 3:], x[..., :3]], -1) * 0.5 + x, randn(2, 4, 6))  # rotate-half
    check_capture(lambda x, y: torch.stack([x, y], -1).amax(-1), randn(4, 6), randn(4, 6, seed=1))


def test_kl_div_and_logsumexp_of_a_constant_axis():
    """F.kl_div on probabilities reads xlogy (isnan); a logsumexp over an axis its input does not vary
    along (a linear layer with a constant weight) is x + log n (it raised a ProgramError)."""
    check_capture(lambda a, b: F.kl_div(F.log_softmax(a, -1), F.softmax(b, -1), reduction="batchmean"),
                  randn(4, 6), randn(4, 6, seed=1))
    check_capture(lambda x: F.linear(x, torch.ones(3, 6, dtype=F64)).logsumexp(-1), randn(4, 6))


def test_reading_an_uninitialised_tensor_is_refused():
    with pytest.raises(CaptureError, match="uninitialised tensor"):
        capture(lambda x: torch.empty_like(x) + x, randn(3, 4))


def test_unary_math():
    def fn(x):
        p = x.abs() + 0.1
        return torch.exp(x), torch.log(p), torch.tanh(x), torch.sqrt(p), torch.rsqrt(p), p.reciprocal(), torch.exp2(x)

    check_capture(fn, randn(4, 6))


def test_pow_of_integers_to_an_integer_raises():
    """Any float power is the pow op (tests/test_more_ops.py); an integer one of integers (other than
    2, 3, 4, which multiply) would be computed in floats, and is refused naming pow."""
    check_capture(lambda x: x.abs() ** 1.7, randn(3))
    with pytest.raises(CaptureError, match="pow"):
        capture(lambda n: n ** 5, torch.arange(3))


# ---------------------------------------------------------------- reductions


def test_reductions():
    def fn(x):
        return (x.amax(-1), x.max(dim=1).values, x.amin(0, keepdim=True), x.sum(-1), x.sum(), x.mean((0, 2)),
                x.var(-1), x.var(-1, correction=0), x.std(1, keepdim=True), x.norm(dim=-1),
                torch.linalg.vector_norm(x, ord=1, dim=1), x.max(), torch.var_mean(x, -1)[1],
                *torch.std_mean(x, 1, correction=0, keepdim=True))

    check_capture(fn, randn(3, 4, 5))


def test_softmax_family():
    def fn(x):
        return torch.softmax(x, -1), F.log_softmax(x, dim=0), torch.logsumexp(x, -1), x.softmax(1)

    check_capture(fn, randn(4, 7))


def test_softmax_is_safe_on_fully_masked_rows():
    """torch's softmax gives NaN on an all -inf row; the captured program gives 0 (SDPA/Flex semantics)."""
    x = randn(3, 5)
    x[1] = -math.inf
    c = capture(lambda x: torch.softmax(x, -1), x)
    out = c.reference(x)
    assert torch.equal(out[1], torch.zeros(5, dtype=F64))
    assert rel_err(out[[0, 2]], torch.softmax(x[[0, 2]], -1)) < 1e-12


def test_max_indices_are_captured_as_the_first_index_attaining_the_max():
    """max(dim).indices (tests/test_argmax.py runs them): the least index whose value equals the max."""
    x = randn(3, 4)
    got = capture(lambda x: x.max(-1).indices + 1, x).reference(x)
    assert torch.equal(got.long(), x.max(-1).indices + 1)


# ---------------------------------------------------------------- masks


def causal_masked(q, k):
    s = q @ k.T
    L, S = s.shape
    i = torch.arange(L)
    j = torch.arange(S)
    return s.masked_fill(j[None, :] > i[:, None], float("-inf")).softmax(-1)


def test_arange_masks_become_affine_index_comparisons():
    c = check_capture(causal_masked, randn(6, 4), randn(6, 4, seed=1))
    (w,) = {n for n in calls(c.program, "where") if n.args[2] == ir.Const(-math.inf)}
    assert masks.affine(w.args[0]) is not None
    assert w.args[0] == ir.Call("le", (ir.Index("j"), ir.Index("i")))


def test_window_and_tril_masks():
    def fn(s):
        L = s.shape[-1]
        i = torch.arange(L).view(L, 1)
        j = torch.arange(L).view(1, L)
        keep = (j <= i) & (i - j < 3)
        a = torch.where(keep, s, float("-inf")).softmax(-1)
        b = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), -math.inf).softmax(-1)
        return a, b, torch.triu(s, 1)

    c = check_capture(fn, randn(2, 7, 7))
    for w in calls(c.program, "where"):
        if w.args[2] == ir.Const(-math.inf):
            assert masks.affine(w.args[0]) is not None, ir.show(w.args[0])


def test_document_mask_from_index_tensor():
    def fn(s, doc):
        same = doc[:, None] == doc[None, :]
        return torch.where(same, s, float("-inf")).softmax(-1)

    doc = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    c = check_capture(fn, randn(8, 8), doc)
    assert c.program.inputs["doc"].dtype == "int64"
    eq = calls(c.program, "eq")
    assert any(set(ir.show(a) for a in n.args) == {"doc[i]", "doc[d]"} for n in eq), [ir.show(n) for n in eq]


# ---------------------------------------------------------------- gathers and losses


def test_gather_along_reduced_axis():
    def fn(x, t):
        return x[torch.arange(x.shape[0]), t], x.gather(-1, t.unsqueeze(-1)).squeeze(-1), x[:, 2], x[1:4, ::2]

    t = torch.tensor([3, 0, 6, 2, 2])
    c = check_capture(fn, randn(5, 7), t)
    assert c.program.inputs["t"].dtype == "int64"
    gathers = [n for n in nodes(c.program, ir.Load) if n.tensor == "x" and isinstance(n.index[-1], ir.Load)]
    assert gathers and all(n.index[-1].tensor == "t" for n in gathers)


def test_cross_entropy_none():
    t = torch.tensor([3, 0, 6, 2])
    check_capture(lambda logits, t: F.cross_entropy(logits, t, reduction="none"), randn(4, 7), t)


def test_cross_entropy_with_ignored_targets():
    x, t = randn(3, 150), torch.tensor([5, -100, 149])
    check_capture(lambda x, t: F.cross_entropy(x, t, reduction="none"), x, t)


def test_float_index_tensor_raises():
    with pytest.raises(CaptureError, match=r"(integer|int64).* at test_frontend\.py:\d+"):
        capture(lambda x, t: x.gather(-1, t), randn(3, 4), randn(3, 1))


# ---------------------------------------------------------------- extra operands and constants


def test_bias_tensor_and_per_head_scalars():
    def fn(q, k, bias, slopes):
        s = q @ k.transpose(-1, -2) + bias + slopes[:, None, None]
        return torch.softmax(s, -1)

    check_capture(fn, randn(1, 3, 5, 4), randn(1, 3, 6, 4, seed=1), randn(1, 1, 5, 6, seed=2), randn(3, seed=3))


SCALE = torch.tensor([0.5, 2.0, -1.0])


def test_captured_tensors_become_inputs():
    def fn(x):
        return x * SCALE + torch.tensor(3.0)

    c = check_capture(fn, randn(4, 3))
    assert "SCALE" in c.program.inputs and "SCALE" in c.constants


# ---------------------------------------------------------------- axis inference


def test_equal_extents_that_never_interact_stay_apart():
    def attn(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

    q, k, v = randn(2, 8, 4), randn(2, 8, 4, seed=1), randn(2, 8, 4, seed=2)
    c = check_capture(attn, q, k, v)
    p = c.program
    assert p.inputs["q"].axes[1] != p.inputs["k"].axes[1]  # query length vs key length
    assert p.inputs["q"].axes[2] == p.inputs["k"].axes[2]  # contracted
    assert p.inputs["v"].axes[2] != p.inputs["q"].axes[2]  # value features vs key features
    assert p.inputs["k"].axes[1] == p.inputs["v"].axes[1]  # keys
    assert p.inputs["q"].axes == ("b", "i", "d") and p.inputs["v"].axes == ("b", "j", "e")


def test_diagonal_uses_get_fresh_axes():
    def fn(x):
        return x + x.T, x @ x.T

    c = check_capture(fn, randn(4, 4))
    assert len(set(c.program.outputs[1].axes)) == 2


def test_later_unification_does_not_merge_axes_of_an_outer_product():
    def fn(x, y):
        return x[:, None] * y[None, :], x + y  # the outer product keeps two axes; x + y reads y at x's

    c = check_capture(fn, randn(5), randn(5, seed=1))
    assert len(set(c.program.outputs[0].axes)) == 2


def test_gqa_uses_floordiv_index():
    def gqa(q, k, v):
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

    c = check_capture(gqa, randn(2, 6, 5, 4), randn(2, 2, 5, 4, seed=1), randn(2, 2, 5, 4, seed=2))
    k_loads = [n for n in nodes(c.program, ir.Load) if n.tensor == "k"]
    assert k_loads and all(n.index[1] == ir.Call("floordiv", (ir.Index("h"), ir.Const(3))) for n in k_loads)
    assert c.program.outputs[0].axes == ("b", "h", "i", "e")


def test_size_one_dims_are_not_axes():
    def decode(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

    q, k, v = randn(1, 2, 1, 4), randn(1, 2, 9, 4, seed=1), randn(1, 2, 9, 4, seed=2)
    c = check_capture(decode, q, k, v)
    assert c.program.inputs["q"].axes == ("h", "d")
    assert c.program.inputs["k"].axes == ("h", "j", "d")
    assert c.inputs(q, k, v)["q"].shape == (2, 4)
    assert c.reference(q, k, v).shape == (1, 2, 1, 4)


# ---------------------------------------------------------------- the Captured object


def test_captured_binding_and_structure():
    def fn(x, n, y):
        return x * n + y.sum(-1, keepdim=True)

    x, y = randn(3, 4), randn(3, 5, seed=1)
    c = capture(fn, x, 2, y)
    assert [b.input for b in c.args] == ["x", None, "y"]
    assert rel_err(c.reference(x, 2, y), fn(x, 2, y)) < 1e-12
    with pytest.raises(CaptureError, match="capture again"):
        c.reference(x, 3, y)
    with pytest.raises(CaptureError, match="capture again for other shapes"):
        c.reference(randn(4, 4), 2, y)


def test_input_dtypes_recorded():
    def fn(a, b, m, t):
        return torch.where(m, a.float() + b.float(), 0.0) + t

    a = torch.randn(3, dtype=torch.float16)
    b = torch.randn(3, dtype=torch.bfloat16)
    m = torch.tensor([True, False, True])
    t = torch.tensor([1, 2, 3], dtype=torch.int32)
    c = capture(fn, a, b, m, t)
    assert [s.dtype for s in c.program.inputs.values()] == ["float16", "bfloat16", "bool", "int32"]


# ---------------------------------------------------------------- errors name the op and the line


def test_unsupported_op_names_op_and_line():
    def my_attn(scores):
        scores = scores * 2
        return scores.sort(-1).values  # the offending line

    with pytest.raises(CaptureError) as info:
        capture(my_attn, randn(3, 4))
    msg = str(info.value)
    assert "unsupported operation aten.sort" in msg
    assert "test_frontend.py:" in msg and "scores.sort(-1)" in msg


def test_dropout_is_refused_as_random_numbers_at_its_line():
    with pytest.raises(CaptureError, match=r"aten\.bernoulli \(random numbers: dropout .* at test_frontend\.py:\d+"):
        capture(lambda x: F.dropout(x, 0.1, True) * 2, randn(3, 4))


def test_boolean_mask_indexing_raises_with_line():
    with pytest.raises(CaptureError, match=r"boolean mask .* at test_frontend\.py:\d+"):
        capture(lambda x, m: x[m], randn(3, 4), torch.rand(3, 4) > 0.5)


def test_data_dependent_control_flow_raises_with_line():
    def branchy(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(CaptureError, match=r"depend on tensor values .* at test_frontend\.py:\d+: if x.sum\(\) > 0"):
        capture(branchy, randn(3))


def test_a_library_functions_value_check_is_named_beside_the_users_line():
    """F.gaussian_nll_loss checks `torch.any(var < 0)` in Python: the refusal names that line of torch
    as well as the user's call (the user's line alone named only the call)."""
    def nll(mu, y, var):
        return torch.nn.functional.gaussian_nll_loss(mu, y, var)

    with pytest.raises(CaptureError, match=r"gaussian_nll_loss branches on tensor values at functional\.py:\d+: "
                                           r"(el)?if torch\.any\(var < 0\).* at test_frontend\.py:\d+: return torch"):
        capture(nll, randn(3, 4), randn(3, 4), torch.rand(3, 4) + 0.1)


# ---------------------------------------------------------------- more PyTorch the frontend understands


def test_norms_and_activations():
    def fn(x, w, b):
        return (F.layer_norm(x, (x.shape[-1],), w, b), F.rms_norm(x, (x.shape[-1],), w, eps=1e-5), F.silu(x),
                F.gelu(x, approximate="tanh"))

    check_capture(fn, randn(3, 8), randn(8, seed=1), randn(8, seed=2))


def test_in_place_updates_have_value_semantics():
    def fn(q, k):
        s = q @ k.T
        s.masked_fill_(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf"))
        s += 1
        return s.softmax(-1)

    check_capture(fn, randn(4, 3), randn(4, 3, seed=1))


def test_writes_into_views_raise():
    def fn(x):
        y = x.clone()
        y[:, 0] = 0
        return y

    with pytest.raises(CaptureError, match=r"unsupported operation .* at test_frontend\.py:\d+: y\[:, 0\] = 0"):
        capture(fn, randn(3, 4))


def test_module_parameters_become_named_inputs():
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 4)).double()
    c = check_capture(mlp, randn(5, 8))
    assert list(c.program.inputs) == ["input", "p0_weight", "p0_bias", "p2_weight", "p2_bias"]


def test_output_structures():
    x = randn(3, 4)
    c = check_capture(lambda a, b: [a, a.expand(2, 3, 4), b.sum()], x, x)
    assert isinstance(c.reference(x, x), list) and len(c.program.outputs) == 3  # fn's own structure
    assert list(c.program.inputs) == ["a", "b"]  # the same tensor passed twice stays two inputs


def test_baddbmm_and_input_masks():
    def fn(bias, q, k, keep):
        s = torch.baddbmm(bias, q, k.transpose(1, 2), beta=0.5, alpha=0.25)
        return s.masked_fill(~keep, float("-inf")).softmax(-1)

    keep = torch.rand(5, 6, generator=torch.Generator().manual_seed(0)) > 0.3
    c = check_capture(fn, randn(3, 5, 6), randn(3, 5, 4, seed=1), randn(3, 6, 4, seed=2), keep)
    # ~keep with -inf reads as where(keep, s, -inf): the predicate says which keys take part
    assert any(w.args[0] == ir.Load("keep", (ir.Index("i"), ir.Index("d"))) for w in calls(c.program, "where"))
