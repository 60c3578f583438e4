"""What a compile is asked to do (Options) and what it produced, phase by phase (Compilation, its
ranked Alternatives): the data the pipeline (neptune_eq.pipeline) and its saturation phases
(neptune_eq.phases) fill in, and the explorer, the CLI and the tests read."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from egglog import EGraph

from . import ir
from .device import DeviceSpec
from .extract.cost import Cost
from .extract.view import EGraphView
from .fusion.search import FusionSearch
from .fusion.types import Binding
from .ir import NeptuneError
from .plan import Plan
from .rules.base import Rule
from .saturate import Budget, BudgetError, Progress, Saturator
from .schedule import KernelSchedule
from .terms import Encoder, Term


@dataclass(frozen=True)
class Options:
    """What a compile may do. Nothing here changes what is computed, only how it is searched and run (and,
    for float32_products, how float32 tiles are rounded on their way into a product)."""

    device: DeviceSpec | None = None  # None: the current GPU, else the H100 spec
    budget: Budget = field(default_factory=Budget)
    split_factors: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    min_chunk: int = 512  # a split-K chunk covers at least this many elements
    inline_max: int = 256  # contractions over axes up to this extent are computed per tile
    max_plans: int = 200
    # also offer plans with a row kernel folded into the pass over the same rows (extract/fold_rows.py;
    # H100: a norm's backward 161 -> 103 us, a bias-activation's 616 -> 346); False: never fold
    fold_rows: bool = True
    # also offer a kernel that is a plain matrix product as the vendor's GEMM (cuBLAS through torch.matmul,
    # lower/library.py) beside the generated tiles; False: every kernel is generated Triton
    library_gemm: bool = True
    # the precisions a generated kernel may multiply float32 tiles at, ranked by the cost model: "ieee"
    # (the FMA pipe, exact float32 products), "tf32x3" (three TF32 tensor-core products, about float32's
    # accuracy: how SDPA multiplies float32), "tf32" (10-bit mantissas: opt in). ("ieee",): IEEE only
    float32_products: tuple[str, ...] = ("ieee", "tf32x3")
    rules: tuple[Rule, ...] = ()  # extra (user) algebra rules, already checked for soundness
    strict_rules: bool = False  # reject user rules that only refine (docs/RULES.md) instead of warning
    progress: Progress | bool = None
    cache_dir: Path | None = None
    # bytes of intermediate buffers a plan may use before run() cuts it into chunks of one axis
    # (neptune_eq/chunked.py); None: the largest input or output of the program, at least 1 GiB
    scratch_limit: int | None = None

    def __post_init__(self) -> None:
        """Wrong types are named here, not met as AttributeErrors deep inside a compile."""
        if isinstance(self.budget, dict):  # budget={"max_seconds": 2.0}
            unknown = set(self.budget) - {f.name for f in fields(Budget)}
            if unknown:
                raise BudgetError(f"unknown budget field(s) {sorted(unknown)}; Budget has "
                                  f"{[f.name for f in fields(Budget)]}")
            object.__setattr__(self, "budget", Budget(**self.budget))
        if not isinstance(self.budget, Budget):
            raise BudgetError(f"budget must be a neptune_eq.Budget (e.g. Budget(max_seconds=2.0)), got "
                              f"{type(self.budget).__name__} {self.budget!r}")
        if self.device is not None and not isinstance(self.device, DeviceSpec):
            raise NeptuneError(f"device must be a neptune_eq.device.DeviceSpec or None, got {self.device!r}")
        if not isinstance(self.split_factors, tuple | list) or not all(
                isinstance(f, int) and not isinstance(f, bool) and f >= 2 for f in self.split_factors):
            raise NeptuneError(f"split_factors must be a tuple of ints >= 2, got {self.split_factors!r}")
        if (not isinstance(self.float32_products, tuple | list) or not self.float32_products
                or not set(self.float32_products) <= {"ieee", "tf32", "tf32x3"}):
            raise NeptuneError(f"float32_products must be a non-empty tuple of 'ieee', 'tf32', 'tf32x3', got "
                               f"{self.float32_products!r}")
        object.__setattr__(self, "float32_products", tuple(dict.fromkeys(self.float32_products)))
        if self.scratch_limit is not None and (isinstance(self.scratch_limit, bool) or not isinstance(
                self.scratch_limit, int) or self.scratch_limit < 1):
            raise NeptuneError(f"scratch_limit must be None or an int >= 1 (bytes), got {self.scratch_limit!r}")
        for name in ("min_chunk", "inline_max", "max_plans"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise NeptuneError(f"{name} must be an int >= 1, got {v!r}")


@dataclass
class Alternative:
    id: int
    plan: Plan
    cost: Cost
    schedules: list[KernelSchedule]
    kind: str = "streamed"  # the schedule kind of each kernel (neptune_eq.space)

    @property
    def structure(self) -> str:
        return f"{self.plan.structure()} [{self.kind}]"

    @property
    def predicted_time(self) -> float:
        return self.cost.time

    def __str__(self) -> str:
        t = self.cost.terms()
        return (f"#{self.id}: {self.structure} — predicted {t['time_us']:.1f} µs, {t['hbm_MB']:.2f} MB HBM, "
                f"{t['tensor_GFLOP']:.3f} TC GFLOP, {t['sfu_Gop']:.3f} G special ops")


@dataclass
class Compilation:
    """Everything the pipeline produced, phase by phase (for the explorer, the CLI and tests)."""

    program: ir.Program
    options: Options
    device: DeviceSpec
    egraph: EGraph
    encoder: Encoder
    roots: dict[str, Term]
    saturator: Saturator
    representative: dict[str, ir.Node] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)
    fusion: FusionSearch | None = None
    view: EGraphView | None = None
    alternatives: list[Alternative] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    nodes: int = 0
    budget_notes: list[str] = field(default_factory=list)  # what a budget cut short (explain() shows it)
    numerics_notes: list[str] = field(default_factory=list)  # a stable spelling chosen over a cheaper one
    refinements_dropped: str | None = None  # why the algebra ran without some refinements (phases.saturated)
    overflow_risks: list[ir.Node] = field(default_factory=list)  # exps under a sum that may overflow
    cancel_risks: list[ir.Node] = field(default_factory=list)  # differences of two sums ≥ 0
    # what plan enumeration could not do: loops dropped (no extractable term), whether it stopped at
    # max_plans (kept as data: the plan space's closures hold the e-graph, which must not outlive the
    # compile's thread in a reference cycle — egglog's EGraph cannot be dropped on another thread)
    dropped_loops: list[str] = field(default_factory=list)
    plans_truncated: bool = False
    held: list[Term] = field(default_factory=list)  # loads of inputs that hold a computed value

    @property
    def best(self) -> Alternative:
        return self.alternatives[0]

    @property
    def numerics_risks(self) -> list[ir.Node]:
        """What the stabilise phase can repair in the representative program."""
        return [*self.overflow_risks, *self.cancel_risks]

    @property
    def rejected_notes(self) -> list[str]:
        """The fusions the rules could not justify, one line each (loop, axis, why)."""
        rejected = self.fusion.rejected if self.fusion else []
        return [f"{', '.join(lp.names)} over {lp.axis}: {lp.reason}" for lp in rejected if lp.reason]

    def axis_bits(self) -> dict[str, int]:
        return {a: 1 << k for k, a in enumerate(self.encoder.axis_order)}
