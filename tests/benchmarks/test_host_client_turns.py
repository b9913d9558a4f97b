"""The host benchmark's client: its slices, and the server CPU clock it reads (no timing asserted)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is not part of the installed package
client = importlib.import_module("benchmarks._host_client")


@pytest.mark.parametrize(
    ("n", "size", "expected"),
    [
        (40, 5, [5] * 8),
        (32, 5, [5, 5, 5, 5, 5, 5, 2]),
        (3, 32, [3]),
        (160, 32, [32] * 5),
        (0, 5, []),
    ],
)
def test_every_response_is_in_exactly_one_slice(n: int, size: int, expected: list[int]) -> None:
    assert client.slices(n, size) == expected
    assert sum(client.slices(n, size)) == n


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="clock_getcpuclockid: Linux here")
def test_the_cpu_clock_of_a_process_counts_every_thread_even_one_that_ended() -> None:
    clock = client.cpu_clock(os.getpid())
    assert clock is not None
    before = time.clock_gettime(clock)
    worker = threading.Thread(target=_burn, args=(0.05,))
    worker.start()
    worker.join()
    # The thread is gone; its CPU time stays in its process's clock (psutil's per-thread
    # figures would have lost it, and its ticks are 10 ms).
    assert time.clock_gettime(clock) - before >= 0.05
    # The same clock as this process's own, read through its pid.
    ours, theirs = time.process_time(), time.clock_gettime(clock)
    assert abs(theirs - ours) < 0.01


def test_a_process_that_is_gone_has_no_cpu_clock() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert client.cpu_clock(gone.pid) is None
