"""One-line integration with Microsoft Agent Framework's ``ResponsesHostServer``.

Put :class:`GuardedResponses` first among the bases and every response the server produces is guarded
(and recorded, when a sink is given)::

    from agent_framework_foundry_hosting import ResponsesHostServer
    from eventguard.foundry import GuardedResponses

    class MyServer(GuardedResponses, ResponsesHostServer):
        pass

    server = MyServer(agent, sink=my_sink)              # options as keyword arguments, or
    class Quiet(GuardedResponses, ResponsesHostServer):  # as class attributes
        eventguard_on_cancel = "omit"
        eventguard_cancel_grace = 5.0

:func:`guarded_server` does the same as a class decorator or factory, and :data:`GuardedResponsesHostServer`
is the ready-made subclass. The explicit ``guard(...)`` form keeps working; this is that loop, written
once, plus what the host knows about each response (agent name, recoverability).

This is the only module of the package that imports ``agent_framework`` / ``azure.ai.agentserver``
(``eventguard.testing``, the model-free building blocks of the demo and the tests, is the other
user of the host).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, cast

from agent_framework_foundry_hosting import ResponsesHostServer

from eventguard.guard import Guard, GuardOptions, info_from_context
from eventguard.lifecycle import ResponseInfo

if TYPE_CHECKING:
    from eventguard.recording import Sink

__all__ = ["GuardedResponses", "GuardedResponsesHostServer", "guarded_server", "response_info"]

OnCancel = Literal["omit", "emit"]
T = TypeVar("T", bound=type)

_UNSET: Any = object()


def _agent_name(server: object, context: object) -> str | None:
    """The agent's name as the host knows it: the platform's, the hosted agent's, then the context's."""
    config = getattr(server, "config", None)
    agent = getattr(server, "_agent", None)  # None on the newest release when built per request
    for name in (
        getattr(config, "agent_name", None),  # the Foundry deployment's agent name, when hosted
        getattr(agent, "name", None),
        getattr(context, "_agent_name", None),  # "server-default-agent" when not hosted
    ):
        if isinstance(name, str) and name:
            return name
    return None


def response_info(server: object, context: object) -> ResponseInfo:
    """Everything the host knows about one response (``info_from_context`` plus the agent name)."""
    info = info_from_context(context)
    return info.model_copy(update={"agent_name": _agent_name(server, context)})


class GuardedResponses:
    """Mixin that guards every response of a ``ResponsesHostServer`` subclass.

    Options, as class attributes or keyword arguments of the constructor (the constructor wins):

    - ``sink`` (``eventguard_sink``): where lifecycles are recorded; ``None`` records nothing.
    - ``on_cancel`` (``eventguard_on_cancel``): ``"omit"`` (default; the host writes the cancel)
      or ``"emit"``.
    - ``cancel_grace`` (``eventguard_cancel_grace``): seconds the guard waits for a stuck inner stream
      or a host that stopped iterating after a cancel; ``None`` disables the watchdog.
    - ``keep_shutdown_completion`` (``eventguard_keep_shutdown_completion``): keep a ``completed``
      produced after shutdown was signalled (recorded as unverified) instead of failing it.
    - ``on_guard``: called with each new :class:`~eventguard.Guard`, before its first event.

    The last guards are kept by response id (:meth:`guard_for`, bounded by ``eventguard_keep_guards``),
    for tests and diagnostics. A resilient server's stored background runs stopped by shutdown are
    recorded ``interrupted`` (they are recovered); on any other server such runs are lost, so ``failed``.
    """

    eventguard_sink: ClassVar[Sink | None] = None
    eventguard_on_cancel: ClassVar[OnCancel] = "omit"
    eventguard_cancel_grace: ClassVar[float | None] = 10.0
    eventguard_keep_shutdown_completion: ClassVar[bool] = False
    eventguard_keep_guards: ClassVar[int] = 256

    def __init__(
        self,
        *args: Any,
        sink: Sink | None = _UNSET,
        on_cancel: OnCancel = _UNSET,
        cancel_grace: float | None = _UNSET,
        keep_shutdown_completion: bool = _UNSET,
        on_guard: Callable[[Guard], None] | None = None,
        **kwargs: Any,
    ) -> None:
        self._eventguard_sink: Sink | None = self.eventguard_sink if sink is _UNSET else sink
        #: The options of every guard of this server (``recoverable`` is set per response).
        self._eventguard_options = GuardOptions(
            on_cancel=self.eventguard_on_cancel if on_cancel is _UNSET else on_cancel,
            cancel_grace=self.eventguard_cancel_grace if cancel_grace is _UNSET else cancel_grace,
            keep_shutdown_completion=(
                self.eventguard_keep_shutdown_completion
                if keep_shutdown_completion is _UNSET
                else keep_shutdown_completion
            ),
        )
        self._eventguard_on_guard = on_guard
        self._eventguard_guards: OrderedDict[str, Guard] = OrderedDict()
        #: Set once the process begins shutting down (cleared when the app starts). The host tells
        #: foreground responses through their context but never background ones; a background run the
        #: exit then cancels was stopped by shutdown, not by a client.
        self._eventguard_exiting = _Flag()
        super().__init__(*args, **kwargs)
        # SIGTERM under ``server.run()``: the host's pre-shutdown callbacks run first of all.
        register = getattr(self, "register_pre_shutdown_callback", None)
        if callable(register):
            register(self._eventguard_exiting.set)
        # Any ASGI server: the lifespan's shutdown, before the host's own shutdown code and before the
        # event loop cancels what still runs. Wrapping the lifespan itself (not the host's shutdown
        # handler) holds whatever handler is registered later and whatever the graceful timeout is.
        router = getattr(self, "router", None)
        lifespan = getattr(router, "lifespan_context", None)
        if lifespan is not None:
            router.lifespan_context = _noting_shutdown(lifespan, self._eventguard_exiting)  # type: ignore[union-attr]

    @property
    def _eventguard_on_cancel(self) -> OnCancel:
        return self._eventguard_options.on_cancel

    @property
    def _eventguard_cancel_grace(self) -> float | None:
        return self._eventguard_options.cancel_grace

    def request_shutdown(self) -> None:
        """The host's ``request_shutdown()`` (call it from your own SIGTERM handler), noted by the guards."""
        self._eventguard_exiting.set()
        parent = getattr(super(), "request_shutdown", None)
        if callable(parent):
            parent()

    def guard_for(self, response_id: str) -> Guard | None:
        """The most recent guard of ``response_id`` (a recovered response gets a new one), if kept."""
        return self._eventguard_guards.get(response_id)

    def _eventguard_remember(self, response_id: str | None, g: Guard) -> None:
        if response_id is None:
            return
        guards = self._eventguard_guards
        guards[response_id] = g
        guards.move_to_end(response_id)
        while len(guards) > max(self.eventguard_keep_guards, 0):
            guards.popitem(last=False)

    async def _handle_response(
        self, request: Any, context: Any, cancellation_signal: Any
    ) -> AsyncIterator[Any]:
        info = response_info(self, context)
        recoverable = bool(info.background and info.store and getattr(self, "_resilient_background", False))
        inner = cast(Any, super())._handle_response(request, context, cancellation_signal)
        g = Guard(
            inner,
            cancellation_signal,
            dataclasses.replace(self._eventguard_options, recoverable=recoverable),
            context=context,
            sink=self._eventguard_sink,
            info=info,
            process_shutdown=self._eventguard_exiting,
        )
        self._eventguard_remember(info.response_id, g)
        if self._eventguard_on_guard is not None:
            self._eventguard_on_guard(g)
        async with g as events:
            async for event in events:
                yield event


class _Flag:
    """A flag with ``is_set()``: set from the host's signal callback, read by the guards (no locks)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False

    def set(self) -> None:
        self.value = True

    def clear(self) -> None:
        self.value = False

    def is_set(self) -> bool:
        return self.value


def _noting_shutdown(
    lifespan: Callable[[Any], AbstractAsyncContextManager[Any]], exiting: _Flag
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    @asynccontextmanager
    async def noting(app: Any) -> AsyncIterator[Any]:
        exiting.clear()  # a new lifetime of the app: an earlier exit is over
        async with lifespan(app) as state:
            try:
                yield state
            finally:
                exiting.set()  # the server is shutting the app down: the host's shutdown runs next

    return noting


def guarded_server(cls: T) -> T:
    """Class decorator / factory: a subclass of ``cls`` (a ``ResponsesHostServer``) that guards responses.

    ``guarded_server(ResponsesHostServer)(agent, sink=...)`` or ``@guarded_server class MyServer(...)``.
    """
    if issubclass(cls, GuardedResponses):
        return cls
    namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    return cast(T, type(cls.__name__, (GuardedResponses, cls), namespace))


class GuardedResponsesHostServer(GuardedResponses, ResponsesHostServer):  # type: ignore[misc,unused-ignore]
    """``ResponsesHostServer`` with every response guarded: ``GuardedResponsesHostServer(agent, sink=s)``."""
