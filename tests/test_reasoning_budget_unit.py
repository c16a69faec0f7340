"""Reasoning budgets on the fake backend, which writes `<think>` blocks as a Qwen3-style model
does (--tool-format qwen3-xml): past the budget the block's close is forced (after the budget
message, where one is set) and the answer follows; the reasoning tokens are counted in usage;
the budget comes from the runner, a request, Chat Completions' vLLM and llama-server fields,
Responses, and Anthropic's thinking.budget_tokens."""

from __future__ import annotations

import json

import pytest

from fakes import FakeBackend
from multiseq import Request, SamplingParams
from multiseq.sampling.budget import ReasoningBudget
from multiseq.server import ServerSettings, create_app
from test_server_unit import post

ASK = [{"role": "user", "content": "How many legs has a spider?"}]
PROMPT = "<user>How many legs has a spider?<assistant>"
CLOSE = "</think>"
FILLER = "!" * len(CLOSE)  # where the forced close lands in the script (the fake writes by position)


def script(thought: str, after: str = FILLER) -> str:
    """The fake's reply: a thought, the text where a close forced after it lands, the answer."""
    return f"<think>{thought}{after}Eight."


def run(make_runner, reply: str, sampling: str = "host", **params) -> object:
    runner = make_runner(FakeBackend(num_slots=2, window=512, replies={PROMPT: reply}), tool_format="qwen3-xml",
                         sampling=sampling, **params.pop("config", {}))
    [result] = runner.run_batch([Request(messages=ASK, sampling=SamplingParams(
        temperature=0, max_tokens=80, **params))])
    return result


@pytest.mark.parametrize("sampling", ["host", "backend"])
def test_past_the_budget_the_close_is_forced_and_the_answer_follows(make_runner, sampling):
    result = run(make_runner, script("abcdef"), sampling, reasoning_budget=6)
    assert (result.reasoning, result.text, result.reasoning_tokens) == ("abcdef", "Eight.", 6)


def test_without_a_budget_the_model_thinks_on_and_its_tokens_are_counted(make_runner):
    result = run(make_runner, "<think>abcdef</think>Eight.")
    assert (result.reasoning, result.text, result.reasoning_tokens) == ("abcdef", "Eight.", 6)
    assert result.completion_tokens == len("<think>abcdef</think>Eight.") + 1  # and the end token


def test_a_budget_of_zero_closes_the_block_as_it_opens(make_runner):
    result = run(make_runner, script(""), reasoning_budget=0)
    assert (result.reasoning or "", result.text, result.reasoning_tokens) == ("", "Eight.", 0)


def test_the_budget_message_is_written_before_the_close(make_runner):
    message = " Time to answer."
    result = run(make_runner, script("abc", "?" * len(message + CLOSE)), reasoning_budget=3,
                 reasoning_budget_message=message)
    assert (result.reasoning, result.text) == ("abc" + message, "Eight.")


def test_the_runners_budget_applies_and_a_requests_own_wins(make_runner):
    by_runner = run(make_runner, script("abcd"), config={"reasoning_budget": 4})
    assert (by_runner.reasoning, by_runner.text) == ("abcd", "Eight.")
    unlimited = run(make_runner, "<think>abcdefgh</think>Eight.", config={"reasoning_budget": 4}, reasoning_budget=-1)
    assert (unlimited.reasoning, unlimited.text) == ("abcdefgh", "Eight.")


def test_a_block_the_prompt_opened_counts_from_the_first_token():
    text = {ord(char): char.encode() for char in "<>/thinkab"}
    budget = ReasoningBudget(2, ("<think>", CLOSE), [ord(char) for char in CLOSE], inside=True,
                             token_text=lambda token: text.get(token, b""))
    forced = []
    for token in [ord("a")] * 11:
        token = budget.forced_token() or token
        forced.append(chr(token))
        budget.accept(token)
    assert "".join(forced) == "aa</think>a" and budget.spent == 2 and budget.forced_token() is None


def test_a_drafts_rows_leave_the_budget_as_it_was(make_runner):
    runner = make_runner(FakeBackend(num_slots=1, window=512, replies={PROMPT: script("ab")}), tool_format="qwen3-xml")
    seq = runner.engine.new_sequence(Request(messages=ASK, sampling=SamplingParams(reasoning_budget=2)), "r")
    sampler = seq.sampler
    before = sampler.budget.saved()
    with sampler.advanced([ord(char) for char in "<think>ab"]):
        assert sampler.budget.forced_token() == ord("<") and sampler.chain_spec is None
    assert sampler.budget.saved() == before and sampler.budget.forced_token() is None


# --- the APIs -----------------------------------------------------------------------------------

@pytest.fixture
def thinking_server(make_runner, serve_app):
    runner = make_runner(FakeBackend(num_slots=2, window=512, replies={PROMPT: script("abcde")}),
                         tool_format="qwen3-xml")
    return serve_app(create_app(runner, ServerSettings(model_name="fake")))


@pytest.mark.parametrize("field", ["thinking_token_budget", "reasoning_budget_tokens", "thinking_budget_tokens"])
def test_chat_completions_take_vllms_and_llama_servers_budget_fields(thinking_server, field):
    status, body, _ = post(thinking_server, "/v1/chat/completions",
                           json.dumps({"messages": ASK, "max_tokens": 60, "temperature": 0, field: 5}))
    assert status == 200
    message = body["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("abcde", "Eight.")
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5


def test_a_bad_budget_is_400_naming_its_field(thinking_server):
    status, body, _ = post(thinking_server, "/v1/chat/completions",
                           json.dumps({"messages": ASK, "thinking_token_budget": -3}))
    assert status == 400 and body["error"]["param"] == "thinking_token_budget"


def test_anthropics_budget_tokens_is_the_budget(thinking_server):
    status, body, _ = post(thinking_server, "/v1/messages", json.dumps({
        "model": "fake", "max_tokens": 60, "temperature": 0, "messages": ASK,
        "thinking": {"type": "enabled", "budget_tokens": 5}}))
    assert status == 200
    assert [(block["type"], block.get("thinking") or block.get("text")) for block in body["content"]] == [
        ("thinking", "abcde"), ("text", "Eight.")]


def test_responses_count_reasoning_tokens_and_take_the_budget(thinking_server):
    status, body, _ = post(thinking_server, "/v1/responses", json.dumps({
        "input": ASK[0]["content"], "max_output_tokens": 60, "temperature": 0, "thinking_token_budget": 5}))
    assert status == 200
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == 5
    assert body["output"][-1]["content"][0]["text"] == "Eight."
