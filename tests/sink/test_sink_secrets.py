"""The sink never shows its URL's password: not in its repr, its outage log, or stats.last_error."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from eventguard.sink import SqlSink

from .helpers import run_guarded, script

PASSWORD = "s3cr3t-Pa55word"


async def test_an_outage_is_logged_and_counted_without_the_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"postgresql+asyncpg://postgres:{PASSWORD}@127.0.0.1:1/test"
    sink = SqlSink(url, spool_path=tmp_path / "spool", connect_timeout=2)
    with caplog.at_level(logging.DEBUG, logger="eventguard"):
        async with asyncio.timeout(30):
            await run_guarded(sink, script("resp_outage"))
            await sink.aclose()
    assert sink.stats.last_error, "the outage was not noticed"
    shown = caplog.text + repr(sink) + str(sink.stats.last_error)
    assert PASSWORD not in shown


def test_a_driver_error_that_echoes_its_dsn_is_shown_without_the_password(tmp_path: Path) -> None:
    sink = SqlSink(f"postgresql+asyncpg://app:{PASSWORD}@db.example/prod", spool_path=tmp_path / "s")
    echoed = OSError(
        f"could not connect to postgresql://app:{PASSWORD}@db.example/prod (password={PASSWORD})"
    )
    why = sink.writer.report.why(echoed)
    assert PASSWORD not in why
    assert why.startswith("OSError: could not connect to")
