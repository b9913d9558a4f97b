"""The measuring scripts refuse an argument they cannot use, with a usage error, before any work."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

_SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", _SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("script", "argv", "says"),
    [
        ("sqlite_cold_writer", ["--pauses", "nan"], "--pauses"),
        ("sqlite_cold_writer", ["--pauses", "inf"], "--pauses"),
        ("sqlite_cold_writer", ["--pauses", "-1"], "--pauses"),
        ("sqlite_cold_writer", ["--pauses", "1e12"], "--pauses"),
        ("sqlite_cold_writer", ["--transactions", "0"], "--transactions"),
        ("sqlite_cold_writer", ["--transactions", "-5"], "--transactions"),
        ("host_instructions", ["--statements", "--responses", "0"], "--responses"),
        ("host_instructions", ["--responses", "-3"], "--responses"),
        ("host_instructions", ["--statements", "--variant", "guarded"], "no SQLite writer thread"),
        # Every variant is checked before the first is served.
        ("host_instructions", ["--statements", "--variant", "sqlite", "--variant", "guarded"], "guarded"),
        ("host_instructions", ["--close-wait", "--variant", "unguarded"], "no sink to wait for"),
        ("host_instructions", ["--close-wait", "--variant", "sqlite", "--variant", "guarded"], "guarded"),
        ("host_instructions", ["--close-wait", "--responses", "0"], "--responses"),
    ],
)
def test_an_unusable_argument_is_a_usage_error_naming_it(
    script: str,
    argv: list[str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = _load(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])

    def no_pause(seconds: float) -> None:  # a script that went on to measure fails here, not hangs
        raise AssertionError(f"the script went on to measure (a pause of {seconds} s)")

    def no_child(*args: object, **kwargs: object) -> None:  # nor serves responses in a child
        raise AssertionError("the script went on to measure (a child process)")

    monkeypatch.setattr(time, "sleep", no_pause)
    monkeypatch.setattr(subprocess, "run", no_child)
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
