"""The public surface of ``eventguard``: its version."""

from __future__ import annotations

from importlib.metadata import version

import eventguard


def test_version_is_the_installed_distributions_version() -> None:
    assert eventguard.__version__ == version("eventguard")
