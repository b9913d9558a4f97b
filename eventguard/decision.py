"""The terminal decision: one small pure function, tested row by row against the README's table.

``decide(how the inner stream ended, the cause flags at that moment, options) -> what to forward,
how the lifecycle ends``. Nothing here reads a clock, a signal or a context: the guard snapshots
the flags at the moment the inner stream produced its terminal (or ended) and passes them in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import warnings
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Final

from eventguard.lifecycle import Cause, State

if TYPE_CHECKING:  # the guard's options object; decide() only reads it (no import cycle at run time)
    from eventguard.guard.options import GuardOptions

__all__ = [
    "NEEDS_START",
    "TERMINAL_ENDINGS",
    "Decision",
    "Ending",
    "Flags",
    "Forward",
    "decide",
    "exit_ending",
    "settle",
    "unverified",
]


_EXITING_DEPRECATED: Final = "Flags.process_exiting is deprecated: it is called process_shutdown now"


class Ending(Enum):
    """How the inner stream ended."""

    COMPLETED = "completed"  # a response.completed terminal
    INCOMPLETE = "incomplete"  # a response.incomplete terminal
    FAILED = "failed"  # a response.failed terminal with status failed
    CANCELLED = "cancelled"  # a response.failed terminal with status cancelled
    NO_TERMINAL = "no_terminal"  # returned without a terminal
    RAISED = "raised"  # raised an Exception
    RAISED_CANCELLED = "raised_cancelled"  # asyncio.CancelledError reached the guard
    RAISED_BASE = "raised_base"  # ResponseExitForRecovery, KeyboardInterrupt, SystemExit...
    CLOSED_EARLY = "closed_early"  # the consumer closed the guard before the end
    ABANDONED = "abandoned"  # the consumer stopped iterating and never came back
    STUCK = "stuck"  # the inner stream ignored the signal past cancel_grace


TERMINAL_ENDINGS = frozenset({Ending.COMPLETED, Ending.INCOMPLETE, Ending.FAILED, Ending.CANCELLED})


class Forward(Enum):
    """What the guard hands the host in place of the inner stream's ending."""

    PASS = "pass"  # the inner terminal, as it is
    NOTHING = "nothing"  # no terminal: the host writes its own (cancel) or the stream just ends
    FAILED_SHUTDOWN = "failed_shutdown"  # a response.failed, error code server_shutdown
    FAILED_MISSING_TERMINAL = "failed_missing_terminal"  # a response.failed, error code missing_terminal
    CANCELLED = "cancelled"  # a response.failed with status cancelled (on_cancel="emit")


@dataclass(frozen=True, slots=True, init=False)
class Flags:
    """The cause flags, as they were at one moment.

    ``Flags(signal, client_cancelled, shutdown, process_shutdown)``; the keyword ``process_exiting=``
    and the attribute ``process_exiting`` are deprecated names of ``process_shutdown`` (they warn).
    """

    #: The host's cancellation signal is set (client cancel, steering, or a shutdown path).
    signal: bool = False
    #: The host says the client cancelled (or disconnected from) this response.
    client_cancelled: bool = False
    #: The host told this response it is shutting down (its context's ``shutdown`` flag).
    shutdown: bool = False
    #: The server process has begun shutting down (SIGTERM), whether or not the host told this response.
    #: It explains a stream that did not end by a terminal of its own (cancelled, raised, cut off: the
    #: exit is the likeliest cause, as the host itself assumes); it never turns a terminal into a failure
    #: (a background run the host was not told about may well complete before the process exits).
    process_shutdown: bool = False

    def __init__(
        self,
        signal: bool = False,
        client_cancelled: bool = False,
        shutdown: bool = False,
        process_shutdown: bool = False,
        *,
        process_exiting: bool | None = None,
    ) -> None:
        if process_exiting is not None:
            warnings.warn(_EXITING_DEPRECATED, DeprecationWarning, stacklevel=2)
            process_shutdown = process_shutdown or process_exiting
        object.__setattr__(self, "signal", signal)
        object.__setattr__(self, "client_cancelled", client_cancelled)
        object.__setattr__(self, "shutdown", shutdown)
        object.__setattr__(self, "process_shutdown", process_shutdown)

    @property
    def process_exiting(self) -> bool:
        """Deprecated: ``process_shutdown``."""
        warnings.warn(_EXITING_DEPRECATED, DeprecationWarning, stacklevel=2)
        return self.process_shutdown

    @property
    def steering(self) -> bool:
        """The signal is set, but neither by a client cancel nor by shutdown: by steering."""
        # The signal is shared by client cancel, steering and (some paths of) shutdown; steering is
        # what is left when neither of the other two flags is set.
        return self.signal and not self.client_cancelled and not self.shutdown


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` says: what to ``forward`` in place of the inner stream's terminal, the
    ``state`` and ``cause`` the lifecycle ends with, a ``reason`` a person can read, and the flags the
    ending carries (``steering_cut_short``, ``unverified``)."""

    forward: Forward
    state: State
    cause: Cause
    reason: str
    steering_cut_short: bool = False
    unverified: bool = False


def decide(ending: Ending, flags: Flags, options: GuardOptions | None = None) -> Decision:
    """Decide what to forward and how the lifecycle ends. Pure: same inputs, same answer.

    ``ending`` is how the inner stream ended (its terminal, or none and why); ``flags`` the host's
    cause flags at that moment.

    Of ``options`` (the guard's :class:`~eventguard.guard.options.GuardOptions`; None: the defaults)
    it reads ``on_cancel``, ``keep_shutdown_completion`` and ``recoverable`` (None counts as False).
    """
    if options is None:
        return _decide(ending, flags, "omit", keep=False, recoverable=False)
    return _decide(
        ending,
        flags,
        options.on_cancel,
        keep=options.keep_shutdown_completion,
        recoverable=bool(options.recoverable),
    )


def _decide(ending: Ending, flags: Flags, on_cancel: str, *, keep: bool, recoverable: bool) -> Decision:
    if ending is Ending.RAISED_BASE:
        # ResponseExitForRecovery and friends pass through untouched; the run may come back.
        return Decision(
            Forward.NOTHING, State.INTERRUPTED, Cause.RECOVERY, "inner stream raised a BaseException"
        )

    if flags.client_cancelled:
        # The host has decided: the response is cancelled, whatever the inner stream says.
        emit = on_cancel == "emit" and ending not in _RAISED
        forward = Forward.CANCELLED if emit else Forward.NOTHING
        return Decision(forward, State.CANCELLED, Cause.CLIENT_CANCEL, f"client cancel; inner {ending.value}")

    if ending in TERMINAL_ENDINGS:
        return _decide_terminal(ending, flags, keep=keep)

    if flags.shutdown or flags.process_shutdown:
        state = State.INTERRUPTED if recoverable else State.FAILED
        forward = Forward.NOTHING
        return Decision(forward, state, Cause.SHUTDOWN, f"shutdown; inner {ending.value}")

    if ending is Ending.NO_TERMINAL:
        return Decision(
            Forward.FAILED_MISSING_TERMINAL,
            State.FAILED,
            Cause.MISSING_TERMINAL,
            "inner stream ended without a terminal event",
        )
    if ending is Ending.RAISED:
        return Decision(Forward.NOTHING, State.FAILED, Cause.ERROR, "inner stream raised")
    if ending is Ending.RAISED_CANCELLED:
        # Cancellation with no flag set yet (a foreground disconnect with store=false): a cancel.
        return Decision(Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL, "task cancelled")
    if ending is Ending.STUCK:
        return Decision(
            Forward.FAILED_MISSING_TERMINAL,
            State.FAILED,
            Cause.STUCK,
            "inner stream ignored the signal past cancel_grace",
        )
    if ending is Ending.ABANDONED:
        return Decision(Forward.NOTHING, State.FAILED, Cause.ABANDONED, "the host stopped iterating")
    # CLOSED_EARLY with no cause flag: the consumer walked away before the end.
    return Decision(Forward.NOTHING, State.FAILED, Cause.CLOSED_EARLY, "closed before the inner stream ended")


def exit_ending(exc: BaseException | None) -> Ending:
    """How the exception an ``async with guard(...)`` body exits with (``exc``; None: none) ends a
    stream the guard had not finished: a cancel thrown into the host's handler (a foreground disconnect
    with store=false) is a cancel, not a consumer that walked away."""
    if exc is None or isinstance(exc, GeneratorExit):
        return Ending.CLOSED_EARLY
    if isinstance(exc, asyncio.CancelledError):
        return Ending.RAISED_CANCELLED
    return Ending.RAISED if isinstance(exc, Exception) else Ending.RAISED_BASE


_RAISED = frozenset({Ending.RAISED, Ending.RAISED_CANCELLED, Ending.RAISED_BASE})

#: Endings a lifecycle cannot reach without having started.
NEEDS_START = frozenset({State.COMPLETED, State.INCOMPLETE})


def settle(decision: Decision, flags: Flags) -> Decision:
    """A terminal's decision, applied when the inner stream ends, by the flags at that end.

    The flags were read when the terminal was produced; only a client cancel counts again here, at the
    end of the stream and never later: the host reports ``cancelled`` for a client that cancelled or
    disconnected before the handler ended, even after a forwarded terminal. (The signal alone does not
    count again: newer hosts set it after every foreground completion.)
    """
    if flags.client_cancelled:
        return Decision(
            Forward.NOTHING,
            State.CANCELLED,
            Cause.CLIENT_CANCEL,
            "client cancel after the terminal was forwarded, before the stream ended",
        )
    return decision


def unverified(decision: Decision, why: str) -> Decision:
    """A completion recorded as it claims but without proof (``why``): never a failure, but flagged.

    For a terminal that could not be read, and for one whose stream never reported its start (the record
    follows what was forwarded, through an implied start). Other endings are returned as they are.
    """
    if decision.state not in NEEDS_START:
        return decision
    return dataclasses.replace(decision, unverified=True, reason=f"{decision.reason}; {why}: not verified")


def _decide_terminal(ending: Ending, flags: Flags, *, keep: bool) -> Decision:
    if ending is Ending.COMPLETED and flags.shutdown:
        if keep:
            return Decision(
                Forward.PASS,
                State.COMPLETED,
                Cause.SHUTDOWN,
                "completion produced after shutdown was signalled, kept on request",
                unverified=True,
            )
        return Decision(
            Forward.FAILED_SHUTDOWN,
            State.FAILED,
            Cause.SHUTDOWN,
            "completion produced after shutdown was signalled cannot be shown whole",
        )
    if ending is Ending.FAILED:
        cause = Cause.SHUTDOWN if flags.shutdown else Cause.ERROR
        return Decision(Forward.PASS, State.FAILED, cause, "inner stream failed")
    if ending is Ending.CANCELLED:
        # The inner stream claims a cancel the host did not ask for: pass it on, but say so.
        return Decision(Forward.PASS, State.CANCELLED, Cause.NORMAL, "inner stream reported a cancel itself")
    state = State.COMPLETED if ending is Ending.COMPLETED else State.INCOMPLETE
    if flags.shutdown:
        return Decision(Forward.PASS, state, Cause.SHUTDOWN, "incomplete under shutdown")
    if flags.steering:
        return Decision(Forward.PASS, state, Cause.STEERING, "cut short by steering", steering_cut_short=True)
    return Decision(Forward.PASS, state, Cause.NORMAL, f"inner stream {ending.value}")
