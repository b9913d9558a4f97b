"""The host-level benchmark, quick: six real servers, a real client, nothing lost, no timing asserted."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.upstream


async def test_quick_host_run_reports_every_variant_and_loses_no_event() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # benchmarks/ is not part of the installed package
    host = importlib.import_module("benchmarks.host")
    sizes = importlib.import_module("benchmarks._common").Sizes.quick()
    async with asyncio.timeout(300):
        rows = await host.run(sizes)
    whats = {r.what for r in rows}
    for c in (1, 16):
        assert f"c={c}, unguarded server: responses/s" in whats
        for label in (
            "guarded, no sink",
            "guarded + SQLite sink",
            "guarded, database= on SQLite (sink + SQL response store)",
        ):
            for figure in ("responses/s", "server CPU per response", "p50 per response", "p99 per response"):
                assert f"c={c}, {label}: {figure}" in whats
        for label in ("unguarded server", "guarded, no sink", "guarded + SQLite sink"):
            assert f"c={c}, {label}: garbage collection per response" in whats
            assert f"c={c}, {label}: kernel CPU per response" in whats
    twin = [r for r in rows if "A/A" in r.what]
    # The twin (a second unguarded server) is the benchmark's resolution: reported, never judged,
    # its runs ranked as the targeted figures' are.
    for c in (1, 16):
        for figure in ("responses/s", "server CPU per response", "p99 per response"):
            assert f"c={c}, a second unguarded server (A/A: the benchmark's resolution): {figure}" in whats
    assert twin and all(r.target is None and r.ok is None for r in twin)
    assert {r.direction for r in twin if "responses/s" in r.what} == {">="}
    collected = [r for r in rows if "garbage collection" in r.what]
    # Counted in the server (gc.callbacks), read over HTTP: a figure, never a negative one.
    assert all(r.value is not None and r.value >= 0 and "% of the server CPU" in r.note for r in collected)
    kernel = [r for r in rows if "kernel CPU" in r.what]
    # System time and context switches (getrusage in the server, every thread): counts, never negative.
    assert all(
        r.value is not None and r.value >= 0 and "context switches per response" in r.note for r in kernel
    )
    lost = [r for r in rows if "not in the database" in r.what]
    # Every recording server is counted, the database= ones (the SQL response store) too.
    counted = {r.what.split(": ")[0] for r in lost}
    sqlite_store = "guarded, database= on SQLite (sink + SQL response store)"
    assert {"c=1, guarded + SQLite sink", f"c=1, {sqlite_store}"} <= counted, counted
    # Losing nothing is a correctness figure, not a timing: it holds at any size.
    assert all(r.value == 0 and r.ok is True for r in lost), [(r.what, r.value, r.note) for r in lost]
    # Every client received whole responses: 28 SSE events each (the host's shape for 20 chunks).
    assert all("[28] events per response" in r.note for r in lost), [r.note for r in lost]
