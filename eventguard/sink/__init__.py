"""The SQL sink: verified-only persistence of response lifecycles and their event history."""

from eventguard.sink.apply import Duplicate, Refusal
from eventguard.sink.filter import EventFilter, EventMode, EventPredicate
from eventguard.sink.quarantine import QuarantineRecord
from eventguard.sink.recorder import SqlRecorder
from eventguard.sink.replay import ReplayResult
from eventguard.sink.report import SinkStats
from eventguard.sink.serialise import Redactor
from eventguard.sink.sink import SqlSink
from eventguard.sql.classify import ErrorKind, classify

__all__ = [
    "Duplicate",
    "ErrorKind",
    "EventFilter",
    "EventMode",
    "EventPredicate",
    "QuarantineRecord",
    "Redactor",
    "Refusal",
    "ReplayResult",
    "SinkStats",
    "SqlRecorder",
    "SqlSink",
    "classify",
]
