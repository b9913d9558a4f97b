"""A replica identity the lease rows cannot hold is refused when the options are built, not at the
first write of a running response."""

from __future__ import annotations

import pytest

from eventguard.replicas import ReplicaOptions


@pytest.mark.parametrize(
    "identity", ["", "a\x00b", "a\udcffb", "\x1b[31mred", "x" * 256, "x" * 1_000_000], ids=repr
)
def test_an_identity_the_lease_rows_cannot_hold_is_a_value_error(identity: str) -> None:
    with pytest.raises(ValueError, match="identity"):
        ReplicaOptions(identity=identity)


def test_a_plain_identity_of_255_characters_is_kept() -> None:
    assert ReplicaOptions(identity="r" * 255).identity == "r" * 255
