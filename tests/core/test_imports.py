"""The core's modules import each other in one direction: no circle, and no import inside a
function (the way a circle is usually hidden)."""

import ast
from pathlib import Path

import attnzoo.core

CORE = Path(attnzoo.core.__file__).parent


def core_imports(tree: ast.Module) -> set[str]:
    """Names of the attnzoo.core modules a module imports anywhere in its source."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "attnzoo.core":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("attnzoo.core."):
                found.add(node.module.removeprefix("attnzoo.core."))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("attnzoo.core."):
                    found.add(alias.name.removeprefix("attnzoo.core."))
    return found


def test_no_import_inside_a_function():
    for path in CORE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = [n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
                assert not inner, f"{path.name}: import inside {node.name}()"


def test_core_modules_import_each_other_without_a_circle():
    modules = {p.stem for p in CORE.glob("*.py") if p.stem != "__init__"}
    graph = {m: core_imports(ast.parse((CORE / f"{m}.py").read_text())) & modules for m in modules}
    assert graph["types"] == set()  # the leaf every other module may name
    done, path = set(), []

    def visit(module):
        assert module not in path, " -> ".join([*path, module])
        if module in done:
            return
        path.append(module)
        for imported in graph[module]:
            visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(modules):
        visit(module)
