"""The SQL sink: verified-only persistence of response lifecycles and their event history."""

from eventguard.sink.errors import InvalidQueryError, SchemaMismatchError, StorageError
from eventguard.sink.filter import EventFilter, EventMode, EventPredicate
from eventguard.sink.recorder import SqlRecorder
from eventguard.sink.serialise import Redactor
from eventguard.sink.sink import ReplayResult, SinkStats, SqlSink
from eventguard.sink.writer import Refusal

__all__ = [
    "EventFilter",
    "EventMode",
    "EventPredicate",
    "InvalidQueryError",
    "Redactor",
    "Refusal",
    "ReplayResult",
    "SchemaMismatchError",
    "SinkStats",
    "SqlRecorder",
    "SqlSink",
    "StorageError",
]
