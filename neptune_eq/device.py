"""Device specs for the cost model: what one GPU can do per second, and a few calibration factors.

The H100 numbers are measurements on the lent H100 (80 GB HBM3, 132 SMs) where we have them
(copy bandwidth 3.0 TB/s counting read + write, bf16 matmul 798 TFLOP/s on 8192³; KINDS.md,
2026-11-13) and datasheet rates otherwise. `from_torch()` reads the SM count, L2 size and clock
of the GPU present and scales the H100 rates by SM count × clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    sms: int
    clock_hz: float
    hbm_bytes_per_s: float
    l2_bytes: int
    tensor_flops: float  # fp16/bf16 dense, fp32 accumulate
    fma_per_sm_per_clk: float = 128.0  # fp32 lanes
    sfu_per_sm_per_clk: float = 16.0  # MUFU ops
    # calibrated on 96 measured (op, size, plan) points on an H200 (bench/calibrate.py, 2026-11-21):
    launch_s: float = 8e-6  # per kernel launch, including the wait on the previous kernel
    sm_stream_bytes_per_s: float = 50e9  # what one program streams when it runs alone (latency-bound)
    overlap: float = 0.5  # fraction of non-dominant work that does not overlap the dominant unit
    # what one program's loads wait for: a program streams about (bytes in flight) / latency
    mem_latency_s: float = 1.0e-6
    # a reduction of a loop state across a program's warps (shared memory between two barriers), as it
    # bounds a loop's step (extract/cost.py's chain). Estimated, not micro-benchmarked: from the loops of
    # bench/sweep_unseen.py on the H100 (2026-11-27; a step of two reductions ran ~1.1 µs, of five ~3.4)
    reduce_latency_s: float = 0.5e-6
    # what L2 delivers to the SMs (every program re-reading one 16 MiB buffer: 8.3-8.8 TB/s on an H200,
    # the H100's GH100 die, bench/microbench.py l2, 2026-11-27): a K-loop tile of 64 rows re-reads the
    # weight of linear cross-entropy from L2 twice as often as one of 128 and ran 17.4 against 13.4 ms
    l2_read_bytes_per_s: float = 8.5e12
    # what a loop bound worked out per call (lower/databounds.bound_tensor) costs the call whatever it
    # saves: a few dozen small torch operations (replayed from a CUDA graph, lower/replay.py) the kernel
    # waits on, and the checked launch path (a call with such a table does not bind its launches).
    # Measured on an H100 (2026-12-06, bench/probe_step_host.py, probe_sweep_kernels.py): the MoE router
    # losses' forward, one such kernel, took 352 µs of host a call where a bound call takes 35-70, and
    # its training step ~300 µs of device time in those operations against 82 µs for all its kernels.
    # 0: every such loop bounded (the data are known to leave tiles out)
    data_bound_call_s: float = 150e-6
    # a row held whole (a resident schedule) over a dynamic axis: its one tile is masked by a length that
    # is no constexpr, so no access along it is proven aligned and every load and store runs scalar.
    # Measured on an H100 (2026-12-07, bench/probe_dynamic_vectorise.py, softmax of 32768 fp16 rows, a
    # resident row dynamic against static): 3.3× at 8192, 3.0× at 3000, 1.9× at 5000 (there static
    # vectorises 8-wide only)
    scalar_row_slowdown: float = 3.0
    # what a library GEMM (lower/library.py) costs the host beyond a bound Triton launch: torch.matmul's
    # dispatch and the views of the call's tensors it runs on. Until session 69 such a plan kept the
    # checked path (124 µs a call against a bound call's 48-54, H100, 2026-11-24: priced 60 µs); now it
    # binds too. Estimated, not micro-benchmarked
    library_call_s: float = 10e-6
    # the fraction of the FMA pipe's peak (at the clock above) a float32 IEEE tl.dot sustains, and the
    # vendor's SGEMM (cuBLAS at torch's default float32 precision, TF32 off). Micro-benchmarked on an
    # H100 (bench/probe_fp32_dot.py, 4096³, 2026-12-06): torch.mm 51.7 TF/s of 59.3 (0.87); Triton 3.6's
    # IEEE dot in a plain GEMM 32.2-45.5 TF/s by tile (0.54 at 128×128×16 … 0.77 at 64×64×32). Fused
    # kernels sustain far less (fp32 attention's one-pass kernel, 32 heads × 4096² × d 128: 0.86 TF/s,
    # 0.015; bench/probe_fp32_attention.py), which one constant does not model: the plain GEMM's lower
    # end, rounded down. (At 0.65 CLIP's loss chose a forward fusing more IEEE products into one
    # kernel and ran 19.8 ms against 12.9 at 0.5, H100, session 65.)
    fma_dot_efficiency: float = 0.5
    sgemm_efficiency: float = 0.87
    # the fraction of the TF32 tensor-core rate (tensor_flops / 2) Triton's tl.dot reaches on float32
    # operands in TF32, and in TF32×3 (three TF32 products, counted as such), with B stored K-major (its
    # contraction axis contiguous, as attention's Kᵀ) and otherwise (B's rows along K, as attention's V,
    # or computed). Micro-benchmarked on an H100 (bench/probe_fp32_dot.py --tf32, 4096³, 2026-12-06):
    # TF32 291.6 / 83.7 TF/s K- / N-major at 128×128×32 (0.74 / 0.21 of 395); TF32×3 78.8-95.4 /
    # 36.1-40.1 TF/s of products (0.60-0.72 / 0.27-0.30 for the three): the lower ends
    tf32_dot_efficiency: float = 0.74
    tf32_dot_efficiency_n_major: float = 0.21
    tf32x3_dot_efficiency: float = 0.6
    tf32x3_dot_efficiency_n_major: float = 0.27
    smem_per_sm: int = 228 * 1024
    regs_per_sm: int = 65536

    def tf32_efficiency(self, precision: str, k_major: bool) -> float:
        """The share of the TF32 rate a float32 tl.dot at `precision` ("tf32" / "tf32x3") reaches."""
        if precision == "tf32":
            return self.tf32_dot_efficiency if k_major else self.tf32_dot_efficiency_n_major
        return self.tf32x3_dot_efficiency if k_major else self.tf32x3_dot_efficiency_n_major

    @property
    def fma_per_s(self) -> float:
        return self.sms * self.clock_hz * self.fma_per_sm_per_clk

    @property
    def sfu_per_s(self) -> float:
        return self.sms * self.clock_hz * self.sfu_per_sm_per_clk

    def scaled(self, **kw) -> DeviceSpec:
        return replace(self, **kw)


H100 = DeviceSpec(
    name="NVIDIA H100 80GB HBM3",
    sms=132,
    clock_hz=1.755e9,
    hbm_bytes_per_s=3.0e12,
    l2_bytes=50 * 1024 * 1024,
    tensor_flops=790e12,
)


def from_torch(default: DeviceSpec = H100) -> DeviceSpec:
    """The spec of the current CUDA device, or `default` when there is none."""
    try:
        import torch

        if not torch.cuda.is_available():
            return default
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
    except Exception:  # pragma: no cover - no usable torch/cuda
        return default
    clock = getattr(p, "clock_rate", 0) * 1e3 or default.clock_hz
    scale = (p.multi_processor_count * clock) / (default.sms * default.clock_hz)
    l2 = getattr(p, "L2_cache_size", 0) or default.l2_bytes
    bw = default.hbm_bytes_per_s
    mem_clock, bus = getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0)
    if mem_clock and bus:  # peak = 2 transfers per clock × bus width; copies reach about 85% of it
        bw = 0.85 * 2 * mem_clock * 1e3 * bus / 8
    return replace(default, name=p.name, sms=p.multi_processor_count, clock_hz=clock,
                   tensor_flops=default.tensor_flops * scale, l2_bytes=l2, hbm_bytes_per_s=bw,
                   l2_read_bytes_per_s=default.l2_read_bytes_per_s * scale)
