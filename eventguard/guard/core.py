"""The guard: an async-iterator combinator that decides a response stream's terminal by its cause.

The inner stream, as in aiostream's ``streamcontext`` and asyncstdlib: the guard answers for it from
the moment it is built. It closes it exactly once, on every exit path, in the call that ends the
guard (never later, from the garbage collector). A guard its consumer drops without closing it
(``break`` out of ``async for`` without ``async with``) is finalised like an async generator: the
event loop's finaliser closes it, and it ends there, closing the inner stream and recording the
ending; nothing (not its watchdog) holds it alive. It never swallows cancellation: ``CancelledError``,
``ResponseExitForRecovery`` and every other ``BaseException`` are re-raised untouched, and
``Task.cancelling()`` is left as it was found.

An ending the guard records on its own, while the inner stream still runs (its watchdog's: a stuck
inner stream, a host that stopped iterating), is final: nothing the inner stream produces afterwards
is forwarded (each event is kept as an anomaly), and the terminal that ending calls for, if any, is
forwarded in its place when the consumer comes back for it. The recorded ending and the forwarded
stream never disagree. The watchdog interrupts only the task inside the guard's current step, found
when it fires (a step may run in a task of its own), never another task.

The per-event loop is the hot path: for an output or delta event it does one ``await``, one type
lookup, one counter increment and, with a sink, one buffered append. Everything else (validation of
lifecycle events, the terminal decision, anomalies) happens only for the handful of lifecycle events.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable
from enum import Enum
from types import AsyncGeneratorType, TracebackType
from typing import Any, Final, Literal, cast

from eventguard.decision import Ending, exit_ending
from eventguard.errors import GuardAlreadyUsed, GuardOutsideLoop
from eventguard.guard.flush import flush
from eventguard.guard.host import CancellationSignal, Host
from eventguard.guard.inner import InnerStream, aiter_of, empty
from eventguard.guard.loop import bound_loop, check_loop
from eventguard.guard.options import GuardOptions
from eventguard.guard.referee import DROP, Referee
from eventguard.guard.watchdog import Watchdog
from eventguard.lifecycle import Lifecycle, ResponseInfo
from eventguard.recording import Recorder, Sink

__all__ = ["Guard", "Phase", "guard"]

log = logging.getLogger("eventguard.guard")

_DEFAULTS: Final = GuardOptions()


class Phase(Enum):
    """The guard's life, one value (as httpx's ``ClientState``), where booleans used to say it.

    Within a step, the hot loop keeps a finer phase of its own in a local integer (see ``Guard._run``).
    """

    #: Built; neither entered, nor stepped, nor closed.
    NEW = "new"
    #: Entered (``async with``), stepped or being closed: a second ``async with`` is refused.
    OPEN = "open"
    #: Ended: the watchdog stopped, the inner stream closed once (or closing in the background), the
    #: ending recorded and flushed. Closing again is a no-op; iterating again yields nothing.
    FINISHED = "finished"


def guard(
    stream: AsyncIterable[Any],
    cancellation_signal: CancellationSignal,
    *,
    context: Any = None,
    sink: Sink | None = None,
    on_cancel: Literal["omit", "emit"] = "omit",
    cancel_grace: float | None = 10.0,
    keep_shutdown_completion: bool = False,
    strict: bool = False,
    recoverable: bool | None = None,
    info: ResponseInfo | None = None,
    flush_timeout: float = 5.0,
    process_shutdown: object = None,
) -> Guard:
    """Guard ``stream``: pass its events through unchanged and decide its terminal by cause.

    Args:
        stream: the inner stream (``_handle_response``'s events); the guard owns it and closes it once.
        cancellation_signal: the host's signal for this response (anything with ``is_set()``); set,
            it is a cause: a client cancel, steering or shutdown, as ``context`` tells.
        context: the host's ``ResponseContext``: it supplies the cause flags and what is known about
            the response; without it a set signal counts as a client cancel.
        sink: where the verified lifecycle and events are recorded (a :class:`~eventguard.SqlSink`);
            None records nothing.
        on_cancel: ``"omit"`` forwards no terminal on a client cancel (the host writes the cancel);
            ``"emit"`` forwards one ``response.failed`` with status ``cancelled``.
        cancel_grace: seconds the stream gets after a cause is signalled before the watchdog steps in
            (a stuck inner stream, a host that stopped iterating); None turns the watchdog off.
        keep_shutdown_completion: keep a ``completed`` produced after shutdown was signalled
            (recorded as unverified) instead of failing it.
        strict: raise ``InvalidEvent`` / ``IllegalTransition`` on bad input instead of recording an
            anomaly and going on.
        recoverable: whether a run stopped by shutdown can be recovered (``interrupted``) or is lost
            (``failed``); None: a stored background run of a resilient host is.
        info: what is known about the response (id, background, stored) when there is no ``context``.
        flush_timeout: bound, in seconds, on the final flush to the sink; it goes on in the
            background after that.
        process_shutdown: anything with ``is_set()``, set when the server process begins shutting
            down: a stream that then ends without finishing (cancelled, abandoned, cut off) was
            stopped by shutdown even when the host never told this response, as it does not tell
            background runs.

    Returns:
        A :class:`Guard`: iterate it (``async for``) in place of ``stream``. See the README for the
        whole table of terminals by cause.
    """
    options = GuardOptions(
        on_cancel=on_cancel,
        cancel_grace=cancel_grace,
        keep_shutdown_completion=keep_shutdown_completion,
        strict=strict,
        recoverable=recoverable,
        flush_timeout=flush_timeout,
    )
    return Guard(
        stream,
        cancellation_signal,
        options,
        context=context,
        sink=sink,
        info=info,
        process_shutdown=process_shutdown,
    )


class _Core:
    """Everything of one guard but its protocols: the parts, the hot loop, the ending.

    The hot loop's generator holds this, not the :class:`Guard` that hands it out, and this holds the
    generator only weakly: a Guard dropped without being closed is freed at once by reference counting,
    and its suspended generator is finalised by the event loop then, not at the next garbage collection.
    """

    #: The hot loop's generator, set by the Guard that makes it (held weakly: see the class docstring).
    _gen_ref: weakref.ref[AsyncGeneratorType[Any, None]]

    __slots__ = (
        "__weakref__",
        "_closing",
        "_gen_ref",
        "_host",
        "_inner",
        "_loop",
        "_options",
        "_phase",
        "_rec",
        "_ref",
        "_watchdog",
        "lifecycle",
    )

    def __init__(
        self,
        stream: AsyncIterable[Any],
        cancellation_signal: CancellationSignal,
        options: GuardOptions,
        context: Any,
        sink: Sink | None,
        info: ResponseInfo | None,
        process_shutdown: object,
    ) -> None:
        aiter_ = aiter_of(stream)  # checked first; called last, once the guard is sure to be built
        #: The only reader of the host's context and signals (see host.py).
        self._host = host = Host(cancellation_signal, context, process_shutdown)
        # Each checked here, naming it: a wrong one would fail later as an AttributeError from inside.
        if not isinstance(options, GuardOptions):
            raise TypeError(f"options must be a GuardOptions, not {type(options).__name__}")
        options.check()
        if sink is not None and not callable(getattr(sink, "recorder", None)):
            raise TypeError(f"sink must be a Sink (an SqlSink, say) or None, not {type(sink).__name__}")
        if info is not None and not isinstance(info, ResponseInfo):
            raise TypeError(f"info must be a ResponseInfo or None, not {type(info).__name__}")
        #: The loop the guard was built in (None outside one: allowed without a sink; see loop.py).
        self._loop = bound_loop(has_sink=sink is not None)
        #: The inner stream, owned: closed exactly once (see inner.py).
        self._inner = InnerStream(stream, aiter_())
        options, info = host.resolve(options, info)
        #: The guard's options, ``recoverable`` resolved: what the decision table reads.
        self._options = options
        #: The live lifecycle model of this response.
        self.lifecycle = Lifecycle.for_recovery(info) if info.is_recovery else Lifecycle(info=info)
        self._rec: Recorder | None = sink.recorder(self.lifecycle) if sink is not None else None
        self._phase = Phase.NEW
        #: The stuck-stream watchdog: its task, and the books of the cancel it may send (watchdog.py).
        self._watchdog = Watchdog()
        #: The I/O-free referee: lifecycle events, terminals, anomalies, decisions (referee.py).
        self._ref = Referee(self.lifecycle, self._rec, options, host)
        #: How the consumer is closing the guard while its generator unwinds (see _end_closed).
        self._closing: Ending | None = None

    def _open(self) -> None:
        """The guard is in use from its first step or close on: single use is spent."""
        if self._phase is Phase.NEW:
            self._phase = Phase.OPEN

    async def _run(self) -> AsyncGenerator[Any, None]:
        """The hot loop: for an output or delta event, one subscript, one set lookup, a counter.

        ``phase`` says where an exception came from, so that only the inner stream's own
        exceptions are treated as its ending: one thrown in at a ``yield`` (``aclose()``,
        ``athrow()``) or raised by the guard itself goes straight through, untouched.
        Its values are literals, not named constants, because a global lookup per event shows
        in the benchmark: 0 pulling from the inner stream, 1 working on an event, 2 handing over
        (where a dropped guard is finalised: ``GeneratorExit`` at phase 2, see the module docstring).
        A hot event never stores it: the hot path runs at 0 and an exception leaving its recorder
        call or its ``yield`` sets 1 or 2 on the way out, where a ``try`` costs nothing.
        """
        self._open()
        grace = self._options.cancel_grace
        if grace is not None or self._rec is not None:
            loop = self._check_loop()
            if grace is not None:
                # It holds the guard only by a weak reference: a guard dropped without being closed is
                # collected and finalised like an async generator, and that cancels the watchdog.
                self._watchdog.start(loop, self._gen_ref, self._ref, self._host, grace)
        rec = self._rec
        if rec is not None:
            # The row is written from the first step on ('new' until the stream says more), so that
            # a run still thinking when its process dies is there for recover(). Not at construction:
            # a guard dropped before its first step, which nothing ends, left its row 'new' (until a
            # recover() took it for an interrupted run). A guard closed unstepped records its ending.
            rec.changed()
        # Plain str types already seen to need nothing but forwarding; emptied (Referee.go_slow) once
        # every event must take the slow path: after the terminal, or when the guard is ending.
        ref = self._ref
        slow = self._watchdog.off_the_hot_path(ref)
        hot = ref.hot
        # The events forwarded, counted in a float: ``n += 1.0`` takes its result from the interpreter's
        # free list, where an int past 256 allocates a new object each time (80 of the guard's 1,530
        # added instructions per event, callgrind). Every integer up to 2**53 is exact; what leaves the
        # loop (the recorder's index, ``ref.n``) is an int.
        n = float(ref.n)
        phase = 0
        final: Any = DROP
        try:
            async for event in self._inner.iterator:
                # Three stores of phase per event cost 1.5 % of the guard's added instructions
                # (callgrind): the hot path marks it only on an exception's way out. Its body sits
                # inside the lookup's ``try``, so no flag carries the lookup's answer out of it: an
                # exception the body marked on its way out (phase 1 or 2) goes straight through.
                try:
                    etype = event["type"]
                    if etype in hot:
                        if rec is not None:
                            try:
                                rec.event(int(n), etype, event)
                            except BaseException:
                                phase = 1
                                raise
                        n += 1.0
                        try:
                            yield event
                        except BaseException:
                            phase = 2
                            raise
                        continue
                except Exception:
                    if phase:
                        raise
                    # Not a dict, no "type", an unhashable type: an event object's type is its
                    # attribute (what reading it raises is the guard's own error, as the lookup's is).
                    phase = 1
                    etype = getattr(event, "type", None)
                except BaseException:
                    if not phase:
                        phase = 1
                    raise
                phase = 1
                if etype.__class__ is str and etype in hot:
                    # An event object of a type the hot path forwards: forwarded as a dict would be.
                    if rec is not None:
                        rec.event(int(n), etype, event)
                    n += 1.0
                    out = event
                else:
                    ref.n = int(n)
                    out = slow(event)
                    n = float(ref.n)
                    if ref.stage.stops:
                        if ref.stage.closes_in_background:
                            self._inner.close_in_background()
                        await self._finish()  # the inner stream's close is already under way
                        final = out
                        break
                    if out is DROP:
                        phase = 0
                        continue
                phase = 2
                yield out
                phase = 0
            else:
                ref.n = int(n)
                final = await self._on_inner_exit(StopAsyncIteration())
        except BaseException as exc:
            ref.n = max(ref.n, int(n))
            if phase == 2:
                # Thrown in by the consumer at a yield: not the inner stream's ending. A close
                # (aclose(), or the loop finalising a guard that was dropped) ends the guard here.
                if exc.__class__ is GeneratorExit and self._phase is not Phase.FINISHED:
                    if self._closing is not None:
                        await self._end_closed(self._closing)  # our aclose(): its caller sees errors
                    else:
                        await self._end_dropped()
                raise
            if phase == 1:
                # The guard's own error (strict mode's InvalidEvent, say): end, then let it through.
                await self._on_raised(exc, Ending.RAISED)
                raise
            final = await self._on_inner_exit(exc)  # re-raises all but our own stuck-stream cancel
        finally:
            ref.n = max(ref.n, int(n))
        if final is not DROP:
            yield final

    def _check_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, which must be the one the guard (and its recorder) was built in."""
        try:
            return check_loop(self._loop, has_sink=self._rec is not None)
        except GuardOutsideLoop:
            # Nothing can be recorded or watched from here: the guard is over before it began, and a
            # later close is a no-op. The inner stream was never pulled; it is left to whoever made it, as
            # when guard() refuses a stream that is not async iterable.
            self._phase = Phase.FINISHED
            self._ref.go_slow()
            raise

    # -- endings: the referee decides, the core acts (closes, flushes, re-raises) ------------------

    async def _finish(self, *, close_inner: bool = True) -> None:
        """Idempotent end: stop the watchdog, close the inner stream, then flush the recorder."""
        if self._phase is Phase.FINISHED:
            return
        self._ref.finished()
        self._phase = Phase.FINISHED
        self._watchdog.stop()
        try:
            if close_inner:
                await self._inner.close()
        finally:
            try:
                if self._rec is not None:
                    await flush(self._rec, self._options.flush_timeout, self.lifecycle.info.response_id)
            finally:
                self._let_go()

    def _let_go(self) -> None:
        """A finished guard keeps what it reports (its lifecycle, how often it closed the inner
        stream) and lets go of what it was given: the host's context (the whole request), the inner
        stream, the recorder, the last response snapshot, the task of its first step.
        ``GuardedResponses`` keeps the last guards for ``guard_for()``; kept, they must not keep their
        requests (a 1 MB input kept 256 times over; and every kept object makes each full garbage
        collection longer)."""
        self._host.release()
        self._inner.release()
        self._ref.release()
        self._watchdog.release()
        self._rec = None

    async def _end_closed(self, ending: Ending) -> None:
        """The consumer closed the guard (or dropped it) before the end: decide, close, flush."""
        self._ref.ended_by(ending)
        await self._finish()

    async def _end_dropped(self) -> None:
        """The event loop's finaliser closes a guard its consumer dropped, in a task nobody awaits:
        an inner stream whose close raises is said here, once, rather than left in that task for
        "Task exception was never retrieved". The ending is recorded all the same."""
        try:
            await self._end_closed(Ending.CLOSED_EARLY)
        except Exception:
            log.warning("eventguard: closing the inner stream of a dropped guard raised", exc_info=True)

    async def _on_inner_exit(self, exc: BaseException) -> Any:
        """The inner stream ended or raised: decide, finish, and say what (if anything) to forward.

        Re-raises ``exc`` itself unless it is the end of the stream or our own stuck-stream cancel.
        """
        if isinstance(exc, StopAsyncIteration):
            out = self._ref.stream_ended()
            await self._finish()
            return out
        if isinstance(exc, asyncio.CancelledError):
            if self._watchdog.take_back(asyncio.current_task()):
                # Our own stuck-stream cancel, taken back: the stream ends as stuck.
                out = self._ref.stuck()
                self._inner.close_in_background()
                await self._finish(close_inner=False)
                return out
            self._ref.ended_by(Ending.RAISED_CANCELLED)
            await self._finish()
            raise exc
        await self._on_raised(exc, Ending.RAISED if isinstance(exc, Exception) else Ending.RAISED_BASE)
        raise exc

    async def _on_raised(self, exc: BaseException, ending: Ending) -> None:
        self._ref.raised(exc, ending)
        await self._finish()


class Guard:
    """A single-use async iterator and async context manager over one guarded stream.

    Made by :func:`guard`, whose arguments it takes (``options`` is them as one
    :class:`GuardOptions`); build it through :func:`guard`.

    The facade of the guard: its protocols. What it guards with lives in ``_Core``, which the hot loop's
    generator holds instead of this object, so that nothing but its consumer keeps a Guard alive.
    """

    __slots__ = ("__weakref__", "_core", "_gen", "lifecycle")

    def __init__(
        self,
        stream: AsyncIterable[Any],
        cancellation_signal: CancellationSignal,
        options: GuardOptions = _DEFAULTS,
        *,
        context: Any = None,
        sink: Sink | None = None,
        info: ResponseInfo | None = None,
        process_shutdown: object = None,
    ) -> None:
        """Built by :func:`guard` from its keyword arguments; built directly with a :class:`GuardOptions`
        (``GuardedResponses`` does). ``options.recoverable=None`` is resolved here, by the host adapter."""
        self._core = core = _Core(stream, cancellation_signal, options, context, sink, info, process_shutdown)
        #: The live lifecycle model of this response.
        self.lifecycle = core.lifecycle
        self._gen: AsyncGeneratorType[Any, None] | None = None

    @property
    def inner_closed(self) -> int:
        """How many times the guard closed the inner stream (0 or 1); public for tests and audits."""
        return self._core._inner.closed

    # -- the async context manager and iterator protocols --------------------------------------

    async def __aenter__(self) -> Guard:
        core = self._core
        if core._phase is not Phase.NEW:
            raise GuardAlreadyUsed("a guard is single-use; build a new one for each stream")
        core._phase = Phase.OPEN
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The body of ``async with`` ended: a cancel thrown into the host's handler (a foreground
        # disconnect with store=false) is a cancel, not a consumer that walked away.
        await self._close(exit_ending(exc))

    def __aiter__(self) -> AsyncGeneratorType[Any, None]:
        # ``async for`` drives the guard's own async generator directly: no extra layer per event.
        gen = self._gen
        if gen is None:
            core = self._core
            if core._phase is Phase.FINISHED:
                gen = cast(AsyncGeneratorType[Any, None], empty())
            else:
                gen = self._gen = cast(AsyncGeneratorType[Any, None], core._run())
                core._gen_ref = weakref.ref(gen)
        return gen

    def __anext__(self) -> Awaitable[Any]:
        return self.__aiter__().__anext__()

    async def aclose(self) -> None:
        """End the guard: close the inner stream once, record the ending, flush. Again: a no-op.

        Like an async generator's, it must not be called while another task is inside a step of
        the guard: that raises ``RuntimeError`` and changes nothing.
        """
        await self._close(Ending.CLOSED_EARLY)

    async def _close(self, ending: Ending) -> None:
        core = self._core
        core._open()
        gen = self._gen
        if gen is not None and gen.ag_await is not None:
            if core._phase is Phase.FINISHED:
                return
            raise RuntimeError("aclose(): the guard is in the middle of a step in another task")
        if gen is not None and not gen.ag_running:
            # Suspended between events (or never started): end our generator first, in this call.
            # Suspended at a hand-over, it records the ending itself (see _run), with this cause.
            core._closing = ending
            await gen.aclose()
        if core._phase is Phase.FINISHED:
            return
        await core._end_closed(ending)
