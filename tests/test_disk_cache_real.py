"""The disk tier on real models: a conversation computed by one runner, closed (a restart), is
restored from its file by the next one, and the greedy continuation is the one a runner without
a disk tier computes; a damaged file is never restored."""

from __future__ import annotations

import pytest

from multiseq import Request, SamplingParams

pytestmark = pytest.mark.model

SYSTEM = ("You are a coding agent. You read files, run commands and write patches. Keep answers short and "
          "say which file you change. ") * 4
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Read main.py and summarize it."}]


def turn(messages: list[dict]) -> Request:
    return Request(messages=messages, sampling=SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))


def second_turn(first_reply: str) -> list[dict]:
    return [*FIRST, {"role": "assistant", "content": first_reply}, {"role": "user", "content": "Now add a test."}]


@pytest.mark.parametrize("model_name", ["smollm2-135m", "gemma3-270m"])
def test_a_conversation_resumed_after_a_restart_continues_as_without_the_disk_tier(model_name, unpacked_model,
                                                                                   real_runner, tmp_path):
    model = unpacked_model(model_name)
    before = real_runner(model, 2, batch_invariant=True, cache_disk=str(tmp_path))
    reply = before.submit(turn(FIRST)).result().text
    before.close()  # what the slot keeps goes to disk
    assert len(list(tmp_path.rglob("*.kv"))) == 1

    after = real_runner(model, 2, batch_invariant=True, cache_disk=str(tmp_path))
    resumed = after.submit(turn(second_turn(reply))).result()
    plain = real_runner(model, 2, batch_invariant=True).submit(turn(second_turn(reply))).result()
    assert resumed.text == plain.text
    if model_name == "smollm2-135m":  # Gemma's sliding-window layers keep only their window: prefilled instead
        assert resumed.prompt_tokens_from_ram >= 100 and plain.prompt_tokens_cached == 0
        assert after.snapshot().host_cache.disk.num_read == 1


def test_a_damaged_state_file_is_removed_and_the_prompt_computed(unpacked_model, real_runner, tmp_path):
    smollm = unpacked_model("smollm2-135m")
    before = real_runner(smollm, 1, batch_invariant=True, cache_disk=str(tmp_path))
    reply = before.submit(turn(FIRST)).result().text
    before.close()
    (path,) = tmp_path.rglob("*.kv")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit in the middle of the KV
    path.write_bytes(bytes(data))

    after = real_runner(smollm, 1, batch_invariant=True, cache_disk=str(tmp_path))
    resumed = after.submit(turn(second_turn(reply))).result()
    plain = real_runner(smollm, 1, batch_invariant=True).submit(turn(second_turn(reply))).result()
    assert resumed.prompt_tokens_cached == 0 and resumed.text == plain.text
    assert after.snapshot().host_cache.disk.num_damaged == 1 and not path.exists()
