"""The watchdog of one guard: its task, the stuck-stream cancel it sends, and that cancel's take-back.

Once a cause is signalled it gives the stream ``cancel_grace`` seconds, then looks where the guard is
(:meth:`Watchdog.on_grace`: the referee decides, the watchdog keeps time and the cancel's books). It
holds the guard's generator only by a weak reference, and only between its awaits: a guard dropped
without being closed is collected, and its generator's finaliser cancels the watchdog.

The task to interrupt is the one whose await runs through the guard's step, found when the watchdog
fires, never on the hot path. A step may run in a task of its own (as under
``asyncio.wait_for(anext(it), t)`` or the host's wind-down loop): the task that took the first step is
looked at first, then every task of the loop; a task that merely awaits another task is not inside it.

The take-back follows ``asyncio.timeout``: only our own cancel is undone; when an outside cancel
arrives at the same time, that one wins and propagates. The cancel is only ever sent to a task with no
cancel pending (one on its way ends the wait anyway), so the count ``asyncio.timeout`` notes before its
cancel is zero here, and our cancel alone is a count of one.

The one cancel it may send has a state, one value (as httpx's ``ClientState``)::

    NOT_SENT ──cancel_stuck()──► SENT ──take_back() / give_back()──► HANDLED
        └──────────no task to interrupt: the ending recorded without one──────────┘

The watchdog does its own task bookkeeping (``task.cancel()``, ``task.uncancel()``); the referee only
decides (``Referee.record_stuck``, ``Referee.abandoned``), and the guard core asks the watchdog to
take back or give back its cancel when it reaches the guard.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import weakref
from collections.abc import AsyncGenerator, Callable
from enum import Enum
from types import AsyncGeneratorType, CoroutineType, GeneratorType
from typing import TYPE_CHECKING, Any, Final

from eventguard.guard.inner import keep
from eventguard.guard.referee import STUCK_MESSAGE

if TYPE_CHECKING:
    from eventguard.guard.host import Host
    from eventguard.guard.referee import Referee

log = logging.getLogger("eventguard.guard")

__all__ = ["STUCK_MESSAGE", "StuckCancel", "Watchdog", "awaits_through", "waiting_task"]


class StuckCancel(Enum):
    """The state of the one stuck-stream cancel a watchdog may send (see the module docstring)."""

    #: Not sent, nothing dealt with yet.
    NOT_SENT = "not_sent"
    #: Sent to ``Watchdog.stuck_task``, not yet dealt with: the next ``CancelledError`` in that task,
    #: or the next event the inner stream produces (it swallowed the cancel), is ours.
    SENT = "sent"
    #: Dealt with: taken back, given back, or the ending recorded without a cancel (no task found).
    HANDLED = "handled"


class Watchdog:
    """The stuck-stream watchdog of one guard, and the books of the one cancel it may send."""

    __slots__ = ("cancel", "first_task", "stuck_task", "task")

    def __init__(self) -> None:
        #: The watchdog's own task, once started.
        self.task: asyncio.Task[None] | None = None
        #: The task that took the first step: where the waiting task is looked for first.
        self.first_task: asyncio.Task[Any] | None = None
        #: Where the stuck-stream cancel is (see StuckCancel).
        self.cancel = StuckCancel.NOT_SENT
        #: The task the stuck-stream cancel was sent to, while that is handled (None unless SENT).
        self.stuck_task: asyncio.Task[Any] | None = None

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        gen: weakref.ref[AsyncGeneratorType[Any, None]],
        referee: Referee,
        host: Host,
        grace: float,
    ) -> None:
        """Start watching the guard's generator ``gen`` (a weak reference) and its ``referee``, once
        ``host`` signals a cause, for ``grace`` seconds; from the guard's first step, in ``loop`` (the
        current task is where it looks first)."""
        self.first_task = asyncio.current_task()
        # The watchdog task is kept alive (inner.keep) until it ends, so that it is never collected
        # pending along with a dropped guard and the signal it waits on.
        self.task = task = loop.create_task(self._watch(gen, referee, host, grace))
        keep(task)

    def stop(self) -> None:
        """The guard is ending: stop watching (unless this is the watchdog's own call).

        The cancel is all it takes: the watchdog's task only ever resumes from an await, where a
        cancel sent before it resumed is raised, so it never runs a step after this (no flag to check).
        """
        task = self.task
        if task is not None and task is not asyncio.current_task():
            # Forget the task as we cancel it: the cancelled task keeps its CancelledError, whose
            # traceback holds _watch's frame and so this watchdog; a watchdog still holding the
            # task would close a cycle (task, error, frame, watchdog, task), and every guard's
            # objects would wait for a full garbage collection instead of going with the stream.
            self.task = None
            task.cancel()

    def release(self) -> None:
        """The guard has ended (the watchdog stopped): let go of the task of its first step."""
        self.first_task = None

    async def _watch(
        self, ref: weakref.ref[AsyncGeneratorType[Any, None]], referee: Referee, host: Host, grace: float
    ) -> None:
        """Once a cause is signalled, give the stream ``grace`` seconds, then stop waiting for it.

        Holds the guard's generator only by ``ref``, and only between its awaits: a guard dropped
        without being closed is collected, and its generator's finaliser cancels this task.
        """
        try:
            await host.wait_for_cause(ref)
        except Exception as exc:
            # Not expected (a flag that raises is read as not set): said here, since nobody awaits
            # this task (asyncio would say "Task exception was never retrieved").
            log.warning(
                "eventguard guard: waiting for a cause raised %s; the watchdog stops", type(exc).__name__
            )
            return
        await asyncio.sleep(grace)
        gen = ref()
        if gen is None or not self.on_grace(gen, referee, grace):
            return
        del gen
        await asyncio.sleep(grace)
        if ref() is not None:
            self.on_second_grace(referee)

    @property
    def cancel_pending(self) -> bool:
        """The stuck-stream cancel was sent and not yet dealt with."""
        return self.cancel is StuckCancel.SENT

    def cancel_stuck(self, task: asyncio.Task[Any]) -> None:
        """Cancel just the stuck await of ``task`` (which has no other cancel pending), as
        ``asyncio.timeout`` does."""
        self.cancel = StuckCancel.SENT
        self.stuck_task = task
        task.cancel(msg=STUCK_MESSAGE)

    def take_back(self, task: asyncio.Task[Any] | None) -> bool:
        """A ``CancelledError`` reached the guard in ``task``: True when it was our cancel alone.

        Our own cancel is undone; if someone else cancelled too, theirs stands and propagates.
        """
        if task is None or task is not self.stuck_task:  # stuck_task is None unless our cancel is pending
            return False
        self.cancel = StuckCancel.HANDLED
        self.stuck_task = None
        # The count was zero before our cancel: back at zero, ours was the only one.
        return not task.uncancel()

    def on_grace(self, gen: AsyncGeneratorType[Any, None], referee: Referee, grace: float) -> bool:
        """``grace`` after the cause, the guard (its generator ``gen``, its ``referee``) not finished.
        True when a stuck await was cancelled and is to be checked again after a second ``grace``."""
        if referee.stage.owned:
            return False
        if gen.ag_await is not None:
            # Suspended inside an await of the hot loop: that is the inner stream's __anext__, in
            # whichever task took this step (each step may be a task of its own: wait_for(anext(it))).
            task = waiting_task(gen, self.first_task)
            if task is None:
                # No task is seen waiting through the guard (a step driven by hand, or through an
                # awaitable the guard cannot look into). Never cancel a task that is not inside the
                # guard: record the ending without interrupting anyone.
                self.cancel = StuckCancel.HANDLED
                referee.record_stuck(
                    f"{STUCK_MESSAGE}; no task waiting in the guard could be found to interrupt: ending "
                    "recorded without it, the consumer stays blocked until the inner stream returns"
                )
                return False
            if task.cancelling():
                # A cancel is already on its way to that await (a timeout, the host): it ends the
                # wait anyway, and ours could not be told apart from it when it arrives.
                return False
            # Stuck in the inner stream's await: cancel just that await, as asyncio.timeout does,
            # and take the cancel back when it reaches the guard (see _Core._on_inner_exit).
            referee.go_slow()
            self.cancel_stuck(task)
            return True
        # Not inside a step: the host may have stopped iterating (the referee decides).
        referee.abandoned(grace)
        return False

    def on_second_grace(self, referee: Referee) -> None:
        """A second ``grace`` after our cancel, the guard not finished."""
        if not self.cancel_pending:
            return
        # Nothing reached the guard since our cancel (no CancelledError: take_back; no event:
        # give_back; no end of the stream: the guard would be finished), so it is still suspended in
        # the inner stream's await: the inner stream swallowed the cancel and is waiting again.
        # Nothing short of running every pull in a task of its own (a cost on every event) can end
        # that wait; record the ending now, and give the task back the cancel count it had.
        self.give_back()
        referee.record_stuck(
            f"{STUCK_MESSAGE}; it swallowed the cancel and is still waiting: ending recorded "
            "without it, the consumer stays blocked until the inner stream returns"
        )
        log.warning("eventguard: %s", STUCK_MESSAGE + " and swallowed the cancel")

    def off_the_hot_path(self, referee: Referee) -> Callable[[Any], Any]:
        """What the guard does with an event off the hot path: what to forward (or DROP)."""
        event = referee.event
        swallowed = referee.swallowed_cancel

        def slow(e: Any) -> Any:
            if self.cancel_pending:
                # The inner stream swallowed our cancel and produced an event: give its task back the
                # cancel count it had (our books); the referee decides what the event means.
                self.give_back()
                return swallowed(e)
            return event(e)

        return slow

    def give_back(self) -> None:
        """The inner stream swallowed our cancel: give its task back the cancel count it had."""
        self.cancel = StuckCancel.HANDLED
        task = self.stuck_task
        self.stuck_task = None
        if task is not None:
            task.uncancel()  # ours, still counted: the stream swallowed it (a no-op at zero)


async def _probe() -> AsyncGenerator[None, None]:
    yield None


def _step_wrapper_types() -> tuple[type, ...]:
    """The awaitables that stand for one step of an async generator: asend, athrow, anext(it, d)."""
    hooks = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(None, None)  # a probe, not an async generator for the loop to finalise
    try:
        gen = _probe()
        made = [gen.asend(None), gen.athrow(GeneratorExit()), anext(gen, None)]
        kinds = tuple({type(m) for m in made})
        for m in made:
            m.close()
    finally:
        sys.set_asyncgen_hooks(*hooks)
    return kinds


_STEP_WRAPPERS: Final = _step_wrapper_types()
_CHAIN_TYPES: Final = (AsyncGeneratorType, CoroutineType, GeneratorType, *_STEP_WRAPPERS)
_MAX_CHAIN: Final = 256


def waiting_task(
    gen: AsyncGeneratorType[Any, None], hint: asyncio.Task[Any] | None
) -> asyncio.Task[Any] | None:
    """The task whose current await runs through ``gen``: the one inside the guard's step, or None.

    Read at fire time only (never on the hot path): ``hint``, the task of the first step, is looked
    at first, then every task of the loop.
    """
    if hint is not None and not hint.done() and awaits_through(hint, gen):
        return hint
    for task in asyncio.all_tasks():
        if task is not hint and awaits_through(task, gen):
            return task
    return None


def awaits_through(task: asyncio.Task[Any], gen: object) -> bool:
    """Whether ``task``'s chain of awaits (coroutines, generators, async generator steps) reaches ``gen``.

    The chain stops at a future: a task that awaits another task is not inside that task's step.
    """
    obj: object = task.get_coro()
    for _ in range(_MAX_CHAIN):
        if obj is gen:
            return True
        if isinstance(obj, CoroutineType):
            obj = obj.cr_await
        elif isinstance(obj, AsyncGeneratorType):
            obj = obj.ag_await
        elif isinstance(obj, GeneratorType):
            obj = obj.gi_yieldfrom
        elif isinstance(obj, _STEP_WRAPPERS):
            # A step of an async generator (anext(it), it.asend(v)) keeps its generator to itself.
            obj = next((r for r in gc.get_referents(obj) if isinstance(r, _CHAIN_TYPES)), None)
        else:
            return False
    return False
