"""The shape of gq's code: no import circles between its modules, and no module over 600 lines
(STYLE.md: small modules that each own one thing).

Imports are read from the source (ast), every one of them: at module level, inside functions
and under `if TYPE_CHECKING:`, as each is a dependency all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

GQ = Path(__file__).resolve().parent.parent / "gq"
MAX_LINES = 600
#: Circles allowed for now (none: a new one must be broken, not listed).
KNOWN_CYCLES: set[frozenset[str]] = set()
#: Modules over MAX_LINES that others are splitting (none now).
KNOWN_LONG: set[str] = set()


def _modules() -> dict[str, Path]:
    """Every module of gq by its dotted name (a package by its own name)."""
    out = {}
    for path in sorted(GQ.rglob("*.py")):
        parts = path.relative_to(GQ.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The gq modules `name` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1],
                                 *([base] if base else [])])
            # `from gq.head import jobs` imports the module gq.head.jobs; `from gq.sched
            # import plan` the name plan of the package gq.sched.
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                         for a in node.names)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_scan_sees_imports_of_every_kind() -> None:
    """The scan finds a module-level import, one inside a function, and a package's name."""
    graph = _graph()
    assert "gq.head.jobs" in graph["gq.head.core"]  # from gq.head.jobs import JobTable
    assert "gq.head.gate" in graph["gq.head.core"]  # from gq.head import gate
    assert "gq.sched" in graph["gq.head.core"]  # from gq.sched import Snapshot, plan
    assert "gq.store" in graph["gq.head.jobs"]
    # Function-level ones too: a circle made there is a circle all the same.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        frozenset({"a", "b", "c"})]


def test_no_import_circles() -> None:
    cycles = set(_cycles(_graph()))
    assert cycles - KNOWN_CYCLES == set(), "import circles: " + "; ".join(
        " <-> ".join(sorted(c)) for c in cycles - KNOWN_CYCLES)
    # An allow-listed circle that is gone must leave the list too.
    assert KNOWN_CYCLES - cycles == set(), f"no longer circles: {KNOWN_CYCLES - cycles}"


def test_the_head_s_parts_sit_above_the_job_table() -> None:
    """The job table knows nothing of what uses it: no import of the modules above it."""
    graph = _graph()
    above = {"gq.head.core", "gq.head.daemon", "gq.head.submits", "gq.head.actions",
             "gq.head.listings", "gq.head.admission", "gq.head.nodes"}
    below = {"gq.head.jobs", "gq.head.journal", "gq.head.orders", "gq.head.views",
             "gq.head.index", "gq.head.reasons", "gq.head.limits", "gq.head.gate",
             "gq.head.usage", "gq.head.launches"}
    for name in below:
        assert not graph[name] & above, f"{name} imports {graph[name] & above}"


def test_no_module_over_600_lines() -> None:
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert set(long) - KNOWN_LONG == set(), f"modules over {MAX_LINES} lines: {long}"
