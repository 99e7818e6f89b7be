"""Incremental text and the stop rules, token by token, with the expected answers written out.

The tests' byte tokenizer has one token per byte, so a multi-byte UTF-8 character arrives over
several tokens: the text must not show a half character (U+FFFD) that the next byte would complete.
Stop strings: text that could still be the start of a stop string is held back, and a stop string
cuts the text where it starts.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from lookahead.engine.stopping import IncrementalText, StopState
from lookahead.testing import byte_tokenizer

REPLACEMENT = "\ufffd"


@functools.lru_cache(maxsize=1)
def tok() -> Any:
    return byte_tokenizer()


@functools.lru_cache(maxsize=1)
def _byte_to_token() -> dict[int, int]:
    # GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest map to 256 + n.
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {b: tok().convert_tokens_to_ids(c) for b, c in chars.items()}


def ids(data: bytes) -> list[int]:
    return [_byte_to_token()[b] for b in data]


def test_byte_tokens_are_bytes() -> None:
    assert ids("aé".encode()) == tok().encode("aé", add_special_tokens=False)
    assert tok().decode(ids("€".encode())) == "€"


@pytest.mark.parametrize(
    ("data", "deltas", "flushed"),
    [
        # ASCII: every byte is a character at once
        (b"ab", ["a", "b"], ""),
        # e with acute is C3 A9: held after C3, released whole with A9
        ("aé".encode(), ["a", "", "é"], ""),
        # the euro sign is E2 82 AC: two bytes held, then the character; then "!"
        ("€!".encode(), ["", "", "€", "!"], ""),
        # a 4-byte emoji: three bytes held
        ("😀".encode(), ["", "", "", "😀"], ""),
        # a stray continuation byte cannot start a character: shown as U+FFFD with the next byte
        (b"\x80b", ["", REPLACEMENT + "b"], ""),
        # invalid bytes are held only while they could still become a character (UTF-8 has at most 4
        # bytes): the 4th pending byte releases them all; the 5th waits for more
        (b"\xff" * 5, ["", "", "", REPLACEMENT * 4, ""], REPLACEMENT),
        # a character cut off at the very end: flush() hands out what is left
        (b"a\xe2\x82", ["a", "", ""], REPLACEMENT),
    ],
)
def test_incremental_text_holds_back_partial_utf8(data: bytes, deltas: list[str], flushed: str) -> None:
    text = IncrementalText(tok())
    assert [text.add(t) for t in ids(data)] == deltas
    assert text.flush() == flushed
    assert "".join(deltas) + flushed == tok().decode(ids(data))  # nothing lost, nothing doubled


def steps(state: StopState, data: bytes) -> list[tuple[str, str | None, str]]:
    """Push data's tokens until a stop: (token's text, finish reason, text handed out after it)."""
    out = []
    for t in ids(data):
        reason = state.push(t)
        out.append((tok().decode([t]), reason, state.take_text()))
        if reason:
            break
    return out


def test_stop_string_holds_back_its_possible_start() -> None:
    # stop "ab": the last character may start it, so it waits one token
    state = StopState(tok(), [], 100, ["ab"])
    assert steps(state, b"xyabz") == [
        ("x", None, ""),  # the last character is always held: hold = len("ab") - 1 = 1
        ("y", None, "x"),
        ("a", None, "y"),  # "a" held: it starts "ab"
        ("b", "stop", ""),  # "ab" found: the text ends before it; "z" is never pushed
    ]
    assert state.text == "xy" and state.token_ids == ids(b"xyab") and state.finish_reason == "stop"


def test_partial_match_that_fails_is_released() -> None:
    # stop "abc" (hold 2): "ab" is held, then "x" shows it was not the stop; "abc" later stops
    state = StopState(tok(), [], 100, ["abc"])
    assert steps(state, b"abxabc") == [
        ("a", None, ""),
        ("b", None, ""),
        ("x", None, "a"),
        ("a", None, "b"),
        ("b", None, "x"),
        ("c", "stop", ""),
    ]
    assert state.text == "abx"


def test_stop_string_found_across_tokens_already_pushed() -> None:
    # "\n\n" completes on the second newline; the first one was pushed in an earlier step
    state = StopState(tok(), [], 100, ["\n\n"])
    assert steps(state, b"a\nb\n\nc") == [
        ("a", None, ""),
        ("\n", None, "a"),
        ("b", None, "\n"),
        ("\n", None, "b"),
        ("\n", "stop", ""),
    ]
    assert state.text == "a\nb"


def test_stop_string_with_a_multibyte_character() -> None:
    # "é!" is 3 bytes; the text holds its possible start in characters, and the half "é" never shows
    state = StopState(tok(), [], 100, ["é!"])
    assert steps(state, "aé!".encode()) == [
        ("a", None, ""),
        (REPLACEMENT, None, ""),  # C3: half a character, nothing new to show
        (REPLACEMENT, None, "a"),  # A9 completes "é", which may start "é!": held
        ("!", "stop", ""),
    ]
    assert state.text == "a"


def test_eos_stops_without_adding_text_and_releases_the_held_tail() -> None:
    eos = ids(b"\x00")[0]
    state = StopState(tok(), [eos], 100, ["zz"])
    assert steps(state, b"az\x00b") == [
        ("a", None, ""),
        ("z", None, "a"),  # "z" may start "zz": held
        ("\x00", "stop", "z"),  # EOS: finished, the held "z" is not a stop after all
    ]
    assert state.text == "az" and state.token_ids == ids(b"az\x00")


def test_length_flushes_a_partial_character() -> None:
    # max_new_tokens = 3 ends on half of "€": finished, so what is held comes out (as U+FFFD)
    state = StopState(tok(), [], 3, [])
    assert steps(state, "a€".encode()) == [
        ("a", None, "a"),  # no stop strings: nothing to hold back
        (REPLACEMENT, None, ""),
        (REPLACEMENT, "length", REPLACEMENT),
    ]


def test_length_on_the_last_byte_of_a_character() -> None:
    state = StopState(tok(), [], 3, [])
    assert steps(state, "hé".encode()) == [("h", None, "h"), (REPLACEMENT, None, ""), (REPLACEMENT, "length", "é")]
    assert state.text == "hé"


def test_push_after_stop_is_a_bug() -> None:
    state = StopState(tok(), [], 1, [])
    assert state.push(ids(b"a")[0]) == "length"
    with pytest.raises(AssertionError, match="push after stop"):
        state.push(ids(b"b")[0])
