"""docs/design.md's layer list is the truth: every module is in it once, and nothing imports upward.

The doc holds one fenced ``layers`` block, bottom layer first, one ``layer: module module ...`` line
per layer. This test reads it and checks it against the package on disk and against each module's
imports (read with :mod:`ast`, at module level and inside functions; ``if TYPE_CHECKING:`` blocks
are skipped, as they never run):

- every module under ``eventguard/`` is listed exactly once, and every listed module exists;
- no module imports an eventguard module of a higher layer (its own layer is fine), except the
  pairs the doc lists under "Known upward imports" (exactly those: a new one fails, and so does
  a listed one that is gone);
- only the host adapter and the test kit import the host (``agent_framework*``,
  ``azure.ai.agentserver``), and only the test kit, the demo and the CLI import ``uvicorn`` and
  ``openai``;
- every file and name the doc quotes in backticks in "Where a change goes" and after still exists;
- importing the store loads the SQL layer, never the sink (a package's ``__init__`` runs on the way
  to any of its modules, which the import check above does not see).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "eventguard"
DESIGN = ROOT / "docs" / "design.md"

#: Who may import the host's packages, and who may import uvicorn/openai (module-name prefixes).
HOST_PACKAGES = ("agent_framework", "azure.ai.agentserver")
# eventguard.provider implements the host's ResponseProviderProtocol and must raise its exception
# classes (the host catches ResponseAlreadyExistsError by class); eventguard.envelopes defines
# ProviderStorageError, a ResponseStoreCorruptionError to the host.
HOST_IMPORTERS = (
    "eventguard.foundry",
    "eventguard.agent_sessions",
    "eventguard.provider",
    "eventguard.envelopes",
    "eventguard.testing",
    "eventguard.demo",
)
CLIENT_PACKAGES = ("uvicorn", "openai")
CLIENT_IMPORTERS = ("eventguard.testing", "eventguard.demo", "eventguard.cli")


def _fenced(text: str, tag: str) -> str:
    blocks = re.findall(rf"^```{tag}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"docs/design.md must hold exactly one ```{tag} block"
    return blocks[0]


@cache
def layers() -> dict[str, int]:
    """Module name -> layer number (0 = bottom), from the doc's ```layers block."""
    found: dict[str, int] = {}
    lines = [line.split("#", 1)[0].strip() for line in _fenced(DESIGN.read_text(), "layers").splitlines()]
    for number, line in enumerate(line for line in lines if line):
        name, sep, modules = line.partition(":")
        assert sep and name.strip() and modules.split(), f"not a `layer: modules` line: {line!r}"
        for module in modules.split():
            assert module not in found, f"{module} is listed twice in docs/design.md"
            found[module] = number
    return found


@cache
def known_upward() -> frozenset[tuple[str, str]]:
    """The doc's ```upward block: ``importer -> imported`` lines, the upward imports we live with."""
    pairs = set()
    for line in _fenced(DESIGN.read_text(), "upward").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            importer, arrow, imported = line.partition("->")
            assert arrow, f"not an `importer -> imported` line: {line!r}"
            pairs.add((importer.strip(), imported.strip()))
    return frozenset(pairs)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package on disk: dotted name -> file (a package is its __init__.py)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(nodes: list[ast.stmt]):
    """Every node that runs: all but the body of an ``if TYPE_CHECKING:`` (its else runs)."""
    for node in nodes:
        if _is_type_checking(node):
            assert isinstance(node, ast.If)
            yield from _walk(node.orelse)
            continue
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from _walk([child])
            else:
                yield from ast.walk(child)


@cache
def imports(module: str) -> frozenset[str]:
    """Every module ``module`` imports at run time, as dotted names (``from a import b``: a, or a.b)."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _walk(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules() else source)
    return frozenset(found)


def internal_imports(module: str) -> set[str]:
    """The eventguard modules ``module`` imports (the nearest existing module of each name)."""
    found = set()
    for name in imports(module):
        while name and name not in modules():
            name = name.rpartition(".")[0]
        if name.startswith("eventguard") and name != module:
            found.add(name)
    return found


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") or module.startswith(p + "_") for p in prefixes)


def test_every_module_is_listed_once() -> None:
    unlisted = sorted(set(modules()) - set(layers()))
    assert not unlisted, f"add these to the layers block of docs/design.md: {unlisted}"


def test_every_listed_module_exists() -> None:
    missing = sorted(set(layers()) - set(modules()))
    assert not missing, f"docs/design.md lists modules that do not exist: {missing}"


def test_known_upward_imports_are_listed_modules() -> None:
    for importer, imported in known_upward():
        assert importer in layers() and imported in layers(), (importer, imported)
        assert layers()[imported] > layers()[importer], f"{importer} -> {imported} is not upward"


def upward_imports() -> set[tuple[str, str]]:
    level = layers()
    return {
        (module, imported)
        for module in modules()
        if module in level
        for imported in internal_imports(module)
        if imported in level and level[imported] > level[module]
    }


def test_nothing_imports_upward() -> None:
    new = sorted(upward_imports() - known_upward())
    assert not new, f"modules import a higher layer (see docs/design.md): {new}"


def test_known_upward_imports_still_exist() -> None:
    gone = sorted(known_upward() - upward_imports())
    assert not gone, f"fixed: remove these from docs/design.md's upward block: {gone}"


@pytest.mark.parametrize(
    ("packages", "allowed"),
    [(HOST_PACKAGES, HOST_IMPORTERS), (CLIENT_PACKAGES, CLIENT_IMPORTERS)],
    ids=["host", "uvicorn-openai"],
)
def test_third_party_imports_stay_at_the_edge(packages: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    offenders = sorted(
        (module, name)
        for module in modules()
        if not _under(module, allowed)
        for name in imports(module)
        if _under(name, packages)
    )
    assert not offenders, f"only {allowed} may import {packages}: {offenders}"


def test_the_parser_sees_function_level_imports_and_skips_type_checking() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from eventguard.store import ResponseStore\n"
        "def f():\n    from eventguard.sink import SqlSink\n    import eventguard.verify\n"
    )
    tree = ast.parse(source)
    names = {
        node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        for node in _walk(tree.body)
        if isinstance(node, ast.Import | ast.ImportFrom)
    }
    assert names == {"typing", "eventguard.sink", "eventguard.verify"}


@cache
def _words() -> frozenset[str]:
    """Every identifier-like word in the package, its tests and its migrations."""
    text = "\n".join(
        path.read_text()
        for folder in ("eventguard", "tests", "migrations")
        for path in (ROOT / folder).rglob("*.py")
    )
    return frozenset(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def _stale(token: str) -> bool:
    """Whether a name the doc quotes in backticks is gone from the code (a file, or a word in it)."""
    if "<" in token:  # a template, such as eventguard/cli/<name>.py
        return False
    if "/" in token or token.endswith(".py"):
        bare = token.rstrip("/")
        return not (
            (ROOT / bare).exists()
            or (PACKAGE / bare).exists()
            or any(PACKAGE.rglob(bare))
            or any(ROOT.glob(bare))
        )
    token = token.lstrip("@").split("(", 1)[0]
    return any(word not in _words() for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", token))


def test_the_names_the_doc_quotes_still_exist() -> None:
    """Where a change goes, the vocabulary and the known inconsistencies name files and names that exist."""
    text = DESIGN.read_text()
    checked = text[text.index("\n## 2.") :]
    stale = sorted({token for token in re.findall(r"`([^`\n]+)`", checked) if _stale(token)})
    assert not stale, f"docs/design.md names what the code no longer has: {stale}"


def test_importing_the_store_does_not_load_the_sink() -> None:
    """The store reads through ``eventguard.sql`` only: ``import eventguard.store`` in a fresh
    interpreter leaves ``eventguard.sink`` (and its writer) unloaded."""
    code = (
        "import sys, eventguard.store\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[:2] == ['eventguard', 'sink'])\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
