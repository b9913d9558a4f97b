"""A file's path given where a database URL belongs is refused saying what a URL looks like; the
text itself is not shown (it could be a secret pasted in the wrong place)."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import ArgumentError

from eventguard.sink import SqlSink
from eventguard.store import ResponseStore


@pytest.mark.parametrize("build", [SqlSink, ResponseStore])
def test_a_path_for_a_url_says_it_has_no_scheme(build: type) -> None:
    with pytest.raises(ArgumentError, match=r"has no scheme://; a SQLite file is sqlite:///") as caught:
        build("/var/lib/app/history.db")
    assert "history" not in str(caught.value)
