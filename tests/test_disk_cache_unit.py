"""The disk tier of the prefix cache (--cache-disk): states that outlive the process, found by
their tokens after a restart, never loaded when damaged, the folder within its bound. On the
fake backend, whose output depends on the tokens alone: a restored state gives the same text
as a prefill, so every reply is compared with a runner's that has no disk tier."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fakes import FakeBackend
from multiseq import Request, SamplingParams
from multiseq.kv import disk as disk_module
from multiseq.kv.disk import DiskTier, state_key

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
AGENT_PROMPT = "You are an agent with tools to read and write files. " * 8


def state_bytes(seed: int, size: int = 5000) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def written(tier: DiskTier, tokens, state) -> None:
    assert tier.put(np.asarray(tokens), state, wait=True)
    tier.flush()


def files_in(tier: DiskTier) -> list[str]:
    return sorted(path.name for path in tier.folder.iterdir())


def folder_bytes(tier: DiskTier) -> int:
    return sum(path.stat().st_size for path in tier.folder.iterdir())


# --- the tier alone ---------------------------------------------------------------------------

def test_a_state_written_is_found_by_its_tokens_after_a_restart_and_reads_back_exactly(tmp_path):
    tier = DiskTier(tmp_path, 1 << 20, "model-a")
    written(tier, range(100), state_bytes(1))
    tier.close()

    again = DiskTier(tmp_path, 1 << 20, "model-a")
    entry, length = again.best_match(np.array([*range(60), 7, 7], dtype=np.int64))
    assert length == 60
    assert np.array_equal(again.read(entry), state_bytes(1))
    assert again.stats.num_read == 1 and again.stats.num_damaged == 0


def test_states_of_another_model_or_setting_are_never_found(tmp_path):
    written(DiskTier(tmp_path, 1 << 20, "model-a"), range(100), state_bytes(1))
    other = DiskTier(tmp_path, 1 << 20, "model-b")
    assert other.best_match(np.arange(100)) == (None, 0)


def test_a_file_moved_under_another_key_is_damaged_not_loaded(tmp_path):
    tier = DiskTier(tmp_path, 1 << 20, "model-a")
    written(tier, range(100), state_bytes(1))
    other = DiskTier(tmp_path, 1 << 20, "model-b")
    for path in tier.folder.iterdir():
        os.replace(path, other.folder / path.name)
    again = DiskTier(tmp_path, 1 << 20, "model-b")
    assert again.num_files == 0 and again.stats.num_damaged == 1
    assert files_in(again) == []


@pytest.mark.parametrize("damage", ["flip a state byte", "flip a token byte", "cut the end", "grow the end"])
def test_a_damaged_file_is_removed_and_counted_never_loaded(tmp_path, damage):
    tier = DiskTier(tmp_path, 1 << 20, "model-a")
    written(tier, range(100), state_bytes(1))
    (path,) = tier.folder.iterdir()
    data = bytearray(path.read_bytes())
    if damage == "flip a state byte":
        data[-10] ^= 0x40
    elif damage == "flip a token byte":
        data[disk_module._HEADER.size + 8 * 50] ^= 0x01  # token 50: the file still matches the first 50
    elif damage == "cut the end":
        del data[-100:]
    else:
        data += b"\0" * 8
    path.write_bytes(bytes(data))

    again = DiskTier(tmp_path, 1 << 20, "model-a")
    entry, _ = again.best_match(np.arange(100))
    assert entry is None or again.read(entry) is None
    assert again.stats.num_damaged == 1 and again.num_files == 0 and files_in(again) == []


def test_a_file_damaged_after_the_scan_is_caught_at_its_read(tmp_path):
    tier = DiskTier(tmp_path, 1 << 20, "model-a")
    written(tier, range(100), state_bytes(1))
    entry, _ = tier.best_match(np.arange(100))
    with entry.path.open("r+b") as file:
        file.seek(-1, os.SEEK_END)
        file.write(b"\xff" if file.read(1) != b"\xff" else b"\0")
    assert tier.read(entry) is None
    assert tier.stats.num_damaged == 1 and files_in(tier) == []


def test_a_partial_file_left_by_a_crash_is_removed_at_start(tmp_path):
    tier = DiskTier(tmp_path, 1 << 20, "model-a")
    (tier.folder / "0123.kv.77.1.partial").write_bytes(b"half a state")
    again = DiskTier(tmp_path, 1 << 20, "model-a")
    assert files_in(again) == [] and again.num_bytes == 0


def test_the_folder_stays_within_its_bound_the_least_recently_used_going_first(tmp_path):
    one_file = disk_module._HEADER.size + 8 * 100 + 5000
    tier = DiskTier(tmp_path, 2 * one_file + 100, "model-a")
    written(tier, range(100), state_bytes(1))
    written(tier, range(1000, 1100), state_bytes(2))
    assert tier.read(tier.best_match(np.arange(100))[0]) is not None  # the first is used again
    written(tier, range(2000, 2100), state_bytes(3))
    assert folder_bytes(tier) <= tier.limit_bytes and tier.stats.num_evicted == 1
    assert tier.best_match(np.arange(1000, 1100))[1] == 0  # the least recently used went
    assert tier.best_match(np.arange(100))[1] == 100
    tier.close()
    # The order survives a restart: the oldest use goes first under a smaller bound.
    os.utime(tier.folder / (disk_module._name_of(np.arange(100, dtype=np.int64)) + ".kv"), (1e9, 1e9))
    again = DiskTier(tmp_path, one_file + 100, "model-a")
    assert again.best_match(np.arange(2000, 2100))[1] == 100 and again.best_match(np.arange(100))[1] == 0


def test_a_state_larger_than_the_bound_is_not_written(tmp_path):
    tier = DiskTier(tmp_path, 1000, "model-a")
    assert not tier.put(np.arange(100), state_bytes(1))
    assert files_in(tier) == []


def test_a_full_disk_loses_the_state_being_written_and_nothing_else(tmp_path, monkeypatch):
    tier = DiskTier(tmp_path, 1 << 20, "model-a")
    written(tier, range(100), state_bytes(1))
    real_write = disk_module._write_file

    def disk_full(partial, final, *args):
        partial.write_bytes(b"the start of a state")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_module, "_write_file", disk_full)
    written(tier, range(1000, 1100), state_bytes(2))
    assert tier.stats.num_failed_writes == 1 and len(files_in(tier)) == 1  # no partial file left
    monkeypatch.setattr(disk_module, "_write_file", real_write)
    written(tier, range(2000, 2100), state_bytes(3))  # room is free again
    assert tier.num_bytes == folder_bytes(tier) and tier.num_files == 2
    assert np.array_equal(tier.read(tier.best_match(np.arange(100))[0]), state_bytes(1))


def test_the_key_follows_the_model_file_not_its_path(tmp_path):
    model = tmp_path / "a.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    moved = tmp_path / "b.gguf"
    moved.write_bytes(model.read_bytes())
    changed = tmp_path / "c.gguf"
    changed.write_bytes(model.read_bytes()[:-1] + b"!")
    assert state_key(str(model), "f16") == state_key(str(moved), "f16")
    assert state_key(str(model), "f16") != state_key(str(changed), "f16")
    assert state_key(str(model), "f16") != state_key(str(model), "q8_0")


# --- the engine with a disk tier --------------------------------------------------------------

def run_prompts(make_runner, prompts, **config) -> list:
    runner = make_runner(FakeBackend(num_slots=1, window=1024), **config)
    results = [runner.submit(Request(prompt=prompt, sampling=GREEDY)).result(timeout=10) for prompt in prompts]
    runner.close()
    return results


def test_a_prompt_computed_before_a_restart_is_restored_after_it(make_runner, tmp_path):
    first = run_prompts(make_runner, [AGENT_PROMPT + "Read main.py."], cache_disk=str(tmp_path))
    after = run_prompts(make_runner, [AGENT_PROMPT + "Write tests."], cache_disk=str(tmp_path))
    without = run_prompts(make_runner, [AGENT_PROMPT + "Write tests."])
    assert first[0].prompt_tokens_cached == 0
    assert after[0].prompt_tokens_from_ram == after[0].prompt_tokens_cached > 100
    assert after[0].text == without[0].text


def test_without_the_disk_tier_a_restart_computes_the_prompt_again(make_runner, tmp_path):
    run_prompts(make_runner, [AGENT_PROMPT + "Read main.py."])
    after = run_prompts(make_runner, [AGENT_PROMPT + "Write tests."], cache_disk=str(tmp_path))
    assert after[0].prompt_tokens_cached == 0


def test_states_leaving_host_memory_go_to_disk_and_come_back_in_the_same_process(make_runner, tmp_path):
    prompts = [f"Session {number}: " + AGENT_PROMPT for number in range(3)]
    results = run_prompts(make_runner, prompts + [prompts[0] + "Go on."], cache_ram_mib=0, cache_disk=str(tmp_path))
    plain = run_prompts(make_runner, prompts + [prompts[0] + "Go on."], cache_ram_mib=0)
    assert results[3].prompt_tokens_from_ram > 100 and plain[3].prompt_tokens_cached < 20
    assert [result.text for result in results] == [result.text for result in plain]


def test_a_damaged_state_is_prefilled_instead_and_the_text_is_the_same(make_runner, tmp_path):
    run_prompts(make_runner, [AGENT_PROMPT + "Read main.py."], cache_disk=str(tmp_path))
    (damaged,) = tmp_path.rglob("*.kv")
    data = bytearray(damaged.read_bytes())
    data[-5] ^= 0xFF
    damaged.write_bytes(bytes(data))
    after = run_prompts(make_runner, [AGENT_PROMPT + "Write tests."], cache_disk=str(tmp_path))
    without = run_prompts(make_runner, [AGENT_PROMPT + "Write tests."])
    assert after[0].prompt_tokens_cached == 0 and after[0].text == without[0].text
    assert not damaged.exists()  # removed; the file there now is the new prompt's, written at close


def test_the_disk_tier_is_counted_in_the_snapshot_and_in_metrics(make_runner, serve_app, tmp_path):
    from multiseq.server import ServerSettings, create_app
    from test_server_unit import get

    run_prompts(make_runner, [AGENT_PROMPT + "Read main.py."], cache_disk=str(tmp_path))
    runner = make_runner(FakeBackend(num_slots=1, window=1024), cache_disk=str(tmp_path))
    assert runner.submit(Request(prompt=AGENT_PROMPT + "Write tests.", sampling=GREEDY)).result(timeout=10).ok
    disk = runner.snapshot().host_cache.disk
    assert (disk.num_files, disk.num_read, disk.num_damaged) == (1, 1, 0) and disk.num_bytes > 0
    status, data = get(serve_app(create_app(runner, ServerSettings(model_name="fake"))), "/metrics")
    metrics = data.decode()
    assert status == 200 and "multiseq_disk_cache_files 1.0" in metrics and "multiseq_disk_cache_reads_total 1.0" in metrics
