"""The read bandwidth this GPU reaches under the benchmark's timing (do_bench, L2 flushed): the
ceiling a decode kernel, which streams K and V once, can approach.

    python bench/bandwidth.py            # the bytes each DC case reads at its largest L

torch.sum over a contiguous fp16 tensor of the case's Q+K+V+O bytes (a streaming read, one
tiny write) and a device-to-device copy of half as many bytes (read + write).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from cases import DC_SIZES, HEADS, Case  # noqa: E402


def main() -> int:
    from triton.testing import do_bench

    print(torch.cuda.get_device_name())
    for op in [o for o in HEADS if o.endswith("_dc")]:
        case = Case(op, DC_SIZES[-1])
        n = int(case.io_bytes()) // 2
        x = torch.empty(n, dtype=torch.float16, device="cuda").normal_()
        ms = do_bench(lambda x=x: x.sum(), return_mode="median")
        y = torch.empty(n // 2, dtype=torch.float16, device="cuda")
        src = x[: n // 2]
        ms_copy = do_bench(lambda y=y, src=src: y.copy_(src), return_mode="median")
        gbps = 2 * n / (ms * 1e-3) / 1e9  # bytes over seconds
        gbps_copy = 2 * n / (ms_copy * 1e-3) / 1e9
        print(f"{case.label}: {2 * n / 1e6:.0f} MB  sum {ms * 1e3:.1f} µs = {gbps:.0f} GB/s;  "
              f"copy {ms_copy * 1e3:.1f} µs = {gbps_copy:.0f} GB/s (read + write)")
        del x, y, src
    return 0


if __name__ == "__main__":
    sys.exit(main())
