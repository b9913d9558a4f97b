"""The migrations travel in the wheel: an installed package, away from the source tree, upgrades
and downgrades both databases."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from .conftest import PG_URL, Target

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import eventguard
    from eventguard.sink import SqlSink
    from eventguard.sql import migrate
    assert "site-packages" in eventguard.__file__, eventguard.__file__
    assert "_migrations" in str(migrate.migrations_dir()), migrate.migrations_dir()

    async def main(url, schema):
        sink = SqlSink(url, schema=schema or None, auto_migrate=False)
        await sink.migrate()
        await migrate.check(sink.engine)
        await sink.downgrade("base")
        assert await migrate.current_revision(sink.engine) == ()
        await sink.migrate()
        await sink.aclose()
        print("ok", migrate.migrations_dir())

    asyncio.run(asyncio.wait_for(main(sys.argv[1], sys.argv[2]), 60))
    """
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(ROOT), "-w", str(base / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if built.returncode != 0:
        pytest.skip(f"cannot build the wheel here (no build backend?): {built.stderr[-500:]}")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    wheel = next((base / "dist").glob("eventguard-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        timeout=300,
    )
    # Dependencies come from the test environment; eventguard itself only from the wheel.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.mark.slow
def test_installed_wheel_migrates_both_ways(installed: Path, target: Target, tmp_path: Path) -> None:
    url = target.url if target.kind == "sqlite" else PG_URL
    done = subprocess.run(
        [str(installed), "-c", SCRIPT, url, target.schema or ""],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "site-packages/eventguard/_migrations" in done.stdout
