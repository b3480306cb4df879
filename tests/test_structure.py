"""The package's shape (issue 16): module and class sizes, no import cycle, layers that import down only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vime"
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _top_level_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that `name` imports when it is imported (function-local imports are lazy: left out)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    body = ast.parse(path.read_text(encoding="utf-8")).body
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` imports never run
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                stack += node.body + node.orelse
            continue
        if isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def test_no_module_is_over_the_line_limit() -> None:
    over = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {over}"


def test_no_class_is_over_the_line_limit() -> None:
    over = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                if (n := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                    over[f"{path.relative_to(PACKAGE.parent)}:{node.name}"] = n
    assert not over, f"classes over {MAX_CLASS_LINES} lines: {over}"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    mods = _modules()
    known = set(mods)
    edges = {name: _top_level_imports(name, path, known) for name, path in mods.items()}
    # a package's __init__ importing its own submodules is how packages re-export, not a cycle
    for name in edges:
        edges[name] = {t for t in edges[name] if not (mods[name].name == "__init__.py" and t.startswith(name + "."))}
    assert _cycles(edges) == []


@pytest.mark.parametrize("layer", ["vime.orchestrator", "vime.rollout", "vime.algo", "vime.weight_sync"])
def test_the_loop_never_imports_a_backend(layer: str) -> None:
    """DESIGN.md: the orchestrator, rollout and algo layers get backends passed in."""
    mods = _modules()
    known = set(mods)
    for name, path in mods.items():
        if name == layer or name.startswith(layer + "."):
            bad = {t for t in _top_level_imports(name, path, known) if t.startswith(("vime.sim", "vime.real"))}
            assert not bad, f"{name} imports {sorted(bad)}"
