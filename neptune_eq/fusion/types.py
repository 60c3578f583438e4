"""What the fusion and correction searches produce, as plain data: the reductions they work on
(Binding), the loop groups they propose (LoopCandidate, CompCandidate), the corrections they find
(CorrectionResult) and the rule applications a derivation reports (Application).

Plan extraction (extract/plans.py) and the explorer read these; only fusion/ builds them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from neptune_eq import ir
from neptune_eq.terms import Loop, Term


@dataclass(frozen=True)
class Binding:
    """A reduction of the representative program: computed by a loop, or inline per element."""

    name: str
    node: ir.Reduce
    cid: int  # its e-class
    free: tuple[str, ...]  # free axes, program order

    @property
    def op(self) -> str:
        return self.node.op

    @property
    def axis(self) -> str:
        return self.node.axis

    def ref(self, kind: ir.RefKind) -> ir.StateRef:
        """This reduction's final, inline, current or old value (ir.RefKind) as an IR leaf."""
        return ir.StateRef(kind, self.name, self.free)


def direct_bindings(body: ir.Node, bindings: dict[ir.Node, Binding]) -> set[str]:
    """Bindings referenced by `body` outside of other bindings (the ones a substitution replaces)."""
    found: set[str] = set()
    stack = [body]
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        b = bindings.get(n)
        if b is not None:
            found.add(b.name)
            continue
        stack.extend(n.children())
    return found


@dataclass
class CorrectionResult:
    """What a correction search found for one quotient: h and the ⊗' applying it, or why not."""

    quotient: ir.Node
    dist: str | None = None  # ⊗' that applies the correction
    inverse: str | None = None
    cond: str = "any"  # side condition that makes ⊗' distribute over the consumer's monoid
    annihilator: float = 0.0
    correction: ir.Node | None = None
    iterations: int = 0
    nodes: int = 0
    seconds: float = 0.0
    reason: str = ""
    matches: Counter = field(default_factory=Counter)
    kind: str = "quotient"  # found in the quotient's e-class, or "reset": derived (fusion/reset.py)

    @property
    def found(self) -> bool:
        return self.correction is not None


@dataclass
class AffineResult:
    """The repair of one sum over the accumulators it borrows: `terms` maps each carried sum's name
    to its coefficient hₖ; `constant` is h₀ (multiplied by the count of elements seen), or None."""

    terms: dict[str, ir.Node] = field(default_factory=dict)
    constant: ir.Node | None = None
    core: ir.Node | None = None  # the body as carried, when it reads running means (fusion/extrapolate.py)
    means: tuple[str, ...] = ()  # the sums read as running means in that body
    iterations: int = 0
    nodes: int = 0
    seconds: float = 0.0
    reason: str = ""

    @property
    def found(self) -> bool:
        return bool(self.terms) or self.constant is not None


@dataclass
class Application:
    """One fusion-rule application, as the derivation reports it."""

    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


@dataclass
class CompCandidate:
    binding: Binding
    body: ir.Node  # bindings it uses replaced by their current, final or inline values (ir.StateRef)
    producers: tuple[str, ...]  # in-loop producers (rolling)
    mask: ir.Node  # body ≡ where(mask, core, identity)
    core: ir.Node
    mask_term: Term | None = None
    core_term: Term | None = None
    correction: CorrectionResult | None = None
    quotient_term: Term | None = None
    affine: AffineResult | None = None  # a repair over several carried sums (when no multiplicative one)

    @property
    def chosen(self) -> CorrectionResult | None:
        return self.correction if self.correction is not None and self.correction.found else None

    @property
    def chosen_affine(self) -> AffineResult | None:
        return self.affine if self.chosen is None and self.affine is not None and self.affine.found else None

    @property
    def count_name(self) -> str | None:
        """The carried count of elements this component's repair multiplies h₀ by, or its body divides
        a running sum by (None: not needed)."""
        a = self.chosen_affine
        return count_name(self.binding) if a is not None and (a.constant is not None or a.core is not None) else None


def count_name(b: Binding) -> str:
    """The name of the element count carried for `b`'s affine repair."""
    return f"count_{b.name}"


@dataclass
class LoopCandidate:
    axis: str
    comps: list[CompCandidate]
    term: Loop | None = None
    valid: bool = False
    reason: str = ""
    applications: list[Application] = field(default_factory=list)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.binding.name for c in self.comps)
