"""Prompt lines with the fields real batch files carry, and the lines written back: parsed and
shaped without a model."""

from __future__ import annotations

import io
import json

import pytest

from multiseq import FinishReason, Result, SamplingParams, Timings, TokenLogprob, TopLogprob
from multiseq.formats.output import ResultSink, ResultWriter
from multiseq.formats.reader import PromptFormat, parse_jsonl_line, parse_openai_line
from multiseq.formats.records import record_for
from multiseq.formats.resume import record_succeeded

DEFAULTS = SamplingParams()
TIMINGS = Timings(0.0, 0.1, None, None, 0.2)
SCHEMA = {"type": "object", "properties": {"label": {"enum": ["a", "b"]}}, "required": ["label"]}


def openai_line(body: dict, url: str = "/v1/chat/completions", custom_id: str = "r1"):
    return parse_openai_line(json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}), 1,
                             DEFAULTS)


def chat(text: str = "Hi") -> list[dict]:
    return [{"role": "user", "content": text}]


def test_an_openai_line_with_every_field_it_can_honour():
    item = openai_line({
        "model": "gpt-4o-mini", "user": "u1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto",
        "stream": False, "stream_options": None, "parallel_tool_calls": True, "tool_choice": "none",
        "messages": [{"role": "developer", "content": "Be terse."},
                     {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Classify:"},
                                                                 {"type": "text", "text": "great product"}]}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "label", "schema": SCHEMA, "strict": True}},
        "logprobs": True, "top_logprobs": 3, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "logit_bias": {"42": -100, "7": 5}, "max_completion_tokens": 20, "seed": 9, "stop": "\n", "n": 1,
    })
    assert item.is_valid, item.error
    request, sampling = item.request, item.request.sampling
    # The developer role and the text parts reach the template as they came (it reads them as
    # llama-server's does: developer as system, parts joined by newlines where it reads text).
    assert request.messages == ({"role": "developer", "content": "Be terse."},
                                {"role": "user", "content": [{"type": "text", "text": "Classify:"},
                                                             {"type": "text", "text": "great product"}]})
    assert sampling.json_schema == SCHEMA and sampling.logprobs and sampling.top_logprobs == 3
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.5)
    assert sampling.logit_bias == {42: -100, 7: 5} and sampling.max_tokens == 20 and sampling.seed == 9
    assert sampling.stop == ("\n",)


def test_json_object_and_text_response_formats():
    assert openai_line({"messages": chat(), "response_format": {"type": "json_object"}}).request.sampling.json_object
    plain = openai_line({"messages": chat(), "response_format": {"type": "text"}}).request.sampling
    assert not plain.is_constrained


def test_completions_logprobs_is_a_count_of_alternatives():
    item = openai_line({"prompt": "Once", "logprobs": 2, "stop": ["\n", "."]}, url="/v1/completions")
    assert item.request.sampling.logprobs and item.request.sampling.top_logprobs == 2
    assert item.request.sampling.stop == ("\n", ".")


@pytest.mark.parametrize("body, url, param, words", [
    ({"messages": chat(), "tools": [{"type": "web_search"}]}, None, "tools[0].type", "must be a function tool"),
    ({"messages": chat(), "tools": [{"type": "function", "function": {"name": ""}}]}, None, "tools[0].function.name",
     "printable string"),
    ({"messages": chat(), "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, None,
     "tools[0].function.parameters", "JSON schema object"),
    ({"messages": chat(), "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "maybe"}, None,
     "tool_choice", "must be 'auto'"),
    ({"messages": chat(), "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, None, "tool_choice", "not among the tools"),
    ({"messages": chat(), "tool_choice": "required"}, None, "tool_choice", "has no tools"),
    ({"messages": chat(), "functions": [{"name": "f"}], "function_call": {"name": "h"}}, None, "function_call",
     "not among the tools"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     None, "messages[0].content[1].image_url.url", "this server fetches nothing"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64,aGVsbG8="}}]}]},
     None, "messages[0].content[0].image_url.url", "not an image or audio in a format multiseq reads"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     None, "messages[0].content[0].input_audio", "base64 'data'"),
    ({"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]},
     None, "messages[0].content[0].type", "'file' part"),
    ({"messages": chat() + [{"role": "tool", "content": "42"}]}, None, "messages[1].tool_call_id", "tool result"),
    ({"messages": chat() + [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {}}]}]},
     None, "messages[1].tool_calls[0].function", "must be"),
    ({"messages": [{"role": ["user"], "content": "hi"}]}, None, "messages[0].role", 'has role ["user"]'),
    ({"input": "moderate me"}, "/v1/moderations", "url", "must be /v1/chat/completions, /v1/completions or /v1/embeddings"),
    ({"input": "embed me", "dimensions": 0}, "/v1/embeddings", "dimensions", "must be an integer > 0"),
    ({"messages": chat(), "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, None,
     "response_format.json_schema.schema", "needs"),
    ({"messages": chat(), "response_format": {"type": "json_schema",
                                              "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     None, "response_format", "cannot be compiled"),
    ({"messages": chat(), "logit_bias": {"abc": 1}}, None, "logit_bias", "token ids"),
    ({"messages": chat(), "presence_penalty": 3}, None, "presence_penalty", "[-2, 2]"),
    ({"messages": chat(), "top_logprobs": 3}, None, "top_logprobs", "needs logprobs"),
    ({"messages": chat(), "n": 0}, None, "n", "'n' must be"),
    ({"messages": chat(), "frobnicate": 1}, None, "frobnicate", "unknown field"),
    ({"messages": chat(), "max_completion_tokens": "ten"}, None, "max_completion_tokens", "must be an integer"),
    ({"prompt": "x", "echo": True, "n": 2}, "/v1/completions", "n", "'echo' takes n = 1"),
    ({"prompt": "x", "echo": "yes"}, "/v1/completions", "echo", "true or false"),
    ({"messages": chat(), "echo": True}, None, "echo", "for chat"),
    ({"prompt": [[1, 2], "x", 3]}, "/v1/completions", "prompt", "'prompt[2]' must be"),
    ({"prompt": [[1, -2]]}, "/v1/completions", "prompt", "token id -2"),
    ({"prompt": []}, "/v1/completions", "prompt", "non-empty list"),
    ({"prompt": "x", "echo": True, "logprobs": 21}, "/v1/completions", "logprobs", "[0, 20]"),
    ({"messages": chat(), "temperature": float("inf")}, None, "body.temperature", "not a finite number"),
    ({"messages": chat(), "logit_bias": {"5": float("nan")}}, None, "body.logit_bias.5", "not a finite number"),
    ({"messages": chat(), "stop": [str(index) for index in range(17)]}, None, "stop", "at most 16"),
    ({"messages": chat(), "stop": "x" * 257}, None, "stop", "at most 256"),
    ({"messages": chat(), "max_tokens": 4, "min_tokens": 5}, None, "min_tokens", "at most max_tokens"),
    ({"messages": chat(), "repetition_penalty": 0}, None, "repetition_penalty", "repetition_penalty must be"),
    ({"messages": chat(), "chat_template_kwargs": {"messages": []}}, None, "chat_template_kwargs", "may not set"),
    ({"messages": chat(), "chat_template_kwargs": ["x"]}, None, "chat_template_kwargs", "must be an object"),
    ({"messages": chat(), "reasoning_effort": "extreme"}, None, "reasoning_effort", "must be one of"),
])
def test_a_field_that_cannot_run_fails_its_line_naming_the_field(body, url, param, words):
    item = openai_line(body, url=url or "/v1/chat/completions")
    assert not item.is_valid and item.error_param == param and words in item.error and item.error.startswith("line 1")
    record = record_for(PromptFormat.OPENAI, item, None, "m")
    assert record["response"]["status_code"] == 400 and record["error"] is None
    assert record["response"]["body"]["error"] == {"message": item.error, "type": "invalid_request_error",
                                                   "param": param, "code": None}


def test_fields_vllm_and_llama_server_clients_send():
    item = openai_line({"messages": chat(), "repetition_penalty": 1.2, "min_tokens": 3, "cache_prompt": False,
                        "top_k": 7, "min_p": 0.2})
    sampling = item.request.sampling
    assert (sampling.repeat_penalty, sampling.min_tokens, sampling.top_k, sampling.min_p) == (1.2, 3, 7, 0.2)
    both = openai_line({"messages": chat(), "repetition_penalty": 1.2, "repeat_penalty": 1.1})
    assert both.request.sampling.repeat_penalty == 1.1, "llama.cpp's own name wins"
    line = parse_jsonl_line(json.dumps({"prompt": "p", "min_tokens": 2, "repetition_penalty": 1.3}), 1, DEFAULTS)
    assert line.request.sampling.min_tokens == 2 and line.request.sampling.repeat_penalty == 1.3


def test_jsonl_lines_take_the_same_fields():
    item = parse_jsonl_line(json.dumps({"id": "x", "prompt": "p", "json_schema": SCHEMA, "logprobs": True,
                                        "top_logprobs": 2, "n": 2, "seed": 5, "logit_bias": {"3": 1.5}}), 1, DEFAULTS)
    assert item.is_valid and item.n == 2 and item.request.sampling.json_schema == SCHEMA
    grammar = parse_jsonl_line(json.dumps({"prompt": "p", "grammar": 'root ::= "a"'}), 2, DEFAULTS)
    assert grammar.request.sampling.grammar == 'root ::= "a"'
    bad = parse_jsonl_line(json.dumps({"prompt": "p", "grammar": 'root ::= "a'}), 3, DEFAULTS)
    assert bad.error_param == "grammar" and "cannot be compiled" in bad.error
    both = parse_jsonl_line(json.dumps({"prompt": "p", "grammar": 'root ::= "a"', "json_object": True}), 4, DEFAULTS)
    assert "at most one of" in both.error


def test_n_choices_are_requests_with_their_own_ids_and_seeds():
    item = parse_jsonl_line(json.dumps({"id": "q", "prompt": "p", "n": 3, "seed": 10}), 1, DEFAULTS)
    assert [r.id for r in item.requests] == ["q#0", "q#1", "q#2"] == item.request_ids
    assert [r.sampling.seed for r in item.requests] == [10, 11, 12]
    unseeded = parse_jsonl_line(json.dumps({"id": "u", "prompt": "p", "n": 2}), 2, DEFAULTS)
    assert [r.sampling.seed for r in unseeded.requests] == [None, None]
    single = parse_jsonl_line(json.dumps({"id": "s", "prompt": "p"}), 3, DEFAULTS)
    assert [r.id for r in single.requests] == ["s"]


def result(request_id: str, text: str = "ok", reason: FinishReason = FinishReason.STOP, **fields) -> Result:
    return Result(id=request_id, text=text, finish_reason=reason, prompt_tokens=10, completion_tokens=3,
                  timings=TIMINGS, **fields)


LOGPROBS = (TokenLogprob(5, b"ok", -0.1, (TopLogprob(5, b"ok", -0.1), TopLogprob(6, b"\xc3", -2.5))),)


def test_openai_chat_output_with_n_choices_and_logprobs():
    item = openai_line({"messages": chat(), "n": 2, "logprobs": True, "top_logprobs": 2})
    record = record_for(PromptFormat.OPENAI, item, [result("r1#0", logprobs=LOGPROBS),
                                                     result("r1#1", "no", FinishReason.LENGTH, logprobs=LOGPROBS)], "m")
    body = record["response"]["body"]
    assert record["response"]["status_code"] == 200 and record_succeeded(record)
    assert [c["message"]["content"] for c in body["choices"]] == ["ok", "no"]
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16,
                             "prompt_tokens_details": {"cached_tokens": 0, "cached_tokens_from_ram": 0}}
    assert body["choices"][0]["logprobs"]["content"] == [
        {"token": "ok", "logprob": -0.1, "bytes": [111, 107],
         "top_logprobs": [{"token": "ok", "logprob": -0.1, "bytes": [111, 107]},
                          {"token": "\\xc3", "logprob": -2.5, "bytes": [195]}]}]


def test_openai_completions_logprobs_shape():
    item = openai_line({"prompt": "p", "logprobs": 2}, url="/v1/completions")
    body = record_for(PromptFormat.OPENAI, item, [result("r1", logprobs=LOGPROBS)], "m")["response"]["body"]
    assert body["choices"][0]["logprobs"] == {"tokens": ["ok"], "token_logprobs": [-0.1],
                                              "top_logprobs": [{"ok": -0.1, "\\xc3": -2.5}], "text_offset": [0]}


def test_openai_failures_by_kind():
    item = openai_line({"messages": chat()})
    rejected = record_for(PromptFormat.OPENAI, item, [Result.rejected("r1", "prompt has 900 tokens")], "m")
    assert rejected["response"]["status_code"] == 400
    assert rejected["response"]["body"]["error"]["type"] == "invalid_request_error"
    failed = record_for(PromptFormat.OPENAI, item, [result("r1", reason=FinishReason.ERROR,
                                                          error="llama_decode failed at /srv/models/x.gguf")], "m")
    assert failed["response"]["status_code"] == 500 and failed["response"]["body"]["error"]["type"] == "server_error"
    assert "/srv" not in json.dumps(failed) and "llama_decode" not in json.dumps(failed), "the cause goes to the log"
    assert "log" in failed["response"]["body"]["error"]["message"]
    cancelled = record_for(PromptFormat.OPENAI, item, [result("r1", reason=FinishReason.CANCELLED)], "m")
    assert cancelled["response"] is None and cancelled["error"]["code"] == "batch_cancelled"
    assert not any(record_succeeded(record) for record in (rejected, failed, cancelled))


def test_jsonl_output_of_n_choices_and_logprobs():
    item = parse_jsonl_line(json.dumps({"id": "q", "prompt": "p", "n": 2, "logprobs": True}), 1, DEFAULTS)
    record = record_for(PromptFormat.JSONL, item, [result("q#0", logprobs=LOGPROBS), result("q#1", "yes")], "m")
    assert record["id"] == "q" and record["n"] == 2 and record["error"] is None and record_succeeded(record)
    assert [(c["index"], c["text"]) for c in record["choices"]] == [(0, "ok"), (1, "yes")]
    assert record["completion_tokens"] == 6 and "id" not in record["choices"][0]
    assert record["choices"][0]["logprobs"][0]["top_logprobs"][1] == {"token": "\\xc3", "id": 6, "logprob": -2.5,
                                                                      "bytes": [195]}
    partial = record_for(PromptFormat.JSONL, item, [result("q#0"), result("q#1", reason=FinishReason.CANCELLED)], "m")
    assert partial["error"].startswith("choice 1 did not finish") and not record_succeeded(partial)
    partial["error"] = None  # --resume trusts no line with an unfinished choice, whatever its error says
    assert not record_succeeded(partial)


def test_failed_lines_go_to_the_errors_stream():
    out, errors = io.BytesIO(), io.BytesIO()
    writer = ResultWriter(ResultSink(out, "out"), keep_input_order=True, errors_sink=ResultSink(errors, "errors"))
    good = openai_line({"messages": chat()}, custom_id="a")
    bad = openai_line({"messages": chat(), "tools": [{"type": "retrieval"}]}, custom_id="b")
    writer.write(record_for(PromptFormat.OPENAI, bad, None, "m"), 1)
    writer.write(record_for(PromptFormat.OPENAI, good, [result("a")], "m"), 0)
    writer.flush_pending()
    assert [json.loads(line)["custom_id"] for line in out.getvalue().splitlines()] == ["a"]
    assert [json.loads(line)["custom_id"] for line in errors.getvalue().splitlines()] == ["b"]
