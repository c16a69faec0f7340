"""Streamed text is never half a character and never leaks part of a stop string."""

from __future__ import annotations

from multiseq.loop.detok import IncrementalDetokenizer, StopMatcher, TextAssembler


def test_a_character_split_across_pieces_comes_out_whole():
    detok = IncrementalDetokenizer()
    data = "€ and 😀".encode("utf-8")
    pieces = [detok.feed(data[index:index + 1]) for index in range(len(data))]
    assert "".join(pieces) == "€ and 😀"
    assert all(piece in ("", "€", " ", "a", "n", "d", "😀") for piece in pieces)


def test_an_incomplete_character_at_the_end_is_dropped():
    detok = IncrementalDetokenizer()
    assert detok.feed("aé".encode("utf-8")[:2]) == "a"
    detok.end()
    assert detok.feed(b"b") == "b", "the cut character's first byte is gone, not glued to what follows"


def test_stop_string_across_pieces_is_cut_with_what_follows():
    matcher = StopMatcher(("###",))
    assert matcher.feed("abc#") == ("abc", False)
    assert matcher.feed("#") == ("", False)
    assert matcher.feed("#tail") == ("", True)


def test_held_text_is_released_when_it_stops_matching():
    matcher = StopMatcher(("STOP",))
    assert matcher.feed("ST") == ("", False)
    assert matcher.feed("AR") == ("STAR", False)
    assert matcher.feed("S") == ("", False)
    assert matcher.flush() == "S"


def test_the_earliest_of_several_stop_strings_wins():
    matcher = StopMatcher(("world", "lo w"))
    assert matcher.feed("hello world") == ("hel", True)


def test_assembler_flushes_held_text_at_the_end():
    assembler = TextAssembler(("\n\n",))
    text, stopped = assembler.feed(b"line\n")
    assert (text, stopped) == ("line", False)
    assert assembler.flush() == "\n"
