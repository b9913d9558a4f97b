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

import asyncio
import dataclasses
import inspect
import logging
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, cast

from agent_framework_foundry_hosting import ResponsesHostServer

from eventguard import _arguments as arguments
from eventguard._text import one_line
from eventguard.guard import Guard, GuardOptions, info_from_context
from eventguard.lifecycle import ResponseInfo

if TYPE_CHECKING:
    from sqlalchemy.engine import URL
    from sqlalchemy.ext.asyncio import AsyncEngine

    from eventguard.agent_sessions import SqlAgentSessionStoreProvider
    from eventguard.provider import SqlResponseProvider
    from eventguard.recording import Sink
    from eventguard.replicas import ReplicaOptions
    from eventguard.replicas.replica import Replica

__all__ = ["GuardedResponses", "GuardedResponsesHostServer", "Storage", "guarded_server", "response_info"]

OnCancel = Literal["omit", "emit"]
T = TypeVar("T", bound=type)

_UNSET: Any = object()

log = logging.getLogger("eventguard.foundry")


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
    - ``on_guard``: called with each new :class:`~eventguard.Guard`, before its first event; an
      error it raises is logged (``eventguard.foundry``) and the response goes on.
    - ``database`` (``eventguard_database``): one URL or ``AsyncEngine`` for everything: an
      :class:`~eventguard.SqlSink` for the guards (unless ``sink=`` is given; ``sink=None`` keeps
      only the store) and an :class:`~eventguard.SqlResponseProvider` as the host's response store
      (``response_store=`` on newer hosts, ``store=`` on 1.0.0b260918; unless you pass one of those
      yourself), and an :class:`~eventguard.SqlAgentSessionStoreProvider` as its
      ``agent_session_store_provider`` (unless you pass one), so the agent sessions live in the
      database, not the state folder. ``schema`` is the PostgreSQL schema; ``migrate``: ``None``
      creates the schema in an empty database, ``True`` also upgrades an older one, ``False`` only
      checks. What ``database`` builds lives as long as the server: the sink and the store are
      opened when the app starts (schema checked, a leftover spool replayed) and closed when it
      stops, after the host's own shutdown, so the last guard's events are flushed first.
    - ``replicas`` (``eventguard_replicas``): a :class:`~eventguard.replicas.ReplicaOptions` turns
      this server into one replica of several on the ``database`` (leases with fencing tokens, a
      heartbeat, a reaper, cancel/delete/duplicate ids answered as the owner would: README
      "Several replicas"). Needs ``database=``.
    - ``spool_path``: the spool of the sink ``database=`` builds (default: beside an SQLite file,
      else ``./eventguard-spool-<database>.jsonl``); needed for an engine whose URL names no host
      and no database (one that connects by its own ``async_creator``).

    The last guards are kept by response id (:meth:`guard_for`, bounded by ``eventguard_keep_guards``),
    for tests and diagnostics; a finished guard keeps its lifecycle, not the request it served. A
    resilient server's stored background runs stopped by shutdown are recorded ``interrupted`` (they are
    recovered); on any other server such runs are lost, so ``failed``.
    """

    eventguard_sink: ClassVar[Sink | None] = None
    eventguard_on_cancel: ClassVar[OnCancel] = "omit"
    eventguard_cancel_grace: ClassVar[float | None] = 10.0
    eventguard_keep_shutdown_completion: ClassVar[bool] = False
    eventguard_keep_guards: ClassVar[int] = 256
    eventguard_database: ClassVar[str | URL | AsyncEngine | None] = None
    eventguard_replicas: ClassVar[ReplicaOptions | None] = None

    def __init__(
        self,
        *args: Any,
        sink: Sink | None = _UNSET,
        on_cancel: OnCancel = _UNSET,
        cancel_grace: float | None = _UNSET,
        keep_shutdown_completion: bool = _UNSET,
        on_guard: Callable[[Guard], None] | None = None,
        database: str | URL | AsyncEngine | None = _UNSET,
        schema: str | None = None,
        migrate: bool | None = None,
        replicas: ReplicaOptions | None = _UNSET,
        spool_path: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
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
        # Checked now, before anything is built: a bad one would otherwise fail every request's guard.
        self._eventguard_options.check()
        arguments.callable_or_none("on_guard", on_guard)
        if database is _UNSET:
            database = self.eventguard_database
        if replicas is _UNSET:
            replicas = self.eventguard_replicas
        if replicas is not None and database is None:
            raise ValueError("replicas= needs database= (the leases live in that database)")
        if spool_path is not None and (database is None or sink is not _UNSET):
            # Nothing here would use it: said, not ignored.
            raise ValueError(
                "spool_path= is the spool of the sink database= builds: with sink= given, give that "
                "sink its spool_path=; without database=, there is no sink of eventguard's making"
            )
        if replicas is not None and ("store" in kwargs or "response_store" in kwargs):
            # The replicas' leases fence eventguard's SQL store, and every replica must serve from
            # it: the application's own store was replaced without a word.
            given = "store" if "store" in kwargs else "response_store"
            raise ValueError(
                f"replicas= serves every response from eventguard's SQL store in database=; "
                f"it cannot be combined with {given}= (drop one of them)"
            )
        #: What ``database=`` built (opened and closed with the app), or None.
        self.eventguard_storage: Storage | None = None
        if database is not None:
            keyword = _store_keyword()
            wants_store = "store" not in kwargs and "response_store" not in kwargs
            self.eventguard_storage = Storage.build(
                database,
                schema=schema,
                migrate=migrate,
                sink=sink is _UNSET,
                provider=wants_store,
                replicas=replicas,
                spool_path=spool_path,
            )
            if self.eventguard_storage.sink is not None:
                sink = self.eventguard_storage.sink
            if self.eventguard_storage.provider is not None:
                kwargs[keyword] = self.eventguard_storage.provider
            if kwargs.get("agent_session_store_provider") is None:
                sessions = self.eventguard_storage.sessions(database, schema, migrate)
                kwargs["agent_session_store_provider"] = sessions
        self._eventguard_sink: Sink | None = self.eventguard_sink if sink is _UNSET else sink
        self._eventguard_on_guard = on_guard
        self._eventguard_guards: OrderedDict[str, Guard] = OrderedDict()
        #: Set once the process begins shutting down (cleared when the app starts). The host tells
        #: foreground responses through their context but never background ones; a background run the
        #: exit then cancels was stopped by shutdown, not by a client.
        self._eventguard_process_shutdown = _Flag()
        self._eventguard_running = _Running()
        super().__init__(*args, **kwargs)
        # SIGTERM under ``server.run()``: the host's pre-shutdown callbacks run first of all.
        register = getattr(self, "register_pre_shutdown_callback", None)
        if callable(register):
            register(self._eventguard_process_shutdown.set)
        # Any ASGI server: the lifespan's shutdown, before the host's own shutdown code and before the
        # event loop cancels what still runs. Wrapping the lifespan itself (not the host's shutdown
        # handler) holds whatever handler is registered later and whatever the graceful timeout is.
        router = getattr(self, "router", None)
        lifespan = getattr(router, "lifespan_context", None)
        if lifespan is not None:
            wrapped = _noting_shutdown(lifespan, self._eventguard_process_shutdown, self._eventguard_running)
            if self.eventguard_storage is not None:
                wrapped = _owning(wrapped, self.eventguard_storage)
            router.lifespan_context = wrapped  # type: ignore[union-attr]
        # eventguard.replicas: requests about another replica's responses (see docs/replicas.md).
        replica = self._eventguard_replica
        if replica is not None:
            from eventguard.replicas.relay import ReplicaMiddleware

            cast(Any, self).add_middleware(ReplicaMiddleware, replica=replica)

    @property
    def _eventguard_replica(self) -> Replica | None:
        storage = self.eventguard_storage
        return None if storage is None else storage.replica

    @property
    def _eventguard_on_cancel(self) -> OnCancel:
        return self._eventguard_options.on_cancel

    @property
    def _eventguard_cancel_grace(self) -> float | None:
        return self._eventguard_options.cancel_grace

    def request_shutdown(self) -> None:
        """The host's ``request_shutdown()`` (call it from your own SIGTERM handler), noted by the guards."""
        self._eventguard_process_shutdown.set()
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
        replica = self._eventguard_replica  # eventguard.replicas: the lease, claimed inside the guard
        if replica is not None and info.response_id is not None:
            inner = replica.leased(info.response_id, context, inner)
        g = Guard(
            inner,
            cancellation_signal,
            dataclasses.replace(self._eventguard_options, recoverable=recoverable),
            context=context,
            sink=self._eventguard_sink,
            info=info,
            process_shutdown=self._eventguard_process_shutdown,
        )
        self._eventguard_remember(info.response_id, g)
        if self._eventguard_on_guard is not None:
            try:
                self._eventguard_on_guard(g)
            except Exception:
                # The application's hook (metrics, a registry) is not the response: the stream goes
                # on. Raised here, it left the guard unstepped (its row 'new' for good) and the host
                # recorded the response failed.
                shown = one_line(g.lifecycle.info.response_id)
                log.warning("eventguard: on_guard raised for response %s", shown, exc_info=True)
        # The task iterating the response (the request's, or the host's background task): ended by
        # the lifespan's shutdown if it is still running then (_Running.end).
        task = asyncio.current_task()
        self._eventguard_running.add(task)
        try:
            async with g as events:
                async for event in events:
                    yield event
        finally:
            self._eventguard_running.discard(task)
            if replica is not None and info.response_id is not None:
                # A task of the replica (kept there, and given its chance when the replica stops).
                replica.settle_later(info.response_id, context)


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


class _Running:
    """The tasks iterating a guarded response now, so that the lifespan's shutdown can end those still
    running (:meth:`end`)."""

    __slots__ = ("_tasks",)

    #: How long the shutdown waits for the responses it cancelled to record their endings (each
    #: guard's final flush is bounded by its own ``flush_timeout``, 5 s by default).
    WITHIN: ClassVar[float] = 10.0

    def __init__(self) -> None:
        #: Task -> how many guarded responses it is iterating (one, but nothing forbids more).
        self._tasks: dict[asyncio.Task[Any], int] = {}

    def add(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._tasks[task] = self._tasks.get(task, 0) + 1

    def discard(self, task: asyncio.Task[Any] | None) -> None:
        if task is None:
            return
        left = self._tasks.pop(task, 0) - 1
        if left > 0:
            self._tasks[task] = left

    async def end(self, within: float = WITHIN) -> None:
        """Cancel every task still iterating a guarded response and wait, at most ``within`` seconds,
        for them to end: each guard records its ending (``shutdown``: the flag is set) and writes it.

        The event loop would cancel them too, but later, and not always: uvicorn re-raises the
        SIGTERM it handled as soon as the lifespan has shut down, and the process ends there, with
        a background run still ``in_progress`` in the database and nothing spooled. Here the sink and
        the response store are still open, and the host's own handler of the response is told.
        """
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not me and not t.done()]
        if not tasks:
            return
        log.info("eventguard: shutdown: ending %d responses still running", len(tasks))
        for task in tasks:
            task.cancel()
        _done, pending = await asyncio.wait(tasks, timeout=within)
        if pending:
            log.warning(
                "eventguard: shutdown: %d responses still running %.0f s after they were cancelled",
                len(pending),
                within,
            )


def _noting_shutdown(
    lifespan: Callable[[Any], AbstractAsyncContextManager[Any]], exiting: _Flag, running: _Running
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    @asynccontextmanager
    async def noting(app: Any) -> AsyncIterator[Any]:
        exiting.clear()  # a new lifetime of the app: an earlier exit is over
        try:
            async with lifespan(app) as state:
                try:
                    yield state
                finally:
                    exiting.set()  # the server is shutting the app down: the host's shutdown runs next
        finally:
            # After the host's own shutdown (its drain, its handlers), before the storage closes.
            await running.end()

    return noting


def _store_keyword() -> str:
    """The host's keyword for its response store: ``response_store`` (newer; ``store`` is its
    deprecated alias there), ``store`` on 1.0.0b260918."""
    parameters = inspect.signature(ResponsesHostServer.__init__).parameters
    return "response_store" if "response_store" in parameters else "store"


@dataclasses.dataclass
class Storage:
    """The sink and the response store one ``database=`` built, opened and closed together.

    ``sink``: the :class:`~eventguard.SqlSink` (None when the caller gave its own ``sink=``);
    ``provider``: the :class:`~eventguard.SqlResponseProvider` (None when the caller passed the host
    a store of its own).
    """

    sink: Any | None
    provider: SqlResponseProvider | None
    #: The replica's leases and relay (``replicas=``), or None.
    replica: Replica | None = None
    #: The agent sessions' store (:meth:`sessions`), or None.
    session_store: SqlAgentSessionStoreProvider | None = None

    def sessions(
        self, database: str | URL | AsyncEngine, schema: str | None, migrate: bool | None
    ) -> SqlAgentSessionStoreProvider:
        """The host's agent sessions in the same database: through :attr:`provider` when there is one,
        else through a response store of their own on ``database`` (closed with the rest)."""
        from eventguard.agent_sessions import SqlAgentSessionStoreProvider

        if self.session_store is None:
            shared = self.provider
            self.session_store = SqlAgentSessionStoreProvider(
                shared if shared is not None else database, schema=schema, auto_migrate=migrate
            )
        return self.session_store

    @classmethod
    def build(
        cls,
        database: str | URL | AsyncEngine,
        *,
        schema: str | None,
        migrate: bool | None,
        sink: bool,
        provider: bool,
        replicas: ReplicaOptions | None = None,
        spool_path: str | os.PathLike[str] | None = None,
    ) -> Storage:
        """The sink (if ``sink``, its spool at ``spool_path``, else its default) and the provider
        (if ``provider``) on one database.

        An ``AsyncEngine`` is borrowed by both, whole: its pool, its ``async_creator`` and connection
        settings (rebuilt from ``engine.url`` they would be lost, and a token-authenticated engine's
        URL may name no database at all), with ``schema`` set per transaction. A URL gives each its
        own pool.
        """
        from sqlalchemy.ext.asyncio import AsyncEngine

        from eventguard.provider import SqlResponseProvider
        from eventguard.sink import SqlSink

        made_sink = None
        if not sink:
            pass
        elif isinstance(database, AsyncEngine) and database.url.get_driver_name() in _BORROWABLE:
            made_sink = SqlSink(engine=database, schema=schema, auto_migrate=migrate, spool_path=spool_path)
        else:
            # A URL; or an engine of a driver the sink does not write through (psycopg): its own
            # engine on the engine's URL, with the driver it writes through.
            url = database.url if isinstance(database, AsyncEngine) else database
            made_sink = SqlSink(url, schema=schema, auto_migrate=migrate, spool_path=spool_path)
        if replicas is not None:  # eventguard.replicas: the store fenced by this replica's leases
            from eventguard.replicas.fenced import FencedResponseProvider
            from eventguard.replicas.replica import Replica

            fenced = FencedResponseProvider(database, schema=schema, auto_migrate=migrate)
            return cls(made_sink, fenced, Replica(replicas, fenced))
        made_provider = (
            SqlResponseProvider(database, schema=schema, auto_migrate=migrate) if provider else None
        )
        return cls(made_sink, made_provider)

    async def start(self) -> None:
        """Open both: the sink first (it creates or upgrades the schema, per ``migrate``, and replays
        a spool left from before), then the store (which checks the schema)."""
        if self.sink is not None:
            await self.sink.start()
        if self.provider is not None:
            await self.provider.start()

    async def aclose(self) -> None:
        """Close both: the sink flushes what the guards recorded, the store releases its pool."""
        try:
            if self.sink is not None:
                await self.sink.aclose()
        finally:
            try:
                if self.provider is not None:
                    await self.provider.aclose()
            finally:
                own = self.session_store.provider if self.session_store is not None else None
                if own is not None and own is not self.provider:
                    await own.aclose()


#: The drivers of an engine the sink borrows (``SqlSink(engine=)``).
_BORROWABLE = frozenset({"asyncpg", "aiosqlite"})


def _owning(
    lifespan: Callable[[Any], AbstractAsyncContextManager[Any]], storage: Storage
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """The app's lifespan inside the storage's: opened before the host starts, closed after the
    host's own shutdown has let the last responses end."""

    @asynccontextmanager
    async def owning(app: Any) -> AsyncIterator[Any]:
        await storage.start()
        try:
            if storage.replica is not None:
                await storage.replica.start(app)
            try:
                async with lifespan(app) as state:
                    yield state
            finally:
                if storage.replica is not None:
                    await storage.replica.stop()
        finally:
            await storage.aclose()

    return owning


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
