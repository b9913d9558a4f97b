"""What a string must be before it reaches a column, on SQLite and PostgreSQL alike.

Two kinds of character no column can hold: U+0000 (PostgreSQL's text and jsonb refuse it, and
SQLite's ``json_extract``, through which the writer passes every row, cuts a string at it) and
lone surrogates (U+D800-U+DFFF on their own: UTF-8 cannot encode them, so orjson, asyncpg and
sqlite3 all refuse them). Everything else is storable as it is, controls, ANSI escapes and
bidirectional overrides included: whoever displays a value escapes it (the CLI does).

The rules, each a pure function; a value that needs no change is returned as the same object:

- free text (:func:`free_text`: error messages, reasons): backslashes doubled, NUL as ``\\x00``,
  each lone surrogate as ``\\udXXX``. Reversible: :func:`unescape` gives the original back.
- identifiers (:func:`identifier`: response, conversation, chain ids, partition key, agent name,
  error code and type, owner): a value too long for its column or holding an unstorable character
  becomes ``<escaped prefix>~<16 hex digits of the SHA-256 of the original>``, at most the
  column's length, so two ids that differ only in a bad character or beyond the limit stay two ids.
  The same input gives the same output in every process (a recovered attempt, another replica).
- bounded labels (:func:`bounded`: event types, whose payload keeps the whole value): escaped as
  free text, then cut to the column's length.
- JSON values (:func:`clean_json`: payloads): NUL and lone surrogates in strings (keys too) become
  U+FFFD, NaN and infinities (which orjson writes as ``null``) the strings ``"NaN"``,
  ``"Infinity"`` and ``"-Infinity"``; every change is named by its path.

A changed value comes with a :class:`Fix` that says what was wrong and what was stored, for the
``value_escaped`` (columns) or ``not_serialisable`` (payloads) anomaly.

An id that ends as a stored form does (``~`` and 16 lowercase hex digits) is changed the same way,
even though it is storable: left as it was, ``X~<hash of Y>`` given as an ordinary id would share
the row of Y's stored form (someone computing that hash on purpose could read Y's history through
it). So the stored form is injective: an unchanged id never ends that way, and two changed ids
differ in their hashes (64 bits, which do not collide by accident).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

import orjson

#: A character no column can hold.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: What the reversible escape rewrites: the escape character itself, and the unstorable ones.
_ESCAPED = re.compile("[\\\\\x00\ud800-\udfff]")
_UNESCAPE = re.compile(r"\\(\\|x00|u[dD][89abcdefABCDEF][0-9a-fA-F]{2})")
#: Separates an identifier's escaped prefix from its hash.
SEPARATOR = "~"
HASH_DIGITS = 16
_HASH = re.compile(f"[0-9a-f]{{{HASH_DIGITS}}}")
REPLACEMENT = "\ufffd"
#: How orjson and JSON spell the non-finite floats: the strings stored in their place.
NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
#: At most this many changes are named one by one in a reason; the rest are counted.
NAMED = 20


@dataclass(frozen=True, slots=True)
class Fix:
    """How a value was made storable."""

    stored: str
    #: What was wrong with it and what was done, for a person.
    why: str
    #: It held an unstorable character (else it was only too long).
    escaped: bool


def storable(value: str) -> bool:
    """Whether ``value`` fits any text column as it is (length aside)."""
    if value.isascii():
        return "\x00" not in value
    return _UNSTORABLE.search(value) is None


def _escape_one(m: re.Match[str]) -> str:
    c = m.group()
    if c == "\\":
        return "\\\\"
    if c == "\x00":
        return "\\x00"
    return f"\\u{ord(c):04x}"


def escape(value: str) -> str:
    """The reversible escape: ``\\`` as ``\\\\``, NUL as ``\\x00``, a lone surrogate as ``\\udXXX``."""
    return _ESCAPED.sub(_escape_one, value)


def _unescape_one(m: re.Match[str]) -> str:
    s = m.group(1)
    if s == "\\":
        return "\\"
    if s == "x00":
        return "\x00"
    return chr(int(s[1:], 16))


def unescape(text: str) -> str:
    """The original of an :func:`escape`-d value (a free-text column that a ``value_escaped`` names)."""
    return _UNESCAPE.sub(_unescape_one, text)


def describe(value: str, limit: int | None = None) -> str:
    """What makes ``value`` unstorable, for a person: its NULs, its lone surrogates, its length."""
    parts = []
    bad = _UNSTORABLE.findall(value)
    nul = bad.count("\x00")
    if nul:
        parts.append(f"{nul} NUL (U+0000)")
    surrogates = sorted({ord(c) for c in bad if c != "\x00"})
    if surrogates:
        shown = ", ".join(f"U+{c:04X}" for c in surrogates[:8]) + (", ..." if len(surrogates) > 8 else "")
        parts.append(f"{len(bad) - nul} lone surrogate(s) ({shown})")
    if limit is not None and len(value) > limit:
        parts.append(f"{len(value)} characters (the column holds {limit})")
    return ", ".join(parts)


def free_text(value: str) -> Fix | None:
    """Free text (an unbounded column): None when storable, else its reversible escape."""
    if storable(value):
        return None
    return Fix(
        escape(value),
        f"{describe(value)}: stored escaped (backslashes doubled, NUL as \\x00, lone surrogates as "
        "\\udXXX; eventguard.sql.storable.unescape gives the original back)",
        escaped=True,
    )


def digest(value: str) -> str:
    """The short hash that keeps changed identifiers apart: the same in every process."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_DIGITS]


def _escaped_prefix(value: str, room: int) -> str:
    """The longest escape of a prefix of ``value`` that fits ``room`` characters, never cut inside
    an escape sequence."""
    out: list[str] = []
    used = 0
    for c in value[:room]:
        piece = escape(c) if c == "\\" or not storable(c) else c
        if used + len(piece) > room:
            break
        out.append(piece)
        used += len(piece)
    return "".join(out)


def looks_stored(value: str) -> bool:
    """Whether ``value`` ends as a changed identifier's stored form does: ``~`` and the hash."""
    return (
        len(value) > HASH_DIGITS
        and value[-HASH_DIGITS - 1] == SEPARATOR
        and _HASH.fullmatch(value, len(value) - HASH_DIGITS) is not None
    )


def identifier(value: str, limit: int) -> Fix | None:
    """An identifier column of ``limit`` characters: None when ``value`` fits as it is, else
    ``<escaped prefix>~<hash of the original>``, at most ``limit`` characters. An id that already
    ends that way is changed too (see the module's docstring)."""
    escaped = not storable(value)
    lookalike = not escaped and looks_stored(value)
    if len(value) <= limit and not escaped and not lookalike:
        return None
    room = limit - len(SEPARATOR) - HASH_DIGITS
    stored = f"{_escaped_prefix(value, room)}{SEPARATOR}{digest(value)}"
    what = (
        describe(value, limit)
        or f"an id ending as a stored form does ('{SEPARATOR}' and {HASH_DIGITS} hex digits)"
    )
    return Fix(
        stored,
        f"{what}: stored as its escaped prefix (backslashes doubled, NUL as \\x00, "
        f"lone surrogates as \\udXXX), {SEPARATOR!r} and the first {HASH_DIGITS} hex digits of the "
        f"SHA-256 of its UTF-8 (surrogatepass) bytes: {stored}",
        escaped=escaped,
    )


def bounded(value: str, limit: int) -> Fix | None:
    """A label whose whole value is kept elsewhere (an event type: the payload has it): escaped as
    free text, then cut to ``limit`` characters. None when it fits as it is."""
    escaped = not storable(value)
    if len(value) <= limit and not escaped:
        return None
    if not escaped:
        return Fix(value[:limit], f"{len(value)} characters stored as the first {limit}", escaped=False)
    stored = escape(value)
    cut = len(stored) > limit
    if cut:
        stored = _escaped_prefix(value, limit)
    how = f"escaped (backslashes doubled, NUL as \\x00, lone surrogates as \\udXXX){', cut' if cut else ''}"
    return Fix(stored, f"{describe(value, limit)}: stored {how}: {stored}", escaped=True)


# -- JSON payloads ----------------------------------------------------------------------------------

#: orjson refuses deeper documents anyway (its limit is 255): they are left to its error.
_MAX_DEPTH = 260


def has_non_finite(value: object) -> bool:
    """Whether a NaN or an infinity is anywhere in ``value`` (dict keys included)."""
    stack: list[Any] = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        v = pop()
        t = type(v)
        if t is str or t is int or v is None or t is bool:
            continue
        if isinstance(v, dict):
            for k in v:
                if isinstance(k, float) and not math.isfinite(k):
                    return True
            extend(v.values())
        elif isinstance(v, list | tuple):
            extend(v)
        elif isinstance(v, float) and not math.isfinite(v):
            return True
    return False


def nulls_hide_non_finite(value: object, data: bytes) -> bool:
    """Whether orjson's ``data`` for ``value`` wrote a NaN or an infinity (as ``null``).

    Cheap first: only output holding ``null`` can, and when reading it back gives ``value`` again
    (compared in C), none did. Only what differs (a NaN, a tuple, a non-string key) is walked.
    """
    return data.find(b"null") >= 0 and orjson.loads(data) != value and has_non_finite(value)


@dataclass(slots=True)
class JsonNotes:
    """The changes :func:`clean_json` made, by kind, each named by its path."""

    nul: list[str]
    surrogates: list[str]
    non_finite: list[str]
    #: Replaced keys that met another key, numbered to stay apart.
    renamed: list[str]

    def __init__(self) -> None:
        self.nul, self.surrogates, self.non_finite, self.renamed = [], [], [], []

    def reasons(self) -> list[str]:
        out = []
        if self.nul:
            out.append(
                f"NUL characters (U+0000) stored as U+FFFD (jsonb cannot hold them): {_listed(self.nul)}"
            )
        if self.surrogates:
            out.append(
                "lone surrogates stored as U+FFFD (UTF-8 cannot encode them), by path and position: "
                + _listed(self.surrogates)
            )
        if self.non_finite:
            out.append(
                'non-finite numbers stored as the strings "NaN", "Infinity", "-Infinity" (JSON has no '
                f"such number; orjson would store null): {_listed(self.non_finite)}"
            )
        if self.renamed:
            out.append(f"replaced keys that met another key were numbered: {_listed(self.renamed)}")
        return out


def _listed(items: list[str]) -> str:
    more = len(items) - NAMED
    return "; ".join(items[:NAMED]) + (f"; and {more} more" if more > 0 else "")


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _path(parent: str, key: object) -> str:
    if isinstance(key, str) and _PLAIN_KEY.match(key):
        return f"{parent}.{key}"
    if isinstance(key, str):
        return f"{parent}[{ascii(key)[:80]}]"
    return f"{parent}[{key!r}]"


def _clean_str(value: str, path: str, notes: JsonNotes) -> str:
    if storable(value):
        return value
    nul = value.count("\x00")
    if nul:
        notes.nul.append(f"{path} ({nul})")
    places = [(m.start(), ord(m.group())) for m in _UNSTORABLE.finditer(value) if m.group() != "\x00"]
    if places:
        shown = ", ".join(f"U+{c:04X} at {i}" for i, c in places[:5])
        more = f" and {len(places) - 5} more" if len(places) > 5 else ""
        notes.surrogates.append(f"{path}: {shown}{more}")
    return _UNSTORABLE.sub(REPLACEMENT, value)


def _clean_float(value: float, path: str, notes: JsonNotes) -> float | str:
    if math.isfinite(value):
        return value
    text = "NaN" if math.isnan(value) else NON_FINITE[value]
    notes.non_finite.append(f"{path}: {text}")
    return text


def clean_json(value: Any, notes: JsonNotes, path: str = "$", depth: int = 0) -> Any:
    """``value`` with what no JSON column can hold replaced (see the module's docstring).

    A new object wherever something changed; ``value`` itself is never mutated. Other objects
    (ints, datetimes, models...) are left for the serialiser.
    """
    if isinstance(value, str):
        return _clean_str(value, path, notes)
    if isinstance(value, float):
        return _clean_float(value, path, notes)
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            key = k
            if isinstance(k, str):
                key = _clean_str(k, f"{_path(path, k)} (the key)", notes)
            elif isinstance(k, float):
                key = _clean_float(k, f"{_path(path, k)} (the key)", notes)
            if key is not k:
                # Two keys must not become one: a replaced key that meets another gets a number.
                base, n = key, 1
                while key in out or key in value:
                    n += 1
                    key = f"{base} #{n}"
                if n > 1:
                    notes.renamed.append(f"{_path(path, k)} stored as key {key!a}")
            out[key] = clean_json(v, notes, _path(path, k), depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [clean_json(v, notes, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    return value
