"""A template that knows tools renders the history's calls itself: most write a call's
arguments with `| tojson` (an object), Functionary v3.2's concatenates them as text, so a
conversation with a past call renders either way."""

from __future__ import annotations

from pathlib import Path

from helpers import TemplateModel
from multiseq import Request
from multiseq.tools import Tool
from multiseq.tools.support import ToolSupport

TEMPLATES = Path(__file__).parent / "data" / "llama.cpp-templates"
WEATHER = Tool("get_weather", None, {"type": "object", "properties": {"city": {"type": "string"}}})
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]


def rendered(template: str) -> str:
    source = (TEMPLATES / template).read_text()
    return ToolSupport(source).render(TemplateModel(source), Request(messages=HISTORY, tools=(WEATHER,)))


def test_a_template_that_concatenates_arguments_gets_them_as_text():
    assert '>>>get_weather\n{"city": "Paris"}' in rendered("meetkai-functionary-medium-v3.2.jinja")


def test_a_template_that_writes_tojson_gets_them_as_an_object():
    assert '"arguments": {"city": "Paris"}' in rendered("Qwen-Qwen3-0.6B.jinja")


CLIENT_IDS = [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "toolu_01AbCdEf", "type": "function",
                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
              {"role": "tool", "tool_call_id": "toolu_01AbCdEf", "content": "sunny"}]


def test_mistral_templates_get_nine_character_call_ids_the_same_every_turn():
    """Mistral's templates refuse any id but 9 alphanumeric characters: a client's ids (Claude
    Code's toolu_..., ours before) are renamed, the call and its result alike, the same way on
    every turn so the prompt's prefix does not change."""
    source = (TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text()
    request = Request(messages=CLIENT_IDS, tools=(WEATHER,))
    first = ToolSupport(source).render(TemplateModel(source), request)
    assert first == ToolSupport(source).render(TemplateModel(source), request)
    assert "toolu_01AbCdEf" not in first
    [renamed] = {part.split('"')[0] for part in first.split('"id": "')[1:]}
    assert len(renamed) == 9 and renamed.isalnum() and f'"call_id": "{renamed}"' in first
    support = ToolSupport(source)
    parser = support.parser(request)
    parser.feed('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]')
    parser.close()
    [call] = parser.result().tool_calls
    assert len(call.id) == 9 and call.id.isalnum()


def test_a_turns_results_are_one_user_turn_for_a_template_that_insists_on_turns_in_turn():
    """Gemma 3's template refuses two user turns in a row: the generic format writes the results
    of two parallel calls, and the question after them, as one user turn."""
    source = (Path(__file__).parent.parent / "models" / "templates" / "gemma3.jinja").read_text()
    history = [{"role": "user", "content": "Weather in Paris and Rome?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                   {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
               {"role": "tool", "tool_call_id": "c2", "content": "rain"},
               {"role": "user", "content": "And tomorrow?"}]
    prompt = ToolSupport(source).render(TemplateModel(source), Request(messages=history, tools=(WEATHER,)))
    assert ('<start_of_turn>user\n{"tool_response": {"name": "get_weather", "content": "sunny"}}\n'
            '{"tool_response": {"name": "get_weather", "content": "rain"}}\nAnd tomorrow?<end_of_turn>\n'
            '<start_of_turn>model\n') in prompt
