"""Sums that share a factor and are only used added become one: Σₖ x·f + Σₖ y·f → Σₖ (x + y)·f.

Two gradient contributions to one weight are two contractions over the same axis that read one
operand: linear cross-entropy's dW is Σᵢ pᵢⱼ·hᵢ (the softmax) plus Σᵢ [tᵢ = j]·cᵢ·hᵢ (the
gather's adjoint). Run as two tile GEMMs they read h twice and do the tensor-core work twice; as
one, the computed operand is x + y (p − onehot·c, what Liger-Kernel writes by hand) and the dot
runs once. The rewrite is on the plan, not in the e-graph: Σa + Σb → Σ(a + b) holds for all
values, but the factored body (x + y)·f is not an identity where f is ±inf and both terms are
selected out (0 against 0·inf); the dot's lowering already takes a loaded operand as finite
(README, "What is guaranteed"), and contraction.opened reads the sum as that product.

Applies to two sum components of one kernel's unsplit passes over one axis, with the same free
axes, no repair and no integer state, each a tile product, whose sum is again one (a shared
factor), when every reference to either result is to their sum. The components' masks go into
the body as conditions except the affine conjuncts they share, which still bound the tiles the
loop visits.
"""

from __future__ import annotations

from neptune_eq import ir
from neptune_eq.contraction import is_product, masked_body
from neptune_eq.masks import affine, conjunction, conjuncts
from neptune_eq.plan import CompPlan, KernelPlan


def merge_shared_sums(kernels: list[KernelPlan], owner: dict[str, int]) -> list[str]:
    """Merge, in place, every such pair in `kernels` (of one pass, or of two passes of one kernel over
    the same axis: the later one's sum moves into the earlier, which is dropped when emptied); the
    derivation lines of the merges made."""
    out = []
    for k in kernels:
        merged = True
        while merged:
            merged = False
            for pa, a, pb, b in _pairs(k):
                if _merge(kernels, a, b):
                    pb.comps.remove(b)
                    if pb is not pa and not pb.comps and not pb.stores:
                        k.phases.remove(pb)
                    owner.pop(b.name, None)
                    out.append(f"merge_sums: {a.name} + {b.name} share a factor and are only used added: "
                               f"one sum over {pa.axis} of their bodies' sum ({a.name})")
                    merged = True
                    break
    return out


def _pairs(k: KernelPlan):
    passes = k.passes()
    comps = [(ps, c) for ps in passes if ps.split == 1 for c in ps.comps
             if c.op == "sum" and not c.producers and c.corr is None and not c.affine and not c.integer]
    for i, (pa, a) in enumerate(comps):
        for pb, b in comps[i + 1:]:
            if pa.axis == pb.axis and set(a.free) == set(b.free) and is_product(a.core) and is_product(b.core) \
                    and not _reads_states_of(b, passes[passes.index(pa):passes.index(pb) + 1]):
                yield pa, a, pb, b


def _reads_states_of(b: CompPlan, passes) -> bool:
    """Does `b`'s body read the result of a component of `passes`? Moved into the first of them, it
    would read a final value that pass has not computed (fuzz seed 1541: a layer norm's gradient summed
    %1·fin:sum_j7 in a later pass and was merged into sum_j7's own; KeyError writing the kernel)."""
    names = {c.name for ps in passes for c in ps.comps}
    return any(isinstance(n, ir.StateRef) and n.name in names
               for e in (b.core, b.mask) if e is not None for n in ir.walk(e))


def _merge(kernels: list[KernelPlan], a: CompPlan, b: CompPlan) -> bool:
    """Give `a` the body of a + b and point every use of their sum at `a` (the caller drops `b`)."""
    if any(a.name in c.producers or b.name in c.producers for k in kernels for p in k.passes() for c in p.comps):
        return False
    fa, fb = a.ref(ir.RefKind.FINAL), b.ref(ir.RefKind.FINAL)
    both = {ir.Call("add", (fa, fb)): fa, ir.Call("add", (fb, fa)): fa}
    exprs = list(_exprs(kernels))
    if not any(n in both for e in exprs for n in ir.walk(e)):
        return False
    marker = ir.Const(0.0)
    for e in exprs:  # every other reference to a or b blocks the merge
        rest = ir.substitute(e, dict.fromkeys(both, marker))
        if any(isinstance(n, ir.StateRef) and n.name in (a.name, b.name) for n in ir.walk(rest)):
            return False
    ca = conjuncts(a.mask) if a.mask is not None else []
    cb = conjuncts(b.mask) if b.mask is not None else []
    shared = [m for m in ca if m in cb and affine(m) is not None]
    body = ir.Call("add", (masked_body(a.core, conjunction([m for m in ca if m not in shared])),
                           masked_body(b.core, conjunction([m for m in cb if m not in shared]))))
    if not is_product(body):
        return False
    a.core, a.mask = body, conjunction(shared)
    for k in kernels:
        k.substitute(both)
    return True


def _exprs(kernels: list[KernelPlan]):
    """What the kernels compute and store, their affine repair terms included."""
    for k in kernels:
        yield from k.exprs()
        yield from (h for ps in k.passes() for c in ps.comps for _, h in c.affine)
