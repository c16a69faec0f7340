"""The kimi family: Kimi K2's section tokens (functions.NAME:INDEX ids, JSON arguments) and
Kimi K3's XTML (<|open|>/<|close|>/<|sep|> elements). Expected parses copied from llama.cpp's
tests/test-chat.cpp (the Kimi-K2-Thinking, Kimi-K2 and Kimi-K3 blocks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiseq.llama.chat_template import JinjaRenderer
from multiseq.tools import ChoiceMode, TextDelta, Tool, ToolChoice, output_parser, read_output
from multiseq.tools.families import detect
from multiseq.tools.family import CUT_OFF
from test_family_grammars_unit import family_accepts
from multiseq.tools.writing import written

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"
K2_PROMPT = "<|im_assistant|>assistant<|im_middle|>"  # Kimi-K2-Thinking's: the model opens <think> itself
K3_PROMPT = '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'  # Kimi-K3's, thinking on
MARKERS = ("<|tool_call", "<think>", "</think>", "<|open|>", "<|close|>", "<|sep|>")

INTEGER = {"type": "integer"}
TOOLS = (
    Tool("special_function", parameters={"type": "object", "properties": {"arg1": INTEGER}, "required": ["arg1"]}),
    Tool("special_function_with_opt", parameters={"type": "object", "properties": {"arg1": INTEGER, "arg2": INTEGER}}),
    Tool("python", parameters={"type": "object", "properties": {"code": {"type": "string"}}}),
    Tool("html", parameters={"type": "object", "properties": {"markup": {"type": "string"}}}),
    Tool("empty_args", parameters={"type": "object", "properties": {}}),
)


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def summary(parsed):
    return (parsed.content, parsed.reasoning,
            [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls], parsed.error)


def read_everywhere(text: str, template_name: str, prompt: str):
    """The text read whole and one character at a time: the same result."""
    whole = read_output(text, template=template(template_name), tools=TOOLS, prompt=prompt)
    pieces = read_output(list(text), template=template(template_name), tools=TOOLS, prompt=prompt)
    assert summary(pieces) == summary(whole)
    return whole


@pytest.mark.parametrize("name", ["Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja", "moonshotai-Kimi-K2.jinja",
                                  "Kimi-K3.jinja"])
def test_templates_are_detected(name):
    assert detect(template(name)).name == "kimi"


def test_variants():
    family = detect(template("Kimi-K3.jinja"))
    assert family.variant_of(template("Kimi-K3.jinja")) == "kimi-k3"
    assert family.variant_of(template("Kimi-K2-Thinking.jinja")) == "kimi-k2"
    assert family.opens_reasoning(K3_PROMPT) and family.opens_reasoning(K2_PROMPT + "<think>")
    assert not family.opens_reasoning('<|open|>message role="assistant"<|sep|><|open|>response<|sep|>')


K2_CALL = '<|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>{"arg1": 1}<|tool_call_end|>'


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:4971
    ("Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", None, []),
    # test-chat.cpp:4974
    (f"<|tool_calls_section_begin|>{K2_CALL}<|tool_calls_section_end|>", None, None,
     [("special_function", {"arg1": 1})]),
    # test-chat.cpp:4982
    (f"<think>I'm thinking about this</think><|tool_calls_section_begin|>{K2_CALL}<|tool_calls_section_end|>",
     None, "I'm thinking about this", [("special_function", {"arg1": 1})]),
    # test-chat.cpp:4992
    (f"Hello, world!\nWhat's up?<|tool_calls_section_begin|>{K2_CALL}<|tool_calls_section_end|>",
     "Hello, world!\nWhat's up?", None, [("special_function", {"arg1": 1})]),
    # test-chat.cpp:5065 (three calls, markup in a string)
    ("<|tool_calls_section_begin|>" + K2_CALL
     + '<|tool_call_begin|>functions.python:1<|tool_call_argument_begin|>{"code": "print(1)"}<|tool_call_end|>'
     '<|tool_call_begin|>functions.html:2<|tool_call_argument_begin|>{"markup": "<p>test</p>"}<|tool_call_end|>'
     "<|tool_calls_section_end|>", None, None,
     [("special_function", {"arg1": 1}), ("python", {"code": "print(1)"}), ("html", {"markup": "<p>test</p>"})]),
    # test-chat.cpp:5084: calls inside the unclosed reasoning
    ("<think>I need to call two functions<|tool_calls_section_begin|>" + K2_CALL
     + "<|tool_call_begin|>functions.python:1<|tool_call_argument_begin|>{\"code\": \"print('hey')\"}<|tool_call_end|>"
     "<|tool_calls_section_end|>", None, "I need to call two functions",
     [("special_function", {"arg1": 1}), ("python", {"code": "print('hey')"})]),
    # test-chat.cpp:5103: ... and without the section's markers or the calls' end markers
    ("<think>I need to call two functions"
     '<|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>{"arg1": 1}'
     "<|tool_call_begin|>functions.python:1<|tool_call_argument_begin|>{\"code\": \"print('hey')\"}",
     None, "I need to call two functions", [("special_function", {"arg1": 1}), ("python", {"code": "print('hey')"})]),
])
def test_llama_cpp_k2_thinking_parses(text, content, reasoning, calls):
    assert summary(read_everywhere(text, "Kimi-K2-Thinking.jinja", K2_PROMPT)) == (content, reasoning, calls, None)


@pytest.mark.parametrize("name", ["moonshotai-Kimi-K2.jinja", "Kimi-K2-Instruct.jinja"])
def test_llama_cpp_k2_instruct_parses(name):
    # test-chat.cpp:5186 and 5197
    text = f"<|tool_calls_section_begin|>{K2_CALL}<|tool_calls_section_end|>"
    assert summary(read_everywhere(text, name, K2_PROMPT)) == (None, None, [("special_function", {"arg1": 1})], None)


K3_CALL = ('<|open|>call tool="special_function" index="1"<|sep|>'
           '<|open|>argument key="arg1" type="number"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|>')


@pytest.mark.parametrize("text, content, reasoning, calls", [
    # test-chat.cpp:4869
    ("<|open|>response<|sep|>Hello, world!\nWhat's up?<|close|>response<|sep|><|close|>message<|sep|>",
     "Hello, world!\nWhat's up?", None, []),
    # test-chat.cpp:4875
    ("I'm thinking about this<|close|>think<|sep|><|open|>response<|sep|>Hello, world!\nWhat's up?"
     "<|close|>response<|sep|><|close|>message<|sep|>", "Hello, world!\nWhat's up?", "I'm thinking about this", []),
    # test-chat.cpp:4883
    ("<|open|>response<|sep|>Use the response tag, then message the handler.<|close|>response<|sep|>"
     "<|close|>message<|sep|>", "Use the response tag, then message the handler.", None, []),
    # test-chat.cpp:4889
    ("I was still thinking when the budget ran out", None, "I was still thinking when the budget ran out", []),
    # test-chat.cpp:4907
    ("I should call it<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>"
     f"<|open|>tools<|sep|>{K3_CALL}<|close|>tools<|sep|><|close|>message<|sep|>",
     "On it.", "I should call it", [("special_function", {"arg1": 1})]),
    # test-chat.cpp:4933
    ("<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>" + K3_CALL
     + '<|open|>call tool="special_function_with_opt" index="2"<|sep|>'
     '<|open|>argument key="arg1" type="number"<|sep|>1<|close|>argument<|sep|>'
     '<|open|>argument key="arg2" type="number"<|sep|>2<|close|>argument<|sep|>'
     "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>", None, None,
     [("special_function", {"arg1": 1}), ("special_function_with_opt", {"arg1": 1, "arg2": 2})]),
    # test-chat.cpp:4951
    ("<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
     '<|open|>call tool="python" index="1"<|sep|>'
     "<|open|>argument key=\"code\" type=\"string\"<|sep|>print('hey')<|close|>argument<|sep|>"
     "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>", None, None,
     [("python", {"code": "print('hey')"})]),
])
def test_llama_cpp_k3_parses(text, content, reasoning, calls):
    assert summary(read_everywhere(text, "Kimi-K3.jinja", K3_PROMPT)) == (content, reasoning, calls, None)


def test_k3_value_holding_its_closer_text():
    text = ("Write it.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
            '<|open|>call tool="python" index="1"<|sep|><|open|>argument key="code" type="string"<|sep|>'
            "<|close|>argument<|sep|> ends args<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>")
    parsed = read_everywhere(text, "Kimi-K3.jinja", K3_PROMPT)
    assert summary(parsed) == (None, "Write it.", [("python", {"code": "<|close|>argument<|sep|> ends args"})], None)


K2_CUT = ('Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0'
          '<|tool_call_argument_begin|>{"arg')
K3_CUT = ('<|open|>tools<|sep|><|open|>call tool="python" index="1"<|sep|>'
          '<|open|>argument key="code" type="string"<|sep|>print(')


@pytest.mark.parametrize("template_name, prompt, text, content", [
    ("Kimi-K2-Thinking.jinja", K2_PROMPT, K2_CUT, "Sure."),
    ("Kimi-K3.jinja", K3_PROMPT, "Go.<|close|>think<|sep|>" + K3_CUT, None),
])
def test_a_cut_off_call_is_dropped_with_an_error(template_name, prompt, text, content):
    parsed = read_everywhere(text, template_name, prompt)
    assert (parsed.tool_calls, parsed.content, parsed.error) == ((), content, CUT_OFF)
    # While it streamed (before the end settled it), no marker was shown as content.
    assert not any(marker in _streamed_content(text, template_name, prompt) for marker in MARKERS)


def _streamed_content(text: str, template_name: str, prompt: str) -> str:
    """The content deltas of the text fed one character at a time, without closing the stream."""
    parser = output_parser(template=template(template_name), tools=TOOLS, prompt=prompt)
    return "".join(delta.text for piece in text for delta in parser.feed(piece) if isinstance(delta, TextDelta))


# --- Kimi K3's constrained calls (the kimi-k3 CallSyntax) ----------------------------------------

K3 = detect(template("Kimi-K3.jinja"))
K3_CONTROL = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")  # Kimi K3's control tokens
K3_NO_THINKING = '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>'  # its prompt, thinking off
THINK_END = "<|close|>think<|sep|><|open|>response<|sep|>"
WEATHER = Tool("get_weather", parameters={"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}, "metric": {"type": "boolean"},
    "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "units": {"type": "object", "properties": {
        "temp": {"enum": ["c", "f"]}, "detail": {"type": "object"}}, "required": ["temp"]},
    "tags": {"type": "array", "items": {"type": "string"}}, 'odd "key" & more': {"type": "number"}},
    "required": ["city"]})
CLOCK = Tool("now")
K3_TOOLS = (WEATHER, CLOCK)
TRICKY = 'Zürich "old town" <b>&amp;</b>\n\tline 2 — 東京 \\ {"x": 1} [y] </argument>'  # no control token


REQUIRED = ToolChoice(ChoiceMode.REQUIRED)


def k3_constrained(text: str, prompt: str = K3_PROMPT, choice=REQUIRED, control=K3_CONTROL):
    """Whether the kimi-k3 grammar (as the server builds it for the prompt) accepts `text`, and
    the text read back, whole and one character at a time alike."""
    accepted = family_accepts(text, K3, K3_TOOLS, choice, control, variant="kimi-k3", prompt=prompt)
    whole = read_output(text, template=template("Kimi-K3.jinja"), tools=K3_TOOLS, prompt=prompt)
    assert summary(read_output(list(text), template=template("Kimi-K3.jinja"), tools=K3_TOOLS, prompt=prompt)) == \
        summary(whole)
    return accepted, whole


K3_CALLS = [
    [("get_weather", {"city": TRICKY, "days": 3, "metric": False, "note": None,
                      "units": {"temp": "c", "detail": {"deep": [1, 2.5, None]}}, "tags": [TRICKY, ""],
                      'odd "key" & more': -1.5})],
    [("get_weather", {"city": "", "note": "a note"}), ("now", {}), ("get_weather", {"city": "Paris", "days": 7})],
]


@pytest.mark.parametrize("control", [K3_CONTROL, ()], ids=["control-tokens", "text"])
@pytest.mark.parametrize("prompt, before, reasoning, content", [
    (K3_PROMPT, "I should call it" + THINK_END + "On it.", "I should call it", "On it."),
    (K3_PROMPT, THINK_END, None, None),
    (K3_NO_THINKING, "Checking\nnow.", None, "Checking\nnow."),
    (K3_NO_THINKING, "", None, None),
], ids=["thinking", "empty-thinking", "no-thinking", "no-content"])
@pytest.mark.parametrize("calls", K3_CALLS, ids=["every-kind", "several"])
def test_k3_a_constrained_call_reads_back_as_itself(calls, prompt, before, reasoning, content, control):
    text = before + written(K3.syntax_for("kimi-k3"), calls)
    accepted, parsed = k3_constrained(text, prompt, control=control)
    assert accepted, text
    assert summary(parsed) == (content, reasoning, calls, None)


def test_k3_the_grammar_writes_a_turn_as_the_template_writes_it_back():
    arguments = {"city": 'Paris "Nice" <b>', "days": 3, "metric": True, "note": None,
                 "units": {"temp": "c", "detail": {"a": [1, 2]}}, "tags": ["a"], 'odd "key" & more': 2.5}
    assistant = {"role": "assistant", "reasoning_content": "Weather needed.", "content": "On it.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": arguments}},
        {"type": "function", "function": {"name": "now", "arguments": {}}}]}
    renderer = JinjaRenderer(template("Kimi-K3.jinja"), "kimi-k3", "", "", add_bos=False)
    user = ({"role": "user", "content": "Weather?"},)
    prompt, rendered = renderer.render(user), renderer.render((*user, assistant))
    assert prompt.endswith(K3_PROMPT) and rendered.startswith(prompt)
    turn = rendered[len(prompt):].split("<|end_of_msg|>")[0]
    calls = [("get_weather", arguments), ("now", {})]
    # The grammar's calls (numbered from 0 here; the template numbers them from 1, any number reads).
    ours = "Weather needed." + THINK_END + "On it." + written(K3.syntax_for("kimi-k3"), calls)
    assert turn == ours.replace('index="1"', 'index="2"').replace('index="0"', 'index="1"')
    accepted, parsed = k3_constrained(turn)
    assert accepted and summary(parsed) == ("On it.", "Weather needed.", calls, None)


CALL_HEAD = '<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
CALL_TAIL = "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"
CITY = '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'


@pytest.mark.parametrize("arguments", [
    '<|open|>argument key="city" type="number"<|sep|>3<|close|>argument<|sep|>',  # a type its schema does not allow
    CITY + '<|open|>argument key="days" type="string"<|sep|>3<|close|>argument<|sep|>',
    CITY + '<|open|>argument key="days" type="integer"<|sep|>3<|close|>argument<|sep|>',  # the template says number
    CITY + '<|open|>argument key="days" type="number"<|sep|>0<|close|>argument<|sep|>',
    CITY + '<|open|>argument key="metric" type="boolean"<|sep|>True<|close|>argument<|sep|>',
    CITY + '<|open|>argument key="note" type="number"<|sep|>1<|close|>argument<|sep|>',
    CITY + '<|open|>argument key="units" type="object"<|sep|>{"temp": "k"}<|close|>argument<|sep|>',
    CITY + '<|open|>argument key="town" type="string"<|sep|>x<|close|>argument<|sep|>',
    CITY + '<|open|>argument key="odd "key" & more" type="number"<|sep|>1<|close|>argument<|sep|>',
    '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>' + CITY,  # not in the schema's order
    "",  # the required one missing
])
def test_k3_the_grammar_refuses_what_does_not_follow_the_syntax_or_the_schema(arguments):
    assert not k3_constrained(CALL_HEAD + arguments + CALL_TAIL, K3_NO_THINKING)[0]
    assert k3_constrained(CALL_HEAD + CITY + CALL_TAIL, K3_NO_THINKING)[0]


def test_k3_forced_calls_close_the_think_and_response_elements_and_auto_is_free():
    call = CALL_HEAD + CITY + CALL_TAIL
    assert k3_constrained("Thought." + THINK_END + call)[0]
    assert not k3_constrained(call)[0]  # the prompt opened the think element: it closes first
    assert not k3_constrained("<|open|>tools<|sep|>" + call.split("<|open|>tools<|sep|>")[1], K3_NO_THINKING)[0]
    assert k3_constrained(call, K3_NO_THINKING, ToolChoice(ChoiceMode.FUNCTION, "get_weather"))[0]
    assert not k3_constrained(call.replace("get_weather", "now").replace(CITY, ""), K3_NO_THINKING,
                              ToolChoice(ChoiceMode.FUNCTION, "get_weather"))[0]
    assert not k3_constrained(call.replace(CALL_TAIL, CALL_TAIL.replace("<|close|>call<|sep|>", "")), K3_NO_THINKING)[0]
    # `auto`: the response's closer is a control token free text cannot hold: no grammar.
    assert k3_constrained("Sunny.", K3_NO_THINKING, ToolChoice(ChoiceMode.AUTO))[0] is None
