"""The in-flight memory part, quick: responses held open keep no object per forwarded event."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def test_held_responses_keep_no_object_per_forwarded_event() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # benchmarks/ is not part of the installed package
    memory = importlib.import_module("benchmarks.memory")
    sizes = importlib.import_module("benchmarks._common").Sizes.quick()
    async with asyncio.timeout(300):
        rows = await memory.run(sizes)
    flat = [r for r in rows if "live blocks kept per forwarded event" in r.what]
    assert flat and all(not r.skipped for r in flat if "SQLite" in r.what)
    # One object kept per event would read >= 1 block per event; the target is 0.1. Not a timing.
    assert all(r.skipped or r.value < 1 for r in flat), [(r.what, r.value, r.note) for r in flat]
    resident = [r for r in rows if "resident memory per in-flight response" in r.what]
    assert len(resident) >= 2 and all(r.baseline for r in resident if not r.skipped)
