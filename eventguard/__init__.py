"""eventguard: record what an agent server's response stream really did.

The public surface is these names; every module behind them is an implementation detail.
"""

from eventguard.decision import Decision, Ending, Flags, Forward, decide
from eventguard.errors import (
    EventGuardError,
    GuardAlreadyUsed,
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
    "EventGuardError",
    "Flags",
    "Forward",
    "Guard",
    "GuardAlreadyUsed",
    "IllegalTransition",
    "InvalidEvent",
    "Lifecycle",
    "NotAsyncIterable",
    "Recorder",
    "ResponseInfo",
    "Sink",
    "State",
    "Transition",
    "Usage",
    "decide",
    "guard",
]
