"""One replica: its identity, its leases' heartbeat, the reaper, and the cancel relay."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import event, func, literal, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from eventguard.envelopes import key as _key
from eventguard.envelopes import partition as _partition
from eventguard.envelopes import shown as _shown
from eventguard.envelopes import user_of as _user_of
from eventguard.lifecycle import AnomalyKind
from eventguard.replicas import leases as lease_sql
from eventguard.replicas import snapshot
from eventguard.replicas.fenced import FencedResponseProvider, LeaseUnavailableError
from eventguard.replicas.identity import default_identity
from eventguard.replicas.options import ReplicaOptions
from eventguard.replicas.reap import end_envelope, end_lifecycle
from eventguard.replicas.relay import RELAYED
from eventguard.sql.tables import anomalies, responses

log = logging.getLogger(__name__)

#: The PostgreSQL channel a relayed cancel is announced on (payload: the owner's identity).
CHANNEL = "eventguard_cancel"
#: Seconds at most :meth:`Replica.stop` waits for the settlements still running (the host's own
#: shutdown grace has already passed by then; an orchestrator's kill comes not much later).
STOP_SETTLE_WAIT = 2.0
#: Stored statuses a settlement keeps waiting on: in flight, or nothing stored yet (None).
_WAITED_FOR = frozenset({*snapshot.IN_FLIGHT, None})
#: Headers of the original cancel request the owner's host needs (its user partition, call id).
_KEPT_HEADERS = ("x-agent-user-id", "x-agent-foundry-call-id", "authorization")


class Replica:
    """This process's part in a deployment of several replicas on one database."""

    def __init__(self, options: ReplicaOptions, provider: FencedResponseProvider) -> None:
        self.options = options
        self.identity = options.identity or default_identity()
        self.provider = provider
        provider.replica = self
        #: The fencing token of each lease this replica holds, by (partition, response key).
        self.tokens: dict[tuple[str, str], int] = {}
        #: Leases a terminal write of this replica ended (the handler's end need not end them).
        self.ended: set[tuple[str, str]] = set()
        #: The responses whose handler has started here (``leased``), until ``settle``.
        self.runs: set[tuple[str, str]] = set()
        #: What this replica reaped, and which of its writes were fenced out (diagnostics, tests).
        self.reaped: list[str] = []
        self.fenced_out: list[str] = []
        self.started = False
        self._app: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._listener: AsyncConnection | None = None
        self._delivering: set[asyncio.Task[None]] = set()
        #: Settlements running after their handler (:meth:`settle_later`): (partition, key, id, user).
        self._settling: dict[asyncio.Task[None], tuple[str, str, str, str | None]] = {}
        self._stopping = asyncio.Event()

    # -- lifetime ---------------------------------------------------------------------------------

    async def start(self, app: Any) -> None:
        """Start the heartbeat, the reaper and the cancel relay (after the storage has started)."""
        self._app = app
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        await self._bound_idle_transactions()
        await self._listen()
        for loop in (self._heartbeat_loop, self._reaper_loop, self._cancel_loop):
            self._tasks.append(asyncio.create_task(loop(), name=f"eventguard-replica-{loop.__name__}"))
        self.started = True

    async def stop(self) -> None:
        """Stop the loops, after the settlements still running had their bounded chance
        (:meth:`_stop_settling`): the host's own shutdown, which ran before, let its last responses
        write their terminals."""
        self.started = False
        try:
            await self._stop_settling()
        except Exception as exc:  # never in the way of the rest of the shutdown
            log.warning("stopping: the settlements of this replica's leases failed: %s", exc)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._listener.close(), 5)
            self._listener = None

    @contextlib.asynccontextmanager
    async def _tx(self) -> AsyncIterator[AsyncConnection]:
        async with self.provider.engine.begin() as conn:
            yield conn

    # -- ownership --------------------------------------------------------------------------------

    def _where(self, response_id: str, user: str | None) -> tuple[str, str]:
        return _partition(SimpleNamespace(user_id_key=user)), _key(response_id)

    async def claim_id(self, response_id: str, user: str | None) -> bool:
        """Claim a client-chosen id before the host runs it; False: live or stored elsewhere."""
        part, key = self._where(response_id, user)
        async with self._tx() as conn:
            token = await lease_sql.claim(
                conn, partition=part, key=key, response_id=response_id, owner=self.identity,
                lease=self.options.lease, takeover=False,
            )  # fmt: skip
        if token is not None:
            self.tokens[(part, key)] = token
        return token is not None

    async def release_unrun(self, response_id: str, user: str | None) -> None:
        """End the lease ``claim_id`` took for a POST the host refused before its handler ran (a
        400 for a malformed id, say): nothing else would, and every heartbeat would renew it."""
        where = self._where(response_id, user)
        if where in self.runs:
            return  # the handler runs: settle() ends the lease
        token = self.tokens.get(where)
        if token is None:
            return
        try:
            async with self._tx() as conn:
                # Nothing ran or was stored: ended (as it was), the id's corrected retry met a 409.
                await lease_sql.release(conn, where[0], where[1], self.identity, token)
        except Exception as exc:  # called from the relay's finally: the request's own error stands
            # Kept, and renewed by the heartbeat: once this process stops, a reaper ends it.
            log.warning("could not give back the lease of %r (its POST was refused): %s", response_id, exc)
            return
        self.tokens.pop(where, None)

    async def claim_run(self, response_id: str, context: Any) -> None:
        """Hold the lease of a response the host starts running here (a recovered run takes over an
        expired or interrupted lease)."""
        part, key = _partition(context), _key(response_id)
        background = _background(context)
        held = self.tokens.get((part, key))
        if held is not None:  # claimed for its POST, before the host made the context
            async with self._tx() as conn:
                await lease_sql.note_background(conn, part, key, self.identity, held, background)
            return
        async with self._tx() as conn:
            token = await lease_sql.claim(
                conn, partition=part, key=key, response_id=response_id, owner=self.identity,
                lease=self.options.lease, takeover=True, background=background,
            )  # fmt: skip
        if token is None:
            log.warning("response %r is leased by another live replica: writes here unfenced", response_id)
            return
        self.tokens[(part, key)] = token

    async def leased(self, response_id: str, context: Any, inner: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """``inner``'s events once this run's lease is held. The claim is made here, inside the
        guard's iteration, so a database that cannot answer it fails the run where the guard records
        it (:class:`LeaseUnavailableError`), instead of before the guard, where nothing would."""
        self.runs.add((_partition(context), _key(response_id)))
        try:
            await self.claim_run(response_id, context)
        except Exception as exc:
            with contextlib.suppress(Exception):
                await cast(Any, inner).aclose()
            raise LeaseUnavailableError(
                f"replica {self.identity!a} could not claim the lease of response {response_id!a}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        async for item in inner:
            yield item

    def settle_later(self, response_id: str, context: Any) -> None:
        """Start :meth:`settle` as a task of this replica (after the handler ended): its caller is
        never held up by it, and :meth:`stop` gives it a bounded chance to finish."""
        task = asyncio.get_running_loop().create_task(self.settle(response_id, context))
        self._settling[task] = (_partition(context), _key(response_id), response_id, _user(context))
        task.add_done_callback(lambda done: self._settling.pop(done, None))

    async def settle(self, response_id: str, context: Any) -> None:
        """After the handler ended: give the host the time to write the terminal (which ends the
        lease under the token); then end the lease if nothing did.

        The host's write can come later than one lease (seen under heavy load), so while waiting
        the lease is renewed under its token at the heartbeat's cadence (the heartbeat itself can be
        late then too). What ends the wait is decided by whether the host stores the response
        (:func:`_host_stores`: the context's ``mode_flags.store``, else the request's ``store``;
        unknown counts as stored, the host's default):

        - not stored (``store=false``): at once. The host writes nothing for it, so nothing would
          end the lease, and there is no write to fence.
        - stored: after one lease the stored envelope is looked at at the heartbeat's cadence
          (at once while :meth:`stop` runs): terminal ends the wait; in flight, *or not stored
          yet*, the wait goes on, up to ``settle_wait`` (default six leases). "Not stored yet" is
          not "done": the host (2.2.0b1 and 2.4.0b1) writes the envelope of a run that ended
          before its ``response.created`` once, at the end (``create_response``), and a write
          later than one lease found the lease ended there, and went unfenced.

        Run as a task after the handler (:meth:`settle_later`, from ``foundry``)."""
        where = (_partition(context), _key(response_id))
        user = _user(context)
        stored = _host_stores(context)
        loop = asyncio.get_running_loop()
        start = loop.time()
        every = self.options.heartbeat_every
        bound = start + max(self.options.settle_within, self.options.lease)
        renew_due, look_due = start + every, start + self.options.lease
        while stored and (token := self.tokens.get(where)) is not None and loop.time() < bound:
            now = loop.time()
            if now >= renew_due:
                renew_due = now + every
                try:
                    async with self._tx() as conn:
                        held = await lease_sql.renew_fenced(
                            conn, where[0], where[1], self.identity, token, self.options.lease
                        )
                except Exception as exc:  # the heartbeat renews it too; the wait stays bounded
                    log.warning("could not renew the lease of %r while settling: %s", response_id, exc)
                    held = True
                if not held:
                    break  # no longer ours: the end below is refused, as any write under it would be
            if now >= look_due or self._stopping.is_set():
                look_due = now + every
                if await self._stored_status(response_id, user) not in _WAITED_FOR:
                    break  # terminal (or unreadable as a dict: the host's fallback answers it)
            await asyncio.sleep(0.05)  # the terminal write happens in the host, after the handler
        await self._end_settled(where, stored=stored)

    async def _end_settled(self, where: tuple[str, str], *, stored: bool = True) -> None:
        token = self.tokens.pop(where, None)
        self.ended.discard(where)
        self.runs.discard(where)
        if token is not None:
            async with self._tx() as conn:
                if stored:
                    await lease_sql.end_fenced(conn, where[0], where[1], self.identity, token, "ended")
                else:
                    # The host kept nothing of a store=false run, and one server takes its id again.
                    await lease_sql.release(conn, where[0], where[1], self.identity, token)

    async def _stop_settling(self) -> None:
        """At exit: the settlements still running get a bounded chance to finish (:data:`STOP_SETTLE_WAIT`,
        looking at the store at once); then, of the leases still held, each whose stored envelope is
        already terminal is ended under its token. The others (in flight, or never stored) are left
        for another replica's reaper, after their lease, and said so in a log line."""
        if not self._settling:
            return
        self._stopping.set()
        pending = dict(self._settling)
        _done, late = await asyncio.wait(pending, timeout=min(STOP_SETTLE_WAIT, self.options.settle_within))
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)  # a cancel of stop() itself still stops it
        for task in late:
            part, key, response_id, user = pending[task]
            if (part, key) not in self.tokens:
                continue
            try:
                async with asyncio.timeout(STOP_SETTLE_WAIT):
                    status = await self._stored_status(response_id, user)
                    if status in _WAITED_FOR:
                        log.warning(
                            "stopping with response %r %s: its lease is left for another replica's "
                            "reaper (after the lease)", response_id,
                            "still in flight in the store" if status else "not stored yet",
                        )  # fmt: skip
                        continue
                    await self._end_settled((part, key))
            except Exception as exc:  # the reaper of another replica ends it after the lease
                log.warning(
                    "stopping: could not end the lease of %r (%s): left for a reaper",
                    response_id,
                    exc,
                )

    async def _lease_elsewhere(self, response_id: str, user: str | None) -> lease_sql.Lease | None:
        """The live lease another replica holds on the response, if one does."""
        part, key = self._where(response_id, user)
        async with self._tx() as conn:
            lease = await lease_sql.lease_of(conn, part, key)
        if lease is None or lease.state != "running" or lease.expired or lease.owner == self.identity:
            return None
        return lease

    async def running_elsewhere(self, response_id: str, user: str | None) -> bool:
        return await self._lease_elsewhere(response_id, user) is not None

    async def foreground_elsewhere(self, response_id: str, user: str | None) -> bool:
        """A foreground response still running on another live replica (its owner answers 404)."""
        lease = await self._lease_elsewhere(response_id, user)
        if lease is None:
            return False
        if lease.background is not None:
            # Written by the owner before the run's first event, so before any envelope exists:
            # the sink's row below can be a flush interval later than the envelope.
            return not lease.background
        try:
            stored = await self.provider.get_response(response_id, context=SimpleNamespace(user_id_key=user))
        except KeyError:
            return False
        if stored.get("status") not in ("queued", "in_progress") or stored.get("background") is True:
            return False
        # The host's stored envelope does not say ``background`` (2.2.0b1 and 2.4.0b1 leave it out):
        # the sink's row, written from the response's context, does.
        async with self._tx() as conn:
            r = responses.c
            background = (
                await conn.execute(select(r.background).where(r.response_id == _shown(response_id)))
            ).scalar_one_or_none()
        return background is not True

    async def replay_elsewhere(self, response_id: str, user: str | None) -> bool:
        """A background streamed response another replica ran (or runs), not cancelled: its replay
        (``?stream=true``) lives only in that replica's process-local stream store, so this replica's
        host would answer "not created with stream=true or the stream TTL has expired", which is
        not so (docs/replicas.md, "Replay anywhere")."""
        part, key = self._where(response_id, user)
        async with self._tx() as conn:
            lease = await lease_sql.lease_of(conn, part, key)
            if lease is None or lease.owner == self.identity or lease.state not in ("running", "ended"):
                return False
            r = responses.c
            row = (
                await conn.execute(
                    select(r.background, r.stream, r.status).where(r.response_id == _shown(response_id))
                )
            ).first()
        # A cancelled one: its owner deleted the replay too, and the host here answers as it does.
        return row is not None and row.background is True and row.stream is True and row.status != "cancelled"

    async def folded(self, response_id: str, envelope: dict[str, Any]) -> dict[str, Any]:
        """``envelope`` (another replica's in-flight response) as of its last stored event."""
        async with self._tx() as conn:
            stored = await snapshot.stored_events(conn, _shown(response_id))
        return snapshot.fold(envelope, stored)

    # -- cancel relay -----------------------------------------------------------------------------

    async def relay_cancel(self, response_id: str, user: str | None, headers: dict[str, str]) -> None:
        """A cancel for another replica's running response: record it, tell the owner, and wait (the
        host's bound) until the owner's terminal is in the store, which this replica's host then
        answers (200 with the cancelled response). Returns at once for anything else.

        A lease past its expiry but still ``running`` is relayed too: under load the owner's
        heartbeat can come later than its lease while the owner runs on, and the owner still takes
        relayed cancels and writes its terminal under its token (neither looks at the expiry). An
        owner that is really gone has its lease ended by a reaper, which ends the wait as well."""
        part, key = self._where(response_id, user)
        async with self._tx() as conn:
            lease = await lease_sql.lease_of(conn, part, key)
        if lease is None or lease.state != "running" or lease.owner == self.identity:
            return
        kept = {k: v for k, v in headers.items() if k in _KEPT_HEADERS}
        async with self._tx() as conn:
            owner = await lease_sql.request_cancel(conn, part, key, kept)
            if owner is not None and conn.dialect.name == "postgresql":
                notify = text("SELECT pg_notify(:channel, :owner)")
                await conn.execute(notify, {"channel": CHANNEL, "owner": owner})
        if owner is None:
            return
        loop = asyncio.get_running_loop()
        # The bound runs from the owner's taking the cancel, as the host's own wait runs from its
        # receiving it: under load the delivery alone (a NOTIFY, then one transaction that can take
        # seconds) ate into a bound counted from here, and B answered 404 while A went on to cancel.
        # Until it is delivered, the same bound again (a dead owner's lease is reaped meanwhile).
        deadline = loop.time() + self.options.cancel_wait
        delivered = False
        while loop.time() < deadline:
            async with self._tx() as conn:
                lease = await lease_sql.lease_of(conn, part, key)
            if not delivered and lease is not None and lease.cancel_delivered is not None:
                delivered = True
                deadline = loop.time() + self.options.cancel_wait
            if lease is None or lease.state not in ("running", "ended"):
                return  # deleted, or reaped as ``interrupted`` (its envelope is left in flight)
            # A lease can end before its envelope is terminal (the owner's handler end let it go
            # while the host's write was still to come): the host here answers from the store.
            if lease.state == "ended" and await self._stored_ended(response_id, user):
                return
            await asyncio.sleep(0.05)
        log.warning(
            "relayed cancel of %r: no terminal from the owner within %ss of %s",
            response_id,
            self.options.cancel_wait,
            "its taking the cancel" if delivered else "asking (the owner never took it)",
        )

    async def _stored_ended(self, response_id: str, user: str | None) -> bool:
        """The stored envelope is no longer in flight (or is gone: the host answers that too)."""
        return await self._stored_status(response_id, user) not in snapshot.IN_FLIGHT

    async def _stored_status(self, response_id: str, user: str | None) -> str | None:
        """The stored envelope's status; None when nothing is stored, or it cannot be read; any
        other string (``"?"``) for something stored that is not an envelope with a status."""
        try:
            stored = await self.provider.get_response(response_id, context=SimpleNamespace(user_id_key=user))
        except Exception:  # not found, or unreadable: the host's own fallback answers it
            return None
        status = stored.get("status") if isinstance(stored, dict) else None
        return status if isinstance(status, str) else "?"

    async def _bound_idle_transactions(self) -> None:
        """On PostgreSQL, a session of this replica idle inside a transaction for longer than a
        lease is ended by the server: a paused replica (SIGSTOP, a long GC pause) must not hold the
        row locks the survivors need to end its responses.

        On the application's engine (``database=engine``, borrowed) the bound is set per transaction
        of eventguard's, beside its schema: the connections are the application's, and nothing of
        eventguard's may stay on them. On the provider's own engine, new connections get the
        setting and the pool, opened by the schema check, is emptied so that every connection is a
        new one. An application's engine of another driver, used as it is, is left alone."""
        engine = self.provider.engine
        if engine.url.get_backend_name() != "postgresql":
            return
        millis = max(int(self.options.lease * 1000), 100)
        if self.provider.bound_idle_transactions(millis / 1000):
            return
        if not self.provider.owns_engine:
            log.warning(
                "the engine given is not postgresql+asyncpg: a paused replica's idle transactions "
                "are not bounded (they are on a URL or an asyncpg engine)"
            )
            return

        def bound(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute(f"SET idle_in_transaction_session_timeout = {millis}")
            cursor.close()

        event.listen(engine.sync_engine, "connect", bound)
        await engine.dispose()

    async def _listen(self) -> None:
        """LISTEN on PostgreSQL (asyncpg), on a connection of its own for the replica's life, made
        the way the engine makes its connections (its URL may name nothing: an application's
        ``async_creator``) and then detached from the pool, whose size it does not take from.
        Polling covers every database and every failure here."""
        engine = self.provider.engine
        if engine.url.get_backend_name() != "postgresql":
            return
        connection: AsyncConnection | None = None
        try:
            connection = await asyncio.wait_for(engine.connect(), 10)
            driver = (await connection.get_raw_connection()).driver_connection
            await connection.run_sync(lambda sync: sync.detach())
            add_listener = getattr(driver, "add_listener", None)
            if add_listener is None:
                raise TypeError(f"{type(driver).__name__} has no add_listener (asyncpg has)")

            def woken(_conn: object, _pid: int, _channel: str, payload: str) -> None:
                if payload == self.identity:
                    self._wake.set()

            await add_listener(CHANNEL, woken)
            self._listener, connection = connection, None
        except Exception as exc:  # polling still delivers every cancel
            # (A TimeoutError says nothing in its text: the application's pool was busy, say.)
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.warning("LISTEN %s unavailable (%s): relayed cancels are polled", CHANNEL, reason)
        finally:
            if connection is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 5)

    async def _cancel_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.options.cancel_poll)
            self._wake.clear()
            try:
                async with self._tx() as conn:
                    taken = await lease_sql.take_cancels(conn, self.identity)
            except Exception as exc:
                log.warning("could not read relayed cancels: %s", exc)
                continue
            for lease in taken:
                task = asyncio.create_task(self._deliver(lease.response_id, lease.cancel_headers or {}))
                self._delivering.add(task)
                task.add_done_callback(self._delivering.discard)

    async def _deliver(self, response_id: str, headers: dict[str, str]) -> None:
        """The host's own cancel, in-process: it sets exactly what a client's cancel sets."""
        from urllib.parse import quote

        path = f"/responses/{quote(response_id, safe='')}/cancel"
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"content-length", b"0"), (RELAYED.encode(), b"1")]
            + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
            "client": ("127.0.0.1", 0), "server": ("eventguard-relay", 0),
        }  # fmt: skip
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # no disconnect: the cancel runs to its end
            return {"type": "http.disconnect"}

        async def send(_message: dict[str, Any]) -> None:
            return None

        try:
            await self._app(scope, receive, send)
        except Exception:
            log.exception("the relayed cancel of %r failed on its owner", response_id)

    # -- heartbeat and reaper ---------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        every = self.options.heartbeat_every
        due = loop.time()
        while True:
            # A fixed cadence from each renewal's start, not a pause after its end: under load a
            # renewal takes seconds (a busy pool, a busy database: up to 7 s measured at a load of
            # 15 on 2 cores), and a gap of the interval plus that ate most of the lease.
            due = max(due + every, loop.time())
            await asyncio.sleep(due - loop.time())
            try:
                async with self._tx() as conn:
                    await lease_sql.heartbeat(conn, self.identity, self.options.lease)
            except Exception as exc:
                log.warning("lease heartbeat failed: %s", exc)

    async def _reaper_loop(self) -> None:
        while True:
            every = self.options.reap_interval
            await asyncio.sleep(every * (1 + random.random() * self.options.jitter))
            try:
                await self.reap_once()
            except Exception as exc:
                log.warning("reaper pass failed: %s", exc)

    async def reap_once(self, limit: int = 100) -> list[str]:
        """End every expired lease by the policy, each exactly once across replicas (the ids this
        replica ended)."""
        return await reap_expired(self._tx, self.identity, self.options.reap_policy, limit, self.reaped)

    async def record_fenced_out(self, response_id: str, reason: str) -> None:
        """A refused write is an anomaly on the response's lifecycle (and a warning), never silent."""
        self.fenced_out.append(response_id)
        log.warning("fenced out: %s", reason)
        try:
            async with self._tx() as conn:
                await record_anomaly(conn, response_id, AnomalyKind.FENCED_OUT.value, reason)
        except Exception as exc:
            log.error("could not record the fenced-out write of %r: %s", response_id, exc)


async def reap(
    engine: AsyncEngine, *, policy: str = "failed", limit: int = 1000, reaper: str = "eventguard-recover"
) -> list[str]:
    """End every response whose replica's lease expired (``eventguard recover --expired-leases``):
    the reaper's pass, by an operator. Exactly once with the replicas' own reapers."""

    @contextlib.asynccontextmanager
    async def tx() -> AsyncIterator[AsyncConnection]:
        async with engine.begin() as conn:
            yield conn

    return await reap_expired(tx, reaper, policy, limit)


async def reap_expired(
    tx: Any, reaper: str, policy: str, limit: int, into: list[str] | None = None
) -> list[str]:
    """The reaper's pass: see :meth:`Replica.reap_once`."""
    async with tx() as conn:
        candidates = await lease_sql.expired(conn, limit)
    ended: list[str] = []
    state = "ended" if policy == "failed" else "interrupted"
    for lease in candidates:
        try:
            async with tx() as conn:
                if conn.dialect.name == "postgresql":
                    # A row still locked by the dead or paused owner: give up, retry next pass.
                    await conn.execute(text("SET LOCAL lock_timeout = '2s'"))
                if await lease_sql.take_expired(conn, lease, reaper, state, policy) is None:
                    continue  # another replica took it first
                if policy == "failed":
                    await end_envelope(conn, lease.partition, lease.response_key, reaper)
                await end_lifecycle(conn, lease.response_id, policy, reaper)
        except DBAPIError as exc:
            log.warning("could not reap %r yet (%s): next pass", lease.response_id, exc)
            continue
        ended.append(lease.response_id)
    if into is not None:
        into.extend(ended)
    return ended


async def record_anomaly(conn: AsyncConnection, response_id: str, kind: str, reason: str) -> bool:
    """An anomaly (source ``replica``) on the response's current attempt; False when the sink has no
    row for it (nothing recorded it)."""
    shown = _shown(response_id)
    r, a = responses.c, anomalies.c
    attempt = (await conn.execute(select(r.attempt).where(r.response_id == shown))).scalar_one_or_none()
    if attempt is None:
        return False
    idx = (
        select(func.coalesce(func.max(a.idx), -1) + 1)
        .where(a.response_id == shown, a.attempt == attempt, a.source == "replica")
        .scalar_subquery()
    )
    from datetime import UTC, datetime

    await conn.execute(
        anomalies.insert().from_select(
            ["response_id", "attempt", "source", "idx", "kind", "reason", "at"],
            select(literal(shown), literal(attempt), literal("replica"), idx, literal(kind),
                   literal(json.dumps(reason)), literal(datetime.now(UTC), anomalies.c.at.type)),
        )
    )  # fmt: skip
    return True


def _background(context: Any) -> bool | None:
    """The run's mode as the host's context gives it (``mode_flags.background``); None when unknown."""
    value = getattr(getattr(context, "mode_flags", None), "background", None)
    return value if isinstance(value, bool) else None


def _user(context: Any) -> str | None:
    """The run's user key as the host gives it to its store (:func:`eventguard.envelopes.user_of`:
    ``platform_context.user_id_key`` of the host's ``ResponseContext``, both ends); None when it is
    not a ``str`` (the lease's partition, :func:`_partition`, refuses that)."""
    user = _user_of(context)
    return user if isinstance(user, str) else None


def _host_stores(context: Any) -> bool:
    """Whether the host stores this response: the context's ``mode_flags.store`` (2.2.0b1 and
    2.4.0b1), else its request's ``store`` (None: the default, stored); unknown counts as stored."""
    flag = getattr(getattr(context, "mode_flags", None), "store", None)
    if isinstance(flag, bool):
        return flag
    return getattr(getattr(context, "request", None), "store", None) is not False
