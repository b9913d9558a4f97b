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


ENV = {k: v for k, v in os.environ.items() if k != "EVENTGUARD_DATABASE_URL"}


def eventguard(*args: str, cwd: Path, ignoring_sigint: bool = False) -> subprocess.Popen[str]:
    """The console script on the demo's database, SIGINT ignored as a shell does for a background
    job when asked."""

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return subprocess.Popen(
        [str(SCRIPT), *args, "--database-url", f"sqlite:///{cwd / 'demo.db'}"],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint if ignoring_sigint else None,
    )


def sigint_while_serving(demo: subprocess.Popen[str]) -> str:
    """Sends SIGINT once the demo's first response runs and its server serves (the window in which
    uvicorn's own handlers took it); what the demo said on stderr, to its end."""
    assert demo.stderr is not None
    give_up = time.monotonic() + BOUND
    seen: list[str] = []
    try:
        while not any(line.startswith("[1/5]") for line in seen):
            assert time.monotonic() < give_up, f"the demo never started: {seen}"
            line = demo.stderr.readline()
            assert line, f"the demo ended before its first response: {seen}"
            seen.append(line)
        time.sleep(0.8)  # the first response takes over a second: its server is serving now
        demo.send_signal(signal.SIGINT)
        _out, rest = demo.communicate(timeout=BOUND)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(timeout=BOUND)
    return "".join(seen) + rest


def test_ctrl_c_in_the_demo_interrupts_it_and_says_so(tmp_path: Path) -> None:
    demo = eventguard("demo", cwd=tmp_path)
    said = sigint_while_serving(demo)
    assert demo.returncode == 130, said
    assert said.rstrip().endswith("eventguard: interrupted"), said
    assert "cannot use the database" not in said
    assert "Traceback" not in said
    for command in (["responses", "list", "--json"], ["verify"]):  # readable, and true
        after = eventguard(*command, cwd=tmp_path)
        out, err = after.communicate(timeout=BOUND)
        assert after.returncode == 0, (command, out, err)


def test_a_demo_that_ignores_sigint_runs_to_its_end(tmp_path: Path) -> None:
    demo = eventguard("demo", cwd=tmp_path, ignoring_sigint=True)
    said = sigint_while_serving(demo)
    assert demo.returncode == 0, said
    assert "[5/5]" in said
