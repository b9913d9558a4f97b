"""Text that is safe to show (on a terminal, in a log line, in a span attribute), and text that
can be sent to a database at all. Private.

One escaper for everything eventguard prints or logs from data it did not write itself (ids, error
text, event types, agent names, anomaly reasons): a NUL, an ANSI escape, a newline or a bidi
override in a response id must neither drive a terminal nor split or forge a log line.
"""

from __future__ import annotations

from typing import Final

__all__ = ["one_line", "printable", "utf8_size"]

_NAMED: Final = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def printable(value: object) -> str:
    """``value`` as text that is safe on a terminal or in a log line.

    Every character Python's ``repr`` would escape is shown as its escape: C0 controls (``\\n``,
    ``\\r``, ``\\t``, ``\\x1b`` ...), DEL, C1 controls, bidi overrides and isolates (``\\u202e``,
    ``\\u2066``), other invisible format characters, line and paragraph separators, non-ASCII
    spaces, private-use and unassigned code points, lone surrogates (``\\udcff``). Everything else,
    backslashes included, is shown as it is.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def one_line(value: object, limit: int = 500) -> str:
    """:func:`printable`, cut to about ``limit`` characters (saying how many were left out)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    return printable(text)


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def utf8_size(text: str) -> int | None:
    """How many bytes ``text`` takes in UTF-8; None when it holds a lone surrogate (``\\udcff``),
    which UTF-8 cannot encode, so that no driver can send it (asyncpg and sqlite3 both raise)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None
