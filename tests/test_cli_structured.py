"""batch-run over a realistic OpenAI Batch file: every line it can honour runs, every other one
names its field; --errors and --resume."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from helpers import sampling_seed

pytestmark = pytest.mark.model

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
SENTIMENT = {"type": "object", "additionalProperties": False, "required": ["sentiment", "confidence"],
             "properties": {"sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
                            "confidence": {"type": "integer", "minimum": 1, "maximum": 5}}}
SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly."}


def line(custom_id: str, body: dict, url: str = CHAT) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "gpt-4o-mini", **body}}


def user(text) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": text}]


BATCH = [
    line("plain", {"messages": user("Name a fruit."), "max_tokens": 8, "temperature": 0, "user": "u-1",
                   "metadata": {"job": "demo"}, "store": False, "service_tier": "auto"}),
    line("parts", {"messages": user([{"type": "text", "text": "Translate to French:"},
                                     {"type": "text", "text": "good morning"}]), "max_completion_tokens": 8,
                   "temperature": 0}),
    line("schema", {"messages": user("Classify the review 'I loved it' as JSON."), "max_tokens": 40,
                    "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {
                        "name": "sentiment", "strict": True, "schema": SENTIMENT}}}),
    line("object", {"messages": user("Give a JSON object with a key 'fruit'."), "max_tokens": 64, "temperature": 0,
                    "response_format": {"type": "json_object"}}),  # ends in 10 tokens
    line("logprobs", {"messages": user("Say yes."), "max_tokens": 3, "temperature": 0, "logprobs": True,
                      "top_logprobs": 5, "min_tokens": 1}),  # a token to report, whatever the model
    line("penalties", {"messages": user("List colors."), "max_tokens": 8, "presence_penalty": 0.6,
                       "frequency_penalty": 0.4, "logit_bias": {"0": -100}, "seed": sampling_seed(3)}),
    line("two", {"messages": user("Write a word."), "max_tokens": 4, "n": 2, "temperature": 0.9,
                 "seed": sampling_seed(11)}),
    # The grammar writes the stop string (llama.cpp's extension): it must be cut, whatever the model.
    line("complete", {"prompt": "One, two, three,", "max_tokens": 24, "temperature": 0, "stop": [" six", "\n"],
                      "grammar": 'root ::= " four, five, six, seven."'}, COMPLETIONS),
    line("tools", {"messages": user("What is the weather in Paris?"), "tools": [{"type": "web_search"}],
        "tool_choice": "auto"}),  # a hosted tool this server cannot run
    line("embed", {"input": "some text", "model": "text-embedding-3-small"}, "/v1/embeddings"),
]


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in lines))
    return path


def test_a_realistic_openai_batch_runs_every_line_it_can_and_names_the_rest(tmp_path, run_cli, read_jsonl):
    prompts = write(tmp_path / "batch.jsonl", BATCH)
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    args = ["batch-run", str(prompts), "-o", str(out), "--errors", str(errors), "-np", "4", "--slot-ctx", "256",
            "--no-dashboard"]
    result = run_cli(*args)
    assert result.exit_code == 1, result.output  # the hosted tool's line cannot run
    done = {record["custom_id"]: record for record in read_jsonl(out)}
    failed = {record["custom_id"]: record for record in read_jsonl(errors)}
    assert set(done) == {"plain", "parts", "schema", "object", "logprobs", "penalties", "two", "complete", "embed"}
    assert {name: record["response"]["body"]["error"]["param"] for name, record in failed.items()} == \
        {"tools": "tools[0].type"}
    embedded = done["embed"]["response"]["body"]
    assert embedded["object"] == "list" and len(embedded["data"][0]["embedding"]) == 576
    assert all(record["response"]["status_code"] == 400 for record in failed.values())
    bodies = {name: record["response"]["body"] for name, record in done.items() if name != "embed"}
    assert all(record["response"]["status_code"] == 200 for record in done.values())
    assert all(c["finish_reason"] in ("stop", "length") for body in bodies.values() for c in body["choices"])
    schema_choice = bodies["schema"]["choices"][0]
    assert schema_choice["finish_reason"] == "stop", f"premise: the model closes its object within 40 tokens: " \
                                                     f"{schema_choice}"
    jsonschema.validate(json.loads(schema_choice["message"]["content"]), SENTIMENT)
    object_choice = bodies["object"]["choices"][0]
    assert object_choice["finish_reason"] == "stop", f"premise: the model closes its object within 64 tokens: " \
                                                     f"{object_choice}"
    assert isinstance(json.loads(object_choice["message"]["content"]), dict)
    content = bodies["logprobs"]["choices"][0]["logprobs"]["content"]
    assert len(content) >= 1 and all(len(entry["top_logprobs"]) == 5 for entry in content)
    assert all(entry["logprob"] == entry["top_logprobs"][0]["logprob"] for entry in content), "greedy: the top token"
    assert [c["index"] for c in bodies["two"]["choices"]] == [0, 1]
    usage = bodies["two"]["usage"]
    assert 2 <= usage["completion_tokens"] <= 8 and usage["total_tokens"] == usage["prompt_tokens"] + usage[
        "completion_tokens"], "the prompt counted once, both choices' tokens"
    completion = bodies["complete"]["choices"][0]
    assert bodies["complete"]["object"] == "text_completion" and "six" not in completion["text"]
    assert completion["text"] == " four, five," and completion["finish_reason"] == "stop", "cut at the stop string"

    rerun = run_cli(*args, "--resume")
    assert rerun.exit_code == 1
    assert {record["custom_id"] for record in read_jsonl(out)} == set(done), "done lines are not run again"
    assert sorted(record["custom_id"] for record in read_jsonl(errors)) == ["tools"]


def test_jsonl_lines_with_a_schema_and_n_choices(tmp_path, run_cli, read_jsonl):
    prompts = write(tmp_path / "prompts.jsonl", [
        {"id": "label", "messages": user("Classify 'great value' as JSON."), "json_schema": SENTIMENT,
         "max_tokens": 40, "temperature": 0},
        # ignore_eos: both choices run their 5 tokens, whatever this machine draws.
        {"id": "pair", "prompt": "A short poem:", "n": 2, "max_tokens": 5, "seed": sampling_seed(4), "logprobs": True,
         "ignore_eos": True},
        {"id": "broken", "prompt": "x", "grammar": "root ::= (", "max_tokens": 5},
    ])
    out = tmp_path / "out.jsonl"
    result = run_cli("batch-run", str(prompts), "-o", str(out), "-np", "3", "--slot-ctx", "256", "--no-dashboard")
    assert result.exit_code == 1
    records = {record["id"]: record for record in read_jsonl(out)}
    assert records["label"]["finish_reason"] == "stop", f"premise: the model closes its object within 40 tokens: " \
                                                        f"{records['label']}"
    jsonschema.validate(json.loads(records["label"]["text"]), SENTIMENT)
    pair = records["pair"]
    assert pair["n"] == 2 and [choice["index"] for choice in pair["choices"]] == [0, 1]
    assert all(len(choice["logprobs"]) == choice["completion_tokens"] == 5 for choice in pair["choices"])
    assert records["broken"]["param"] == "grammar" and "cannot be compiled" in records["broken"]["error"]
