"""The typed errors users catch: every one eventguard raises on purpose, in one module.

Everything eventguard raises on purpose derives from :class:`EventGuardError`, so one
``except EventGuardError`` separates our verdicts from bugs and from the host's own errors.
An error that is also a misuse of Python's own kind derives from that builtin too, so
``except TypeError`` or ``except ValueError`` still catches it::

    EventGuardError
    ├── IllegalTransition       the lifecycle state machine refused a transition (strict guards)
    ├── InvalidEvent            an event a strict guard cannot accept
    ├── NotAsyncIterable        (also TypeError) guard() was handed something else
    ├── GuardAlreadyUsed        (also RuntimeError) a guard iterated or entered a second time
    ├── GuardOutsideLoop        (also RuntimeError) a guard built or stepped outside its event loop
    ├── SinkLoopError           (also RuntimeError) an SqlSink used from two event loops at once
    ├── BadDatabaseURL          (also ValueError) a database URL that cannot be used as written
    ├── BadSpoolPath            (also ValueError) a spool path that cannot be the spool
    └── StorageError            the database: eventguard's storage errors
        ├── DatabaseUnavailableError  the database could not be reached or used (refused,
        │                       timed out, login refused): start(), ResponseStore's calls
        ├── SchemaMismatchError the database's schema is not the one this version writes
        ├── InvalidQueryError   (also ValueError) a query argument the store cannot use
        ├── ResponseStoreError  the host's response store (SqlResponseProvider) could not use
        │                       the database: never a KeyError, which the host reads as "not found"
        └── UnstorableError     (also ValueError) a value the response store cannot keep exactly

None of them needs SQLAlchemy: importing this module is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventguard.lifecycle import State

__all__ = [
    "BadDatabaseURL",
    "BadSpoolPath",
    "DatabaseUnavailableError",
    "EventGuardError",
    "GuardAlreadyUsed",
    "GuardOutsideLoop",
    "IllegalTransition",
    "InvalidEvent",
    "InvalidQueryError",
    "NotAsyncIterable",
    "ResponseStoreError",
    "SchemaMismatchError",
    "SinkLoopError",
    "StorageError",
    "UnstorableError",
]


class EventGuardError(Exception):
    """Base class of every error eventguard raises on purpose."""


def _rebuilt(cls: type[EventGuardError], args: tuple[Any, ...], kwargs: dict[str, Any]) -> EventGuardError:
    """An error of ``cls`` made again from its own arguments: how one whose ``__init__`` takes
    fields, not the message, comes back from ``pickle`` (another process, a result queue)."""
    return cls(*args, **kwargs)


# -- the guard and its lifecycle ---------------------------------------------------------------


class IllegalTransition(EventGuardError):
    """The lifecycle state machine refused a transition.

    The guard records it as an anomaly and carries on, unless it was built with ``strict=True``.
    ``from_state`` and ``to_state`` are the refused move; ``reason`` says why it was asked for.
    """

    def __init__(self, from_state: State, to_state: State, reason: str) -> None:
        self.from_state = from_state
        self.to_state = to_state
        self.reason = reason
        super().__init__(f"illegal lifecycle transition {from_state.value} -> {to_state.value}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (type(self), (self.from_state, self.to_state, self.reason), {})


class InvalidEvent(EventGuardError):
    """An event the guard cannot accept: raised only by a ``strict`` guard; otherwise an anomaly."""


class NotAsyncIterable(EventGuardError, TypeError):
    """``guard()`` was handed something that is not an async iterable."""


class GuardAlreadyUsed(EventGuardError, RuntimeError):
    """A guard is single-use: it was iterated, or entered, a second time."""


class GuardOutsideLoop(EventGuardError, RuntimeError):
    """A guard was built or iterated outside the running event loop it needs.

    Build the guard inside the coroutine that iterates it.
    """


# -- the sink and the store --------------------------------------------------------------------


class SinkLoopError(EventGuardError, RuntimeError):
    """An SqlSink was used from a second event loop while another loop (another thread) runs it.

    One sink serves several event loops one after the other (each gets its own writer and
    engine), not at the same time: create one SqlSink per event loop.
    """


class BadDatabaseURL(EventGuardError, ValueError):
    """A database URL that cannot be used as written: a control or invisible character in it (a
    newline from an env file), a password with an unencoded ``@`` (the parser reads the rest of it
    into the host), a port that is not a number.

    ``shown`` is the URL as :func:`eventguard.sql.engine.safe_url` shows it (no secret);
    ``problem`` says what is wrong in words that quote none of it. The message is both.
    """

    def __init__(self, shown: str, problem: str) -> None:
        super().__init__(f"bad database URL {shown!r}: {problem}")
        self.shown = shown
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuilt, (type(self), (self.shown, self.problem), {})


class BadSpoolPath(EventGuardError, ValueError):
    """A spool path (``SqlSink(spool_path=...)``, its default beside the SQLite file, ``eventguard
    spool replay --spool``) that cannot be the spool: a file that is not one (taken as the spool, it
    would be set aside by the replay, read as bad entries and removed), the database's own file, a
    directory, a name no file can have. Raised when the sink is built; the file is left as it was."""


class StorageError(EventGuardError):
    """Base class for eventguard's database errors."""


class DatabaseUnavailableError(StorageError):
    """The database could not be reached or used: it refused the connection or the login, timed out,
    does not exist, is out of connections or disk, or the connection was lost.

    Raised by ``SqlSink.start()``, ``SqlResponseProvider.start()`` and :class:`~eventguard.ResponseStore`'s
    calls (a sink's writes never raise it: they spool). The message names the database, without its
    password, and the driver's error; that error is the ``__cause__``.
    """


class SchemaMismatchError(StorageError):
    """The database's schema is not the one this eventguard version writes.

    ``message`` says what differs; ``command`` is what to run about it; ``current`` and
    ``expected`` are Alembic revisions.
    """

    def __init__(
        self, message: str, *, current: tuple[str, ...], expected: tuple[str, ...], command: str
    ) -> None:
        super().__init__(message)
        self.current = current
        self.expected = expected
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        fields = {"current": self.current, "expected": self.expected, "command": self.command}
        return _rebuilt, (type(self), self.args, fields)


class InvalidQueryError(StorageError, ValueError):
    """A query argument the store cannot use (a bad cursor, an unknown status, ...)."""


class ResponseStoreError(StorageError):
    """The host's response store (:class:`~eventguard.SqlResponseProvider`) could not read or write
    the database: it is away, locked, at another schema, or a stored row does not decode.

    Raised instead of ``KeyError``, which the host takes for "not found" (and, on recovery, as the
    signal to drop a response for good). What the provider raises is also the host's
    ``ResponseStoreCorruptionError`` (see ``eventguard.provider.ProviderStorageError``).
    """


class UnstorableError(StorageError, ValueError):
    """A value the response store cannot keep exactly: not JSON (an object, a set), or JSON only
    after a change (a tuple, a non-string key, NaN), or an id that is not a string.

    Refused rather than stored changed: what the host reads back must equal what it wrote.
    """
