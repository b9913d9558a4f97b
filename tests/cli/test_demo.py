"""``eventguard demo``, run for real: the console script, a real host under uvicorn, the openai client.

Then, as the README says, ``responses list --status cancelled --json`` lists the cancelled runs and
``verify`` finds no disagreement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.version import Version

pytest.importorskip("agent_framework_foundry_hosting", reason="the upstream host is not installed")

pytestmark = pytest.mark.upstream

# agent-framework-foundry-hosting before 1.0.0b261002 yields `completed` after a cancel
# (see tests/upstream/_drivers.py).
OLD_RELEASE = Version(metadata.version("agent-framework-foundry-hosting")) < Version("1.0.0b261002")
SCRIPT = Path(sys.executable).with_name("eventguard")
BOUND = 120.0  # seconds for one command; the demo itself takes a few


def eventguard(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EVENTGUARD_DATABASE_URL"}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=BOUND, check=False
    )


def test_demo_json_then_list_and_verify(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    run = eventguard("demo", "--json", "--database-url", url, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "[5/5]" in run.stderr  # progress, on stderr
    demo = json.loads(run.stdout)
    assert demo["ok"] is True
    rows = {row["scenario"]: row for row in demo["responses"]}
    assert list(rows) == [
        "completes",
        "cancel while suspended (seed)",
        "cancel after text streamed",
        "executor raises",
        "chat cut short by shutdown",
    ]
    expected = ["completed", "cancelled", "cancelled", "failed", "failed"]
    assert [row["recorded_status"] for row in rows.values()] == expected
    assert [row["public_status"] for row in rows.values()] == expected

    shutdown = rows["chat cut short by shutdown"]
    assert (shutdown["unguarded_terminal"], shutdown["recorded_cause"]) == ("completed", "shutdown")
    assert "D" in shutdown["unguarded_flags"] and shutdown["lie"]
    cancels = [rows["cancel while suspended (seed)"], rows["cancel after text streamed"]]
    if OLD_RELEASE:  # the seed's bug: response.completed after the cancel
        assert [(c["unguarded_terminal"], c["unguarded_flags"]) for c in cancels] == [("completed", "SC")] * 2
        assert all(c["lie"] for c in cancels)
    else:  # fixed upstream: no terminal at all; eventguard records the cancel from the cause
        assert [c["unguarded_terminal"] for c in cancels] == [None, None]
    assert all(c["recorded_cause"] == "client_cancel" for c in cancels)
    assert rows["completes"]["verdict"] == "truthful"
    assert rows["executor raises"]["recorded_cause"] == "error"

    listed = eventguard(
        "responses", "list", "--status", "cancelled", "--json", "--database-url", url, cwd=tmp_path
    )
    assert listed.returncode == 0, listed.stderr
    assert {r["response_id"] for r in json.loads(listed.stdout)} == {c["response_id"] for c in cancels}

    verify = eventguard("verify", "--database-url", url, cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.strip() == "checked 5 responses: no disagreement"


def test_demo_table_in_the_default_database(tmp_path: Path) -> None:
    run = eventguard("demo", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "eventguard.db").exists()  # the sink's default: ./eventguard.db
    out = run.stdout
    assert "unguarded handler yielded" in out and "eventguard recorded" in out and "public API" in out
    assert "completed {SD}" in out and "LIE, corrected" in out
    lies = 3 if OLD_RELEASE else 1
    assert f"{lies} of 5 unguarded terminals lied" in out
    assert "Traceback" not in run.stderr
    again = eventguard("demo", cwd=tmp_path)  # a second run adds five more, and verifies clean
    assert again.returncode == 0, again.stderr
    verify = eventguard("verify", cwd=tmp_path)
    assert verify.returncode == 0 and "checked 10 responses: no disagreement" in verify.stdout
