"""eventguard: record what an agent server's response stream really did.

The public surface is these names; every module behind them is an implementation detail.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from eventguard.decision import Decision, Ending, Flags, Forward, decide
from eventguard.errors import (
    EventGuardError,
    GuardAlreadyUsed,
    GuardOutsideLoop,
    IllegalTransition,
    InvalidEvent,
    NotAsyncIterable,
)
from eventguard.guard import Guard, guard
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
from eventguard.sink import (
    EventFilter,
    InvalidQueryError,
    Redactor,
    SchemaMismatchError,
    SqlSink,
    StorageError,
)
from eventguard.store import ResponseStore

try:
    __version__: str = _version("eventguard")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ALLOWED_TRANSITIONS",
    "ENDED_STATES",
    "TERMINAL_STATES",
    "Anomaly",
    "AnomalyKind",
    "Cause",
    "Decision",
    "Ending",
    "ErrorInfo",
    "EventFilter",
    "EventGuardError",
    "Flags",
    "Forward",
    "Guard",
    "GuardAlreadyUsed",
    "GuardOutsideLoop",
    "IllegalTransition",
    "InvalidEvent",
    "InvalidQueryError",
    "Lifecycle",
    "NotAsyncIterable",
    "Recorder",
    "Redactor",
    "ResponseInfo",
    "ResponseStore",
    "SchemaMismatchError",
    "Sink",
    "SqlSink",
    "State",
    "StorageError",
    "Transition",
    "Usage",
    "__version__",
    "decide",
    "guard",
]
