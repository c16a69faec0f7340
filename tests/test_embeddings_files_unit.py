"""Embedding files through batch-run on the fake backend: JSONL lines with `input` (a vector per
line out, beside generation lines), OpenAI Batch lines whose url is /v1/embeddings, a bad line
its own error, and --resume running only what did not finish."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from fakes import BOS, FakeBackend, fake_embedding_rows


def write(path: Path, lines: list) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def normalized_mean(text: str) -> np.ndarray:
    mean = fake_embedding_rows([BOS, *text.encode()]).astype(np.float64).mean(axis=0)
    return mean / np.linalg.norm(mean)


def test_a_jsonl_file_gets_a_normalized_vector_per_input_line_beside_generation_lines(tmp_path, fake_job, read_jsonl):
    prompts = write(tmp_path / "docs.jsonl", [
        {"id": "a", "input": "The first document."},
        {"id": "b", "input": "A second one.", "pooling": "last"},
        {"id": "c", "input": ""},
        {"id": "d", "prompt": "Say hi"},
        {"id": "e", "input": [BOS, *b"Token ids."]},
    ])
    out = tmp_path / "out.jsonl"
    assert fake_job(prompts, out) == 1  # line c failed
    records = {record["id"]: record for record in read_jsonl(out)}
    assert np.allclose(records["a"]["embedding"], normalized_mean("The first document."), atol=1e-6)
    last = fake_embedding_rows([BOS, *b"A second one."])[-1].astype(np.float64)
    assert np.allclose(records["b"]["embedding"], last / np.linalg.norm(last), atol=1e-6)
    assert np.allclose(records["e"]["embedding"], normalized_mean("Token ids."), atol=1e-6)
    assert records["a"]["finish_reason"] == "stop" and records["a"]["prompt_tokens"] == len("The first document.") + 1
    assert records["c"]["error"] == "line 3: 'input' is empty: there is nothing to embed" and records["c"]["param"] == "input"
    assert records["d"]["text"] and "embedding" not in records["d"]


def test_resume_embeds_only_the_lines_that_did_not_finish(tmp_path, fake_job, read_jsonl):
    prompts = write(tmp_path / "docs.jsonl", [{"id": str(index), "input": f"document {index}"} for index in range(4)])
    out = tmp_path / "out.jsonl"
    assert fake_job(prompts, out) == 0
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:2]) + "\n")  # as if the run had stopped after two lines
    backend = FakeBackend(num_slots=4, window=64, n_batch=64)
    assert fake_job(prompts, out, backend=backend, resume=True) == 0
    records = read_jsonl(out)
    assert sorted(record["id"] for record in records) == ["0", "1", "2", "3"]
    assert sum(len(call.embedding_slots) for call in backend.calls) == 2, "only the two missing lines ran"


def test_openai_batch_lines_to_v1_embeddings_answer_in_openais_shape(tmp_path, fake_job, read_jsonl):
    url = "/v1/embeddings"
    prompts = write(tmp_path / "batch.jsonl", [
        {"custom_id": "pair", "method": "POST", "url": url, "body": {"model": "m", "input": ["one", "two"]}},
        {"custom_id": "b64", "method": "POST", "url": url, "body": {"input": "three", "encoding_format": "base64"}},
        {"custom_id": "wide", "method": "POST", "url": url, "body": {"input": "four", "dimensions": 12}},
        {"custom_id": "empty", "method": "POST", "url": url, "body": {"input": ["ok", ""]}},
    ])
    out = tmp_path / "out.jsonl"
    assert fake_job(prompts, out) == 1
    records = {record["custom_id"]: record["response"] for record in read_jsonl(out)}
    body = records["pair"]["body"]
    assert records["pair"]["status_code"] == 200 and body["object"] == "list"
    assert [item["index"] for item in body["data"]] == [0, 1]
    assert np.allclose(body["data"][1]["embedding"], normalized_mean("two"), atol=1e-6)
    assert body["usage"]["prompt_tokens"] == len("one") + len("two") + 2
    vector = np.frombuffer(base64.b64decode(records["b64"]["body"]["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(vector, normalized_mean("three"), atol=1e-6)
    assert records["wide"]["status_code"] == 400 and records["wide"]["body"]["error"]["param"] == "dimensions"
    assert "have 8 dimensions" in records["wide"]["body"]["error"]["message"]
    assert records["empty"]["status_code"] == 400 and records["empty"]["body"]["error"]["param"] == "input[1]"
