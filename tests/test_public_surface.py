"""The public surface of ``eventguard``: its names, their docstrings, its version, what importing costs.

The exported-members test follows httpx's ``tests/test_exported_members.py``: adding or removing a
public name means changing the pinned list here, on purpose.
"""

from __future__ import annotations

import builtins
import inspect
import re
import subprocess
import sys
import types
from importlib.metadata import version
from pathlib import Path

import pytest

import eventguard
import eventguard.envelopes
import eventguard.errors
import eventguard.lifecycle
import eventguard.recording
import eventguard.records
import eventguard.sql.engine
import eventguard.sql.transactions
import eventguard.store

#: Every public name of ``eventguard``, in ``__all__``'s order (constants, classes, then the rest).
EXPORTED = [
    "ALLOWED_TRANSITIONS",
    "ENDED_STATES",
    "TERMINAL_STATES",
    "Anomaly",
    "AnomalyKind",
    "AnomalyRecord",
    "Attempt",
    "BadDatabaseURL",
    "BadSpoolPath",
    "Cause",
    "DatabaseUnavailableError",
    "Decision",
    "Ending",
    "ErrorInfo",
    "EventFilter",
    "EventGuardError",
    "EventRecord",
    "Flags",
    "Forward",
    "Guard",
    "GuardAlreadyUsed",
    "GuardOptions",
    "GuardOutsideLoop",
    "History",
    "IllegalTransition",
    "InvalidEvent",
    "InvalidQueryError",
    "Lifecycle",
    "NotAsyncIterable",
    "Page",
    "PruneResult",
    "Recorder",
    "Redactor",
    "ResponseInfo",
    "ResponseRecord",
    "ResponseStore",
    "ResponseStoreError",
    "SchemaMismatchError",
    "Sink",
    "SinkLoopError",
    "SqlAgentSessionStoreProvider",
    "SqlResponseProvider",
    "SqlSink",
    "State",
    "Stats",
    "StorageError",
    "Transition",
    "TransitionRecord",
    "UnstorableError",
    "Usage",
    "__version__",
    "decide",
    "guard",
    "include_object",
    "metadata",
]

#: Exported names that have no docstring yet, each in a module this surface's owner does not edit.
#: Remove a name once its module documents it.
UNDOCUMENTED: set[str] = set()

#: What ``from eventguard import guard`` must not load.
HEAVY = ("sqlalchemy", "alembic", "asyncpg", "aiosqlite")

PACKAGE = Path(eventguard.__file__).parent


def _run(code: str) -> None:
    """Run ``code`` in a fresh interpreter, where nothing has been imported yet."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def _sort_key(name: str) -> tuple[int, str]:
    # isort's order for __all__ (ruff RUF022): CONSTANTS, then Classes, then everything else.
    if name.isupper() and len(name) > 1:
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def test_all_pins_the_exported_names() -> None:
    assert eventguard.__all__ == EXPORTED


def test_all_is_sorted() -> None:
    assert eventguard.__all__ == sorted(eventguard.__all__, key=_sort_key)


def test_every_public_name_of_the_package_is_in_all() -> None:
    public = {
        name
        for name in dir(eventguard)
        if (not name.startswith("_") or name == "__version__")
        and not isinstance(getattr(eventguard, name), types.ModuleType)
    }
    assert public == set(eventguard.__all__)


@pytest.mark.parametrize(
    "module",
    [
        eventguard.sql.engine,
        eventguard.sql.transactions,
        eventguard.envelopes,
        eventguard.errors,
        eventguard.lifecycle,
        eventguard.recording,
        eventguard.records,
        eventguard.store,
    ],
    ids=lambda module: module.__name__,
)
def test_each_module_declares_its_names_in_a_sorted_all(module: types.ModuleType) -> None:
    assert module.__all__ == sorted(module.__all__, key=_sort_key)
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ == module.__name__, f"{name} is defined in {value.__module__}"


@pytest.mark.parametrize("name", EXPORTED)
def test_every_exported_name_resolves(name: str) -> None:
    getattr(eventguard, name)


def _documented_by_comment(name: str) -> bool:
    """A constant or an alias is documented by a ``#:`` comment on the line above its assignment."""
    pattern = re.compile(rf"^#:.*\n{re.escape(name)}\s*[:=]", re.MULTILINE)
    return any(pattern.search(path.read_text(encoding="utf-8")) for path in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("name", sorted(set(EXPORTED) - UNDOCUMENTED - {"__version__"}))
def test_every_exported_name_has_a_docstring(name: str) -> None:
    value = getattr(eventguard, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        doc = vars(value).get("__doc__") if inspect.isclass(value) else value.__doc__
        assert doc, f"{name} has no docstring of its own"
        assert not doc.startswith(f"{name}("), f"{name}'s docstring is the one dataclasses generated"
    else:
        assert _documented_by_comment(name), f"{name} has no '#:' comment above its assignment"


def test_the_errors_docstring_draws_the_whole_hierarchy() -> None:
    """Every error in eventguard.errors is in the tree, under its parent, with its builtin base."""
    drawn: dict[str, tuple[str, str | None]] = {}
    parents = ["EventGuardError"]
    for line in (eventguard.errors.__doc__ or "").splitlines():
        match = re.search(r"[├└]── (\w+)\s*(?:\(also (\w+)\))?", line)
        if match is None:
            continue
        depth = (match.start() - 4) // 4
        del parents[depth + 1 :]
        drawn[match.group(1)] = (parents[depth], match.group(2))
        parents.append(match.group(1))
    assert {"EventGuardError", *drawn} == set(eventguard.errors.__all__)
    for name, (parent, also) in drawn.items():
        bases = [getattr(eventguard.errors, parent)] + ([getattr(builtins, also)] if also else [])
        assert list(getattr(eventguard.errors, name).__bases__) == bases, name


def test_version_is_the_installed_distributions_version() -> None:
    assert eventguard.__version__ == version("eventguard")


def test_importing_guard_loads_neither_sqlalchemy_nor_alembic() -> None:
    _run(
        "import sys\n"
        "from eventguard import guard\n"
        f"loaded = sorted({{m for m in sys.modules if m.split('.')[0] in {set(HEAVY)!r}}})\n"
        "assert not loaded, loaded\n"
    )


def test_the_heavy_names_are_imported_on_first_use() -> None:
    _run(
        "import sys\n"
        "import eventguard\n"
        "assert not {'eventguard.sink', 'eventguard.store', 'eventguard.records'} & set(sys.modules)\n"
        "assert 'SqlSink' in dir(eventguard) and 'ResponseStore' in dir(eventguard)\n"
        "from eventguard.sink import SqlSink\n"
        "assert eventguard.SqlSink is SqlSink\n"
        "from eventguard import ResponseStore\n"
        "from eventguard.store import ResponseStore as direct\n"
        "assert ResponseStore is direct\n"
        "from eventguard.records import History\n"
        "assert eventguard.History is History\n"
    )


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        eventguard.NoSuchName  # noqa: B018


def _own_members(cls: type) -> list[tuple[str, object]]:
    """The public functions and properties a class defines itself (not what it inherits)."""
    members = []
    for attr, value in vars(cls).items():
        if attr.startswith("_"):
            continue
        target = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if inspect.isfunction(target) or isinstance(target, property):
            members.append((f"{cls.__name__}.{attr}", target))
    return members


def _callables_users_call() -> list[tuple[str, object]]:
    """Every exported function, and every public method and property of an exported class, except
    pydantic records (their fields are the docs) and enums (their values are)."""
    from enum import Enum

    from pydantic import BaseModel

    found: list[tuple[str, object]] = []
    for name in sorted(set(EXPORTED) - UNDOCUMENTED - {"__version__"}):
        value = getattr(eventguard, name)
        if inspect.isfunction(value):
            found.append((name, value))
        elif inspect.isclass(value) and not issubclass(value, (BaseModel, Enum)):
            found.extend(_own_members(value))
    return found


@pytest.mark.parametrize(
    ("label", "member"), _callables_users_call(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_public_callable_documents_each_of_its_parameters(label: str, member: object) -> None:
    """help() on a public function or method says what it is and names every parameter it takes."""
    doc = inspect.getdoc(member) or ""
    assert doc.strip(), f"{label} has no docstring"
    if isinstance(member, property):
        return
    assert callable(member)
    unnamed = [
        p
        for p in inspect.signature(member).parameters
        if p not in ("self", "cls") and not re.search(rf"\b{re.escape(p)}\b", doc)
    ]
    assert not unnamed, f"{label}'s docstring does not name {unnamed}"


def _constructors_users_call() -> list[tuple[str, type]]:
    """Exported classes built with arguments of their own (not pydantic records, enums, protocols or
    dataclasses, whose fields carry ``#:`` docs)."""
    import dataclasses
    from enum import Enum
    from typing import Protocol

    from pydantic import BaseModel

    found = []
    for name in sorted(set(EXPORTED) - UNDOCUMENTED - {"__version__"}):
        value = getattr(eventguard, name)
        if not inspect.isclass(value) or issubclass(value, (BaseModel, Enum)):
            continue
        if dataclasses.is_dataclass(value) or Protocol in value.__mro__ or "__init__" not in vars(value):
            continue
        found.append((name, value))
    return found


#: Built by a factory whose docstring names the arguments (Guard by guard()).
BUILT_BY_A_FACTORY = {"Guard"}


@pytest.mark.parametrize(
    ("name", "cls"), _constructors_users_call(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_public_constructor_documents_each_of_its_parameters(name: str, cls: type) -> None:
    """The class's docstring (or its __init__'s) names every argument it is built with."""
    if name in BUILT_BY_A_FACTORY:
        pytest.skip(f"{name} is built by a factory: its docstring says which")
    doc = (inspect.getdoc(cls) or "") + "\n" + (vars(cls)["__init__"].__doc__ or "")
    unnamed = [
        p
        for p in inspect.signature(vars(cls)["__init__"]).parameters
        if p not in ("self", "args", "kwargs") and not re.search(rf"\b{re.escape(p)}\b", doc)
    ]
    assert not unnamed, f"{name}'s docstring does not name {unnamed}"


#: The errors whose ``__init__`` takes fields rather than the message, built as eventguard builds them.
_FIELD_ERRORS: dict[str, BaseException] = {
    "IllegalTransition": eventguard.IllegalTransition(
        eventguard.State.COMPLETED, eventguard.State.IN_PROGRESS, "after the terminal"
    ),
    "SchemaMismatchError": eventguard.SchemaMismatchError(
        "the database is at 0007", current=("0007",), expected=("0008",), command="eventguard db upgrade"
    ),
    "BadDatabaseURL": eventguard.BadDatabaseURL(
        "postgresql://***", "it contains a control or invisible character (\\x00)"
    ),
}


@pytest.mark.parametrize("name", eventguard.errors.__all__)
def test_every_public_error_comes_back_from_pickle_with_its_fields(name: str) -> None:
    """An error sent to another process (a pool's result, a queue) arrives whole: its type, its
    message and each field it was built with; one that takes fields failed to unpickle before."""
    import pickle

    cls = getattr(eventguard.errors, name)
    error = _FIELD_ERRORS.get(name) or cls("what went wrong")
    assert type(error) is cls
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls and str(back) == str(error) and back.args == error.args
    assert vars(back) == vars(error)
