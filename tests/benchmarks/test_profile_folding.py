"""py-spy's raw stacks fold into own time, packages, threads, eventguard's share; the harness left out."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is not part of the installed package

profile_host = importlib.import_module("benchmarks.profile_host")

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
RAW = "\n".join(
    [
        f"thread (1): MainThread;run ({STDLIB}/asyncio/runners.py);"
        f"_handle_response ({SITE}/eventguard/foundry.py);encode ({STDLIB}/json/encoder.py) 6",
        f"thread (1): MainThread;run ({STDLIB}/asyncio/runners.py);"
        f"_write ({SITE}/eventguard/sink/sink.py);execute ({SITE}/sqlalchemy/engine/base.py) 3",
        f"thread (2): Thread-1 (_connection_worker_thread);"
        f"_connection_worker_thread ({SITE}/aiosqlite/core.py) 1",
        f"thread (1): MainThread;_stream ({SITE}/eventguard/testing/host.py) 2",
        "thread (1): MainThread;add_bench_routes.<locals>.reset (/repo/benchmarks/_host_server.py) 5",
        "not a stack line",
    ]
)


def test_samples_fold_into_own_time_by_function_and_package() -> None:
    prof = profile_host.fold(RAW)
    assert prof.total == 12 and prof.harness == 5  # the reset route is counted apart, not in the total
    assert prof.own["encode (stdlib/json/encoder.py)"] == 6
    assert prof.own["execute (sqlalchemy/engine/base.py)"] == 3
    assert prof.packages["stdlib/json"] == 6 and prof.packages["sqlalchemy"] == 3
    assert prof.packages["aiosqlite"] == 1 and prof.packages["eventguard/testing"] == 2


def test_eventguard_share_counts_its_frames_anywhere_on_the_stack_but_not_its_test_kit() -> None:
    prof = profile_host.fold(RAW)
    assert prof.eventguard == 9  # 6 under the guard + 3 under the sink; the scripted client is not eventguard
    assert prof.eventguard_inclusive["_write (eventguard/sink/sink.py)"] == 3
    assert prof.threads["MainThread"] == 11
    assert prof.threads["Thread-1 (_connection_worker_thread)"] == 1


def test_the_markdown_section_names_the_top_sites() -> None:
    text = "\n".join(profile_host.section("sqlite", profile_host.fold(RAW)))
    assert "### guarded + SQLite sink" in text
    assert "| 50.0 % | `encode (stdlib/json/encoder.py)` |" in text
