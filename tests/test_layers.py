"""The layers point one way, and nothing imports in a circle (docs/design.md, "Layers").

The import graph is derived from the source, not from what a process happens to load: every
``import`` and ``from ... import`` statement counts, at module level, under ``TYPE_CHECKING`` and
inside functions. ``from pkg import name`` is an edge to the module ``pkg.name`` when there is one,
else to ``pkg`` itself (its ``__init__``). A module may import only what its layer's rule allows
(the longest matching prefix in ``RULES`` decides), and the graph has no cycle at all.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "dledger", "broker", "namesrv", "client", "cli", "chaos", "bench", "tests",
            "examples")

# module prefix -> the first-party prefixes its modules may import (the longest prefix wins).
# Bottom to top: protocol; the Raft core; the log; the broker (core, features, API, front ends,
# the shell); the client beside the broker, on protocol alone; the NameServer, the CLI, the
# chaos suite and the benchmarks on top.
LOG = ("protocol", "dledger")
RULES: dict[str, tuple[str, ...]] = {
    "protocol": ("protocol",),
    "dledger.raft": ("dledger.raft", "protocol.errors"),
    "dledger": LOG,
    "broker": (*LOG, "broker", "client"),
    "client": ("protocol", "client"),
    "namesrv": (*LOG, "namesrv", "client", "broker"),
    "chaos": (*LOG, "broker", "namesrv", "client", "chaos"),
    "cli": (*LOG, "broker", "namesrv", "client", "chaos", "cli"),
    "cli.bench": (*LOG, "broker", "namesrv", "client", "chaos", "cli", "bench"),  # dledger bench
    "bench": (*LOG, "broker", "namesrv", "client", "chaos", "cli", "bench"),
    "examples": ("client", "protocol", "examples"),
    "tests": PACKAGES,
}


def modules(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the first-party packages."""
    found: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _targets(node: ast.Import | ast.ImportFrom, name: str, path: Path,
             known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def import_graph(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    """module -> the first-party modules it imports (the longest known prefix of each name)."""
    known = modules(root, packages)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(node, name, path, known):
                parts = target.split(".")
                while parts and ".".join(parts) not in known:
                    parts.pop()
                if parts and ".".join(parts) != name:
                    edges.add(".".join(parts))
        graph[name] = edges
    return graph


def _rule(module: str) -> tuple[str, ...] | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        allowed = RULES.get(".".join(parts[:n]))
        if allowed is not None:
            return allowed
    return None


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, edges in sorted(graph.items()):
        allowed = _rule(module)
        if allowed is None:
            out.append(f"{module}: no layer rule covers it")
            continue
        out.extend(f"{module} imports {t} (its layer may import {', '.join(allowed)})"
                   for t in sorted(edges) if not any(_within(t, a) for a in allowed))
    return out


def circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every strongly connected component of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[tuple[str, ...]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(tuple(sorted(component)))
    return found


def test_every_import_follows_the_layers() -> None:
    graph = import_graph()
    assert len(graph) > 300, "the source tree was not found"
    assert layer_violations(graph) == []


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_the_client_library_stands_on_protocol_alone() -> None:
    graph = import_graph()
    reached = {"client"}
    todo = ["client"]
    while todo:
        for t in graph[todo.pop()]:
            if t not in reached:
                reached.add(t)
                todo.append(t)
    assert sorted(m for m in reached if m.split(".")[0] not in ("client", "protocol")) == []


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_fire_on_an_upward_import_and_on_a_circle(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "protocol/__init__.py": "",
        "protocol/frames.py": "def f():\n    from client import alpha\n",  # upward, lazily
        "client/__init__.py": "",
        "client/alpha.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from client import beta\n",
        "client/beta.py": "from . import alpha\n",  # relative, closing a circle
        "dledger/__init__.py": "",
        "dledger/raft/__init__.py": "",
        "dledger/raft/core.py": "import dledger.node\n",  # the pure core reaching up
        "dledger/node.py": "from protocol.frames import f\n",
    })
    graph = import_graph(tmp_path, ("protocol", "client", "dledger"))
    found = layer_violations(graph)
    assert "protocol.frames imports client.alpha (its layer may import protocol)" in found
    assert any(v.startswith("dledger.raft.core imports dledger.node") for v in found)
    assert not any(v.startswith("dledger.node ") for v in found)  # the log may use protocol
    assert circles(graph) == [("client.alpha", "client.beta")]


MODULE_LINES_MAX = 450  # a module a reader takes in at once (docs/design.md, "Small modules")
FOLDER_MODULES_MAX = 20  # modules directly in one package folder (tests/ mirrors them: not counted)


def oversized(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> list[str]:
    """The modules over ``MODULE_LINES_MAX`` lines, and the source folders (not ``tests``) holding
    more than ``FOLDER_MODULES_MAX`` modules directly."""
    found = []
    folders: dict[Path, int] = {}
    for name, path in modules(root, packages).items():
        lines = len(path.read_text().splitlines())
        if lines > MODULE_LINES_MAX:
            found.append(f"{path.relative_to(root)}: {lines} lines")
        if path.name != "__init__.py" and name.split(".")[0] != "tests":
            folders[path.parent] = folders.get(path.parent, 0) + 1
    found += [f"{folder.relative_to(root)}/: {n} modules" for folder, n in sorted(folders.items())
              if n > FOLDER_MODULES_MAX]
    return found


def test_no_module_or_source_folder_is_oversized() -> None:
    assert oversized() == []


def test_the_size_check_fires(tmp_path: Path) -> None:
    _tree(tmp_path, {"client/__init__.py": "", "client/long.py": "x = 1\n" * 451,
                     **{f"client/m{k}.py": "" for k in range(20)}})
    assert oversized(tmp_path, ("client",)) == ["client/long.py: 451 lines", "client/: 21 modules"]
