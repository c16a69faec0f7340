"""The minimax-m3 family (MiniMax-M3): ]<]minimax[>[-namespaced <invoke> calls whose parameters
are tags of their own names, nested elements for objects and arrays, reasoning in <mm:think>.
Expected parses copied from llama.cpp's tests/test-chat.cpp (vendored llama.cpp)."""

from __future__ import annotations

import pytest

from marked_family_checks import calls_of, detected, read_everywhere, streamed

from multiseq.tools import Tool
from multiseq.tools.family import CUT_OFF

FAMILY = "minimax-m3"
NS = "]<]minimax[>["
HELLO = "Hello, world!\nWhat's up?"


def _tool(name: str, properties: dict, required: tuple[str, ...] = ()) -> Tool:
    return Tool(name, None, {"type": "object", "properties": properties, "required": list(required)})


NUMBER, STRING, INTEGER = {"type": "number"}, {"type": "string"}, {"type": "integer"}
# llama.cpp's test tools (tests/test-chat.cpp:425-800), the ones the copied cases call.
TOOLS = (
    _tool("get_time", {"city": STRING}, ("city",)),
    _tool("get_weather", {"city": STRING}, ("city",)),
    _tool("special_function", {"arg1": INTEGER}, ("arg1",)),
    _tool("empty_args", {}),
    _tool("magic_int", {"ref": INTEGER, "name": STRING}, ("ref",)),
    _tool("amount", {"orig": NUMBER}, ("orig",)),
    _tool("toggle", {"enabled": {"type": "boolean"}}, ("enabled",)),
    _tool("imaginary_number", {"number": {"type": "object", "properties": {"real": NUMBER, "imaginary": NUMBER}}}),
    _tool("nested_args", {"tags": {"type": "array", "items": STRING}, "entries": {
        "type": "array", "items": {"type": "object", "properties": {"id": INTEGER, "label": STRING}}}}),
    _tool("union_args", {
        "filter": {"anyOf": [{"type": "array", "items": STRING},
                             {"type": "object", "properties": {"field": STRING, "op": STRING}}]},
        "label": {"oneOf": [STRING, {"type": "object", "properties": {"text": STRING}}]},
        "limit": {"oneOf": [INTEGER, {"type": "object", "properties": {"max": INTEGER}}]}}),
)


def block(*invokes: str) -> str:
    return f"{NS}<tool_call>\n" + "".join(invokes) + f"{NS}</tool_call>"


def invoke(name: str, body: str = "") -> str:
    return f'{NS}<invoke name="{name}">{body}{NS}</invoke>\n'


def element(key: str, value: str) -> str:
    return f"{NS}<{key}>{value}{NS}</{key}>"


def read(text: str, prompt: str = ""):
    return read_everywhere(text, FAMILY, tools=TOOLS, prompt=prompt)


def test_the_m3_template_is_detected_and_not_hermes():
    assert detected("MiniMax-M3.jinja") == FAMILY
    assert detected("MiniMax-M2.jinja") != FAMILY and detected("MiniMax-M1.jinja") != FAMILY


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:5495
    ("</mm:think>" + HELLO, HELLO, None, []),
    # test-chat.cpp:5503
    ("<mm:think>I'm\nthinking</mm:think>" + HELLO, HELLO, "I'm\nthinking", []),
    # test-chat.cpp:5511
    ("<mm:think>Let me check the time</mm:think>" + block(invoke("get_time", element("city", "Tokyo"))),
     None, "Let me check the time", [("get_time", {"city": "Tokyo"})]),
    # test-chat.cpp:5526
    ("</mm:think>" + block(invoke("special_function", element("arg1", "1"))), None, None,
     [("special_function", {"arg1": 1})]),
    # test-chat.cpp:5541
    ("<mm:think>Let's call a tool:</mm:think>" + block(invoke("empty_args")), None, "Let's call a tool:",
     [("empty_args", {})]),
    # test-chat.cpp:5555
    ("<mm:think>Calling both</mm:think>" + block(invoke("get_time", element("city", "Paris")),
                                                 invoke("get_weather", element("city", "Paris"))),
     None, "Calling both", [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]),
    # test-chat.cpp:5574
    ("<mm:think>Thinking about it</mm:think>Let me call the function."
     + block(invoke("special_function", element("arg1", "1"))), "Let me call the function.", "Thinking about it",
     [("special_function", {"arg1": 1})]),
    # test-chat.cpp:5594, 5613, 5632
    ("<mm:think>Test negative</mm:think>" + block(invoke("magic_int", element("ref", "-14"))), None,
     "Test negative", [("magic_int", {"ref": -14})]),
    ("<mm:think>Test decimal</mm:think>" + block(invoke("amount", element("orig", "3.14"))), None,
     "Test decimal", [("amount", {"orig": 3.14})]),
    ("<mm:think>Test boolean</mm:think>" + block(invoke("toggle", element("enabled", "true"))), None,
     "Test boolean", [("toggle", {"enabled": True})]),
    # test-chat.cpp:5651
    ("<mm:think>Multi-arg call</mm:think>" + block(invoke("magic_int", element("ref", "42") + element("name", "foo bar"))),
     None, "Multi-arg call", [("magic_int", {"ref": 42, "name": "foo bar"})]),
    # test-chat.cpp:5671
    ("<mm:think>Nested object</mm:think>" + block(invoke("imaginary_number", element(
        "number", element("real", "1.5") + element("imaginary", "-2.5")))),
     None, "Nested object", [("imaginary_number", {"number": {"real": 1.5, "imaginary": -2.5}})]),
    # test-chat.cpp:5692
    ("<mm:think>Nested arrays</mm:think>" + block(invoke("nested_args", element(
        "tags", element("item", "alpha") + element("item", "beta")) + element(
        "entries", element("item", element("id", "1") + element("label", "one"))))),
     None, "Nested arrays", [("nested_args", {"tags": ["alpha", "beta"], "entries": [{"id": 1, "label": "one"}]})]),
    # test-chat.cpp:5720, 5739, 5756, 5775
    ("<mm:think>Union array</mm:think>" + block(invoke("union_args", element(
        "filter", element("item", "alpha") + element("item", "beta")))),
     None, "Union array", [("union_args", {"filter": ["alpha", "beta"]})]),
    ("<mm:think>Union scalar</mm:think>" + block(invoke("union_args", element("limit", "5"))), None,
     "Union scalar", [("union_args", {"limit": 5})]),
    ("<mm:think>Union nested</mm:think>" + block(invoke("union_args", element("limit", element("max", "10")))), None,
     "Union nested", [("union_args", {"limit": {"max": 10}})]),
    ("<mm:think>Union string</mm:think>" + block(invoke("union_args", element("label", "hi"))), None,
     "Union string", [("union_args", {"label": "hi"})]),
    # test-chat.cpp:5812
    ("<mm:think></mm:think>" + block(invoke("get_time", element("city", "XYZCITY"))), None, None,
     [("get_time", {"city": "XYZCITY"})]),
])
def test_llama_cpp_parses(text, content, reasoning, calls):
    parsed = read(text)
    assert (parsed.content, parsed.reasoning, calls_of(parsed), parsed.error) == (content, reasoning, calls, None)


def test_nested_elements_under_a_string_alternative_are_the_object():
    # test-chat.cpp:5793 expects the raw markup as the string (llama.cpp's grammar reads any
    # value as a string where the schema allows one); the namespace token is no text, and the
    # elements are how the template writes an object: read as {"text": "hi"}.
    text = "</mm:think>" + block(invoke("union_args", element("label", element("text", "hi"))))
    assert calls_of(read(text)) == [("union_args", {"label": {"text": "hi"}})]


def test_without_a_schema_items_are_a_list_and_other_elements_an_object():
    text = "</mm:think>" + block(invoke("unknown", element("tags", element("item", "a") + element("item", "2"))
                                        + element("where", element("city", "Paris") + element("days", "3"))))
    assert calls_of(read(text)) == [("unknown", {"tags": ["a", 2], "where": {"city": "Paris", "days": 3}})]


def test_the_prompt_opens_the_reasoning_in_enabled_thinking_mode():
    parsed = read("I'm\nthinking</mm:think>" + HELLO, prompt="]~b]ai\n<mm:think>")
    assert (parsed.content, parsed.reasoning) == (HELLO, "I'm\nthinking")


def test_the_end_of_turn_ends_the_output():
    parsed = read("</mm:think>Hi![e~[\n]~b]user\nmore")
    assert (parsed.content, parsed.reasoning, parsed.error) == ("Hi!", None, None)


def test_a_block_whose_close_never_came_keeps_its_complete_calls():
    text = "</mm:think>" + block(invoke("get_time", element("city", "Paris")))[:-len(f"{NS}</tool_call>")]
    parsed = read(text)
    assert calls_of(parsed) == [("get_time", {"city": "Paris"})] and parsed.error is None


@pytest.mark.parametrize("text, content", [
    (f'Sure.{NS}<tool_call>\n{NS}<invoke name="get_time">{NS}<city>Par', "Sure."),
    (f'{NS}<tool_call>\n{NS}<invoke name="get_ti', None),
    (f"{NS}<tool_call>\n", None),
])
def test_a_cut_off_call_is_dropped_with_an_error(text, content):
    parsed = read("</mm:think>" + text)
    assert parsed.tool_calls == () and parsed.error == CUT_OFF and parsed.content == content
    _, shown = streamed("</mm:think>" + text, FAMILY, list("</mm:think>" + text), tools=TOOLS)
    assert NS not in shown


def test_a_cut_off_second_call_keeps_the_first():
    text = "</mm:think>" + block(invoke("get_time", element("city", "Paris")))[:-len(f"{NS}</tool_call>")] \
        + f'{NS}<invoke name="get_weather">{NS}<city>Pa'
    parsed = read(text)
    assert calls_of(parsed) == [("get_time", {"city": "Paris"})] and parsed.error == CUT_OFF
    assert parsed.content is None  # the cut-off call is dropped, not shown as its markup


def test_markup_that_is_not_a_call_is_content_with_an_error():
    text = f"</mm:think>{NS}<tool_call>\n{NS}<call get_time>{NS}</tool_call>After."
    parsed = read(text)
    assert parsed.tool_calls == () and parsed.error is not None
    assert parsed.content == text[len("</mm:think>"):]
