"""How the host's response store keys its rows and encodes its envelopes, shared by the provider and
the replicas.

:mod:`eventguard.provider` (the host's store) and :mod:`eventguard.replicas` (its fenced subclass,
the leases, the reaper) write the same rows, so they key and encode them one way, here:

- :func:`key` turns an exact string (a response id, a user) into a row key; :func:`partition`
  turns the host's context (``PlatformContext`` or ``ResponseContext``, :func:`user_of`) into the
  partition its rows live in (:data:`ANONYMOUS` without a user);
  :func:`shown` is the id as the event sink stores it (for people, and for joins with its tables);
  :func:`encode_id` stores an exact id in a text column, :func:`decode_id` reads it back.
- :func:`dump` turns an envelope or item into ASCII JSON text that reads back equal (or refuses it
  with :class:`~eventguard.errors.UnstorableError`); :func:`load` reads it back (or raises
  :class:`ProviderStorageError`).

:class:`ProviderStorageError` is defined here, beside :func:`load` that raises it, and exported
by :mod:`eventguard.provider`, where users meet it.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from azure.ai.agentserver.responses.store._base import ResponseStoreCorruptionError

from eventguard.errors import ResponseStoreError, UnstorableError
from eventguard.sql import storable
from eventguard.sql.tables import ID

__all__ = [
    "ANONYMOUS",
    "DATETIME_TAG",
    "ENCODED_ID",
    "ProviderStorageError",
    "decode_id",
    "dump",
    "encode_id",
    "key",
    "load",
    "partition",
    "shown",
    "user_of",
]

#: The partition of a call without a user (no context, or ``user_id_key`` None).
ANONYMOUS = "anonymous"

#: How a ``datetime`` travels in the stored JSON (the host's resilient checkpoints carry one in
#: ``created_at``): ``{TAG: isoformat}``, read back as the same ``datetime``. A real object spelt
#: like that would read back as a datetime: the round-trip check refuses it instead.
DATETIME_TAG = "$eventguard.datetime"

#: Marks an id stored JSON-encoded because it is not storable as it is (see :func:`encode_id`).
ENCODED_ID = "~"


class ProviderStorageError(ResponseStoreError, ResponseStoreCorruptionError):
    """The response store could not read or write the database (away, locked, wrong schema, a
    row that does not decode). Never a ``KeyError``: the host takes that for "not found" and, on
    recovery, drops the response for good.

    It is an :class:`eventguard.errors.ResponseStoreError` for users and the host's
    ``ResponseStoreCorruptionError`` for the host, which then answers 500 instead of 404 and keeps
    a resilient run for a later recovery.
    """


def _encode_other(value: object) -> object:
    if isinstance(value, datetime):
        return {DATETIME_TAG: value.isoformat()}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _decode_object(obj: dict[str, Any]) -> object:
    if len(obj) == 1 and DATETIME_TAG in obj and isinstance(obj[DATETIME_TAG], str):
        return datetime.fromisoformat(obj[DATETIME_TAG])
    return obj


def _loads(text: str) -> Any:
    # The object hook costs a Python call per object: only text holding the tag needs it.
    if DATETIME_TAG in text:
        return json.loads(text, object_hook=_decode_object)
    return json.loads(text)


def dump(value: object, what: str) -> str:
    """``value`` as ASCII JSON text that decodes to an equal value, or :class:`UnstorableError`
    naming ``what`` (such as ``"response 'resp_1'"``).

    ASCII, so NUL and lone surrogates travel as ``\\u`` escapes (no column refuses them); a
    ``datetime`` travels tagged (:data:`DATETIME_TAG`); the round trip is checked (in C), so a
    tuple, a non-string key or a bool key is refused rather than stored as something else.
    """
    try:
        text = json.dumps(
            value, ensure_ascii=True, allow_nan=False, separators=(",", ":"), default=_encode_other
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise UnstorableError(f"{what} cannot be stored exactly as JSON: {exc}") from None
    if _loads(text) != value:
        raise UnstorableError(
            f"{what} would not read back equal to itself from JSON (a tuple, a non-string key, ...)"
        )
    return text


def load(text: str | None, what: str) -> Any:
    """The value :func:`dump` stored as ``text``; :class:`ProviderStorageError` naming ``what``
    when there is no text (``None``) or it does not decode."""
    if text is None:
        raise ProviderStorageError(f"{what} has no stored body")
    try:
        return _loads(text)
    except ValueError as exc:
        raise ProviderStorageError(f"{what} does not decode: {exc}") from exc


def key(value: str) -> str:
    """The row key of an exact string ``value``: its SHA-256 (lone surrogates kept by surrogatepass)."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def encode_id(value: str) -> str:
    """An exact id in a text column: as it is when storable, else ``~`` and its ASCII JSON."""
    if storable.storable(value) and not value.startswith(ENCODED_ID):
        return value
    return ENCODED_ID + json.dumps(value, ensure_ascii=True)


def decode_id(text: str) -> str:
    """The exact id :func:`encode_id` stored as ``text``; :class:`ProviderStorageError` when it
    decodes to something else than a string."""
    if text.startswith(ENCODED_ID):
        decoded = json.loads(text[1:])
        if isinstance(decoded, str):
            return decoded
        raise ProviderStorageError("a stored item id does not decode to a string")
    return text


def user_of(context: object) -> object:
    """The user key the host partitions ``context``'s rows by, as it is (``None``: no user).

    The host hands its store the ``PlatformContext`` (``user_id_key``), and its handler the
    ``ResponseContext``, which has no ``user_id_key`` of its own but carries that ``PlatformContext``
    as ``platform_context`` (2.2.0b1 and 2.4.0b1). Both read the same user here, so a replica's
    lease of a run and the host's writes of it land in one partition."""
    if context is None:
        return None
    platform = getattr(context, "platform_context", None)
    holder = platform if platform is not None else context
    return getattr(holder, "user_id_key", None)


def partition(context: object) -> str:
    """The partition of a call made with the host's ``context`` (its ``PlatformContext``, or the
    ``ResponseContext`` carrying it, see :func:`user_of`): :data:`ANONYMOUS` without one (or with
    ``user_id_key`` None), else the :func:`key` of its ``user_id_key``; :class:`UnstorableError`
    when that is not a ``str``."""
    user = user_of(context)
    if user is None:
        return ANONYMOUS
    if not isinstance(user, str):
        raise UnstorableError(f"context.user_id_key must be a str or None, not {type(user).__name__}")
    return key(user)


def shown(value: str) -> str:
    """The sink's storable form of an id ``value`` (for people, and joins with ``eventguard_responses``)."""
    fix = storable.identifier(value, ID.length or 255)
    return value if fix is None else fix.stored
