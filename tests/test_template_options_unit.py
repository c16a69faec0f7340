"""A chat's switches reach its template: OpenAI's reasoning_effort, llama-server's and vLLM's
chat_template_kwargs, Anthropic's thinking and the Responses API's reasoning.effort become the
names thinking templates read (enable_thinking, thinking, reasoning_effort)."""

from __future__ import annotations

import pytest

from multiseq.llama.chat_template import JinjaRenderer
from multiseq.formats.fields import ItemError
from multiseq.formats.tool_fields import template_options
from multiseq.server.messages_request import translate_request
from multiseq.server.responses_request import parse_request

THINKING_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
                     "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% else %}<think>"
                     "{% endif %}{% if reasoning_effort is defined %}[{{ reasoning_effort }}]{% endif %}")


def render(options: dict | None) -> str:
    renderer = JinjaRenderer(THINKING_TEMPLATE, "a test template", "<s>", "</s>", add_bos=False)
    return renderer.render(({"role": "user", "content": "Hi"},), options=options)


@pytest.mark.parametrize("effort, thinks, level", [
    ("none", False, "low"), ("minimal", True, "low"), ("low", True, "low"), ("high", True, "high"),
    ("xhigh", True, "high")])
def test_reasoning_effort_becomes_the_templates_switches(effort, thinks, level):
    options = template_options({"reasoning_effort": effort})
    assert options == {"enable_thinking": thinks, "thinking": thinks, "reasoning_effort": level}
    assert render(options) == f"<user>Hi<assistant>{'<think>' if thinks else '<think></think>'}[{level}]"


def test_chat_template_kwargs_win_and_may_not_replace_what_the_server_renders():
    assert template_options({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}})[
        "enable_thinking"] is True
    with pytest.raises(ItemError, match="may not set 'tools'"):
        template_options({"chat_template_kwargs": {"tools": []}})
    with pytest.raises(ItemError, match="reasoning_effort"):
        template_options({"reasoning_effort": "turbo"})
    assert template_options({}) == {}


def test_anthropic_thinking_and_the_responses_effort_reach_the_chat_body():
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]}
    disabled = translate_request({**body, "thinking": {"type": "disabled"}}).chat_body
    assert disabled["chat_template_kwargs"] == {"enable_thinking": False, "thinking": False}
    enabled = translate_request({**body, "thinking": {"type": "enabled", "budget_tokens": 2048}}).chat_body
    assert enabled["chat_template_kwargs"]["enable_thinking"] is True
    assert "chat_template_kwargs" not in translate_request(body).chat_body
    assert parse_request({"input": "Hi", "reasoning": {"effort": "high"}}).chat_fields["reasoning_effort"] == "high"
