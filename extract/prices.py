"""What the cost model predicts for a kernel and for a plan: every term kept, so the explorer can show
why a plan wins (extract/cost.py computes them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class KernelCost:
    name: str
    programs: int
    iterations: float  # per program, all passes
    hbm_bytes: float
    requested_bytes: float
    tensor_flops: float
    alu_ops: float
    sfu_ops: float
    t_mem: float
    t_tc: float
    t_alu: float
    t_sfu: float
    efficiency: float
    latency: float
    time: float
    t_l2: float = 0.0  # L2 → SM delivery of every byte the programs load (traffic.l2_time)
    t_chain: float = 0.0  # the programs' loop steps one after another, a memory latency or more each
    work: float = 0.0  # the time the units need, before the chain's bound (ranks plans it ties)

    def __str__(self) -> str:
        return (f"kernel {self.name}: {self.programs} programs, {self.iterations:.1f} loop tiles each, "
                f"{self.hbm_bytes / 1e6:.3f} MB HBM, predicted {self.time * 1e6:.2f} µs "
                f"(mem {self.t_mem * 1e6:.2f}, tensor {self.t_tc * 1e6:.2f}, alu {self.t_alu * 1e6:.2f}, "
                f"sfu {self.t_sfu * 1e6:.2f}, L2 {self.t_l2 * 1e6:.2f}, steps {self.t_chain * 1e6:.2f} µs; "
                f"fill {self.efficiency:.0%})")


@dataclass
class Cost:
    kernels: list[KernelCost] = field(default_factory=list)

    @property
    def time(self) -> float:
        return sum(k.time for k in self.kernels)

    @property
    def rank(self) -> tuple[float, float]:
        """Sort key: the time, then the units' work where the chain bounds plans alike."""
        return self.time, sum(k.work for k in self.kernels)

    @property
    def hbm_bytes(self) -> float:
        return sum(k.hbm_bytes for k in self.kernels)

    @property
    def flops(self) -> float:
        return sum(k.tensor_flops + k.alu_ops for k in self.kernels)

    @property
    def exps(self) -> float:
        return sum(k.sfu_ops for k in self.kernels)

    def terms(self) -> dict[str, float]:
        return {
            "time_us": self.time * 1e6,
            "hbm_MB": self.hbm_bytes / 1e6,
            "tensor_GFLOP": sum(k.tensor_flops for k in self.kernels) / 1e9,
            "alu_Gop": sum(k.alu_ops for k in self.kernels) / 1e9,
            "sfu_Gop": self.exps / 1e9,
            "launches": len(self.kernels),
            "programs": sum(k.programs for k in self.kernels),
        }
