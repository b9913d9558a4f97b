"""A prune racing a ``create_response`` whose history names old items keeps what the new response
names: its history nodes and its items, on PostgreSQL and SQLite; a prune that committed between the
host's history read and its create makes the create fail instead.

The prune ran beside the create's open transaction (PostgreSQL, READ COMMITTED): it did not see the
new response, so it took the history nodes and the items that only the new response was about to
name, and the create then committed a history whose nodes or items were gone (reads silently
skipped them). The create is held open, mid-transaction, at its fencing hook (after the envelope's
row, before its history), while the prune runs; then both finish, in whichever order the database
lets them.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncConnection

from eventguard import ResponseStore
from eventguard.provider import ProviderStorageError, SqlResponseProvider
from eventguard.sql.tables import provider_items, provider_responses

from .conftest import Database, Store
from .test_parity_with_the_hosts_store import envelope, item, out

T = 60
#: How long the held create waits for the prune to finish before it goes on (the prune is blocked
#: by then when the database serialises the two; otherwise it has long finished).
HOLD = 3.0


async def old_chain(p: SqlResponseProvider) -> list[str]:
    """Start ``p`` and store an old chain: ``resp_a`` (``i_a``, ``o_a``), ``resp_b`` chained on it
    (``i_b``, ``o_b``), both ended and last written 30 days ago; the history of a turn chained on
    ``resp_b``, read as the host reads it, is returned."""
    await p.start()
    await p.create_response(envelope("resp_a"), [item("i_a")], None)
    await p.update_response(envelope("resp_a", status="completed", output=[out("o_a")]))
    history_b = await p.get_history_item_ids("resp_a", None, -1)
    await p.create_response(envelope("resp_b", previous_response_id="resp_a"), [item("i_b")], history_b)
    await p.update_response(
        envelope("resp_b", previous_response_id="resp_a", status="completed", output=[out("o_b")])
    )
    then = datetime.now(UTC) - timedelta(days=30)
    async with p.engine.begin() as conn:
        await conn.execute(update(provider_responses).values(updated_at=then))
        await conn.execute(update(provider_items).values(updated_at=then))
    history_c = await p.get_history_item_ids("resp_b", None, -1)
    assert history_c == ["i_a", "o_a", "i_b", "o_b"]
    return history_c


class HeldCreate(SqlResponseProvider):
    """Holds ``resp_c``'s create in its transaction until ``prune`` ends or ``HOLD`` passes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inside = asyncio.Event()
        self.go = asyncio.Event()

    async def _fence_update(
        self, conn: AsyncConnection, part: str, response_id: str, status: str | None
    ) -> None:
        if response_id == "resp_c":
            self.inside.set()
            await self.go.wait()


async def test_a_prune_beside_a_create_keeps_the_history_the_new_response_names(
    sql_database: Database,
) -> None:
    url, schema = sql_database.url, sql_database.schema
    assert url is not None
    p = HeldCreate(url, schema=schema)
    async with asyncio.timeout(T):
        history_c = await old_chain(p)

        # A new turn on the old chain, held open inside its transaction while the prune runs.
        turn_c = envelope("resp_c", previous_response_id="resp_b")
        create = asyncio.create_task(p.create_response(turn_c, [item("i_c")], history_c))
        await p.inside.wait()
        async with ResponseStore(url, schema=schema) as store:
            prune = asyncio.create_task(store.prune_envelopes(older_than=timedelta(days=7)))
            await asyncio.wait({prune}, timeout=HOLD)
            p.go.set()
            await create
            result = await prune

        assert result.envelopes == 2  # resp_a, resp_b: ended and old
        assert await p.get_history_item_ids("resp_c", None, -1) == ["i_a", "o_a", "i_b", "o_b", "i_c"]
        assert await p.get_input_items("resp_c", ascending=True) == [
            item("i_a"),
            out("o_a"),
            item("i_b"),
            out("o_b"),
            item("i_c"),
        ]
        # A second prune, with nothing racing it, takes nothing resp_c names either.
        async with ResponseStore(url, schema=schema) as store:
            again = await store.prune_envelopes(older_than=timedelta(days=7))
        assert (again.envelopes, again.items, again.history_nodes) == (0, 0, 0)
        await p.aclose()


async def test_a_turn_whose_history_was_pruned_after_it_was_read_is_refused_not_stored_hollow(
    sql_store: Store,
) -> None:
    """The window before the create's transaction: the host reads the history of the previous
    response (``get_history_item_ids``), a prune then expires that response and every item only it
    named, and the host's ``create_response`` of the next turn comes after the prune committed.

    Decided: the create is refused with a storage error (to the host a failed turn, not a 404 nor
    a silent success), as the turn would have been refused had the prune come a moment earlier
    (the previous response not found). Stored as it was before, the new response named items that
    were gone, and every read of it (input items, the next turn's history) skipped them in silence:
    the conversation's past lost without a word. (Refusing any history id without a stored item
    is not the rule: the host's own stores accept such ids, and the parity suite keeps that; the
    next test pins what is still stored.)
    """
    p = sql_store.provider
    async with asyncio.timeout(T):
        history_c = await old_chain(p)
        async with ResponseStore(sql_store.url, schema=sql_store.schema) as store:
            pruned = await store.prune_envelopes(older_than=timedelta(days=7))
        assert (pruned.envelopes, pruned.items) == (2, 4)

        # The host's envelope names the response its history was read from.
        turn_c = envelope("resp_c", previous_response_id="resp_b")
        with pytest.raises(ProviderStorageError, match="resp_b"):
            await p.create_response(turn_c, [item("i_c")], history_c)
        with pytest.raises(KeyError):
            await p.get_response("resp_c")


async def test_a_history_with_ids_no_prune_took_is_stored_as_given(sql_store: Store) -> None:
    """What the refusal is not: ids that never had an item, under a previous response that is
    live (the host's stores accept them), and a previous response deleted after the history was
    read while every item its history names is still stored (nothing is lost: items outlive
    their response)."""
    p = sql_store.provider
    async with asyncio.timeout(T):
        history_c = await old_chain(p)
        ghostly = envelope("resp_g", previous_response_id="resp_b")
        await p.create_response(ghostly, [item("i_g")], ["never_stored", *history_c])
        assert [i["id"] for i in await p.get_input_items("resp_g", ascending=True)] == [*history_c, "i_g"]

        await p.delete_response("resp_b")
        await p.create_response(envelope("resp_c", previous_response_id="resp_b"), [item("i_c")], history_c)
        assert [i["id"] for i in await p.get_input_items("resp_c", ascending=True)] == [*history_c, "i_c"]


HOSTILE = {
    "nul": "resp_\x00nul",
    "lone surrogate": "resp_\udcff",
    "ansi escape": "resp_\x1b[31mred\x1b[0m",
    "1 MB": "resp_" + "x" * 1_000_000,
}


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
async def test_the_refusal_check_takes_any_previous_response_id_and_item_id(
    sql_store: Store, value: str
) -> None:
    """A hostile ``previous_response_id`` (never stored) and hostile history ids reach the check's
    look-ups as keys: a history whose items are all stored is stored as given and read back
    exactly; one naming an id without an item is refused with a storage error whose message is
    plain ASCII (the values escaped); nothing else is lost."""
    p = sql_store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_h0"), [item(value, text=value)], None)
        kept = envelope("resp_h1", previous_response_id=value)
        await p.create_response(kept, [item("i_h1")], [value])
        assert (await p.get_response("resp_h1"))["previous_response_id"] == value
        assert await p.get_history_item_ids("resp_h1", None, -1) == [value, "i_h1"]
        assert await p.get_items([value]) == [item(value, text=value)]

        hollow = envelope("resp_h2", previous_response_id=value)
        with pytest.raises(ProviderStorageError) as refused:
            await p.create_response(hollow, [item("i_h2")], [value, value + "_gone"])
        assert str(refused.value).isascii()
        with pytest.raises(KeyError):
            await p.get_response("resp_h2")
        assert await p.get_history_item_ids("resp_h1", None, -1) == [value, "i_h1"]
