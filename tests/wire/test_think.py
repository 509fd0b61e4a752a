"""Inline think-tag splitting (§4, D23)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from svir.wire.think import ThinkSplitter


def split(pieces: list[str]) -> tuple[str, str]:
    s = ThinkSplitter()
    answer, reasoning = [], []
    for piece in [*pieces, None]:
        parts = s.flush() if piece is None else s.feed(piece)
        for is_reasoning, text in parts:
            assert text, "empty piece"
            (reasoning if is_reasoning else answer).append(text)
    return "".join(answer), "".join(reasoning)


def test_seed_example() -> None:
    assert split(["a<thi", "nk>b</think>c"]) == ("ac", "b")


def test_closing_marker_split() -> None:
    assert split(["<think>x</", "thi", "nk>", "y"]) == ("y", "x")


def test_unfinished_marker_at_end_is_text() -> None:
    assert split(["done<thi"]) == ("done<thi", "")
    assert split(["<think>r</thi"]) == ("", "r</thi")


def test_closing_marker_without_opening_stays_answer() -> None:
    text = "The user wants a count.\n</think>\n\nOne, two."
    assert split([text]) == (text, "")


def test_text_that_only_looks_like_a_marker() -> None:
    assert split(["a <b> <thin", "g> c"]) == ("a <b> <thing> c", "")


def test_several_blocks() -> None:
    assert split(["<think>1</think>a<think>2</think>b"]) == ("ab", "12")


def test_marker_alone_is_not_visible() -> None:
    s = ThinkSplitter()
    assert s.feed("<think>") == []
    assert s.saw_marker


@given(st.lists(st.sampled_from(["a", "<", "think", ">", "</", "/", "b", "<think>", "</think>"])))
def test_any_split_same_result(tokens: list[str]) -> None:
    text = "".join(tokens)
    whole = split([text])
    assert split(list(text)) == whole
    mid = len(text) // 2
    assert split([text[:mid], text[mid:]]) == whole
    # Nothing is lost but the markers themselves.
    assert len(whole[0]) + len(whole[1]) <= len(text)
