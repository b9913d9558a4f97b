"""Every correction and anomaly is said: a log line, an event on the current span, a metric.

Issue 14 part 3 ("a corrected lie or any other anomaly produces no log line"). The guard runs on
scripted streams as the host would drive it; OpenTelemetry's SDK with in-memory exporters stands in
for the application's tracing and metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import use_span

from eventguard import guard, telemetry
from eventguard.lifecycle import CORRECTIONS, AnomalyKind, Lifecycle, ResponseInfo
from eventguard.testing import Scripted, host_context, stream_events, terminal
from tests._telemetry import reading_metrics


@pytest.fixture
def metrics() -> Iterator[InMemoryMetricReader]:
    with reading_metrics() as reader:
        yield reader


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "eventguard.anomaly"]


async def _run(events: list[Any], ctx: Any) -> list[Any]:
    out: list[Any] = []
    async with asyncio.timeout(10):
        async with guard(Scripted(events), asyncio.Event(), context=ctx) as stream:
            async for e in stream:
                out.append(e)
    return out


def _shutdown_lie(rid: str = "resp_1") -> tuple[list[Any], Any]:
    """A chat run cut short by shutdown that says ``completed`` (the upstream lie of every release)."""
    ctx = host_context(response_id=rid)
    ctx.shutdown.set()
    return [*stream_events(2, final=None), terminal("completed", rid)], ctx


def _points(reader: InMemoryMetricReader, name: str) -> dict[tuple[tuple[str, Any], ...], int]:
    data = reader.get_metrics_data()
    found: dict[tuple[tuple[str, Any], ...], int] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        found[tuple(sorted(point.attributes.items()))] = int(point.value)
    return found


async def test_a_corrected_lie_is_one_warning_line_with_the_response_id_and_kind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events, ctx = _shutdown_lie("resp_lie")
    with caplog.at_level(logging.INFO, logger="eventguard.anomaly"):
        out = await _run(events, ctx)
    assert out[-1]["type"] == "response.failed"
    lines = _lines(caplog)
    warnings = [r for r in lines if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in lines]
    message = warnings[0].getMessage()
    assert "resp_lie" in message and "terminal_replaced" in message and "corrected" in message
    assert "\n" not in message


async def test_a_run_that_tells_the_truth_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="eventguard.anomaly"):
        await _run(stream_events(3), host_context())
    assert _lines(caplog) == []


async def test_an_anomaly_that_corrects_no_lie_is_an_info_line(caplog: pytest.LogCaptureFixture) -> None:
    # An output event after the terminal: kept as an anomaly, not a lie about the ending.
    events = [*stream_events(1), {"type": "response.output_text.delta", "delta": "late"}]
    with caplog.at_level(logging.INFO, logger="eventguard.anomaly"):
        await _run(events, host_context())
    lines = _lines(caplog)
    assert lines, "the late event must be reported"
    assert {r.levelno for r in lines} == {logging.INFO}
    assert any("event_after_terminal" in r.getMessage() for r in lines)


@pytest.mark.parametrize(
    "rid",
    ["resp\n2026-12-01 CRITICAL forged line", "resp\x1b[2J\x1b[31mred", "resp\x00nul\udcff", "r" * 1_000_000],
    ids=["newline", "ansi", "nul-surrogate", "1MB"],
)
async def test_a_hostile_response_id_stays_on_one_escaped_bounded_line(
    caplog: pytest.LogCaptureFixture, rid: str
) -> None:
    events, ctx = _shutdown_lie(rid)
    with caplog.at_level(logging.INFO, logger="eventguard.anomaly"):
        await _run(events, ctx)
    lines = _lines(caplog)
    assert len(lines) == 1
    message = lines[0].getMessage()
    assert message.isprintable(), repr(message[:200])
    assert len(message) < 5_000
    message.encode("utf-8")  # no lone surrogate reaches a handler


async def test_levels_are_settings_and_none_silences(caplog: pytest.LogCaptureFixture) -> None:
    before = telemetry.set_reporting(telemetry.Reporting(correction_level=logging.ERROR, anomaly_level=None))
    try:
        events, ctx = _shutdown_lie()
        with caplog.at_level(logging.DEBUG, logger="eventguard.anomaly"):
            await _run(events, ctx)
            await _run([*stream_events(1), {"type": "response.output_text.delta"}], host_context())
    finally:
        telemetry.set_reporting(before)
    assert [r.levelno for r in _lines(caplog)] == [logging.ERROR]


async def test_each_correction_is_an_event_on_the_current_span(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    events, ctx = _shutdown_lie("resp_span")
    span = provider.get_tracer("the-host").start_span("POST /responses")
    with use_span(span, end_on_exit=True):
        await _run(events, ctx)
    (finished,) = exporter.get_finished_spans()
    reported = [e for e in finished.events if e.name.startswith("eventguard.")]
    assert [e.name for e in reported] == ["eventguard.correction"]
    attributes = dict(reported[0].attributes or {})
    assert attributes["eventguard.anomaly.kind"] == "terminal_replaced"
    assert attributes["eventguard.response.id"] == "resp_span"
    assert attributes["eventguard.attempt"] == 1


async def test_endings_are_counted_by_status_and_cause(metrics: InMemoryMetricReader) -> None:
    await _run(stream_events(1), host_context())
    await _run(stream_events(1), host_context())
    events, ctx = _shutdown_lie()
    await _run(events, ctx)
    ended = _points(metrics, "eventguard.response.ended")
    assert ended == {
        (("eventguard.response.cause", "normal"), ("eventguard.response.status", "completed")): 2,
        (("eventguard.response.cause", "shutdown"), ("eventguard.response.status", "failed")): 1,
    }
    anomalies = _points(metrics, "eventguard.anomaly")
    assert anomalies == {
        (("eventguard.anomaly.kind", "terminal_replaced"), ("eventguard.correction", True)): 1
    }


async def test_opentelemetry_off_reports_no_metric(metrics: InMemoryMetricReader) -> None:
    telemetry.set_reporting(telemetry.Reporting(opentelemetry=False, meter_provider=None))
    await _run(stream_events(1), host_context())
    assert _points(metrics, "eventguard.response.ended") == {}


def test_a_failing_log_handler_never_breaks_the_lifecycle() -> None:
    class Broken(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("handler down")

    handler = Broken()
    handler.handleError = lambda record: (_ for _ in ()).throw(RuntimeError("raise from handleError"))  # type: ignore[method-assign]
    logger = logging.getLogger("eventguard.anomaly")
    logger.addHandler(handler)
    before = logger.level
    logger.setLevel(logging.INFO)
    try:
        lc = Lifecycle(info=ResponseInfo(response_id="r"))
        lc.note(AnomalyKind.TERMINAL_REPLACED, "x")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
    assert len(lc.anomalies) == 1


def test_corrections_are_the_kinds_where_the_stream_said_something_untrue() -> None:
    assert {k for k in AnomalyKind if k.correction} == CORRECTIONS
    assert AnomalyKind.TERMINAL_REPLACED.correction and not AnomalyKind.SINK_REFUSED.correction


async def test_the_sinks_own_anomalies_are_said_too(caplog: pytest.LogCaptureFixture, tmp_path: Any) -> None:
    from eventguard import SqlSink

    rid = "resp\x00with-nul"
    sink = SqlSink(f"sqlite:///{tmp_path / 'eg.db'}", spool_path=tmp_path / "spool.jsonl")
    with caplog.at_level(logging.INFO, logger="eventguard.anomaly"):
        async with asyncio.timeout(30):
            await sink.start()
            async with guard(
                Scripted(stream_events(1)), asyncio.Event(), context=host_context(response_id=rid), sink=sink
            ) as stream:
                async for _ in stream:
                    pass
            await sink.aclose()
    escaped = [r for r in _lines(caplog) if "value_escaped" in r.getMessage()]
    assert escaped, [r.getMessage() for r in _lines(caplog)]
    assert all(r.levelno == logging.INFO and r.getMessage().isprintable() for r in escaped)


async def test_a_log_handler_that_raises_at_every_level_never_reaches_the_stream() -> None:
    """A handler that raises for every eventguard record, DEBUG included: the failed report's own
    DEBUG line (that reporting failed) goes to the same handler, and raised out of the stream."""

    class Raising(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("handler down")

    handler = Raising(level=logging.DEBUG)
    logger = logging.getLogger("eventguard")
    logger.addHandler(handler)
    before = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        events, ctx = _shutdown_lie("resp_handler")
        out = await _run(events, ctx)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
    assert [e["type"] for e in out][-1] == "response.failed"  # the lie corrected, the stream whole
    assert len(out) == len(events)
