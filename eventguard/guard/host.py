"""The host adapter: everything the guard reads from the host's ``ResponseContext``, in one place.

The guard never looks at the context itself. It asks this adapter three things: the cause flags at
one moment (:meth:`Host.flags`), to wait until a cause is signalled (:meth:`Host.wait_for_cause`,
for the watchdog), and what the host says about the response (:func:`info_from_context`,
:meth:`Host.recoverable`). Only here is the context's private ``_task_context`` read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Final, Protocol

from eventguard.decision import Flags
from eventguard.guard.options import GuardOptions
from eventguard.lifecycle import ResponseInfo

__all__ = ["CancellationSignal", "Host", "info_from_context", "is_set"]


class CancellationSignal(Protocol):
    def is_set(self) -> bool: ...


class Host:
    """The cause flags of one response: the host's signal, its context, the process's shutdown flag."""

    __slots__ = ("_said", "context", "frozen", "process_shutdown", "signal", "unreadable")

    def __init__(
        self, signal: CancellationSignal, context: Any = None, process_shutdown: object = None
    ) -> None:
        if not callable(getattr(signal, "is_set", None)):
            raise TypeError("cancellation_signal must have an is_set() method (an asyncio.Event, say)")
        # An async is_set() answers with a coroutine, which is always true: every response would be
        # taken for cancelled and its completion withheld from the client.
        for name, flag in (("cancellation_signal", signal), ("process_shutdown", process_shutdown)):
            if inspect.iscoroutinefunction(getattr(flag, "is_set", None)):
                raise TypeError(f"{name}.is_set() must answer at once with a bool, not be async")
        self.signal = signal
        self.context = context
        self.process_shutdown = process_shutdown
        #: The flags as they were when the guard ended (:meth:`release`), else None.
        self.frozen: Flags | None = None
        #: Flags whose read raised and that nobody has taken yet (:meth:`take_unreadable`): (the
        #: flag's name, the error), each flag once.
        self.unreadable: list[tuple[str, Exception]] = []
        #: The flags already found unreadable.
        self._said: set[str] = set()

    def flags(self) -> Flags:
        """The cause flags at this moment (once released: at the moment it was)."""
        if self.frozen is not None:
            return self.frozen
        signal = self._read("cancellation_signal", self.signal)
        process_shutdown = self.process_shutdown is not None and self._read(
            "process_shutdown", self.process_shutdown
        )
        ctx = self.context
        if ctx is None:
            # Without a context a set signal counts as a client cancel: never record a false success.
            return Flags(signal=signal, client_cancelled=signal, process_shutdown=process_shutdown)
        return Flags(
            signal=signal,
            client_cancelled=self._read("context.client_cancelled", ctx, "client_cancelled"),
            shutdown=self._read("context.shutdown", ctx, "shutdown"),
            process_shutdown=process_shutdown,
        )

    def _read(self, name: str, flag: object, attribute: str | None = None) -> bool:
        """One flag (``flag``, or its ``attribute``), taken as not set when reading it raises.

        Every ending asks for the flags: a read that raised (a remote flag store that is down, a
        property that fails) ended the guard's own bookkeeping halfway, leaving the response
        ``in_progress`` for good and its inner stream open. The stream's own ending stands instead,
        and the guard records that this flag could not be read (:meth:`take_unreadable`)."""
        try:
            if attribute is not None:
                flag = getattr(flag, attribute, None)
            return is_set(flag)
        except Exception as exc:
            self._note(name, exc)
            return False

    def _note(self, name: str, exc: Exception) -> None:
        if name not in self._said:
            self._said.add(name)
            self.unreadable.append((name, exc))

    def take_unreadable(self) -> list[tuple[str, Exception]]:
        """The flags found unreadable since the last call (each flag once in a guard's life)."""
        found, self.unreadable = self.unreadable, []
        return found

    def resolve(self, options: GuardOptions, info: ResponseInfo | None) -> tuple[GuardOptions, ResponseInfo]:
        """``options`` with ``recoverable=None`` resolved (see :meth:`recoverable`), and ``info`` (by
        default: what the context says)."""
        info = info if info is not None else info_from_context(self.context)
        if options.recoverable is None:
            options = dataclasses.replace(options, recoverable=self.recoverable(info))
        return options, info

    def recoverable(self, info: ResponseInfo) -> bool:
        """Whether a run stopped by shutdown can be recovered, by default: only a resilient host
        recovers a run, and it gives such runs a durable task context."""
        durable = getattr(self.context, "_task_context", None) is not None
        return bool(info.background and info.store and durable)

    def release(self) -> None:
        """The guard has ended: let go of the host's objects, its flags kept as they are now.

        The context holds the whole request (its input, its headers), and a finished guard may be
        kept for a while (``GuardedResponses.guard_for``): it must not keep the request with it.
        """
        self.frozen = self.flags()
        self.unreadable = []  # the guard's record is written: nothing more goes into it
        self.context = None
        self.signal = _RELEASED
        self.process_shutdown = None

    async def wait_for_cause(self, alive: Callable[[], object]) -> None:
        """Return once the signal (or the context's shutdown flag) is set, or ``alive()`` is None."""
        if self.frozen is not None:
            return
        signal = self.signal
        try:
            shutdown = getattr(self.context, "shutdown", None) if self.context is not None else None
        except Exception as exc:  # a property that fails: watched as not set, as flags() reads it
            self._note("context.shutdown", exc)
            shutdown = None
        if isinstance(signal, asyncio.Event) and (shutdown is None or isinstance(shutdown, asyncio.Event)):
            # Nothing to poll: woken only by the signal (or the shutdown flag) itself.
            if shutdown is None:
                await signal.wait()
                return
            waits = [asyncio.ensure_future(signal.wait()), asyncio.ensure_future(shutdown.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            return
        # A signal we cannot wait on (a threading.Event, any object with is_set()): poll it, gently.
        # Each read as flags() reads it: one that raises (a flag store that is down for a moment) is
        # taken as not set, and the watchdog goes on watching.
        while not (self._read("cancellation_signal", signal) or self._read("context.shutdown", shutdown)):
            if alive() is None:
                return
            await asyncio.sleep(0.05)


class _Released:
    """The signal of a released :class:`Host`: never read (its flags are frozen), never set."""

    __slots__ = ()

    def is_set(self) -> bool:
        return False


_RELEASED: Final = _Released()


def info_from_context(context: Any) -> ResponseInfo:
    """What a host ``ResponseContext`` (or anything shaped like it) says about the response."""
    if context is None:
        return ResponseInfo()
    mode = getattr(context, "mode_flags", None)
    platform = getattr(context, "platform_context", None)
    try:
        chain_id = getattr(context, "conversation_chain_id", None)
    except Exception:  # a property that cannot resolve is not worth failing a response over
        chain_id = None
    return ResponseInfo(
        response_id=_opt_str(getattr(context, "response_id", None)),
        conversation_id=_opt_str(getattr(context, "conversation_id", None)),
        chain_id=_opt_str(chain_id),
        partition_key=_opt_str(getattr(platform, "user_id_key", None)),
        background=_opt_bool(getattr(mode, "background", None)),
        stream=_opt_bool(getattr(mode, "stream", None)),
        store=_opt_bool(getattr(mode, "store", None)),
        is_recovery=bool(getattr(context, "is_recovery", False)),
        is_steered_turn=bool(getattr(context, "is_steered_turn", False)),
    )


def is_set(flag: object) -> bool:
    """A flag that is anything with ``is_set()``, or a plain value: a ``bool`` (or 0 or 1), None
    for not set. Anything else is a ``TypeError``, which a guard takes as a flag it cannot read
    (not set, and said in a ``flag_unreadable`` anomaly): read for its truth, the string ``"false"``
    or a stand-in object was a cancel, and the guard recorded the opposite of what was sent."""
    method = getattr(flag, "is_set", None)
    value = method() if callable(method) else flag
    if value is None or value is False or value is True:
        return bool(value)
    if type(value) is int and value in (0, 1):
        return bool(value)
    raise TypeError(f"a flag must be a bool, not {type(value).__name__} ({value!r:.40})")


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _opt_bool(value: object) -> bool | None:
    return None if value is None else bool(value)
