"""Run a bench script with each Triton kernel compile of neptune_eq timed and printed (kernel name,
stages, seconds), and Python's stacks dumped every `--every` seconds: for finding where a first call
spends its time on the GPU host.

    python bench/compile_trace.py [--every 60] SCRIPT [ARGS...]
"""

from __future__ import annotations

import faulthandler
import runpy
import sys
import time

from neptune_eq.lower import launch


def main() -> None:
    args = sys.argv[1:]
    every = 60.0
    if args[:1] == ["--every"]:
        every, args = float(args[1]), args[2:]
    fitting = launch.launch_fitting

    def timed(fn, grid, argv, kw, name):
        t = time.time()
        out = fitting(fn, grid, argv, kw, name)
        print(f"[compile] {name} grid {grid} {kw}: {time.time() - t:.1f} s", flush=True)
        return out

    launch.launch_fitting = timed
    faulthandler.dump_traceback_later(every, repeat=True)
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
