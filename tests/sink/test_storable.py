"""The rules that make a value storable (eventguard.sql.storable), and the payload encoder that
uses them: no database needed."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from eventguard.lifecycle import AnomalyKind
from eventguard.sink.serialise import encode
from eventguard.sql.storable import (
    REPLACEMENT,
    JsonNotes,
    bounded,
    clean_json,
    digest,
    escape,
    free_text,
    has_non_finite,
    identifier,
    storable,
    unescape,
)

#: Any text, lone surrogates and NULs included (hypothesis' text() leaves surrogates out).
any_text = st.text(
    alphabet=st.one_of(
        st.characters(codec=None),
        st.sampled_from(["\x00", "\\", "\udcff", "\ud800", "x", "0", "~", "\u202e", "\x1b"]),
    ),
    max_size=300,
)

#: Storable as they are: never changed, byte for byte.
ORDINARY = [
    "resp_68a9f0c1d2e3",
    "",
    "a" * 255,
    "r'; DROP TABLE eventguard_events; --",
    "résumé-日本-🙂",
    "a\x01\x07\x08\x1f\x7f\x85\x9fb",
    "a\x1b[31mred\x1b[0m",
    "a\u202eevil\u202cb",
    "back\\slash and \\x00 spelt out",
    "\ufffd\uffff",
]


def is_storable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


@pytest.mark.parametrize("value", ORDINARY)
def test_ordinary_values_are_left_alone(value: str) -> None:
    assert storable(value)
    assert identifier(value, 255) is None
    assert free_text(value) is None
    assert bounded(value, 255) is None


#: Texts that spell an escape out: only doubling backslashes keeps them apart from the escape.
SPELT_OUT = ["\\x00", "\\udcff", "C:\\x00\x00", "\\\x00", "a\\"]


@given(any_text)
@example("\\x00")
@example("\\udcff\udcff")
@example("C:\\x00\x00")
def test_escape_is_reversible_and_storable(value: str) -> None:
    assert unescape(escape(value)) == value
    assert is_storable(escape(value))
    assert storable(value) == is_storable(value)


@given(any_text)
@example("C:\\x00\x00")
@example("\\udcff\udcff")
def test_free_text_is_escaped_only_when_it_is_not_storable(value: str) -> None:
    fix = free_text(value)
    if is_storable(value):
        assert fix is None
        return
    assert fix is not None and fix.escaped
    assert is_storable(fix.stored)
    assert unescape(fix.stored) == value


@given(any_text, st.integers(min_value=20, max_value=255))
def test_identifier_fits_and_is_storable(value: str, limit: int) -> None:
    fix = identifier(value, limit)
    if is_storable(value) and len(value) <= limit:
        assert fix is None
        return
    assert fix is not None
    assert is_storable(fix.stored) and len(fix.stored) <= limit
    assert fix.stored.endswith("~" + digest(value))
    # The prefix is the escape of a prefix of the original, never cut inside an escape.
    head = fix.stored[: -len(digest(value)) - 1]
    assert value.startswith(unescape(head))
    assert identifier(value, limit) == fix  # the same in every call, every process


@settings(max_examples=300)
@given(st.lists(any_text, min_size=2, max_size=20, unique=True))
def test_distinct_identifiers_stay_distinct(values: list[str]) -> None:
    stored = [v if (f := identifier(v, 40)) is None else f.stored for v in values]
    assert len(set(stored)) == len(values)


@pytest.mark.parametrize("value", SPELT_OUT)
def test_spelt_out_escapes_round_trip(value: str) -> None:
    assert unescape(escape(value)) == value
    fix = free_text(value)
    assert fix is None or unescape(fix.stored) == value


def test_ids_that_differ_only_in_a_bad_character_or_past_the_limit_stay_distinct() -> None:
    ids = ["r\x00a", "r\x00b", "r\udcffa", "r\\x00a", "ra", "p" * 255 + "A", "p" * 255 + "B", "p" * 256]
    stored = [v if (f := identifier(v, 255)) is None else f.stored for v in ids]
    assert len(set(stored)) == len(ids)
    assert stored[3] == "r\\x00a" and stored[4] == "ra"  # ordinary: unchanged
    assert stored[0].startswith("r\\x00a~")
    assert stored[2].startswith("r\\udcffa~")
    assert all(len(s) <= 255 for s in stored)
    fix = identifier("r\x00a", 255)
    assert fix is not None and fix.why.startswith("1 NUL (U+0000): stored as its escaped prefix")


def test_identifier_never_splits_an_escape() -> None:
    fix = identifier("\x00" * 300, 255)
    assert fix is not None
    head = fix.stored.rsplit("~", 1)[0]
    assert head == "\\x00" * 59 and len(fix.stored) == 59 * 4 + 17


def test_a_bounded_label_is_escaped_then_cut_to_its_column() -> None:
    assert bounded("x" * 128, 128) is None
    fix = bounded("x" * 300, 128)
    assert fix is not None and fix.stored == "x" * 128 and not fix.escaped
    assert fix.why == "300 characters stored as the first 128"
    fix = bounded("t\udcff", 128)
    assert fix is not None and fix.escaped and fix.stored == "t\\udcff"
    fix = bounded("t\x00" * 100, 128)
    assert fix is not None and len(fix.stored) <= 128 and fix.stored.startswith("t\\x00t")
    assert "200 characters (the column holds 128)" in fix.why


def test_clean_json_names_every_change() -> None:
    value = {
        "delta": "a\udcffb\x00",
        "n": math.nan,
        "l": [math.inf, -math.inf, 1.5, None],
        "k\x00": 1,
        "k\ufffd": 2,
        math.nan: 3,
        "ok": ("t", 1),
    }
    notes = JsonNotes()
    out = clean_json(value, notes)
    assert value["n"] is not None and "k\x00" in value  # the input is never mutated
    assert out == {
        "delta": f"a{REPLACEMENT}b{REPLACEMENT}",
        "n": "NaN",
        "l": ["Infinity", "-Infinity", 1.5, None],
        "k\ufffd #2": 1,  # two keys never become one
        "k\ufffd": 2,
        "NaN": 3,
        "ok": ["t", 1],
    }
    reasons = notes.reasons()
    assert len(reasons) == 4
    assert "$.delta (1)" in reasons[0] and "$['k\\x00'] (the key) (1)" in reasons[0]
    assert "$.delta: U+DCFF at 1" in reasons[1]
    assert "$.n: NaN; $.l[0]: Infinity; $.l[1]: -Infinity; $[nan] (the key): NaN" in reasons[2]
    assert "$['k\\x00'] stored as key 'k\\ufffd #2'" in reasons[3]


def test_has_non_finite_finds_nan_and_infinities_anywhere() -> None:
    assert not has_non_finite({"a": [1, 2.5, None, {"b": "NaN"}]})
    assert has_non_finite({"a": [1, {"b": (0, math.nan)}]})
    assert has_non_finite({math.inf: 1})
    assert has_non_finite(-math.inf)


class Model(BaseModel):
    x: float
    s: str


def test_encode_surrogates_keep_the_event() -> None:
    enc = encode({"type": "d", "delta": "a\udcffb"}, "d", max_bytes=1 << 20)
    assert orjson.loads(str(enc.text)) == {"type": "d", "delta": f"a{REPLACEMENT}b"}  # not a repr stand-in
    assert enc.problems == [
        (
            AnomalyKind.NOT_SERIALISABLE,
            "lone surrogates stored as U+FFFD (UTF-8 cannot encode them), by path and position: "
            "$.delta: U+DCFF at 1",
        )
    ]


def test_encode_non_finite_numbers() -> None:
    enc = encode({"type": "d", "p": math.nan, "m": Model(x=math.inf, s="\x00")}, "d", max_bytes=1 << 20)
    assert orjson.loads(str(enc.text)) == {"type": "d", "p": "NaN", "m": {"x": "Infinity", "s": REPLACEMENT}}
    reasons = " | ".join(r for _, r in enc.problems)
    assert "$.p: NaN" in reasons and "$(model).x: Infinity" in reasons and "$(model).s (1)" in reasons
    top = encode(Model(x=-math.inf, s="ok"), None, max_bytes=1 << 20)
    assert orjson.loads(str(top.text)) == {"x": "-Infinity", "s": "ok"}
    assert top.problems and "$.x: -Infinity" in top.problems[0][1]


def test_encode_plain_null_is_not_a_problem() -> None:
    enc = encode({"type": "d", "x": None, "s": "null"}, "d", max_bytes=1 << 20)
    assert orjson.loads(str(enc.text)) == {"type": "d", "x": None, "s": "null"}
    assert enc.problems == []


def test_encode_truncation_keeps_a_storable_type() -> None:
    enc = encode({"type": "d\udcff", "x": "y" * 5000}, "d\udcff", max_bytes=1000)
    data = orjson.loads(str(enc.text))
    assert data["_eventguard"]["type"] == f"d{REPLACEMENT}"
    assert "\\u0000" not in enc.text


hostile = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**70), max_value=2**70),
        any_text,
        st.binary(max_size=10),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(any_text, st.integers(), st.floats()), inner, max_size=4),
        st.tuples(inner, inner),
    ),
    max_leaves=20,
)


def needs_cleaning(value: Any) -> bool:
    if isinstance(value, str):
        return not is_storable(value)
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(needs_cleaning(k) or needs_cleaning(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(needs_cleaning(v) for v in value)
    return False


@settings(max_examples=300)
@given(hostile)
def test_encode_never_raises_and_stores_only_storable_json(value: Any) -> None:
    enc = encode({"type": "d", "v": value}, "d", max_bytes=1 << 20)
    text = str(enc.text)
    assert is_storable(text)
    assert not needs_cleaning(orjson.loads(text))  # valid JSON, no NUL in any string (jsonb)
    if needs_cleaning(value):
        assert enc.problems  # every change explained
