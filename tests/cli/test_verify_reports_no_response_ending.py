"""``verify`` is read-only, and that includes the metrics: it replayed each stored history through
a ``Lifecycle``, whose ending is reported as a response's, so every run of it (an application's
health check, ``eventguard verify``) added each stored response again to
``eventguard.response.ended`` (with cause ``none``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from eventguard import ResponseStore, SqlSink, guard
from eventguard.verify import verify
from tests._telemetry import reading_metrics


def _ended(reader: Any) -> list[tuple[tuple[tuple[str, Any], ...], int]]:
    points = []
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == "eventguard.response.ended":
                    points += [(tuple(sorted(p.attributes.items())), p.value) for p in m.data.data_points]
    return sorted(points)


async def _stream(rid: str) -> AsyncIterator[dict[str, Any]]:
    yield {"type": "response.created", "response": {"id": rid, "status": "in_progress"}}
    yield {"type": "response.completed", "response": {"id": rid, "status": "completed"}}


def test_verify_adds_nothing_to_the_responses_ended_metric(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'eg.db'}"

    async def main() -> None:
        async with asyncio.timeout(30):
            async with SqlSink(url, spool_path=tmp_path / "spool.jsonl") as sink:
                for i in range(3):
                    async with guard(_stream(f"resp_{i}"), asyncio.Event(), sink=sink) as g:
                        async for _ in g:
                            pass
            recorded = _ended(reader)
            assert sum(value for _, value in recorded) == 3
            async with ResponseStore(url) as store:
                report = await verify(store)
            assert report.ok and report.checked == 3
            assert _ended(reader) == recorded

    with reading_metrics() as reader:
        asyncio.run(main())
