"""``responses show`` says a token count the database does not hold (NULL: a count past 64 bits is
stored so, with its anomaly) is unknown, never 0."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from eventguard import guard
from eventguard.sink import SqlSink

from .conftest import STEP, Cli, event


async def recorded(url: str, rid: str, usage: dict[str, int]) -> None:
    async def stream() -> AsyncIterator[Any]:
        yield event(rid, "response.created")
        yield event(rid, "response.in_progress")
        done = event(rid, "response.completed", "completed")
        done["response"]["usage"] = usage
        yield done

    async with asyncio.timeout(STEP):
        sink = SqlSink(url, spool_path=Path("spool.jsonl"))
        async with sink, guard(stream(), asyncio.Event(), sink=sink, cancel_grace=None) as g:
            async for _ in g:
                pass


def test_a_token_count_the_database_does_not_hold_is_shown_unknown(cli: Cli) -> None:
    asyncio.run(
        recorded(cli.url, "resp_huge", {"input_tokens": 2**70, "output_tokens": 7, "total_tokens": 2**70})
    )
    asyncio.run(recorded(cli.url, "resp_plain", {"input_tokens": 0, "output_tokens": 7, "total_tokens": 7}))
    huge = cli("responses", "show", "resp_huge")
    assert huge.exit_code == 0, huge.output
    assert "in - / out 7 / total -" in huge.output
    plain = cli("responses", "show", "resp_plain")
    assert "in 0 / out 7 / total 7" in plain.output
