"""Retention: ``ResponseStore.prune_envelopes`` (and ``eventguard prune``) expire the host's response
store by age, keeping every item a kept response still names and every response still running."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select, update

from eventguard import ResponseStore
from eventguard.sql.tables import provider_history, provider_items, provider_responses

from .conftest import Database, Store
from .test_parity_with_the_hosts_store import envelope, item, out

T = 60


async def _age(store: Store, days: int) -> None:
    """Make every row written so far look ``days`` old."""
    then = datetime.now(UTC) - timedelta(days=days)
    async with store.provider.engine.begin() as conn:
        await conn.execute(update(provider_responses).values(updated_at=then))
        await conn.execute(update(provider_items).values(updated_at=then))


async def test_old_ended_envelopes_go_and_what_a_kept_response_names_stays(
    sql_store: Store, sql_database: Database
) -> None:
    p = sql_store.provider
    async with asyncio.timeout(T):
        # An old chain: resp_a (i_a, o_a), then resp_b chained on it; resp_old alone; resp_run running.
        await p.create_response(envelope("resp_a"), [item("i_a")], None)
        await p.update_response(envelope("resp_a", status="completed", output=[out("o_a")]))
        await p.create_response(envelope("resp_old", conversation="conv"), [item("i_old")], None)
        await p.update_response(envelope("resp_old", conversation="conv", status="failed"))
        await p.create_response(envelope("resp_run"), [item("i_run")], None)
        await _age(sql_store, 30)
        # A recent turn chained on the old one: its history names i_a and o_a.
        history = await p.get_history_item_ids("resp_a", None, -1)
        await p.create_response(envelope("resp_b", previous_response_id="resp_a"), [item("i_b")], history)
        await p.update_response(envelope("resp_b", status="completed", output=[out("o_b")]))

        async with ResponseStore(sql_database.url, schema=sql_database.schema) as store:
            result = await store.prune_envelopes(older_than=timedelta(days=7))

        assert (result.envelopes, result.items) == (2, 1)  # resp_a, resp_old; i_old
        for gone in ("resp_a", "resp_old"):
            try:
                await p.get_response(gone)
            except KeyError:
                continue
            raise AssertionError(f"{gone} was kept")
        assert (await p.get_response("resp_run"))["status"] == "in_progress"
        assert await p.get_history_item_ids("resp_b", None, -1) == ["i_a", "o_a", "i_b", "o_b"]
        assert await p.get_items(["i_a", "o_a", "i_old", "i_run"]) == [
            item("i_a"),
            out("o_a"),
            None,
            item("i_run"),
        ]
        assert await p.get_history_item_ids(None, "conv", -1) == []
        async with p.engine.connect() as conn:
            nodes = (await conn.execute(select(func.count()).select_from(provider_history))).scalar_one()
        assert nodes == 2  # resp_b's history (i_a, o_a): still reached


async def test_pruning_a_store_with_nothing_old_removes_nothing(
    sql_store: Store, sql_database: Database
) -> None:
    p = sql_store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_new", status="completed"), [item("i")], ["h"])
        async with ResponseStore(sql_database.url, schema=sql_database.schema) as store:
            result = await store.prune_envelopes(older_than=timedelta(days=1))
        assert (result.envelopes, result.items, result.history_nodes) == (0, 0, 0)
        assert (await p.get_response("resp_new"))["status"] == "completed"
