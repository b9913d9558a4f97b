"""(issue 15) The host's response store in SQL against the host's own file store, on this machine.

``create_response`` / ``update_response`` / ``get_response`` of a response with 20 input items (and
three output items on the update), timed one call at a time: p50 and p99 on SQLite and PostgreSQL,
each as a ratio to the host's ``FileResponseStore`` measured in the same run. Then a 1,000-turn
``previous_response_id`` chain, built as the host builds it, and the time of one
``get_history_item_ids`` of its last turn (all 2,000 history ids).

Both stores are warmed up the same way before they are timed: ``WARMUP`` untimed rounds of the same
three calls (other ids) on the very store instance then timed, so no store's one-time costs (the
file store's first directories; the SQL provider's first connections, its writer thread's start,
SQLAlchemy's first compilation of each statement) are among the timed calls. (Until then neither
was warmed: the first calls of each were timed.) That is not why the first of ``--runs 3`` in one
process often shows the worst create and update ratios (before the warm-up: create 1.07x, 0.41x,
0.27x; 1.47x, 0.76x, 0.35x; after it: 0.60x, 0.26x, 0.19x): ten warm-up rounds cannot move the
median of 100 calls, and the pattern stayed. Its cause is not established; read the later runs
beside the first.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from azure.ai.agentserver.responses import FileResponseStore

from eventguard.provider import SqlResponseProvider

from ._common import PG_URL, Row, Sizes, collect, now
from ._sinks import pg_schema, pg_unreachable

NAME = "provider"
INPUTS = 20
OPS = ("create", "update", "get")
#: Untimed rounds on each store before its timed ones (see the module's docstring).
WARMUP = 10


def _item(rid: str, n: int) -> dict[str, Any]:
    text = f"input {n} of {rid}: " + "lorem ipsum dolor sit amet " * 8
    return {
        "id": f"msg_{rid}_{n}",
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }


def _envelope(rid: str, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "status": status,
        "model": "bench",
        "created_at": 1764614400,
        "output": output,
        "metadata": {"_internal_metadata": {"agent_session_id": "s", "turn": rid}},
    }


def _outputs(rid: str) -> list[dict[str, Any]]:
    return [
        {
            "id": f"out_{rid}_{n}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "an answer " * 30, "annotations": []}],
        }
        for n in range(3)
    ]


async def _timings(store: Any, ops: int, tag: str) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {op: [] for op in OPS}
    for i in range(-WARMUP, ops):
        rid = f"resp_{tag}_{i}" if i >= 0 else f"resp_{tag}_warm{-i}"
        inputs = [_item(rid, n) for n in range(INPUTS)]
        t = now()
        await store.create_response(_envelope(rid, "in_progress", []), inputs, None)
        times["create"].append(now() - t)
        done = _envelope(rid, "completed", _outputs(rid))
        t = now()
        await store.update_response(done)
        times["update"].append(now() - t)
        t = now()
        await store.get_response(rid)
        times["get"].append(now() - t)
    # The warm-up rounds are dropped: only the ops timed after them count.
    return {op: samples[WARMUP:] for op, samples in times.items()}


def _pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1e3


@asynccontextmanager
async def _sql(kind: str) -> AsyncIterator[SqlResponseProvider]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            provider = SqlResponseProvider(f"sqlite:///{Path(d) / 'provider.db'}")
            await provider.start()
            try:
                yield provider
            finally:
                await provider.aclose()
        return
    async with pg_schema() as schema:
        provider = SqlResponseProvider(PG_URL, schema=schema)
        await provider.start()
        try:
            yield provider
        finally:
            await provider.aclose()


async def _chain_history_ms(provider: SqlResponseProvider, turns: int) -> tuple[float, int]:
    previous: str | None = None
    for n in range(turns):
        rid = f"resp_chain_{n}"
        history = await provider.get_history_item_ids(previous, None, -1) if previous else None
        inputs = [_item(rid, 0)]
        await provider.create_response(_envelope(rid, "in_progress", []), inputs, history)
        await provider.update_response(_envelope(rid, "completed", _outputs(rid)[:1]))
        previous = rid
    assert previous is not None
    samples = []
    ids: list[str] = []
    for _ in range(20):
        t = now()
        ids = await provider.get_history_item_ids(previous, None, -1)
        samples.append(now() - t)
    return statistics.median(samples) * 1e3, len(ids)


async def run(sizes: Sizes) -> list[Row]:
    quick = sizes.reps == 1 and sizes.peer_events < 1000
    ops = 20 if quick else 100
    turns = 30 if quick else 1000
    kinds = ["sqlite"]
    why_not_pg = await pg_unreachable()
    if why_not_pg is None:
        kinds.append("postgres")
    per: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as d:
        collect()
        per["file"] = await _timings(FileResponseStore(Path(d)), ops, "file")
    for kind in kinds:
        collect()
        async with _sql(kind) as provider:
            per[kind] = await _timings(provider, ops, kind)
    rows: list[Row] = []
    for kind in ("sqlite", "postgres"):
        label = "SQLite" if kind == "sqlite" else "PostgreSQL"
        for op in OPS:
            if kind not in per:
                rows.append(
                    Row("15 provider", f"{op}_response p50, {label}", None, "ms", skipped=why_not_pg or "")
                )
                continue
            base = per["file"][op]
            mine = per[kind][op]
            rows.append(
                Row(
                    "15 provider",
                    f"{op}_response p50, {label} ({INPUTS} input items)",
                    _pct(mine, 50),
                    "ms",
                    "host's FileResponseStore p50",
                    _pct(base, 50),
                    # The goal: no slower than the file store at p50 on SQLite.
                    direction="<=" if kind == "sqlite" else "",
                    target=1.0 if kind == "sqlite" else None,
                    note=f"{ops} calls",
                )
            )
            rows.append(
                Row(
                    "15 provider",
                    f"{op}_response p99, {label}",
                    _pct(mine, 99),
                    "ms",
                    "host's FileResponseStore p99",
                    _pct(base, 99),
                )
            )
    for kind in kinds:
        label = "SQLite" if kind == "sqlite" else "PostgreSQL"
        async with _sql(kind) as provider:
            ms, count = await _chain_history_ms(provider, turns)
        rows.append(
            Row(
                "15 provider",
                f"get_history_item_ids of a {turns}-turn chain, {label} (target <= 10 ms)",
                ms,
                "ms",
                direction="<=",
                target=10.0,
                absolute=True,
                note=f"{count} ids; median of 20 calls",
            )
        )
    return rows
