"""Shared test helpers (tests/ is on sys.path under pytest's default import mode)."""

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def load_example(name: str, attr: str = "program"):
    return runpy.run_path(str(EXAMPLES / f"{name}.py"))[attr]
