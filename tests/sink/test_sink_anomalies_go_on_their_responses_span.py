"""An anomaly the sink records is an event on the span of the response it concerns, never on the
span that happened to be current when the sink started (the application's startup, or the first
request's): the sink's writer works in a task of its own, for every response. On SQLite and
PostgreSQL, with OpenTelemetry's SDK and an in-memory exporter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer, use_span

from eventguard.sink import SqlSink

from .conftest import Target
from .helpers import created, in_progress, run_guarded, terminal

STEP = 30.0


@pytest.fixture
def tracing() -> Iterator[tuple[Tracer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("the-host"), exporter
    provider.shutdown()


def with_nul(rid: str, mark: str) -> list[dict[str, Any]]:
    """A stream whose one delta holds a NUL: the sink stores it changed and records why."""
    delta = {"type": "response.output_text.delta", "delta": f"{mark}\x00", "output_index": 0}
    return [created(rid), in_progress(rid), delta, terminal(rid)]


def sink_events(span: ReadableSpan) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name.startswith("eventguard.")]


def finished(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


async def test_a_stored_nul_is_an_event_on_its_responses_span_not_on_the_startups(
    target: Target, tracing: tuple[Tracer, InMemorySpanExporter]
) -> None:
    tracer, exporter = tracing
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    startup = tracer.start_span("startup")
    async with asyncio.timeout(STEP):
        with use_span(startup, end_on_exit=True):
            await sink.start()  # the writer task is made here, in the startup's context
            try:
                for name in ("POST a", "POST b"):
                    with use_span(tracer.start_span(name), end_on_exit=True):
                        await run_guarded(sink, with_nul(f"resp_{name[-1]}", name[-1]))
                        await sink.flush()  # written while the response's span is recording
            finally:
                await sink.aclose()
    spans = finished(exporter)
    assert sink_events(spans["startup"]) == []
    for rid in ("resp_a", "resp_b"):
        (event,) = sink_events(spans[f"POST {rid[-1]}"])
        assert event["eventguard.anomaly.kind"] == "not_serialisable"
        assert event["eventguard.response.id"] == rid


async def test_a_refused_duplicate_stream_is_an_event_on_the_refused_streams_span(
    target: Target, tracing: tuple[Tracer, InMemorySpanExporter]
) -> None:
    tracer, exporter = tracing
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    plain = [created("resp_dup"), in_progress("resp_dup"), terminal("resp_dup")]
    startup = tracer.start_span("startup")
    async with asyncio.timeout(STEP):
        with use_span(startup, end_on_exit=True):
            await sink.start()
            try:
                for name in ("POST first", "POST again"):
                    with use_span(tracer.start_span(name), end_on_exit=True):
                        await run_guarded(sink, plain)
                        await sink.flush()
            finally:
                await sink.aclose()
    spans = finished(exporter)
    assert sink_events(spans["startup"]) == sink_events(spans["POST first"]) == []
    (event,) = sink_events(spans["POST again"])
    assert event["eventguard.anomaly.kind"] == "duplicate_stream"
    assert event["eventguard.response.id"] == "resp_dup"


async def test_the_writers_work_is_in_no_responses_trace(
    target: Target, tracing: tuple[Tracer, InMemorySpanExporter]
) -> None:
    """The writer task is started by the first response that needs it; it must not carry that
    response's context for the sink's life (a database instrumentation would then put every later
    write in the first response's trace). The redactor runs in the writer and reads the span."""
    tracer, _exporter = tracing
    seen: list[str] = []

    def redact(event_type: str | None, event: Any) -> Any:
        seen.append(getattr(trace.get_current_span(), "name", "(none)"))
        return event

    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool, redact=redact)
    plain = [created("resp_a"), in_progress("resp_a"), terminal("resp_a")]
    async with asyncio.timeout(STEP):
        try:
            with use_span(tracer.start_span("POST a"), end_on_exit=True):
                await run_guarded(sink, plain)  # the writer task starts here
                await sink.flush()
        finally:
            await sink.aclose()
    assert seen and "POST a" not in seen
