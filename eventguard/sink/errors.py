"""Typed errors raised by the sink and the store."""

from __future__ import annotations

from eventguard.errors import EventGuardError


class StorageError(EventGuardError):
    """Base class for eventguard's database errors."""


class SchemaMismatchError(StorageError):
    """The database's schema is not the one this eventguard version writes.

    ``command`` is what to run about it; ``current`` and ``expected`` are Alembic revisions.
    """

    def __init__(
        self, message: str, *, current: tuple[str, ...], expected: tuple[str, ...], command: str
    ) -> None:
        super().__init__(message)
        self.current = current
        self.expected = expected
        self.command = command


class InvalidQueryError(StorageError, ValueError):
    """A query argument the store cannot use (a bad cursor, an unknown status, ...)."""


class SinkLoopError(EventGuardError, RuntimeError):
    """An SqlSink was used from a second event loop while another loop (another thread) runs it.

    One sink serves several event loops one after the other (each gets its own writer and
    engine), not at the same time: create one SqlSink per event loop.
    """
