"""Ctrl-C during ``eventguard demo`` interrupts it, says so and exits 130, and the database the demo
was filling stays readable; where SIGINT is ignored (a background job, ``nohup``), it does nothing:
the embedded uvicorn does not take the process's signals (it stopped serving, and the demo said
"cannot use the database"). The console script, for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("agent_framework_foundry_hosting", reason="the upstream host is not installed")
pytest.importorskip("uvicorn", reason="the demo extra is not installed")

pytestmark = pytest.mark.upstream

SCRIPT = Path(sys.executable).with_name("eventguard")
BOUND = 60.0


def start_demo(tmp_path: Path, *, ignoring_sigint: bool = False) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "EVENTGUARD_DATABASE_URL"}

    def ignore_sigint() -> None:  # as a shell does for a background job
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.Popen(
        [str(SCRIPT), "demo", "--database-url", f"sqlite:///{tmp_path / 'demo.db'}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint if ignoring_sigint else None,
    )


def until_serving(demo: subprocess.Popen[str]) -> list[str]:
    """Waits until the demo's first response runs and its server serves; the lines it said."""
    assert demo.stderr is not None
    give_up = time.monotonic() + BOUND
    seen: list[str] = []
    while not any(line.startswith("[1/5]") for line in seen):
        assert time.monotonic() < give_up, f"the demo never started: {seen}"
        line = demo.stderr.readline()
        assert line, f"the demo ended before its first response: {seen}"
        seen.append(line)
    # Its server is serving by now (the first response takes over a second): the window in
    # which uvicorn's own handlers took SIGINT.
    time.sleep(0.8)
    return seen


def test_ctrl_c_in_the_demo_interrupts_it_and_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "EVENTGUARD_DATABASE_URL"}
    demo = start_demo(tmp_path)
    try:
        seen = until_serving(demo)
        demo.send_signal(signal.SIGINT)
        _out, rest = demo.communicate(timeout=BOUND)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(timeout=BOUND)
    said = "".join(seen) + rest
    assert demo.returncode == 130, said
    assert "eventguard: interrupted" in rest, said
    assert "cannot use the database" not in said
    assert "Traceback" not in said
    for command in (["responses", "list", "--json"], ["verify"]):  # readable, and true
        after = subprocess.run(
            [str(SCRIPT), *command, "--database-url", f"sqlite:///{tmp_path / 'demo.db'}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=BOUND,
            check=False,
        )
        assert after.returncode == 0, (command, after.stdout, after.stderr)


def test_a_demo_that_ignores_sigint_runs_to_its_end(tmp_path: Path) -> None:
    demo = start_demo(tmp_path, ignoring_sigint=True)
    try:
        seen = until_serving(demo)
        demo.send_signal(signal.SIGINT)
        _out, rest = demo.communicate(timeout=BOUND)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(timeout=BOUND)
    said = "".join(seen) + rest
    assert demo.returncode == 0, said
    assert "[5/5]" in said
