"""The dashboard's pure render function on a made-up snapshot."""

from __future__ import annotations

from rich.console import Console

from multiseq.cli.dashboard import RunProgress, render, render_server
from multiseq.loop.stats import HostCacheSnapshot, PoolSnapshot, RunnerSnapshot, RunStats, SlotSnapshot


def made_up_snapshot() -> RunnerSnapshot:
    stats = RunStats(num_steps=120, num_decode_steps=110, generated_tokens=1500, prompt_tokens=900, wall_s=10.0,
                     decode_tokens_per_s=287.5, prefill_tokens_per_s=1210.0, aggregate_tokens_per_s=150.0,
                     avg_seqs_per_decode_step=7.6, num_admitted=20, num_prefix_hits=15, prompt_tokens_reused=2700)
    slots = [
        SlotSnapshot(0, "story-7", "decode", 31, 120, 151, 256, 35.2, "the dragon flew over the\nharbor", True),
        SlotSnapshot(1, "q-12", "prefill", 480, 0, 256, 512, None, "", False, cached_tokens=200),
        SlotSnapshot(2, None, "idle", 0, 0, 0, 256, None, "", False, cached_tokens=190),
    ]
    return RunnerSnapshot(slots=slots, num_waiting=41, num_running=2, num_succeeded=17, num_failed=1,
                          num_cancelled=0, recent_tokens_per_s=301.4, stats=stats,
                          host_cache=HostCacheSnapshot(limit_bytes=2048 * 2**20, num_bytes=300 * 2**20, num_entries=9,
                                                       num_saved=14, num_restored=6, num_evicted=2, tokens_restored=7200),
                          pool=PoolSnapshot(size=65536, cells_used=9100, tokens_held=21400, tokens_shared=12300,
                                            num_evicted=3, num_parked=1))


def rendered_text(width: int = 160) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(render(made_up_snapshot(), RunProgress(total=61, written=18, elapsed_s=12.0)))
    return console.export_text()


def test_render_shows_every_slot_with_phase_tokens_context_and_tail():
    text = rendered_text()
    story_row = next(line for line in text.splitlines() if "story-7" in line)
    for expected in ("decode", "31", "120", "151/256", "35.2", "harbor", "slid"):
        assert expected in story_row, expected
    prefill_row = next(line for line in text.splitlines() if "q-12" in line)
    assert "prefill" in prefill_row and "256/512" in prefill_row and "slid" not in prefill_row
    assert "480 │    200" in prefill_row, "prompt tokens, then how many were reused"
    idle_row = next(line for line in text.splitlines() if line.replace("│", " ").split()[:2] == ["2", "idle"])
    assert "190 kept" in idle_row


def test_render_shows_queue_progress_and_throughput():
    text = rendered_text()
    for expected in ("waiting 41", "running 2", "done 17", "failed 1", "cancelled 0", "18/61", "ETA 28s",
                     "now 301.4 tok/s", "run 150.0 tok/s", "seqs/step 7.6", "prefill 1,210.0", "decode 287.5",
                     "prefix hits 75%", "prompt reused 75%", "RAM cache 300 / 2048 MiB", "entries 9", "saved 14",
                     "restored 6 (7200 tokens)", "evicted 2", "KV pool 9,100 / 65,536 cells", "held 21,400 tokens",
                     "shared 12,300", "moved out 3", "parked 1"):
        assert expected in text, expected


def test_render_fits_a_narrow_terminal():
    text = rendered_text(width=80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "story-7" in text


def test_the_server_view_shows_where_it_listens_slots_queue_and_throughput_without_a_progress_bar():
    console = Console(width=160, record=True, color_system=None)
    console.print(render_server(made_up_snapshot(), "http://127.0.0.1:8080"))
    text = console.export_text()
    for expected in ("serving on http://127.0.0.1:8080", "story-7", "waiting 41", "now 301.4 tok/s", "prefix hits 75%"):
        assert expected in text, expected
    assert "ETA" not in text and "/61" not in text


def test_the_server_view_names_the_device_the_model_runs_on():
    console = Console(width=160, record=True, color_system=None)
    console.print(render_server(made_up_snapshot(), "http://127.0.0.1:8080", "CUDA0 (NVIDIA L4) 31/31 layers"))
    assert "serving on http://127.0.0.1:8080, model on CUDA0 (NVIDIA L4) 31/31 layers" in console.export_text()


def test_the_server_view_counts_requests_per_api_busiest_first():
    console = Console(width=160, record=True, color_system=None)
    console.print(render_server(made_up_snapshot(), "http://127.0.0.1:8080",
                                requests_by_api={"chat": 12, "messages": 1_204, "responses": 87}))
    [line] = [line for line in console.export_text().splitlines() if "requests by API" in line]
    assert line.split() == ["requests", "by", "API", "messages", "1,204", "responses", "87", "chat", "12"]


def test_the_server_view_says_when_no_request_came_yet():
    console = Console(width=160, record=True, color_system=None)
    console.print(render_server(made_up_snapshot(), "http://127.0.0.1:8080"))
    assert "requests by API: none yet" in console.export_text()


def test_the_server_view_shows_every_other_model_with_its_state():
    console = Console(width=160, record=True, color_system=None)
    console.print(render_server(made_up_snapshot(), "http://127.0.0.1:8080",
                                others=[("gemma3-270m", "loaded", made_up_snapshot()), ("bge-small", "unloaded", None)]))
    text = console.export_text()
    assert "model gemma3-270m: loaded" in text and "model bge-small: unloaded" in text
    assert text.count("story-7") == 2, "the loaded one's slots shown too"
