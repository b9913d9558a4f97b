"""History item ids stored in runs (migration 0004): each case builds the same chats on the host's
in-memory provider (the reference) and on the SQL one, and every history and input-items page must
be the same. Long chains, branches, deletes in the middle, hostile ids, writers racing on one run,
and a database written before 0004 upgraded with its data in it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from azure.ai.agentserver.responses import InMemoryResponseProvider
from sqlalchemy import func, inspect, select

from eventguard.provider import SqlResponseProvider
from eventguard.sql import migrate
from eventguard.sql.tables import provider_history, provider_responses

from .conftest import OLD_MEMORY, Store
from .test_parity_with_the_hosts_store import envelope, item, out

T = 120

#: Ids a host may hand over: NUL, lone surrogates, control characters, the provider's own escape
#: marker ("~"), a long one.
HOSTILE = ["nul\x00id", "lone\ud800high", "lone\udfffl\x01ow", "~looks-encoded", '~"x"', "é" * 300]


class Reference(InMemoryResponseProvider):
    """The host's in-memory store. 2.2.0b1's returns nothing for ``-1`` and does not de-duplicate;
    the SQL store keeps 2.4.0b1's rules on both ends (see ``conftest.newest_rules``), so on 2.2.0b1
    the reference's whole answer is read and 2.4.0b1's rules applied to it."""

    async def get_history_item_ids(
        self, previous_response_id: str | None, conversation_id: str | None, limit: int, **kw: Any
    ) -> list[str]:
        if not OLD_MEMORY:
            return list(
                await super().get_history_item_ids(previous_response_id, conversation_id, limit, **kw)
            )
        ids = list(
            dict.fromkeys(
                await super().get_history_item_ids(previous_response_id, conversation_id, 10**9, **kw)
            )
        )
        return ids if limit == -1 else ([] if limit <= 0 else ids[-limit:])


class Both:
    """One chat driven on the reference and on the SQL store alike."""

    def __init__(self, sql: SqlResponseProvider) -> None:
        self.stores: list[Any] = [Reference(), sql]

    async def turn(
        self, rid: str, previous: str | None, inputs: list[str], outputs: list[str], *, limit: int = -1
    ) -> None:
        for p in self.stores:
            history = await p.get_history_item_ids(previous, None, limit) if previous else None
            await p.create_response(
                envelope(rid, previous_response_id=previous), [item(i) for i in inputs], history
            )
            await p.update_response(
                envelope(
                    rid, previous_response_id=previous, status="completed", output=[out(o) for o in outputs]
                )
            )

    async def delete(self, rid: str) -> None:
        for p in self.stores:
            await p.delete_response(rid)

    async def same_history(self, rid: str, limit: int = -1) -> list[str]:
        memory, sql = [await p.get_history_item_ids(rid, None, limit) for p in self.stores]
        assert sql == memory
        return list(sql)

    async def same_input_items(self, rid: str, **page: Any) -> None:
        memory, sql = [await p.get_input_items(rid, **page) for p in self.stores]
        assert sql == memory


async def _count(p: SqlResponseProvider, *columns: Any) -> int:
    query = select(func.count(func.distinct(*columns)) if columns else func.count()).select_from(
        provider_history
    )
    async with p.engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one())


@pytest.mark.slow  # 2,000 writes: ~10 s per database on a quiet machine, 30 s on a busy one
async def test_a_thousand_turn_chain_reads_as_the_hosts_store_reads_it_from_one_run(sql_store: Store) -> None:
    """The host builds each turn's history with ``get_history_item_ids`` of the turn before: here the
    reference builds it and both stores are created with it (the SQL store's own answer is checked
    every 100 turns and at the end, which keeps the case to seconds)."""
    memory, sql = Reference(), sql_store.provider
    turns = 1000
    async with asyncio.timeout(300):
        previous: str | None = None
        for n in range(turns):
            rid = f"resp_{n}"
            history = await memory.get_history_item_ids(previous, None, -1) if previous else None
            if previous is not None and n % 100 == 0:
                assert await sql.get_history_item_ids(previous, None, -1) == history
            stores: tuple[Any, ...] = (memory, sql)
            for p in stores:
                await p.create_response(envelope(rid), [item(f"u{n}")], history)
                await p.update_response(envelope(rid, status="completed", output=[out(f"a{n}")]))
            previous = rid
        both = Both(sql)
        both.stores[0] = memory
        full = await both.same_history("resp_999")
        assert len(full) == 2 * turns
        for limit in (1, 7, 1999, 2000, 5000):
            await both.same_history("resp_999", limit)
        await both.same_input_items("resp_999", limit=100, ascending=True, after="u500")
        await both.same_input_items("resp_999", limit=5, before="a3")
        # One node per history id (not one per id per turn), all in one run.
        assert await _count(sql) == 2 * (turns - 1)
        assert await _count(sql, provider_history.c.run) == 1


async def test_branches_at_many_points_read_back_exactly(sql_store: Store) -> None:
    """Regenerated turns: several children of one response, branches of branches, a branch off the
    trunk's last turn; each history is its own path, none sees another branch's ids."""
    both = Both(sql_store.provider)
    async with asyncio.timeout(T):
        previous: str | None = None
        for n in range(12):
            await both.turn(f"resp_t{n}", previous, [f"tu{n}"], [f"ta{n}"])
            previous = f"resp_t{n}"
        for k, at in enumerate((0, 3, 3, 7, 11)):
            await both.turn(f"resp_b{k}", f"resp_t{at}", [f"bu{k}"], [f"ba{k}"])
        await both.turn("resp_bb", "resp_t3", ["bbu"], ["bba"])
        await both.turn("resp_bbb", "resp_bb", ["bbbu"], ["bbba"])
        await both.turn("resp_bbbb", "resp_bbb", ["x"], ["y"])
        await both.turn("resp_t12", "resp_t11", ["tu12"], ["ta12"])  # the trunk goes on
        sql = sql_store.provider
        rids = [r for (r,) in await _response_ids(sql)]
        for rid in rids:
            await both.same_history(rid)
            await both.same_history(rid, 3)
        assert await _count(sql, provider_history.c.run) > 1


async def _response_ids(p: SqlResponseProvider) -> Any:
    async with p.engine.connect() as conn:
        return (await conn.execute(select(provider_responses.c.response_id))).all()


async def test_a_delete_in_the_middle_of_a_chain_leaves_the_later_turns_whole(sql_store: Store) -> None:
    both = Both(sql_store.provider)
    async with asyncio.timeout(T):
        previous: str | None = None
        for n in range(10):
            await both.turn(f"resp_{n}", previous, [f"u{n}"], [f"a{n}"])
            previous = f"resp_{n}"
        await both.delete("resp_4")
        for rid in ("resp_3", "resp_4", "resp_5", "resp_9"):
            await both.same_history(rid)
        assert await both.same_history("resp_4") == []
        # A new turn on the deleted one starts from nothing; one on its parent branches off.
        await both.turn("resp_after_deleted", "resp_4", ["z"], ["zz"])
        await both.turn("resp_again", "resp_3", ["w"], ["ww"])
        # Re-created with other content: the later turns still read what they were created with.
        await both.turn("resp_4", "resp_3", ["u4_new"], ["a4_new"])
        for rid in ("resp_after_deleted", "resp_again", "resp_4", "resp_9"):
            await both.same_history(rid)
        await both.same_input_items("resp_9", limit=100)


async def test_hostile_ids_in_a_branching_chain_read_back_exactly(sql_store: Store) -> None:
    both = Both(sql_store.provider)
    async with asyncio.timeout(T):
        previous: str | None = None
        for n, hostile in enumerate(HOSTILE):
            await both.turn(f"resp_{n}", previous, [f"{hostile}/in"], [f"{hostile}/out", hostile])
            previous = f"resp_{n}"
        await both.turn("resp_branch", "resp_2", [HOSTILE[0]], [HOSTILE[1]])  # ids seen before: de-duplicated
        for rid in (*(f"resp_{n}" for n in range(len(HOSTILE))), "resp_branch"):
            await both.same_history(rid)
            await both.same_input_items(rid, limit=100, ascending=True)
        last = f"resp_{len(HOSTILE) - 1}"
        assert HOSTILE[1] + "/in" in await both.same_history(last)


async def test_writers_racing_to_extend_one_chain_each_keep_their_own_history(sql_store: Store) -> None:
    """Two engines (two processes' worth) extend the same response at once: each response's history
    must be its own path, whichever took the run and whichever branched off."""
    first, second = sql_store.provider, sql_store.another()
    async with asyncio.timeout(T):
        previous: str | None = None
        for n in range(5):
            history = await first.get_history_item_ids(previous, None, -1) if previous else None
            await first.create_response(envelope(f"resp_{n}"), [item(f"u{n}")], history)
            await first.update_response(envelope(f"resp_{n}", status="completed", output=[out(f"a{n}")]))
            previous = f"resp_{n}"
        trunk = await first.get_history_item_ids("resp_4", None, -1)

        async def extend(p: SqlResponseProvider, k: int) -> None:
            await p.create_response(envelope(f"resp_x{k}"), [item(f"x{k}"), item(f"y{k}")], trunk)

        for _round in range(3):
            await asyncio.gather(*(extend(first if k % 2 else second, _round * 10 + k) for k in range(8)))
        for k in [r * 10 + k for r in range(3) for k in range(8)]:
            want = [*trunk, f"x{k}", f"y{k}"]
            assert await second.get_history_item_ids(f"resp_x{k}", None, -1) == want
            # Grow each one more turn: a branch's own run goes on.
            await second.create_response(envelope(f"resp_z{k}"), [item(f"z{k}")], want)
            assert await first.get_history_item_ids(f"resp_z{k}", None, -1) == [*want, f"z{k}"]
        await second.aclose()


async def test_a_database_written_before_0004_is_upgraded_with_its_histories_intact(sql_store: Store) -> None:
    """Written at head, taken down to 0003 (the columns 0004 adds are dropped: what a 0003 database
    holds), upgraded again: the upgrade fills the runs from the nodes, and every history, the
    reference's included, reads the same; the chains then go on growing."""
    sql = sql_store.provider
    both = Both(sql)
    async with asyncio.timeout(T):
        previous: str | None = None
        for n in range(30):
            await both.turn(f"resp_{n}", previous, [f"u{n}", HOSTILE[n % len(HOSTILE)] + str(n)], [f"a{n}"])
            previous = f"resp_{n}"
        for k, at in enumerate((5, 5, 20)):
            await both.turn(f"resp_b{k}", f"resp_{at}", [f"b{k}"], [f"c{k}"])
        rids = [r for (r,) in await _response_ids(sql)]
        before = {rid: await both.same_history(rid) for rid in rids}
        runs_before = await _count(sql, provider_history.c.run)

        await migrate.downgrade(sql.engine, "0003")
        async with sql.engine.connect() as conn:
            columns = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns(provider_history.name)}
            )
        assert "run" not in columns
        assert "item_key" not in columns
        await migrate.upgrade(sql.engine)
        await migrate.check(sql.engine)

        reopened = sql_store.another()
        both.stores[1] = reopened
        for rid in rids:
            assert await both.same_history(rid) == before[rid]
        assert await _count(reopened, provider_history.c.run) == runs_before
        await both.turn("resp_30", "resp_29", ["u30"], ["a30"])
        await both.turn("resp_b5_again", "resp_5", ["b5x"], ["c5x"])
        for rid in ("resp_30", "resp_b5_again", "resp_29"):
            await both.same_history(rid)
        await reopened.aclose()
