"""What installs with what: the core needs no extra, each extra's absence is said in one line, and the
wheel carries the licence and declares the extras (issue 14, part 1)."""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import eventguard
from eventguard.cli import app

ROOT = Path(__file__).resolve().parents[1]

#: What each extra installs, by import name: none of it may be needed to import eventguard. Not httpx:
#: the host itself requires it (the oldest host imports it through mcp when eventguard.foundry loads).
EXTRA_MODULES = ("typer", "click", "rich", "shellingham", "uvicorn", "openai", "asyncpg")

#: Prepended to a child's script: every extra's module is "not installed" (``None`` in ``sys.modules``
#: makes ``import`` raise ``ModuleNotFoundError``, as a missing package does).
WITHOUT_EXTRAS = f"import sys\nfor _m in {EXTRA_MODULES!r}:\n    sys.modules[_m] = None\n"


def run_child(script: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS + textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def test_the_core_imports_and_records_into_sqlite_without_any_extra(tmp_path: Path) -> None:
    done = run_child(
        """
        import asyncio
        import eventguard
        from eventguard import ResponseStore, SqlSink, guard
        import eventguard.foundry, eventguard.store, eventguard.sink

        async def main():
            async def stream():
                yield {"type": "response.created", "response": {"id": "resp_core", "status": "in_progress"}}
                yield {"type": "response.completed", "response": {"id": "resp_core", "status": "completed"}}

            sink = SqlSink("sqlite:///core.db", spool_path="core.spool.jsonl")
            await sink.start()
            async with guard(stream(), asyncio.Event(), sink=sink) as events:
                async for _ in events:
                    pass
            await sink.aclose()
            async with ResponseStore("sqlite:///core.db") as store:
                print((await store.get("resp_core")).status)

        asyncio.run(asyncio.wait_for(main(), 60))
        """,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["completed"]


def test_the_command_without_the_cli_extra_says_which_extra_to_install_in_one_line() -> None:
    done = run_child("from eventguard.cli import main\nsys.argv = ['eventguard', 'verify']\nmain()\n")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "eventguard: error: this needs typer, which is not installed: pip install 'eventguard[cli]'"
    ]


def test_the_demo_without_the_demo_extra_says_which_extra_to_install_in_one_line(tmp_path: Path) -> None:
    script = """
        for _m in ("typer", "click", "rich", "shellingham"):
            del sys.modules[_m]  # the CLI is installed; only the demo's parts are missing
        from eventguard.cli import main
        sys.argv = ["eventguard", "demo", "--database-url", sys.argv[1]]
        main()
        """
    done = run_child(script, f"sqlite:///{tmp_path / 'demo.db'}")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert re.fullmatch(
        r"eventguard: error: this needs (uvicorn|openai), which is not installed: "
        r"pip install 'eventguard\[demo\]'",
        line,
    ), line
    assert not (tmp_path / "demo.db").exists()


def test_version_option_prints_the_packages_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"eventguard {eventguard.__version__}\n"


def name_of(requirement: str) -> str:
    """The distribution a ``Requires-Dist`` line names (``pydantic<3,>=2.11`` -> ``pydantic``)."""
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match is not None, requirement
    return match[0].lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(ROOT), "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if built.returncode != 0:
        pytest.skip(f"cannot build the wheel here (no build backend?): {built.stderr[-500:]}")
    return next(out.glob("eventguard-*.whl"))


def test_the_wheel_carries_the_mit_licence(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if ".dist-info/" in n and n.endswith("/LICENSE")]
        text = archive.read(name).decode()
    assert text.startswith("MIT License") and text == (ROOT / "LICENSE").read_text()


def test_the_wheel_requires_only_the_core_and_declares_every_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(archive.read(name).decode())
    requires = meta.get_all("Requires-Dist") or []
    core = {name_of(r) for r in requires if "extra ==" not in r}
    assert core == {
        "agent-framework-foundry-hosting",
        "pydantic",
        "sqlalchemy",
        "aiosqlite",
        "alembic",
        "orjson",
    }
    assert {"postgres", "cli", "demo", "all", "test"} <= set(meta.get_all("Provides-Extra") or [])
    assert not any(r.lower().startswith("httpx") and "extra == 'test'" not in r for r in requires), requires
