"""The host's agent sessions in eventguard's SQL database, so losing the host's state folder loses none.

``ResponsesHostServer`` keeps each chat agent's ``AgentSession`` (``to_dict()``) through its
``agent_session_store_provider``; by default in files under ``AGENTSERVER_STATE_ROOT``.
:class:`SqlAgentSessionStoreProvider` keeps them in ``eventguard_agent_sessions`` instead, through
the response store's transactions (``SqlResponseProvider.transactions``, an
:class:`eventguard.sql.transactions.Transactions`: its engine, schema check and storage errors) and
encoding (:mod:`eventguard.envelopes`): rows keyed by the SHA-256 of the platform user and of the
exact session id, the session as ASCII JSON text, so any id and any content the host hands over
is stored exactly, or refused with :class:`~eventguard.errors.UnstorableError`.

Concurrency is the database's, as the host's own store does it with ETags: a store remembers the
version it read, and writes only over that version (a conditional UPDATE), or only where there is
no row when it read none (an INSERT that does nothing on a conflict). Losing either race raises the
host's ``RuntimeError("Another request advanced this agent session; reload before writing.")``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from agent_framework import AgentSession, SessionStore
from agent_framework_foundry_hosting._state_store import StoreProvider
from sqlalchemy import delete, select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from eventguard import _arguments as arguments
from eventguard.envelopes import ANONYMOUS, ProviderStorageError, dump, encode_id, key, load
from eventguard.errors import UnstorableError
from eventguard.provider import SqlResponseProvider
from eventguard.sql import engine as _db
from eventguard.sql.tables import agent_sessions as _t

__all__ = ["CONFLICT", "SqlAgentSessionStore", "SqlAgentSessionStoreProvider"]

#: The host's own words for a lost race (``FoundryAgentSessionStore.set``).
CONFLICT = "Another request advanced this agent session; reload before writing."


def _partition(platform_context: object) -> str:
    """The platform user's partition: the SHA-256 of its ``user_id``, or "anonymous" without one."""
    user = getattr(platform_context, "user_id", None)
    if user is None:
        return ANONYMOUS
    if not isinstance(user, str):
        raise UnstorableError(f"platform_context.user_id must be a str or None, not {type(user).__name__}")
    return key(user)


class SqlAgentSessionStore(SessionStore):
    """One request's agent session store (what :meth:`SqlAgentSessionStoreProvider.get_store` gives).

    :meth:`get` remembers the version it read (or that there was none); :meth:`set` writes over that
    version only, and raises the host's conflict ``RuntimeError`` when another store wrote first. A
    session never read here is written unconditionally (as the host's own store does).
    """

    def __init__(self, provider: SqlResponseProvider, partition: str) -> None:
        self._transactions = provider.transactions
        self._partition = partition
        #: session id -> the version read (None: read, and absent).
        self._versions: dict[str, int | None] = {}

    def _row_key(self, session_id: str) -> str:
        """The session's row key (after the host's own check of the id)."""
        SessionStore.validate_session_id(session_id)
        return key(session_id)

    def _where(self, session_key: str) -> Any:
        return (_t.c.partition == self._partition) & (_t.c.session_key == session_key)

    async def get(self, session_id: str) -> AgentSession | None:
        """The stored session, or ``None`` when there is none."""
        where = self._where(self._row_key(session_id))
        async with self._transactions.open("read") as conn:
            row = (await conn.execute(select(_t.c.value, _t.c.version).where(where))).first()
        if row is None:
            self._versions[session_id] = None
            return None
        value = load(row.value, "an agent session")
        if not isinstance(value, dict):
            raise ProviderStorageError("a stored agent session is not a JSON object")
        session = AgentSession.from_dict(value)
        self._versions[session_id] = int(row.version)
        return session

    async def set(self, session_id: str, session: AgentSession) -> None:
        """Store ``session``: over the version read, where none was when none was read."""
        if not callable(getattr(session, "to_dict", None)):  # a dict: an AttributeError from inside
            raise UnstorableError(f"session must be an AgentSession, not {type(session).__name__}")
        session_key = self._row_key(session_id)
        where = self._where(session_key)
        value = dump(session.to_dict(), "an agent session")
        now = datetime.now(UTC)
        read = session_id in self._versions
        version = self._versions.get(session_id)
        row = {
            "partition": self._partition,
            "session_key": session_key,
            "session_id": encode_id(session_id),
            "value": value,
            "updated_at": now,
        }

        async def write(conn: AsyncConnection) -> int | None:
            if version is not None:
                done = await conn.execute(
                    update(_t)
                    .where(where, _t.c.version == version)
                    .values(value=value, updated_at=now, version=version + 1)
                    .returning(_t.c.version)
                )
                return cast("int | None", done.scalar_one_or_none())
            insert = self._transactions.insert(_t).values(**row, version=1)
            if read:
                statement = insert.on_conflict_do_nothing(index_elements=["partition", "session_key"])
            else:
                statement = insert.on_conflict_do_update(
                    index_elements=["partition", "session_key"],
                    set_={"value": value, "updated_at": now, "version": _t.c.version + 1},
                )
            done = await conn.execute(statement.returning(_t.c.version))
            return cast("int | None", done.scalar_one_or_none())

        written = await self._transactions.write(write)
        if written is None:
            raise RuntimeError(CONFLICT)
        self._versions[session_id] = int(written)

    async def delete(self, session_id: str) -> None:
        """Delete the stored session, if there is one."""
        where = self._where(self._row_key(session_id))

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(delete(_t).where(where))

        await self._transactions.write(write)
        self._versions.pop(session_id, None)


class SqlAgentSessionStoreProvider(StoreProvider[SessionStore]):
    """The host's ``agent_session_store_provider`` in eventguard's SQL database.

    Parameters:
        database: a :class:`~eventguard.SqlResponseProvider` to share (its engine, schema check and
            storage errors), or what one takes: a database URL or an ``AsyncEngine`` to borrow
            (default ``EVENTGUARD_DATABASE_URL``, else ``./eventguard.db``).
        schema: as for :class:`~eventguard.SqlResponseProvider` (a URL or engine only: with a
            provider, the provider's own; a different one is a ``ValueError``).
        auto_migrate: as for :class:`~eventguard.SqlResponseProvider` (a URL or engine only: with
            a provider, the provider's own; a different one is a ``ValueError``).

    Sessions are partitioned by the platform context's ``user_id`` (``None`` is its own partition).
    A database that fails raises :class:`~eventguard.ProviderStorageError`; a session that cannot be
    stored exactly, :class:`~eventguard.errors.UnstorableError`.
    """

    def __init__(
        self,
        database: SqlResponseProvider | str | URL | AsyncEngine | None = None,
        *,
        schema: str | None = None,
        auto_migrate: bool | None = None,
    ) -> None:
        if isinstance(database, SqlResponseProvider):
            # The provider's schema and migration were settled when it was built: a setting given
            # here as well is checked as anywhere else, and one that differs is refused, not ignored.
            _db.valid_schema(schema)
            auto_migrate = arguments.flag("auto_migrate", auto_migrate, none=True)
            for name, given, own in (
                ("schema", schema, database.schema),
                ("auto_migrate", auto_migrate, database.auto_migrate),
            ):
                if given is not None and given != own:
                    raise ValueError(
                        f"{name}={given!r} differs from the SqlResponseProvider's own ({own!r}): give "
                        f"{name} to the provider, or leave it out here"
                    )
            self.provider = database
        elif database is None or isinstance(database, str | URL | AsyncEngine):
            self.provider = SqlResponseProvider(database, schema=schema, auto_migrate=auto_migrate)
        else:
            raise TypeError(
                "database must be a SqlResponseProvider, a database URL (a str or a SQLAlchemy URL), "
                f"an AsyncEngine or None, not {type(database).__name__}"
            )

    def __repr__(self) -> str:
        return f"SqlAgentSessionStoreProvider({self.provider!r})"

    def get_store(self, *, config: Any, platform_context: Any) -> SqlAgentSessionStore:
        """The store for one request: its platform user's sessions.

        Parameters:
            config: the host's ``AgentConfig`` (not read: the database is the same for every host).
            platform_context: the request's ``FoundryAgentRequestContext``; its ``user_id`` picks
                the partition (``None`` is a partition of its own).
        """
        return SqlAgentSessionStore(self.provider, _partition(platform_context))
