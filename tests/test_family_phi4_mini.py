"""Phi-4-mini's format: detected from its template, the tools put where its template reads them
(the system message's `tools`), calls read between <|tool_call|> and <|/tool_call|> (a list, or
one object), and the closing marker never in the content (llama.cpp's reader let it through)."""

from __future__ import annotations

import json

import pytest

from helpers import TemplateModel
from multiseq import Request
from multiseq.tools import ArgumentsDelta, Tool, ToolCallStart, read_output
from multiseq.tools.families import detect
from multiseq.tools.reading import output_parser
from multiseq.tools.support import ToolSupport

# microsoft/Phi-4-mini-instruct's chat template (its tokenizer_config.json).
TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
            "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + "
            "message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
            "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")
WEATHER = Tool("get_weather", "The weather in a city", {"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"]})
ASK = ({"role": "user", "content": "Weather in Paris?"},)


def test_the_template_is_detected_as_phi4_mini():
    assert detect(TEMPLATE).name == "phi4-mini"


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_the_tools_go_in_the_system_message_as_the_template_reads_them(system):
    messages = ASK if system is None else ({"role": "system", "content": system}, *ASK)
    prompt = ToolSupport(TEMPLATE).render(TemplateModel(TEMPLATE), Request(messages=messages, tools=(WEATHER,)))
    tools = json.dumps([WEATHER.openai()["function"]], ensure_ascii=False)
    assert prompt == f"<|system|>{system or ''}<|tool|>{tools}<|/tool|><|end|><|user|>Weather in Paris?<|end|><|assistant|>"


def test_without_tools_the_chat_renders_as_the_template_alone():
    prompt = ToolSupport(TEMPLATE).render(TemplateModel(TEMPLATE), Request(messages=ASK))
    assert prompt == "<|user|>Weather in Paris?<|end|><|assistant|>"


@pytest.mark.parametrize("output, content, calls", [
    ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>', None,
     [("get_weather", {"city": "Paris"})]),
    ('Checking both.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "get_weather", "arguments": {"city": "Rome"}}]<|/tool_call|>', "Checking both.",
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
    ('<|tool_call|>{"name": "get_weather", "arguments": {"city": "Oslo"}}<|/tool_call|>', None,
     [("get_weather", {"city": "Oslo"})]),
    ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]', None, [("get_weather", {"city": "Oslo"})]),
    ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]<|/tool', None,
     [("get_weather", {"city": "Oslo"})]),
    ("It is sunny.", "It is sunny.", []),
])
def test_calls_are_read_and_no_marker_reaches_the_content(output, content, calls):
    for pieces in ([output], list(output)):
        parsed = read_output(pieces, "phi4-mini")
        assert parsed.content == content and parsed.error is None
        assert [(call.name, json.loads(call.arguments)) for call in parsed.tool_calls] == calls


def test_text_where_the_closing_marker_belongs_is_content_with_the_reason_after_the_whole_calls():
    parsed = read_output('<|tool_call|>[{"name": "get_weather", "arguments": {}}] and more', "phi4-mini")
    assert [call.name for call in parsed.tool_calls] == ["get_weather"]  # read whole: it stands
    assert parsed.content == "and more" and "<|/tool_call|>" in parsed.error


def test_long_arguments_stream():
    arguments = json.dumps({"city": "Paris " * 60})
    text = '<|tool_call|>[{"name": "get_weather", "arguments": ' + arguments + "}]<|/tool_call|>"
    parser = output_parser("phi4-mini", call_id=lambda index: f"call_{index}")
    deltas = [delta for index in range(0, len(text), 5) for delta in parser.feed(text[index:index + 5])]
    deltas += parser.close()
    assert [delta for delta in deltas if isinstance(delta, ToolCallStart)] == [ToolCallStart(0, "call_0", "get_weather")]
    parts = [delta.text for delta in deltas if isinstance(delta, ArgumentsDelta)]
    assert len(parts) > 3 and "".join(parts) == arguments == parser.result().tool_calls[0].arguments
