"""What every measurement shares: the result row, sizes, timing, the events and the machine."""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Sizes:
    """How big each measurement is; ``quick()`` is for smoke tests, not for numbers."""

    reps: int = 5
    overhead_events: int = 200_000
    sink_events: int = 100_000
    latency_events: int = 20_000
    scale_streams: int = 1_000
    scale_events: int = 100
    short_streams: int = 1_000
    short_events: int = 20
    memory_streams: int = 4
    memory_small: int = 100
    memory_large: int = 100_000
    peer_events: int = 2_000
    host_rounds: int = 8
    host_responses_c1: int = 40
    host_responses_c16: int = 160
    inflight_streams: int = 1_000
    inflight_small: int = 100
    inflight_large: int = 1_000

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            reps=1,
            overhead_events=2_000,
            sink_events=500,
            latency_events=300,
            scale_streams=10,
            scale_events=10,
            short_streams=20,
            short_events=5,
            memory_streams=2,
            memory_small=10,
            memory_large=200,
            peer_events=50,
            host_rounds=2,
            host_responses_c1=8,
            host_responses_c16=32,
            inflight_streams=50,
            inflight_small=10,
            inflight_large=100,
        )


@dataclass
class Row:
    """One line of the results table: a figure, its baseline from the same run, and the verdict."""

    item: str
    what: str
    value: float | None
    unit: str
    baseline_what: str = ""
    baseline: float | None = None
    #: "<=" (value/baseline must not exceed target), ">=" (must reach it), "" (reported only).
    direction: str = ""
    target: float | None = None
    #: When set, the target applies to the value itself (an absolute bound), not to a ratio.
    absolute: bool = False
    note: str = ""
    skipped: str = ""
    samples: list[float] = field(default_factory=list)
    #: A ratio measured in pairs (the median of per-round ratios), shown instead of value / baseline.
    paired: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.paired is not None:
            return self.paired
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline

    @property
    def ok(self) -> bool | None:
        if self.skipped or self.target is None or not self.direction:
            return None
        r = self.value if self.absolute else self.ratio
        if r is None:
            return False
        return r <= self.target if self.direction == "<=" else r >= self.target


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    a = abs(v)
    if v == int(v) and a < 100_000:
        s = f"{int(v)}"
    elif a >= 100_000:
        s = f"{v:,.0f}"
    elif a >= 100:
        s = f"{v:.0f}"
    elif a >= 10:
        s = f"{v:.1f}"
    elif a >= 1:
        s = f"{v:.2f}"
    else:
        s = f"{v:.3f}"
    return f"{s} {unit}".rstrip()


def collect() -> None:
    gc.collect()
    gc.collect()


def now() -> float:
    return time.perf_counter()


def delta(i: int) -> dict[str, Any]:
    """A small output-text delta, the bulk of every real stream."""
    return {"type": "response.output_text.delta", "delta": f"tok{i}", "output_index": 0, "sequence_number": i}


def script(rid: str, n_deltas: int) -> Iterator[dict[str, Any]]:
    """created, in_progress, ``n_deltas`` fresh delta dicts, completed: ``n_deltas + 3`` events."""
    yield {"type": "response.created", "response": {"id": rid, "status": "in_progress"}}
    yield {"type": "response.in_progress", "response": {"id": rid, "status": "in_progress"}}
    for i in range(n_deltas):
        yield delta(i)
    yield {
        "type": "response.completed",
        "response": {
            "id": rid,
            "status": "completed",
            "usage": {"input_tokens": 3, "output_tokens": n_deltas, "total_tokens": n_deltas + 3},
        },
    }


async def network_stream(events: Iterator[Any]) -> AsyncIterator[Any]:
    """Yields to the event loop before every event, as a stream fed by a socket does."""
    for ev in events:
        await asyncio.sleep(0)
        yield ev


async def bare(stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The baseline layer: a pass-through that does nothing at all."""
    async for ev in stream:
        yield ev


async def drain(stream: Any) -> int:
    n = 0
    async for _ in stream:
        n += 1
    return n


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total() -> str:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


PACKAGES = ("eventguard", "sqlalchemy", "aiosqlite", "asyncpg", "orjson", "pydantic", "openai-agents")


def machine() -> list[tuple[str, str]]:
    versions = []
    for name in PACKAGES:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    import sqlite3

    return [
        ("CPU", _cpu_model()),
        ("cores", str(os.cpu_count())),
        ("memory", _mem_total()),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("SQLite", sqlite3.sqlite_version),
        ("packages", ", ".join(versions)),
    ]


def timed(fn: Callable[[], Any]) -> float:
    t = now()
    fn()
    return now() - t
