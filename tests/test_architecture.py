"""Keeps the pure modules pure: the Raft core and the broker's state machine import nothing with
I/O, time or global randomness (docs/design.md). Checked on the source, so a lazy
import inside a function counts."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PURE_PACKAGES = [ROOT / "dledger" / "raft"]
# The broker's state machine and what it is made of (its server, the shell, is not pure).
PURE_BROKER_MODULES = (
    "broker.core.applied", "broker.core.codec", "broker.core.consumequeue", "broker.core.dedup",
    "broker.core.dedup_restore", "broker.core.dedup_format",
    "broker.core.offsets",
    "broker.core.entries", "broker.core.registry", "broker.core.state",
    *(f"broker.features.{f}.{part}" for f, parts in {
        "acl": ("model", "entries", "apply"), "admin": ("model", "entries", "apply"),
        "delay": ("model", "entries", "apply"), "orderly": ("model", "entries", "apply"),
        "pop": ("model", "entries", "apply"), "retry": ("model",),
        "txn": ("model", "entries", "apply")}.items() for part in parts),
    "broker.machine.kinds", "broker.machine.legacy", "broker.machine.parts", "broker.machine.state",
    "broker.machine.snapshot_view",
)
PURE_PACKAGE_NAMES = ("dledger.raft", *PURE_BROKER_MODULES)
# First-party modules a pure module may import (themselves checked the same way).
PURE_FIRST_PARTY = {"protocol.errors", "protocol.auth_rules", "protocol.topics", "protocol.broker_errors",
                    "protocol.filter_sql", "protocol.broker_kinds", "protocol.consume_rules",
                    "protocol.int_property"}
ALLOWED_STDLIB = {"__future__", "collections", "dataclasses", "enum", "typing", "abc", "functools",
                  "itertools", "bisect", "heapq", "math", "operator", "re", "zlib", "struct",
                  "array", "hashlib",  # (hashlib: digests of bytes, e.g. the dedup fingerprints)
                  "cbor2"}  # cbor2: a pure encoder/decoder of bytes (the entry codec)
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__"}


def _pure_files() -> list[Path]:
    files = [f for pkg in PURE_PACKAGES for f in sorted(pkg.rglob("*.py"))]
    files += [ROOT / (m.replace(".", "/") + ".py") for m in (*PURE_FIRST_PARTY, *PURE_BROKER_MODULES)]
    return files


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _runtime_imports(tree: ast.Module) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if _is_type_checking_block(node):
            return  # imports for annotations only never run
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    bad = []
    for name, line in _runtime_imports(tree):
        top = name.split(".")[0]
        if top in ("dledger", "broker", "protocol"):
            ok = name.startswith(PURE_PACKAGE_NAMES) or name in PURE_FIRST_PARTY
        else:
            ok = top in ALLOWED_STDLIB
        if not ok:
            bad.append(f"{where}:{line} imports {name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in FORBIDDEN_CALLS:
            bad.append(f"{where}:{node.lineno} calls {node.func.id}()")
    return bad


def test_raft_core_and_broker_state_import_nothing_with_io_time_or_global_randomness() -> None:
    files = _pure_files()
    assert len(files) >= 30, files
    problems = [v for f in files for v in violations(f)]
    assert problems == []


def test_the_checker_fires_on_an_impure_module(tmp_path: Path) -> None:
    bad = tmp_path / "impure.py"
    bad.write_text("import os\nimport random\nfrom time import monotonic\n"
                   "def f():\n    import asyncio\n    print(open('x'))\n")
    found = " ".join(violations(bad))
    for needle in ("imports os", "imports random", "imports time", "imports asyncio",
                   "calls open()", "calls print()"):
        assert needle in found
