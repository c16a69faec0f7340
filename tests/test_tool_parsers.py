"""The tool-call parsers: what models of each family write, read whole and as a stream cut
anywhere, gives the same content, reasoning and calls; text is never shown as content before it
is known not to be a call; malformed calls become content with a clear error, never an exception."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings, strategies as st

from multiseq.tools import (ArgumentsDelta, ParsedOutput, ReasoningDelta, TextDelta, ToolCall, ToolCallStart,
                            ToolFormat, output_parser, read_output)

HERMES, LLAMA3, MISTRAL, GENERIC = ToolFormat.HERMES, ToolFormat.LLAMA3, ToolFormat.MISTRAL, ToolFormat.GENERIC


def call_id(index: int) -> str:
    return f"call_{index}"


def calls(*name_arguments: tuple[str, str]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(call_id(index), name, arguments) for index, (name, arguments) in enumerate(name_arguments))


@dataclass(frozen=True)
class Recorded:
    """An output as a model of the family wrote it, and what it must parse to."""

    label: str
    tool_format: ToolFormat
    text: str
    expected: ParsedOutput


WEATHER = '{"city": "Paris", "unit": "celsius"}'
RECORDED = [
    Recorded("hermes plain text", HERMES, "The capital of France is Paris.",
             ParsedOutput("The capital of France is Paris.", None, ())),
    Recorded("hermes one call", HERMES,
             f'<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>',
             ParsedOutput(None, None, calls(("get_weather", WEATHER)))),
    Recorded("hermes two calls", HERMES,
             '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
             ParsedOutput(None, None, calls(("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "CET"}')))),
    Recorded("hermes text before a call", HERMES,
             f'Let me look that up.\n\n<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>',
             ParsedOutput("Let me look that up.", None, calls(("get_weather", WEATHER)))),
    Recorded("hermes reasoning before a call", HERMES,
             '<think>\nThe user wants the weather; I should call get_weather.\n</think>\n\n'
             f'<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>',
             ParsedOutput(None, "The user wants the weather; I should call get_weather.",
                          calls(("get_weather", WEATHER)))),
    Recorded("hermes reasoning opened by the prompt", HERMES,
             "Two plus two is four.\n</think>\n\nThe answer is 4.",
             ParsedOutput("The answer is 4.", "Two plus two is four.", ())),
    Recorded("hermes unicode arguments", HERMES,
             '<tool_call>\n{"name": "translate", "arguments": {"text": "Grüße aus Köln 😀", "to": "日本語"}}\n</tool_call>',
             ParsedOutput(None, None, calls(("translate", '{"text": "Grüße aus Köln 😀", "to": "日本語"}')))),
    Recorded("hermes arguments before name", HERMES,
             '<tool_call>{"arguments": {"q": "a \\"quoted\\" }"}, "name": "search"}</tool_call>',
             ParsedOutput(None, None, calls(("search", '{"q": "a \\"quoted\\" }"}')))),
    Recorded("llama3 plain text", LLAMA3, "Hello! How can I help you today?",
             ParsedOutput("Hello! How can I help you today?", None, ())),
    Recorded("llama3 one call", LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}',
             ParsedOutput(None, None, calls(("get_weather", '{"city": "Paris"}')))),
    Recorded("llama3 two calls after the python tag", LLAMA3,
             '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
             '{"name": "get_time", "arguments": {"zone": "CET"}}',
             ParsedOutput(None, None, calls(("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "CET"}')))),
    Recorded("mistral plain text", MISTRAL, "Bonjour, je suis là.", ParsedOutput("Bonjour, je suis là.", None, ())),
    Recorded("mistral two calls in an array after text", MISTRAL,
             'Checking both. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123xyz"}, '
             '{"name": "get_time", "arguments": {"zone": "CET"}, "id": "def456uvw"}]',
             ParsedOutput("Checking both.", None,
                          calls(("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "CET"}')))),
    Recorded("mistral name[ARGS] calls", MISTRAL,
             '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}',
             ParsedOutput(None, None, calls(("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "CET"}')))),
    Recorded("generic plain text", GENERIC, "Just text, no JSON.", ParsedOutput("Just text, no JSON.", None, ())),
    Recorded("generic tool_calls", GENERIC,
             '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
             '{"name": "get_time", "arguments": {"zone": "CET"}}]}',
             ParsedOutput(None, None, calls(("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "CET"}')))),
    Recorded("generic tool_call", GENERIC, '{\n  "tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}\n}',
             ParsedOutput(None, None, calls(("get_weather", '{"city": "Paris"}')))),
    Recorded("generic response", GENERIC, '{"response": "Hello \\"there\\"\\nsmile \\ud83d\\ude00 caf\\u00e9"}',
             ParsedOutput('Hello "there"\nsmile 😀 café', None, ())),
    Recorded("malformed JSON after a whole call", HERMES,
             '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
             '<tool_call>{"name": "b", "arguments": {"x": tru}}</tool_call>',
             ParsedOutput('<tool_call>{"name": "b", "arguments": {"x": tru}}</tool_call>', None, calls(("a", "{}")),
                          'the model\'s tool call is not valid JSON: Expecting value in {"x": tru}')),
    Recorded("a call cut off mid-arguments is dropped", LLAMA3, '{"name": "get_weather", "parameters": {"city": "Par',
             ParsedOutput(None, None, (), "the model's tool call was cut off before it ended")),
    Recorded("a call cut off after text keeps the text", HERMES,
             'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Par',
             ParsedOutput("Let me check.", None, (), "the model's tool call was cut off before it ended")),
]


def feed_pieces(tool_format: ToolFormat, pieces: list[str], parse_reasoning: bool = True) -> tuple[list, ParsedOutput]:
    parser = output_parser(tool_format, call_id=call_id, reasons=parse_reasoning)
    deltas = [delta for piece in pieces for delta in parser.feed(piece)]
    deltas += parser.close()
    return deltas, parser.result()


def merged(deltas: list) -> list:
    """Consecutive deltas of the same kind (and call) joined: what a client assembles, in order."""
    out: list = []
    for delta in deltas:
        last = out[-1] if out else None
        if isinstance(delta, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + delta.text)
        elif isinstance(delta, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(last.text + delta.text)
        elif isinstance(delta, ArgumentsDelta) and isinstance(last, ArgumentsDelta) and last.index == delta.index:
            out[-1] = ArgumentsDelta(delta.index, last.text + delta.text)
        else:
            out.append(delta)
    return out


@dataclass
class Assembled:
    """A stream put together the way an OpenAI client does."""

    content: str = ""
    reasoning: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, arguments]

    @classmethod
    def of(cls, deltas: list) -> Assembled:
        assembled = cls()
        for delta in deltas:
            if isinstance(delta, TextDelta):
                assembled.content += delta.text
            elif isinstance(delta, ReasoningDelta):
                assembled.reasoning += delta.text
            elif isinstance(delta, ToolCallStart):
                assert delta.index not in assembled.calls, "a call started twice"
                assembled.calls[delta.index] = [delta.id, delta.name, ""]
            else:
                assert delta.index in assembled.calls, "arguments before their call's start"
                assembled.calls[delta.index][2] += delta.text
        return assembled

    def as_output(self) -> tuple:
        return (self.content or None, self.reasoning or None,
                tuple(ToolCall(*self.calls[index]) for index in sorted(self.calls)))


# --- whole outputs ----------------------------------------------------------------------------

@pytest.mark.parametrize("recorded", RECORDED, ids=lambda recorded: recorded.label)
def test_a_recorded_output_parses_to_its_content_reasoning_and_calls(recorded):
    assert read_output(recorded.text, recorded.tool_format, call_id=call_id) == recorded.expected


@pytest.mark.parametrize("recorded", [r for r in RECORDED if r.expected.error is None], ids=lambda r: r.label)
def test_the_stream_fed_character_by_character_adds_up_to_the_parse(recorded):
    deltas, result = feed_pieces(recorded.tool_format, list(recorded.text))
    assert result == recorded.expected
    assert Assembled.of(deltas).as_output() == (result.content, result.reasoning, result.tool_calls)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_stream_cut_anywhere_gives_the_same_deltas_and_result_as_the_whole_text(data):
    recorded = data.draw(st.sampled_from(RECORDED), label="output")
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(recorded.text) - 1)), max_size=12), label="cuts"))
    pieces = [recorded.text[start:end] for start, end in zip([0, *cuts], [*cuts, len(recorded.text)])]
    whole_deltas, whole_result = feed_pieces(recorded.tool_format, [recorded.text])
    deltas, result = feed_pieces(recorded.tool_format, pieces)
    assert result == whole_result == recorded.expected
    assert merged(deltas) == merged(whole_deltas)


# --- streaming ----------------------------------------------------------------------------------

def test_a_call_is_streamed_only_once_whole_its_start_and_arguments_together():
    """A call streamed while written could not be taken back if the output were cut off in it
    (CanIToolCall judges a partial call a client received a failure)."""
    parser = output_parser(HERMES, call_id=call_id)
    assert parser.feed('<tool_call>\n{"name": "get_weath') == []
    assert parser.feed('er"') == []
    assert parser.feed(', "arguments": {"ci') == []
    assert parser.feed('ty": "Paris"}}\n</tool_call') == []  # the closing tag may still be something else
    assert parser.feed('>') == [ToolCallStart(0, "call_0", "get_weather"), ArgumentsDelta(0, '{"city": "Paris"}')]
    assert parser.close() == []
    assert parser.result().tool_calls == calls(("get_weather", '{"city": "Paris"}'))


def test_arguments_written_before_the_name_come_with_it():
    parser = output_parser(GENERIC, call_id=call_id)
    assert parser.feed('{"tool_calls": [{"arguments": {"q": 1}, ') == []
    assert parser.feed('"name": "search"}]}') == [ToolCallStart(0, "call_0", "search"), ArgumentsDelta(0, '{"q": 1}')]


@pytest.mark.parametrize("tool_format, marker, text", [
    (HERMES, "<tool_call>", 'I will check. <tool_call>{"name": "f", "arguments": {}}</tool_call>'),
    (MISTRAL, "[TOOL_CALLS]", 'I will check. [TOOL_CALLS][{"name": "f", "arguments": {}}]'),
    (MISTRAL, "[TOOL_CALLS]", "I will check. [TOOL_CALLS]f[ARGS]{}"),
])
def test_no_prefix_of_a_call_is_ever_streamed_as_content(tool_format, marker, text):
    parser = output_parser(tool_format, call_id=call_id, reasons=False)
    shown = ""
    for char in text:
        shown += "".join(delta.text for delta in parser.feed(char) if isinstance(delta, TextDelta))
        assert not any(marker.startswith(shown[at:]) for at in range(len(shown))), shown
    parser.close()
    assert shown == "I will check."
    assert parser.result().tool_calls == calls(("f", "{}"))


def test_only_what_may_begin_a_marker_is_held_back():
    parser = output_parser(HERMES, call_id=call_id, reasons=False)
    assert parser.feed("Hello <tool") == [TextDelta("Hello")]  # the space waits for what follows it
    assert parser.feed("s> and a < b") == [TextDelta(" <tools> and a < b")]
    assert parser.feed(" and a <") == [TextDelta(" and a")]
    assert parser.close() == [TextDelta(" <")]
    assert parser.result().content == "Hello <tools> and a < b and a <"


@pytest.mark.parametrize("tool_format, pieces", [
    (HERMES, ["a <", " b"]), (HERMES, ["Use <tool", "s>"]), (HERMES, ["<tool_cal", "l is my tag"]),
    (MISTRAL, ["[TOOL", "] is not [TOOL_CALL"]), (LLAMA3, ["<|python", "|> tags"]), (GENERIC, ["{", " is a brace"]),
    (HERMES, ["</thi", "nk> and <thin", "king>"]),
])
def test_held_back_text_that_is_no_marker_comes_out_as_content_unchanged(tool_format, pieces):
    deltas, result = feed_pieces(tool_format, pieces, parse_reasoning=False)
    text = "".join(pieces)
    assert result.content == text and result.tool_calls == () and result.reasoning is None
    if tool_format is not GENERIC:  # a leading "{" in GENERIC is read as JSON: an error, kept as content
        assert result.error is None
    assert "".join(delta.text for delta in deltas) == text


def test_text_before_a_possible_think_close_waits_until_it_is_known_to_be_content():
    """A template may open <think> in the prompt: until a </think> or a call settles it, text may be reasoning."""
    parser = output_parser(HERMES, call_id=call_id)
    assert parser.feed("Thinking about it") == []
    assert parser.feed(' <tool_call>{"name": "f"}</tool_call>') == [TextDelta("Thinking about it"),
                                                                     ToolCallStart(0, "call_0", "f"),
                                                                     ArgumentsDelta(0, "{}")]
    parser = output_parser(HERMES, call_id=call_id)
    assert parser.feed("Thinking about it") == []
    assert parser.feed("</think>Hi") == [ReasoningDelta("Thinking about it"), TextDelta("Hi")]


def test_an_output_that_ends_inside_its_think_block_is_all_reasoning():
    result = read_output("<think>\nI should call the tool but", HERMES, call_id=call_id)
    assert result == ParsedOutput(None, "I should call the tool but", ())


def test_without_reasoning_parsing_think_tags_are_content():
    text = "<think>hmm</think>Hello"
    assert read_output(text, HERMES, call_id=call_id, reasons=False) == ParsedOutput(text, None, ())


# --- what calls hold --------------------------------------------------------------------------

def test_arguments_are_the_json_text_as_written_not_reserialized():
    arguments = '{ "b" :[1,  2.50],"a":{"nested": "\\u00e9"} }'
    result = read_output(f'<tool_call>{{"name": "f", "arguments": {arguments}}}</tool_call>', HERMES, call_id=call_id)
    assert result.tool_calls == calls(("f", arguments))


def test_arguments_written_as_a_json_string_are_unwrapped_to_the_object_text():
    result = read_output('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', HERMES, call_id=call_id)
    assert result.tool_calls == calls(("f", '{"a": 1}'))
    assert json.loads(result.tool_calls[0].arguments) == {"a": 1}


def test_a_call_without_arguments_gets_an_empty_object():
    deltas, result = feed_pieces(LLAMA3, ['{"name": "get_time"}'])
    assert result.tool_calls == calls(("get_time", "{}"))
    assert deltas == [ToolCallStart(0, "call_0", "get_time"), ArgumentsDelta(0, "{}")]


def test_the_closing_tool_call_tag_may_be_missing_at_the_end_of_the_output():
    result = read_output('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_', HERMES, call_id=call_id)
    assert result == ParsedOutput(None, None, calls(("f", '{"a": 1}')))


def test_text_after_llama3_calls_is_content_and_text_first_means_no_call():
    assert read_output('{"name": "f", "parameters": {}}\nDone.', LLAMA3, call_id=call_id) == \
        ParsedOutput("Done.", None, calls(("f", "{}")))
    text = 'Here is JSON: {"name": "f", "parameters": {}}'
    assert read_output(text, LLAMA3, call_id=call_id) == ParsedOutput(text, None, ())


def test_text_between_calls_is_content_and_whitespace_between_them_is_dropped():
    result = read_output(' First. <tool_call>{"name": "a"}</tool_call>\n \n'
                                  '<tool_call>{"name": "b"}</tool_call> Then more. \n', HERMES, call_id=call_id)
    assert result == ParsedOutput("First. Then more.", None, calls(("a", "{}"), ("b", "{}")))


# --- malformed output -------------------------------------------------------------------------

@pytest.mark.parametrize("tool_format, text, reason", [
    (HERMES, 'Hi <tool_call>{"name": "f", "arguments": {"a": 1,}}</tool_call>', "not valid JSON"),
    (HERMES, 'Hi <tool_call>{"arguments": {"a": 1}}</tool_call>', "names no function"),
    (HERMES, 'Hi <tool_call>{"name": "f", "arguments": [1]}</tool_call>', "arguments are not a JSON object"),
    (HERMES, 'Hi <tool_call>{"name": "f"} and then</tool_call>', "not closed by </tool_call>"),
    (LLAMA3, "[f(1)]", "not a Python list of calls with literal keyword arguments"),
    (LLAMA3, "<|python_tag|>brave_search.call(query=x)", "not valid JSON"),
    (LLAMA3, '<|python_tag|>brave_search.call(query="x"; 1)', "not NAME.call(KEY=VALUE, ...)"),
    (MISTRAL, "Hi [TOOL_CALLS]get weather[ARGS]{}", "no [ARGS] after the function name"),
    (MISTRAL, 'Hi [TOOL_CALLS][{"name": "f" "arguments": {}}]', "not valid JSON"),
    (GENERIC, '{"answer": 42}', "holds none of 'tool_calls', 'tool_call' and 'response'"),
    (GENERIC, '{"response": 42}', "'response' is not a JSON string"),
])
def test_a_malformed_call_is_kept_as_content_with_an_error_saying_why(tool_format, text, reason):
    for pieces in ([text], list(text)):
        deltas, result = feed_pieces(tool_format, pieces)
        assert result.content == text.strip()
        assert result.tool_calls == ()
        assert result.error is not None and result.error.startswith("the model's") and reason in result.error
        assert "".join(delta.text for delta in deltas if isinstance(delta, TextDelta)) == result.content


def test_a_call_cut_off_by_the_end_of_the_output_is_dropped_with_an_error():
    """A call cut off by max_tokens was a call, not text: neither its markers nor its raw text
    reach the content; the text before it does."""
    text = 'Hi <tool_call>{"name": "f", "arguments": {"a": "b'
    for pieces in ([text], list(text)):
        deltas, result = feed_pieces(HERMES, pieces)
        assert result == ParsedOutput("Hi", None, (), "the model's tool call was cut off before it ended")
        assert "".join(delta.text for delta in deltas if isinstance(delta, TextDelta)) == "Hi"
        assert not any(isinstance(delta, (ToolCallStart, ArgumentsDelta)) for delta in deltas)


def test_a_stream_cut_off_mid_arguments_sends_no_call_and_no_text():
    parser = output_parser(HERMES, call_id=call_id)
    assert parser.feed('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa') == []
    assert parser.close() == []
    assert parser.result() == ParsedOutput(None, None, (), "the model's tool call was cut off before it ended")


def test_calls_before_a_cut_off_one_are_kept_and_the_cut_off_one_is_dropped():
    """The cut-off call was one more call, not text for the user (CanIToolCall's
    truncated-second-parallel-call fixtures expect no content)."""
    result = read_output('[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {', MISTRAL, call_id=call_id)
    assert result.tool_calls == calls(("a", "{}"))
    assert result.error == "the model's tool call was cut off before it ended"
    assert result.content is None


@pytest.mark.parametrize("tool_format, text", [
    (HERMES, "Let me check. <tool_call>\n"), (MISTRAL, "Let me check.[TOOL_CALLS]"),
    (LLAMA3, "Let me check. <|python_tag|>"),
])
def test_an_output_that_ends_at_a_call_marker_drops_the_marker(tool_format, text):
    for pieces in ([text], list(text)):
        deltas, result = feed_pieces(tool_format, pieces, parse_reasoning=False)
        assert result == ParsedOutput("Let me check.", None, (), "the model's tool call was cut off before it ended")


def test_a_missing_comma_between_calls_is_named_in_the_error():
    result = read_output('{"tool_calls": [{"name": "f"} {"name": "g"}]}', GENERIC, call_id=call_id)
    assert result == ParsedOutput('{"name": "g"}]}', None, calls(("f", "{}")),
                                  "the model's tool call is not valid JSON: expected ',' or ']' after a call, found '{'")


def test_the_parser_is_used_in_order():
    parser = output_parser(HERMES, call_id=call_id)
    with pytest.raises(ValueError, match="before close"):
        parser.result()
    parser.close()
    with pytest.raises(ValueError, match="after close"):
        parser.feed("more")


SOUP = st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", "[TOOL_CALLS]", "[ARGS]",
                        "<|python_tag|>", "<", "{", "}", "[", "]", '"', "\\", ":", ",", ";", " ", "\n", "f", "é",
                        "\\u00e9", "\\ud83d", "\\ude00", "1", "true", '"name"', '"arguments"', '"parameters"',
                        '"response"', '"tool_calls"', '"tool_call"', '"f"', '{"a": 1}'])


@settings(max_examples=600, deadline=None)
@given(data=st.data())
def test_any_output_parses_without_raising_and_the_same_however_it_is_cut(data):
    tool_format = data.draw(st.sampled_from(list(ToolFormat)), label="format")
    parse_reasoning = data.draw(st.booleans(), label="parse_reasoning")
    text = "".join(data.draw(st.lists(SOUP, max_size=30), label="soup"))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=10), label="cuts"))
    pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)])]
    whole_deltas, whole_result = feed_pieces(tool_format, [text], parse_reasoning)
    deltas, result = feed_pieces(tool_format, pieces, parse_reasoning)
    assert result == whole_result
    assert merged(deltas) == merged(whole_deltas)
    assembled = Assembled.of(deltas)
    assert (assembled.content or None, assembled.reasoning or None) == (result.content, result.reasoning)
    if result.error is None:  # a broken call's deltas stay streamed; only then may the two differ
        assert assembled.as_output()[2] == result.tool_calls
    for call in result.tool_calls:
        assert isinstance(json.loads(call.arguments), dict)
