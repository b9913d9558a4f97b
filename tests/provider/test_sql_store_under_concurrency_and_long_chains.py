"""Several writers of one response decided by the database, durable writes seen by another process's
engine, and history that grows linearly along a previous_response_id chain."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from azure.ai.agentserver.responses.store import ResponseAlreadyExistsError
from sqlalchemy import func, select

from eventguard.provider import SqlResponseProvider
from eventguard.sql.tables import provider_history, provider_links

from .conftest import Store
from .test_parity_with_the_hosts_store import envelope, item, out

T = 60


async def _race(calls: list[Any]) -> list[BaseException | None]:
    results = await asyncio.gather(*calls, return_exceptions=True)
    return [r if isinstance(r, BaseException) else None for r in results]


async def test_of_many_creators_of_one_id_on_two_engines_exactly_one_wins(sql_store: Store) -> None:
    first, second = sql_store.provider, sql_store.another()
    async with asyncio.timeout(T):
        outcomes = await _race(
            [
                (first if n % 2 else second).create_response(
                    envelope("resp_race", metadata={"n": str(n)}), [item(f"i{n}")], None
                )
                for n in range(8)
            ]
        )
        winners = [n for n, e in enumerate(outcomes) if e is None]
        assert len(winners) == 1, outcomes
        assert all(isinstance(e, ResponseAlreadyExistsError) for e in outcomes if e is not None)
        got = await second.get_response("resp_race")
        assert got["metadata"] == {"n": str(winners[0])}
        assert [i["id"] for i in await first.get_input_items("resp_race")] == [f"i{winners[0]}"]
        await second.aclose()


async def test_of_many_re_creators_of_a_deleted_id_exactly_one_wins(sql_store: Store) -> None:
    first, second = sql_store.provider, sql_store.another()
    async with asyncio.timeout(T):
        await first.create_response(envelope("resp_again"), None, None)
        await first.delete_response("resp_again")
        outcomes = await _race(
            [
                (first if n % 2 else second).create_response(envelope("resp_again"), None, None)
                for n in range(6)
            ]
        )
        assert sum(e is None for e in outcomes) == 1, outcomes
        await second.aclose()


async def test_concurrent_updates_leave_one_whole_envelope_with_its_own_outputs(sql_store: Store) -> None:
    first, second = sql_store.provider, sql_store.another()
    async with asyncio.timeout(T):
        await first.create_response(envelope("resp_upd"), [item("in")], None)
        versions = [
            envelope(
                "resp_upd", status="completed", output=[out(f"o{n}a"), out(f"o{n}b")], metadata={"n": str(n)}
            )
            for n in range(10)
        ]
        outcomes = await _race(
            [(first if n % 2 else second).update_response(v) for n, v in enumerate(versions)]
        )
        assert outcomes == [None] * 10
        final = await first.get_response("resp_upd")
        assert final in versions
        n = final["metadata"]["n"]
        # The links agree with the envelope that won: no torn mix of two updates.
        assert await second.get_history_item_ids("resp_upd", None, -1) == ["in", f"o{n}a", f"o{n}b"]
        await second.aclose()


async def test_cancel_and_completion_racing_on_one_response_end_in_one_of_the_two(sql_store: Store) -> None:
    """The host's terminal write and /cancel may race; either may win ("cancellation always wins" is
    the host's rule, applied by its order of calls), but never a mix, never an error."""
    first, second = sql_store.provider, sql_store.another()
    async with asyncio.timeout(T):
        await first.create_response(envelope("resp_cc", background=True), None, None)
        completed = envelope("resp_cc", background=True, status="completed", output=[out("o1")])
        cancelled = envelope("resp_cc", background=True, status="cancelled", output=[])
        for _round in range(5):
            assert await _race([first.update_response(completed), second.update_response(cancelled)]) == [
                None,
                None,
            ]
            assert await first.get_response("resp_cc") in (completed, cancelled)
        await second.aclose()


async def test_a_write_is_durable_when_it_returns(sql_store: Store) -> None:
    p = sql_store.provider
    async with asyncio.timeout(T):
        await p.create_response(envelope("resp_dur"), [item("i1")], None)
        await p.update_response(envelope("resp_dur", status="completed", output=[out("o1")]))
        await p.aclose()  # no buffer to flush: the engine goes, the rows stay
        reopened = sql_store.another()
        assert (await reopened.get_response("resp_dur"))["status"] == "completed"
        assert await reopened.get_history_item_ids("resp_dur", None, -1) == ["i1", "o1"]
        await reopened.aclose()


async def test_a_borrowed_engine_is_left_open(sql_store: Store) -> None:
    engine = sql_store.provider.engine
    borrowed = SqlResponseProvider(engine)
    async with asyncio.timeout(T):
        await borrowed.create_response(envelope("resp_b"), None, None)
        await borrowed.aclose()
        assert (await sql_store.provider.get_response("resp_b"))["id"] == "resp_b"


async def _count(p: SqlResponseProvider, table: Any) -> int:
    async with p.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def _chain(p: SqlResponseProvider, turns: int, prefix: str = "") -> str:
    """A chat of ``turns`` turns, each chained on the last as the host does it; the last response id."""
    previous: str | None = None
    for n in range(turns):
        rid = f"resp_{prefix}{n}"
        history = await p.get_history_item_ids(previous, None, -1) if previous else None
        await p.create_response(
            envelope(rid, previous_response_id=previous), [item(f"{prefix}u{n}")], history
        )
        await p.update_response(
            envelope(rid, previous_response_id=previous, status="completed", output=[out(f"{prefix}a{n}")])
        )
        previous = rid
    assert previous is not None
    return previous


async def test_a_long_chain_stores_each_history_id_once(sql_store: Store) -> None:
    p = sql_store.provider
    turns = 120
    async with asyncio.timeout(120):
        last = await _chain(p, turns)
        history = await p.get_history_item_ids(last, None, -1)
        assert history == [f"{k}{n}" for n in range(turns) for k in ("u", "a")]
        # Turn n holds 2n history ids; copied, that is ~turns^2 rows (14,280 here). Shared: one each.
        assert await _count(p, provider_history) == 2 * (turns - 1)
        assert await _count(p, provider_links) == 2 * turns
        items = await p.get_input_items(last, limit=3, ascending=True)
        assert [i["id"] for i in items] == ["u0", "a0", "u1"]


async def test_two_branches_from_one_response_share_its_history(sql_store: Store) -> None:
    p = sql_store.provider
    async with asyncio.timeout(T):
        trunk = await _chain(p, 10)
        before = await _count(p, provider_history)
        for branch in ("x", "y"):
            history = await p.get_history_item_ids(trunk, None, -1)
            await p.create_response(
                envelope(f"resp_{branch}", previous_response_id=trunk), [item(branch)], history
            )
            assert await p.get_history_item_ids(f"resp_{branch}", None, -1) == [*history, branch]
        # The trunk's last turn (u9, a9) is stored once for both branches.
        assert await _count(p, provider_history) == before + 2


async def test_a_history_that_is_not_the_previous_ones_is_stored_as_given(sql_store: Store) -> None:
    p = sql_store.provider
    async with asyncio.timeout(T):
        await _chain(p, 3)
        # A limited fetch (the last 3) is not an extension of the previous history: still exact.
        history = await p.get_history_item_ids("resp_2", None, 3)
        await p.create_response(envelope("resp_cut", previous_response_id="resp_2"), [item("z")], history)
        assert await p.get_history_item_ids("resp_cut", None, -1) == [*history, "z"]


@pytest.mark.parametrize("limit", [1, 5, 100])
async def test_history_limits_cut_from_the_start(sql_store: Store, limit: int) -> None:
    p = sql_store.provider
    async with asyncio.timeout(T):
        last = await _chain(p, 4)
        full = await p.get_history_item_ids(last, None, -1)
        assert await p.get_history_item_ids(last, None, limit) == full[-limit:]
