"""Snapshots of what the compiler emits for the examples: the chosen plan and its Triton source.

A refactor that changes either shows up here as a diff; `pytest --update-snapshots` rewrites them.
"""

from pathlib import Path

import pytest
from helpers import load_example

from neptune_eq.runtime import compile_ir

SNAPSHOTS = Path(__file__).parent / "snapshots"
EXAMPLES = ["softmax", "logsumexp", "log_softmax", "attention", "causal_attention", "naive_attention",
            "decode_attention", "rmsnorm_matmul"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_snapshot(name, update_snapshots):
    prog = compile_ir(load_example(name))
    text = "\n".join([
        f"# {name}: {prog.alternative.structure}",
        "", "## derivation", *prog.plan.derivation,
        "", "## plan", prog.plan.show(),
        "", "## triton (cuda target)", prog.source,
    ])
    path = SNAPSHOTS / f"{name}.txt"
    if update_snapshots or not path.exists():
        path.write_text(text)
        if not update_snapshots:
            pytest.skip(f"wrote new snapshot {path.name}")
    assert text == path.read_text(), f"{name}: output changed; review and run pytest --update-snapshots"
