"""The sink's metrics through OpenTelemetry (issue 14): queue depth, spool bytes, back-pressure,
batches and events written, write latency; read by the SDK's in-memory metric reader from a real
sink on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from eventguard import telemetry
from eventguard.sink import SqlSink
from tests._telemetry import reading_metrics

from .conftest import Overflowing, Target
from .helpers import run_guarded, script

STEP = 30.0
SINK_METRICS = {
    "eventguard.sink.buffered",
    "eventguard.sink.spool.size",
    "eventguard.sink.batches",
    "eventguard.sink.events.written",
    "eventguard.sink.overflows",
    "eventguard.sink.refusals",
    "eventguard.sink.quarantined",
    "eventguard.sink.write.duration",
}


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    with reading_metrics() as reader:
        yield reader


def _metrics(reader: InMemoryMetricReader, owner: str) -> dict[str, dict[tuple[tuple[str, Any], ...], Any]]:
    """{metric name: {attributes but the owner: point}} of one sink's metrics, as collected now."""
    data = reader.get_metrics_data()
    found: dict[str, dict[tuple[tuple[str, Any], ...], Any]] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    attributes = dict(point.attributes)
                    if attributes.pop("eventguard.sink.owner", None) == owner:
                        found.setdefault(metric.name, {})[tuple(sorted(attributes.items()))] = point
    return found


def _value(found: dict[str, dict[tuple[tuple[str, Any], ...], Any]], name: str, **extra: str) -> int:
    (point,) = [p for attrs, p in found[name].items() if all((k, v) in attrs for k, v in extra.items())]
    return int(point.value)


async def test_a_sink_reports_what_it_wrote_and_how_long_each_commit_took(
    target: Target, reader: InMemoryMetricReader
) -> None:
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    async with asyncio.timeout(STEP):
        await sink.start()
        try:
            for i in range(3):
                await run_guarded(sink, script(f"resp_m{i}", n_deltas=4))
            await sink.flush()
        finally:
            await sink.aclose()
    found = _metrics(reader, sink.owner)
    assert set(found) == SINK_METRICS
    system = "sqlite" if target.kind == "sqlite" else "postgresql"
    assert {attrs for points in found.values() for attrs in points} >= {(("db.system.name", system),)}
    stats = sink.stats
    assert stats.events_written == 3 * len(script("resp_m0", n_deltas=4)) and stats.batches_written >= 3
    assert _value(found, "eventguard.sink.events.written") == stats.events_written
    assert _value(found, "eventguard.sink.batches", **{"eventguard.sink.outcome": "written"}) == (
        stats.batches_written
    )
    assert _value(found, "eventguard.sink.batches", **{"eventguard.sink.outcome": "spooled"}) == 0
    for idle in ("buffered", "spool.size", "overflows", "refusals", "quarantined"):
        assert _value(found, f"eventguard.sink.{idle}") == 0, idle
    (latency,) = found["eventguard.sink.write.duration"].values()
    # one record per committed transaction: at least one per cycle that wrote something
    assert 1 <= latency.count <= stats.batches_written and latency.sum > 0
    assert latency.explicit_bounds[0] == 0.001  # seconds, not the SDK's millisecond buckets


async def test_queue_depth_is_the_events_waiting_for_the_writer(
    sqlite_target: Target, reader: InMemoryMetricReader, overflow: Overflowing
) -> None:
    sink = SqlSink(sqlite_target.url, spool_path=sqlite_target.spool, flush_every=1_000)
    async with asyncio.timeout(STEP):
        await sink.start()
        try:
            pending = overflow(sink, "resp_depth", 40)  # 40 deltas, no await: nothing taken yet
            assert _value(_metrics(reader, sink.owner), "eventguard.sink.buffered") == 40
            await pending.complete()
            await sink.flush()
            assert _value(_metrics(reader, sink.owner), "eventguard.sink.buffered") == 0
        finally:
            await sink.aclose()


async def test_back_pressure_shows_as_overflows_spooled_batches_and_spool_bytes(
    sqlite_target: Target, reader: InMemoryMetricReader, overflow: Overflowing
) -> None:
    sink = SqlSink(sqlite_target.url, spool_path=sqlite_target.spool, flush_every=5, max_buffered=10)
    async with asyncio.timeout(STEP):
        await sink.start()
        try:
            pending = overflow(sink, "resp_full", 50)  # past max_buffered: spilled to the spool
            found = _metrics(reader, sink.owner)
            await pending.complete()
        finally:
            await sink.aclose()
    assert sink.stats.overflows >= 1
    assert _value(found, "eventguard.sink.overflows") == sink.stats.overflows
    assert _value(found, "eventguard.sink.batches", **{"eventguard.sink.outcome": "spooled"}) == (
        sink.stats.batches_spooled
    )
    assert _value(found, "eventguard.sink.spool.size") > 0


async def test_a_sink_nobody_holds_is_no_longer_reported(
    sqlite_target: Target, reader: InMemoryMetricReader
) -> None:
    sink = SqlSink(sqlite_target.url, spool_path=sqlite_target.spool)
    owner = sink.owner
    assert _metrics(reader, owner) != {}
    del sink
    gc.collect()
    assert _metrics(reader, owner) == {}


async def test_opentelemetry_off_reports_no_sink_metric(
    sqlite_target: Target, reader: InMemoryMetricReader
) -> None:
    telemetry.set_reporting(telemetry.Reporting(opentelemetry=False))
    sink = SqlSink(sqlite_target.url, spool_path=sqlite_target.spool)
    async with asyncio.timeout(STEP):
        await sink.start()
        try:
            await run_guarded(sink, script("resp_off", n_deltas=2))
            await sink.flush()
        finally:
            await sink.aclose()
    assert sink.stats.events_written == len(script("resp_off", n_deltas=2))
    assert _metrics(reader, sink.owner) == {}


async def test_a_sink_built_before_the_meter_provider_is_set_is_read_by_it(target: Target) -> None:
    """The application sets its MeterProvider (``set_reporting``) after building its sink: the
    sink's figures are there at the first collection, not only after the next response ends."""
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    async with asyncio.timeout(STEP):
        await sink.start()
        try:
            await run_guarded(sink, script("resp_late_provider", n_deltas=2))
            await sink.flush()
            with reading_metrics() as reader:
                found = _metrics(reader, sink.owner)
                assert _value(found, "eventguard.sink.events.written") == sink.stats.events_written > 0
        finally:
            await sink.aclose()
