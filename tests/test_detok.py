"""Streamed text is never half a character and never leaks part of a stop string."""

from __future__ import annotations

from multiseq.loop.detok import IncrementalDetokenizer, IndentLimit, StopMatcher, TextAssembler


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


def feed_all(limit: IndentLimit, pieces: list[str]) -> str:
    return "".join(limit.feed(piece) for piece in pieces) + limit.flush()


def test_a_block_ends_at_the_first_line_indented_less_keeping_its_indentation():
    """llama-server's n_indent: the completion of an indented block stops where it dedents."""
    pieces = ["    return", " x\n", "  ", "  y = 1\n", "  z", " = 2\n    w"]
    limit = IndentLimit(4)
    assert feed_all(limit, pieces) == "    return x\n    y = 1\n  " and limit.reached


def test_the_first_line_is_never_cut_and_deep_enough_lines_go_on():
    limit = IndentLimit(4)
    assert feed_all(limit, ["x", "\n\t\t\t\tok\n", "     also\n"]) == "x\n\t\t\t\tok\n     also\n"
    assert not limit.reached


def test_an_empty_line_ends_an_indented_block():
    limit = IndentLimit(2)
    assert feed_all(limit, ["a\n", "\n", "  b"]) == "a\n" and limit.reached


def test_a_lines_indentation_is_held_until_its_first_character_and_released_at_the_end():
    limit = IndentLimit(4)
    assert limit.feed("a\n  ") == "a\n"
    assert limit.feed("  ") == ""
    assert limit.feed("b") == "    b"
    assert limit.feed("\n ") == "\n" and limit.flush() == " "


def test_no_limit_passes_text_as_it_comes():
    assert feed_all(IndentLimit(0), ["a\n", "b\n", ""]) == "a\nb\n"


def test_assembler_applies_the_indent_limit_after_stop_strings():
    assembler = TextAssembler(("STOP",), min_indent=2)
    assert assembler.feed(b"x\n  y\nz") == ("x\n  y\n", False)
    assert assembler.reached_indent_limit and assembler.flush() == ""
