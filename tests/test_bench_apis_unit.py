"""bench/load.py's clients of the three APIs, against the server on the fake backend: one agent
conversation sent through each renders to the same prompt, and each API's stream is read into
the same figures (usage, calls, content events)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from fakes import FakeBackend
from multiseq import SamplingParams
from multiseq.formats.reader import openai_body_item
from multiseq.server import ServerSettings, create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import load  # noqa: E402 - bench/ is a folder of scripts, not a package
from workloads import agent_tools  # noqa: E402

MODEL = "fake-model"
TOOLS = agent_tools(2)  # read_file, write_file
HISTORY = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Open the main module."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "main.py"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "def main(): pass"},
    {"role": "user", "content": "Now write the tests."},
]


CALL = '{"tool_calls": [{"name": "write_file", "arguments": {"path": "test_main.py", "content": "x"}}]}'


@pytest.fixture
def address(make_runner, serve_app) -> tuple[str, int]:
    backend = FakeBackend(num_slots=2, window=2048, n_batch=64)
    runner = make_runner(backend)
    # The fake answers the conversation with a whole call (its own bytes would write a path
    # that never ends: a call cut off at max_tokens is no call).
    item = openai_body_item("x", {"messages": HISTORY, "tools": TOOLS, "tool_choice": "required"}, True,
                            SamplingParams())
    backend.replies[runner.engine.prompt_text(item.request)] = CALL.encode()
    host, port = serve_app(create_app(runner, ServerSettings(model_name=MODEL))).removeprefix("http://").split(":")
    return host, int(port)


def exchanges(address: tuple[str, int], max_tokens: int, tools: list[dict] | None) -> dict[str, load.Exchange]:
    """The history sent through each API in turn (chat first), as the benchmark sends it."""
    return {api: asyncio.run(load.send(*address, load.APIS[api], HISTORY, max_tokens, MODEL, tools))
            for api in ("chat", "responses", "messages")}


def test_a_tool_conversation_is_the_same_prompt_and_the_same_call_over_every_api(address):
    sent = exchanges(address, 160, TOOLS)
    chat = sent["chat"]
    assert chat.prompt_tokens > 0 and chat.cached_tokens == 0
    assert [call["function"]["name"] for call in chat.tool_calls] == ["write_file"]
    for api in ("responses", "messages"):
        exchange = sent[api]
        assert exchange.prompt_tokens == chat.prompt_tokens, f"{api} rendered another prompt than chat"
        assert exchange.cached_tokens == chat.prompt_tokens - 1, f"{api} did not reuse what chat computed"
        assert exchange.completion_tokens == chat.completion_tokens
        assert [(call["function"]["name"], call["function"]["arguments"]) for call in exchange.tool_calls] == \
            [(call["function"]["name"], call["function"]["arguments"]) for call in chat.tool_calls]
        assert exchange.first_content_at is not None and exchange.done_at is not None
        assert len(exchange.content_times) >= len(exchange.tool_calls) + 1, "the call's start and its arguments"


def test_text_replies_are_their_whole_budget_over_every_api(address):
    for api, exchange in exchanges(address, 24, None).items():
        assert exchange.completion_tokens == 24, api
        assert exchange.text and len(exchange.content_times) >= 1, api
