"""The package's import structure (DESIGN.md, "Layers"): no import circle anywhere, function-local
imports included, and the star `core <- {models, tasks, decoding, train, viz} <- runs <- cli`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attnzoo

ROOT = Path(attnzoo.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str) -> set[str]:
    """Every attnzoo module `name` imports, at module level or inside a function."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from attnzoo.core import scores` imports the submodule attnzoo.core.scores;
            # any other name comes from the package itself
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name) for name in MODULES}


def _cycle() -> list[str] | None:
    """One import circle as a path of module names, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(GRAPH):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_graph_sees_imports():
    """The parser must find real edges, or the acyclicity test below could not fail."""
    assert "attnzoo.core.masks" in GRAPH["attnzoo.core.attention"]
    assert any(GRAPH[name] for name in GRAPH if name.startswith("attnzoo.models"))


def test_core_types_is_a_leaf():
    """AttentionOutput and PreparedKey live where every core module may import them."""
    assert GRAPH["attnzoo.core.types"] == set()


def test_no_import_circle():
    assert _cycle() is None, " -> ".join(_cycle())


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "attnzoo"


# layer -> the layers it may import (besides itself)
ALLOWED = {
    "core": set(),
    "decoding": {"core"},
    "viz": {"core"},
    "train": {"core"},
    "config": {"core"},
    "keras": {"core"},  # Keras 3 layers over the core (imported only with Keras installed)
    "models": {"core", "decoding"},
    "tasks": {"core", "decoding", "viz"},
    "rundir": {"core", "config", "train", "models", "tasks"},
    "runs": {"core", "config", "rundir", "train", "viz", "models", "tasks"},
    "repro": {"core"},  # runs benchmarks/ scripts as subprocesses, never imports them
    "cli": {"core", "runs", "models", "tasks", "repro"},
    "attnzoo": {"core"},
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layers(module):
    layer = _layer(module)
    wrong = sorted(m for m in GRAPH[module] if _layer(m) not in ALLOWED[layer] | {layer})
    assert not wrong, f"{module} ({layer}) imports {wrong}"


def test_runs_knows_no_task_or_model_by_name():
    """runs.py reaches tasks and models only through their registries."""
    named = {
        m
        for m in GRAPH["attnzoo.runs"]
        if _layer(m) in ("tasks", "models") and not m.endswith(".registry")
    }
    packages = {"attnzoo.tasks", "attnzoo.models"}
    assert not named - packages, sorted(named - packages)
