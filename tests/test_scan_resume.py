"""The passes before a run: duplicate ids, --strict, item counts, and --resume's output file."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import click
import numpy as np
import pytest
from fakes import FakeBackend

from multiseq import SamplingParams
from multiseq.loop import stats as stats_module
from multiseq.formats.ids import IdSet, id_hash
from multiseq.cli.interrupts import Interrupts
from multiseq.cli.job import OpenedRunner
from multiseq.formats.reader import PromptFormat, TextMode
from multiseq.formats.resume import keep_succeeded_lines
from multiseq.formats.scan import MAX_LISTED, scan_file
from multiseq.loop.stats import RECENT_WINDOW_S, StatsRecorder


def scan(path, prompt_format=PromptFormat.JSONL, strict=False, keep_id_hashes=False):
    return scan_file(path, prompt_format, strict, SamplingParams(), TextMode.CHAT, keep_id_hashes)


def test_duplicates_are_named_with_their_lines_and_only_the_first_few(tmp_path):
    lines = [json.dumps({"id": f"d{index % 8}" if index < 40 else f"u{index}", "prompt": "x"}) for index in range(60)]
    lines[50] = json.dumps({"id": "d0", "prompt": "x"})
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n\n")
    found = scan(path)
    assert found.num_items == 60
    assert found.duplicates[0] == "'d0' (lines 1, 9, 17, 25, 33, 51)"
    assert len(found.duplicates) == 5


def test_an_id_on_a_line_that_cannot_run_counts_as_its_line_number(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": "2", "prompt": "a"}\nnot json\n')
    assert scan(path).duplicates == ["'2' (lines 1, 2)"]


def test_strict_keeps_the_first_messages_and_counts_the_rest(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join("{bad\n" if index % 2 else '{"prompt": "ok"}\n' for index in range(200)))
    found = scan(path, strict=True)
    assert found.num_bad == 100 and len(found.bad_lines) == MAX_LISTED
    assert found.bad_lines[0].startswith("line 2: not valid JSON")


def test_a_text_file_is_counted_without_a_pass(tmp_path, monkeypatch):
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"one\n\n  \r\ntwo\n\xff\xfe\nthree")
    monkeypatch.setattr("multiseq.formats.scan.iter_lines", lambda path: pytest.fail("a text file needs no id pass"))
    assert scan(path, PromptFormat.TEXT).num_items == 4


def test_resume_counts_done_items_from_the_hashes(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("a\nb\n\nc\n")
    found = scan(path, PromptFormat.TEXT, keep_id_hashes=True)
    found.count_done(IdSet.of(["1", "4", "3", "99"]))  # line 3 is blank: no item "3"
    assert found.num_to_run == 1 and found.id_hashes is None


def test_an_id_set_answers_membership_by_hash():
    ids = IdSet.of([f"id-{index}" for index in range(1000)] + ["id-5"])
    assert len(ids) == 1000 and "id-999" in ids and "id-1000" not in ids and "\ud800" not in ids
    assert ids.count_in(np.array([id_hash("id-1"), id_hash("nope"), id_hash("id-1")], dtype=np.uint64)) == 2


def line(record: dict) -> str:
    return json.dumps(record) + "\n"


def test_resume_keeps_each_succeeded_id_once_and_drops_everything_else(tmp_path):
    out = tmp_path / "out.jsonl"
    ok = {"id": "a", "text": "x", "finish_reason": "stop", "error": None}
    out.write_bytes("".join([
        line(ok),
        line({"id": "b", "finish_reason": "cancelled", "error": None}),
        line({"id": "c", "finish_reason": "error", "error": "boom"}),
        line(dict(ok, text="second copy")),
        line({"finish_reason": "stop", "error": None}),  # names no id
        line({"custom_id": "o1", "response": None, "error": {"code": "x"}}),
        line({"custom_id": "o2", "response": {"status_code": 200, "body": {"choices": [{"finish_reason": "length"}]}}}),
        line({"custom_id": "o3", "response": {"status_code": 200, "body": {"choices": "odd"}}}),
        "[1, 2]\n",
    ]).encode() + b'{"id": "\xff", "finish_reason": "stop"}\n' + b'{"id": "d", "text": "torn')
    done = keep_succeeded_lines(out)
    assert "a" in done and "o2" in done and len(done) == 2
    kept = [json.loads(text) for text in out.read_text().splitlines()]
    assert [record.get("id", record.get("custom_id")) for record in kept] == ["a", "o2"]
    assert kept[0]["text"] == "x", "the first line of a repeated id is kept"
    assert not list(tmp_path.glob("*.resume")), "no temporary file is left"


def test_resume_of_a_missing_output_starts_empty(tmp_path):
    assert len(keep_succeeded_lines(tmp_path / "absent.jsonl")) == 0


def test_a_first_ctrl_c_before_the_run_raises_and_during_it_calls_the_run():
    interrupts = Interrupts()
    with pytest.raises(KeyboardInterrupt):
        interrupts.interrupt()
    calls = []
    interrupts = Interrupts()
    interrupts.listen(lambda: calls.append("stop"))
    interrupts.interrupt()
    assert calls == ["stop"]


def test_a_ctrl_c_while_the_model_loads_ends_the_command_once_the_load_returns(tmp_path, fake_job, make_runner):
    """llama.cpp calls back into Python while it loads (its log lines), where a raised
    KeyboardInterrupt would be printed and dropped: the Ctrl-C must instead take effect once
    the load returns, with nothing run and nothing written."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x"}\n')
    interrupts, opened = Interrupts(), []

    def ctrl_c_inside_a_llama_callback():
        try:
            interrupts.interrupt()  # what the signal handler does
        except KeyboardInterrupt:
            pass  # ctypes prints an exception raised in a callback, then drops it

    def loading_when_ctrl_c_comes(config):
        ctrl_c_inside_a_llama_callback()
        opened.append(OpenedRunner(make_runner(FakeBackend()), "fake"))
        return opened[-1]

    with pytest.raises(KeyboardInterrupt):
        fake_job(prompts, tmp_path / "out.jsonl", interrupts=interrupts, open_runner=loading_when_ctrl_c_comes)
    assert opened and opened[0].runner._closed, "the loaded runner is closed"
    out = tmp_path / "out.jsonl"
    assert not out.exists() or not out.read_text()

    def failing_after_ctrl_c(config):
        ctrl_c_inside_a_llama_callback()
        raise click.ClickException("could not fetch the model")  # the fetch's pip got the Ctrl-C too

    interrupts = Interrupts()
    with pytest.raises(KeyboardInterrupt):
        fake_job(prompts, tmp_path / "out.jsonl", interrupts=interrupts, open_runner=failing_after_ctrl_c)


def test_step_rates_are_forgotten_even_when_nobody_reads_them(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(stats_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    recorder = StatsRecorder()
    for _ in range(10_000):
        clock[0] += 0.01
        recorder.record_step(0.01, 4, 0, 4)
    assert len(recorder._recent) <= RECENT_WINDOW_S / 0.01 + 1
    assert recorder.recent_tokens_per_s(clock[0]) == pytest.approx(400)


class _CtrlCOnImport:
    """A module finder that raises KeyboardInterrupt when `name` is imported, as a Ctrl-C in
    the first few hundred milliseconds of `multiseq` would."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name:
            raise KeyboardInterrupt
        return None


def test_a_ctrl_c_while_the_command_imports_is_one_line_and_exit_130(monkeypatch, capsys):
    from multiseq.cli import entry

    monkeypatch.delitem(sys.modules, "multiseq.cli.main")
    monkeypatch.setattr(sys, "meta_path", [_CtrlCOnImport("multiseq.cli.main"), *sys.meta_path])
    with pytest.raises(SystemExit) as exit_info:
        entry.main()
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"
