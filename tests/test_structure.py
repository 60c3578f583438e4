"""Folders are layers and arrows point down: rules/ (rewrite data and its checks) imports neither
extract/ nor fusion/, and no module of rules/, extract/ or fusion/ imports anything that imports
its own folder back. Imports are read from the source (ast), including those inside functions."""

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("neptune_eq.rules", "neptune_eq.extract", "neptune_eq.fusion")


def _folders() -> dict[str, Path]:
    """Package name → folder, from pyproject's package-dir (rules/ and extract/ live at the top)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {pkg: ROOT / d for pkg, d in cfg.items()}


def _modules() -> dict[str, Path]:
    """Every module of the neptune_eq namespace → its file."""
    folders = _folders()
    out = {}
    for pkg, folder in folders.items():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([pkg, *parts])
            owner = max((p for p in folders if name == p or name.startswith(p + ".")), key=len)
            if owner == pkg:  # (a name mapped to another folder is not read from a subfolder of this one)
                out[name] = f
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The neptune_eq modules `name` imports: `from pkg import mod` imports pkg.mod, and pkg itself
    (its __init__) only where a name taken from it is not a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            subs = [f"{base}.{a.name}" for a in node.names]
            targets = [*subs, *([base] if not all(t in modules for t in subs) else [])]
        else:
            continue
        out |= {t for t in targets if t in modules}
    return out


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for n in graph[stack.pop()]:
            if n not in seen:
                seen.add(n)
                stack.append(n)
    return seen


def _layer(module: str) -> str | None:
    return next((p for p in LAYERS if module == p or module.startswith(p + ".")), None)


def layering_problems(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for m in sorted(graph):
        if _layer(m) == "neptune_eq.rules":
            for up in sorted(n for n in _reach(graph, m) if _layer(n) in ("neptune_eq.extract", "neptune_eq.fusion")):
                problems.append(f"{m} (rules/) depends on {up}")
    for m in sorted(graph):
        own = _layer(m)
        if own is None:
            continue
        for imp in sorted(graph[m]):
            if _layer(imp) == own:
                continue
            back = sorted(n for n in _reach(graph, imp) if _layer(n) == own)
            if back:
                problems.append(f"{m} imports {imp}, which imports {own} back ({', '.join(back)})")
    return problems


def test_layers_have_no_cycles():
    modules = _modules()
    assert {"neptune_eq.rules.algebra", "neptune_eq.extract.plans", "neptune_eq.fusion.search"} <= set(modules)
    assert layering_problems(_graph(modules)) == []


@pytest.mark.parametrize("edge", [("neptune_eq.rules.base", "neptune_eq.fusion.types"),
                                  ("neptune_eq.extract.view", "neptune_eq.fusion.correction"),
                                  ("neptune_eq.rules.soundness", "neptune_eq.pipeline")])
def test_a_cycle_is_caught(edge):
    """The check sees a cycle when one import is added (directly, or through a module above)."""
    graph = _graph(_modules())
    graph[edge[0]].add(edge[1])
    assert layering_problems(graph)


def test_rules_hold_rules_not_searches():
    """rules/ defines rules and checks them; the searches (saturating, extracting) live in fusion/."""
    for name, path in _modules().items():
        if _layer(name) == "neptune_eq.rules":
            src = path.read_text()
            assert "class FusionSearch" not in src and "class CorrectionSearcher" not in src, name
