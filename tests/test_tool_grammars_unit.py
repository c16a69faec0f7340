"""The grammar of the JSON-call formats' calls (their families' syntax, as every family's) and
the prompts that describe tools, checked without a model.

A grammar is checked by feeding text byte by byte to an llguidance matcher over the fake
backend's byte vocabulary: what it accepts is what a constrained model can write."""

from __future__ import annotations

import json

import llguidance
import pytest

from fakes import FakeBackend
from multiseq.tools import ChoiceMode, Tool, ToolChoice, ToolFormat
from multiseq.tools.grammars import family_grammar
from multiseq.tools.families import detect, family_named
from multiseq.request import Request
from multiseq.tools.prompts import call_text, generic_messages
from multiseq.tools.support import ToolSupport

WEATHER = Tool("get_weather", "The weather in a city", {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]})
CLOCK = Tool("now")
TOOLS = [WEATHER, CLOCK]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
GENERIC_CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]}'


def tool_grammar(tools: list[Tool], choice: ToolChoice, parallel: bool, tool_format: ToolFormat,
                 reasoning: bool = False) -> str | None:
    """The grammar a model of the format gets (reasoning: its template reasons in <think>)."""
    syntax = family_named(tool_format.value).call_syntax
    return family_grammar(tools, choice, parallel, syntax, {}, syntax.reasoning if reasoning else None)


def accepts(text: str, tool_format: ToolFormat, mode: str = "auto", name: str | None = None,
            parallel: bool = True, reasoning: bool = False) -> bool:
    """Whether a model constrained by the request's grammar may write `text` and then end."""
    grammar = tool_grammar(TOOLS, ToolChoice(ChoiceMode(mode), name), parallel, tool_format, reasoning)
    matcher = llguidance.LLMatcher(FakeBackend().grammar_tokenizer(), grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return all(matcher.consume_token(byte) for byte in text.encode()) and matcher.is_accepting()


def test_no_grammar_when_the_model_may_not_call():
    assert tool_grammar(TOOLS, ToolChoice(ChoiceMode.NONE), True, ToolFormat.HERMES) is None
    assert tool_grammar([], ToolChoice(ChoiceMode.AUTO), True, ToolFormat.HERMES) is None


@pytest.mark.parametrize("tool_format, call", [(ToolFormat.HERMES, HERMES_CALL), (ToolFormat.GENERIC, GENERIC_CALL),
                                               (ToolFormat.LLAMA3, '{"name": "now", "parameters": {}}'),
                                               (ToolFormat.MISTRAL, '[TOOL_CALLS][{"name": "now", "arguments": {}}]')])
def test_required_allows_a_valid_call_and_nothing_else(tool_format, call):
    assert accepts(call, tool_format, "required")
    assert not accepts("I cannot call tools.", tool_format, "required")
    assert accepts(call, tool_format, "auto")


def test_arguments_must_validate_against_the_tools_parameters():
    assert not accepts('<tool_call>\n{"name": "get_weather", "arguments": {"days": 3}}\n</tool_call>',
                       ToolFormat.HERMES, "required")  # city is required
    assert not accepts('<tool_call>\n{"name": "get_weather", "arguments": {"city": 7}}\n</tool_call>',
                       ToolFormat.HERMES, "required")
    assert not accepts('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
                       ToolFormat.HERMES, "required")  # no such tool


def test_auto_leaves_text_free_until_the_trigger_then_forces_the_call():
    assert accepts("The weather is fine, no call needed.", ToolFormat.HERMES)
    assert accepts("Let me look that up. " + HERMES_CALL, ToolFormat.HERMES)
    assert not accepts("Let me look that up. <tool_call>\nsure thing", ToolFormat.HERMES)
    assert accepts("Plain text does not start with a brace.", ToolFormat.GENERIC)
    assert not accepts('{"city": "Paris"}', ToolFormat.GENERIC)  # a leading brace is a call


def test_a_named_function_and_parallel_false_allow_one_call():
    assert accepts('{"tool_calls": [{"name": "now", "arguments": {}}]}', ToolFormat.GENERIC, "function", "now")
    assert not accepts(GENERIC_CALL, ToolFormat.GENERIC, "function", "now")
    two = HERMES_CALL + "\n" + HERMES_CALL
    assert accepts(two, ToolFormat.HERMES, "required")
    assert not accepts(two, ToolFormat.HERMES, "required", parallel=False)


def test_a_reasoning_model_may_think_before_it_calls():
    assert accepts("<think>Paris is a city.</think>\n" + HERMES_CALL, ToolFormat.HERMES, "required", reasoning=True)
    assert not accepts("<think>Paris is a city.</think>\n" + HERMES_CALL, ToolFormat.HERMES, "required")


def test_calls_are_written_with_json_dumps_separators():
    """What the grammar makes the model write is what call_text re-renders, byte for byte."""
    calls = [{"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]
    assert call_text(ToolFormat.GENERIC, calls) == GENERIC_CALL
    assert accepts(call_text(ToolFormat.GENERIC, calls), ToolFormat.GENERIC, "required")
    assert call_text(ToolFormat.HERMES, [{"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]) \
        == HERMES_CALL
    assert not accepts('{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}', ToolFormat.GENERIC,
                       "required")


def test_the_format_is_told_by_the_template():
    """The registry's detection (tests/test_family_detection.py has every llama.cpp template)."""
    assert detect(None).name == "generic"
    assert detect("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}").name == "generic"
    assert detect('{% if tools %}<tools>{{ tools }}</tools>{% endif %}<tool_call>{"name": "x", "arguments": {}}').name \
        == "hermes"
    assert detect("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]").name == "mistral"
    assert detect("{% if tools %}{% endif %}<|python_tag|>").name == "llama3"


def test_generic_messages_describe_the_tools_and_write_calls_and_results_as_text():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}]
    rendered = generic_messages(messages, TOOLS, ToolFormat.GENERIC)
    assert [message["role"] for message in rendered] == ["system", "user", "assistant", "user"]
    assert rendered[0]["content"].startswith("Be brief.\n\n") and '"name": "get_weather"' in rendered[0]["content"]
    assert rendered[2]["content"] == '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
    assert json.loads(rendered[3]["content"]) == {"tool_response": {"name": "get_weather", "content": "Sunny"}}
    without_system = generic_messages(messages[1:2], TOOLS, ToolFormat.GENERIC)
    assert without_system[0]["role"] == "system" and without_system[1]["content"] == "Weather in Paris?"
    # The system part does not depend on the choice, so every turn keeps the same prefix.
    assert generic_messages(messages[:2], TOOLS, ToolFormat.GENERIC)[0] == rendered[0]


def test_a_tools_own_definitions_resolve_inside_its_arguments():
    """Each tool's parameters are a JSON document of their own: "#/$defs/..." means its $defs."""
    tool = Tool("move", None, {"type": "object", "$defs": {"point": {
        "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}},
        "properties": {"to": {"$ref": "#/$defs/point"}}, "required": ["to"]})
    grammar = tool_grammar([WEATHER, tool], ToolChoice(ChoiceMode.REQUIRED), False, ToolFormat.GENERIC)
    matcher = llguidance.LLMatcher(FakeBackend().grammar_tokenizer(), grammar, log_level=0)
    text = '{"tool_calls": [{"name": "move", "arguments": {"to": {"x": 1, "y": 2}}}]}'
    assert all(matcher.consume_token(byte) for byte in text.encode()) and matcher.is_accepting()
    refused = llguidance.LLMatcher(FakeBackend().grammar_tokenizer(), grammar, log_level=0)
    bad = '{"tool_calls": [{"name": "move", "arguments": {"to": {"x": "one"'
    assert not all(refused.consume_token(byte) for byte in bad.encode())


def test_arguments_allow_no_free_whitespace():
    """Whitespace a model may add is whitespace that would not match the call re-rendered."""
    assert not accepts('{"tool_calls": [{"name": "get_weather", "arguments": {\n  "city": "Paris"}}]}',
                       ToolFormat.GENERIC, "required")


def test_the_generic_system_part_keeps_tool_documentation_short():
    """A page of documentation per tool would fill a small model's window: the first paragraph
    of a description, and parameters without annotations (a property named "description" stays)."""
    tool = Tool("bash", "Run a command.\n\nLong usage notes. " + "More notes. " * 200, {
        "type": "object", "description": "the arguments", "properties": {
            "command": {"type": "string", "description": "what to run", "examples": ["ls"]},
            "description": {"type": "string", "title": "why"}}, "required": ["command"]})
    [line] = generic_messages([{"role": "user", "content": "hi"}], [tool], ToolFormat.GENERIC)[0]["content"] \
        .splitlines()[-1:]
    assert json.loads(line) == {"name": "bash", "description": "Run a command.", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"]}}


def test_mistral_and_llama3_calls_in_auto():
    """Mistral's calls begin at [TOOL_CALLS] wherever the text has it; Llama 3's bare object only
    at the start of the output (text that begins otherwise is text)."""
    assert accepts("No call needed.", ToolFormat.MISTRAL)
    assert accepts('Let me see. [TOOL_CALLS][{"name": "now", "arguments": {}}]', ToolFormat.MISTRAL)
    assert not accepts("Let me see. [TOOL_CALLS] sure", ToolFormat.MISTRAL)
    assert accepts("Plain text, and {braces} later.", ToolFormat.LLAMA3)
    assert accepts('{"name": "now", "parameters": {}}; {"name": "now", "parameters": {}}', ToolFormat.LLAMA3)
    assert not accepts('{"name": "now", "arguments": {}}', ToolFormat.LLAMA3)  # Llama 3 writes "parameters"


def test_a_control_token_marker_is_required_as_that_token():
    """Where [TOOL_CALLS] is a control token of the vocabulary, the grammar asks for the token,
    not for its text (which the model would have to spell in ordinary tokens)."""
    syntax = family_named("mistral").call_syntax
    grammar = family_grammar(TOOLS, ToolChoice(ChoiceMode.REQUIRED), True, syntax, {"[TOOL_CALLS]": 9})
    assert '<[9]> "["' in grammar and '"[TOOL_CALLS]' not in grammar


def test_a_name_is_written_as_a_json_string():
    quoted = Tool('say "hi"\\now')
    grammar = tool_grammar([quoted], ToolChoice(ChoiceMode.REQUIRED), False, ToolFormat.HERMES)
    matcher = llguidance.LLMatcher(FakeBackend().grammar_tokenizer(), grammar, log_level=0)
    text = "<tool_call>\n" + json.dumps({"name": quoted.name, "arguments": {}}) + "\n</tool_call>"
    assert all(matcher.consume_token(byte) for byte in text.encode()) and matcher.is_accepting()


def test_a_prompt_that_opened_the_reasoning_block_is_inside_it():
    """Qwen3's template may open <think> for the model: the calls' grammar then starts inside the
    block (the model closes it), as the family's reader does, instead of asking for <think> again."""
    template = '{% if tools %}<tool_call>{"name": x, "arguments": y}</tool_call>{% endif %}<think>\n'
    support = ToolSupport(template)
    request = Request(messages=({"role": "user", "content": "Weather?"},), tools=tuple(TOOLS),
                      tool_choice=ToolChoice(ChoiceMode.REQUIRED))
    grammar = support.grammar(request, prompt="<|im_start|>assistant\n<think>\n")
    matcher = llguidance.LLMatcher(FakeBackend().grammar_tokenizer(), grammar, log_level=0)
    text = "Paris is a city.</think>\n" + HERMES_CALL
    assert all(matcher.consume_token(byte) for byte in text.encode()) and matcher.is_accepting()
    unopened = support.grammar(request, prompt="<|im_start|>assistant\n")  # the model opens it, or calls at once
    closed_only = llguidance.LLMatcher(FakeBackend().grammar_tokenizer(), unopened, log_level=0)
    assert not all(closed_only.consume_token(byte) for byte in text.encode())
