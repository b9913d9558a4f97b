"""eventguard: record what an agent server's response stream really did.

The public surface is these names; every module behind them is an implementation detail.

The guard, the lifecycle model, the decision table, every error (:mod:`eventguard.errors`) and
the ``Recorder``/``Sink`` protocols are imported with the package. The heavy parts (the SQL sink
and the store, which load SQLAlchemy and Alembic) and the store's record types are imported on
first use of one of their names, so ``from eventguard import guard`` stays cheap.

For an application that migrates the same database with its own Alembic: ``metadata`` is the
SQLAlchemy ``MetaData`` of eventguard's tables, and ``include_object`` is the one-line filter for its
``env.py`` (``context.configure(..., include_object=eventguard.include_object)``) that keeps its
autogenerate away from them (see :func:`eventguard.sql.migrate.include_object`).
"""

import importlib as _importlib
import typing as _typing
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from eventguard.decision import Decision, Ending, Flags, Forward, decide
from eventguard.errors import (
    BadDatabaseURL,
    BadSpoolPath,
    DatabaseUnavailableError,
    EventGuardError,
    GuardAlreadyUsed,
    GuardOutsideLoop,
    IllegalTransition,
    InvalidEvent,
    InvalidQueryError,
    NotAsyncIterable,
    ResponseStoreError,
    SchemaMismatchError,
    SinkLoopError,
    StorageError,
    UnstorableError,
)
from eventguard.guard import Guard, GuardOptions, guard
from eventguard.lifecycle import (
    ALLOWED_TRANSITIONS,
    ENDED_STATES,
    TERMINAL_STATES,
    Anomaly,
    AnomalyKind,
    Cause,
    ErrorInfo,
    Lifecycle,
    ResponseInfo,
    State,
    Transition,
    Usage,
)
from eventguard.recording import Recorder, Sink

if _typing.TYPE_CHECKING:
    from eventguard.agent_sessions import SqlAgentSessionStoreProvider
    from eventguard.provider import SqlResponseProvider
    from eventguard.records import (
        AnomalyRecord,
        Attempt,
        EventRecord,
        History,
        Page,
        PruneResult,
        ResponseRecord,
        Stats,
        TransitionRecord,
    )
    from eventguard.sink import EventFilter, Redactor, SqlSink
    from eventguard.sql.migrate import include_object
    from eventguard.sql.tables import metadata
    from eventguard.store import ResponseStore

try:
    __version__: str = _version("eventguard")
except _PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

#: The heavy names, each imported from its module on first use (see ``__getattr__``).
_LAZY: dict[str, str] = {
    "AnomalyRecord": "eventguard.records",
    "Attempt": "eventguard.records",
    "EventRecord": "eventguard.records",
    "History": "eventguard.records",
    "Page": "eventguard.records",
    "PruneResult": "eventguard.records",
    "ResponseRecord": "eventguard.records",
    "Stats": "eventguard.records",
    "TransitionRecord": "eventguard.records",
    "EventFilter": "eventguard.sink",
    "Redactor": "eventguard.sink",
    "ResponseStore": "eventguard.store",
    "SqlAgentSessionStoreProvider": "eventguard.agent_sessions",
    "SqlResponseProvider": "eventguard.provider",
    "SqlSink": "eventguard.sink",
    "include_object": "eventguard.sql.migrate",
    "metadata": "eventguard.sql.tables",
}


def __getattr__(name: str) -> object:
    """Import a heavy public name from its module on first use, then keep it in this module."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
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
