"""llama-server's slot routes on the fake backend: GET /slots lists every slot, live; POST
/slots/{id}?action=save|restore|erase keeps a slot's KV in a file of --slot-save-path and gives
it back (to the same server, or one started later), in llama-server's shapes, and refuses what
it cannot do with a 4xx naming why."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fakes import FakeBackend
from helpers import wait_until
from multiseq import Request, SamplingParams
from multiseq.server import ServerSettings, create_app
from test_server_unit import assert_error_shape, get, post

PROMPT = "<user>" + "Summarize the repository layout for a new contributor. " * 4 + "<assistant>"
MESSAGES = [{"role": "user", "content": "Summarize the repository layout for a new contributor. " * 4}]


@pytest.fixture
def slot_server(make_runner, serve_app):
    def start(num_slots: int = 2, model_path: str | None = None, **settings):
        backend = FakeBackend(num_slots=num_slots, window=512, n_batch=64, replies={PROMPT: "Done."})
        if model_path is not None:
            backend.facts = dataclasses.replace(backend.facts, path=model_path)
        runner = make_runner(backend)
        return serve_app(create_app(runner, ServerSettings(model_name="fake", **settings))), runner
    return start


def chat(base: str) -> dict:
    status, body, _ = post(base, "/v1/chat/completions", json.dumps({"messages": MESSAGES, "max_tokens": 8}))
    assert status == 200
    return body


def slots(base: str) -> list[dict]:
    status, data = get(base, "/slots")
    assert status == 200
    return json.loads(data)


def action(base: str, slot: int, name: str, filename: str | None = "chat.kv") -> tuple[int, dict]:
    status, body, _ = post(base, f"/slots/{slot}?action={name}", json.dumps({} if filename is None else {"filename": filename}))
    return status, body


def kept_slot(base: str) -> dict:
    (slot,) = [slot for slot in slots(base) if slot["n_prompt_tokens_cache"] > 0]
    return slot


def test_slots_are_listed_idle_and_busy(slot_server):
    base, runner = slot_server(num_slots=1)
    assert [(slot["id"], slot["is_processing"], slot["n_ctx"]) for slot in slots(base)] == [(0, False, 512)]
    assert get(base, "/slots?fail_on_no_slot=1")[0] == 200
    handle = runner.submit(Request(prompt="x", sampling=SamplingParams(max_tokens=10_000, ignore_eos=True)))
    wait_until(lambda: slots(base)[0]["is_processing"])
    busy = slots(base)[0]
    assert busy["id_task"] == handle.id and busy["next_token"][0]["n_decoded"] >= 0
    status, data = get(base, "/slots?fail_on_no_slot=1")
    assert status == 503 and json.loads(data)["error"]["message"] == "no slot available"
    runner.cancel(handle.id)


def test_a_slot_saved_erased_and_restored_serves_its_prompt_again(slot_server, tmp_path):
    base, _ = slot_server(slot_save_path=tmp_path)
    first = chat(base)
    slot = kept_slot(base)
    status, saved = action(base, slot["id"], "save")
    assert status == 200 and saved["filename"] == "chat.kv" and saved["n_saved"] == slot["n_prompt_tokens_cache"]
    assert saved["n_written"] == (tmp_path / "chat.kv").stat().st_size and "save_ms" in saved["timings"]
    status, erased = action(base, slot["id"], "erase", filename=None)
    assert (status, erased) == (200, {"id_slot": slot["id"], "n_erased": saved["n_saved"]})
    assert all(slot["n_prompt_tokens_cache"] == 0 for slot in slots(base))
    status, restored = action(base, 1 - slot["id"], "restore")
    assert status == 200 and restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
    assert kept_slot(base)["id"] == 1 - slot["id"]
    again = chat(base)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 40
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]


def test_a_slot_saved_by_one_server_is_restored_by_the_next(slot_server, tmp_path):
    base, _ = slot_server(slot_save_path=tmp_path)
    chat(base)
    assert action(base, kept_slot(base)["id"], "save")[0] == 200
    later, _ = slot_server(slot_save_path=tmp_path)
    assert action(later, 0, "restore")[0] == 200
    assert chat(later)["usage"]["prompt_tokens_details"]["cached_tokens"] > 40


def test_without_a_save_path_save_and_restore_are_501_and_erase_works(slot_server):
    base, _ = slot_server()
    chat(base)
    status, body = action(base, 0, "save")
    assert status == 501 and "--slot-save-path" in body["error"]["message"]
    assert action(base, kept_slot(base)["id"], "erase", filename=None)[0] == 200


@pytest.mark.parametrize("path, body, param", [
    ("/slots/0?action=save", {"filename": "../outside.kv"}, "filename"),
    ("/slots/0?action=save", {"filename": "/etc/passwd"}, "filename"),
    ("/slots/0?action=save", {}, "filename"),
    ("/slots/7?action=save", {"filename": "a.kv"}, "id_slot"),
    ("/slots/x?action=erase", {}, "id_slot"),
    ("/slots/0?action=copy", {"filename": "a.kv"}, "action"),
])
def test_a_bad_action_is_400_naming_what_is_wrong(slot_server, tmp_path, path, body, param):
    base, _ = slot_server(slot_save_path=tmp_path)
    status, answer, _ = post(base, path, json.dumps(body))
    assert status == 400
    assert_error_shape(answer, "invalid_request_error", param=param)
    assert list(tmp_path.iterdir()) == []


def test_saving_a_slot_that_keeps_nothing_is_400(slot_server, tmp_path):
    base, _ = slot_server(slot_save_path=tmp_path)
    status, body = action(base, 0, "save")
    assert status == 400 and "keeps nothing" in body["error"]["message"]


def test_a_missing_damaged_or_foreign_file_is_refused_and_nothing_restored(slot_server, tmp_path):
    base, _ = slot_server(slot_save_path=tmp_path)
    assert action(base, 0, "restore", "missing.kv")[0] == 404
    chat(base)
    assert action(base, kept_slot(base)["id"], "save")[0] == 200
    data = bytearray((tmp_path / "chat.kv").read_bytes())
    data[-3] ^= 0x20
    (tmp_path / "damaged.kv").write_bytes(bytes(data))
    (tmp_path / "notes.kv").write_text("not a state")
    for name in ("damaged.kv", "notes.kv"):
        status, body = action(base, 0, "restore", name)
        assert status == 400 and body["error"]["param"] == "filename" and str(tmp_path) not in body["error"]["message"]
    same, _ = slot_server(slot_save_path=tmp_path)
    assert action(same, 0, "restore")[0] == 200  # the same model file: its states are valid
    other, _ = slot_server(slot_save_path=tmp_path, model_path="/models/other.gguf")
    status, body = action(other, 0, "restore")
    assert status == 400 and "another model" in body["error"]["message"]
