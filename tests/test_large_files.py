"""Prompt files far larger than the run's window, on the fake backend: streaming, memory,
interrupts, --resume. (The same with the real model and a real Ctrl-C: test_edges_cli.py.)"""

from __future__ import annotations

import io
import json
import threading
import time
import tracemalloc
from pathlib import Path

from fakes import FakeBackend
from multiseq import SamplingParams
from multiseq.formats.batchrun import BatchRun
from multiseq.cli.dashboard import _Display
from multiseq.cli.interrupts import Interrupts
from multiseq.formats.output import OutputError, ResultSink, ResultWriter
from multiseq.formats.reader import PromptFormat, TextMode, read_prompts

BIG = 200_000
WINDOW = 16
SHORT = SamplingParams(max_tokens=2, temperature=0)


def write_prompts(path: Path, count: int, max_tokens: int | None = None) -> Path:
    extra = f', "max_tokens": {max_tokens}' if max_tokens else ""
    path.write_text("".join(f'{{"id": "r{index}", "prompt": "prompt {index}"{extra}}}\n' for index in range(count)))
    return path


class CountingItems:
    """The items of a file, counting how many the run has pulled."""

    def __init__(self, path: Path) -> None:
        self._items = read_prompts(path, PromptFormat.JSONL, SHORT, TextMode.COMPLETION)
        self.pulled = 0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self._items)
        self.pulled += 1
        return item


class WatchingSink:
    """Keeps the lines written and, at each, how many items had been pulled; calls `at_line`
    with the number of lines so far."""

    def __init__(self, items: CountingItems, at_line=None) -> None:
        self.lines: list[bytes] = []
        self.pulled_at_line: list[int] = []
        self._items = items
        self._at_line = at_line

    def write_line(self, data: bytes) -> None:
        self.lines.append(data)
        self.pulled_at_line.append(self._items.pulled)
        if self._at_line is not None:
            self._at_line(len(self.lines))


def stream_file(path: Path, make_runner, num_items: int, stop_after: int | None = None):
    """Run the file through BatchRun on a 4-slot fake; interrupt after `stop_after` lines.
    Returns the outcome, the sink, the counting iterator and the seconds the interrupt took."""
    runner = make_runner(FakeBackend(num_slots=4, window=64, n_batch=64))
    items = CountingItems(path)
    interrupted_at: list[float] = []

    def at_line(count: int) -> None:
        if count == stop_after:
            interrupted_at.append(time.perf_counter())
            run.interrupt()

    sink = WatchingSink(items, at_line)
    run = BatchRun(runner, items, num_items, ResultWriter(sink, keep_input_order=False), PromptFormat.JSONL, "fake",
                   WINDOW)
    with runner:
        outcome = run.execute(_Display(num_items))
        ended = time.perf_counter()
    stop_seconds = ended - interrupted_at[0] if interrupted_at else None
    return outcome, sink, items, stop_seconds


def test_a_huge_file_streams_through_a_bounded_window_and_stops_at_once(tmp_path, make_runner):
    path = write_prompts(tmp_path / "big.jsonl", BIG)
    outcome, sink, items, stop_seconds = stream_file(path, make_runner, BIG, stop_after=2_000)
    assert sink.pulled_at_line[0] <= WINDOW, "the first result came before the reader went past the window"
    open_items = [pulled - written for written, pulled in enumerate(sink.pulled_at_line)]
    assert max(open_items) <= WINDOW, "never more than the window read and not yet written"
    assert items.pulled < 2_000 + 2 * WINDOW, "reading stopped with the interrupt"
    assert outcome.interrupted and stop_seconds < 1.0
    assert outcome.tally.num_not_started + len(sink.lines) == BIG, "every item is written or counted as not started"
    ids = [json.loads(line)["id"] for line in sink.lines]
    assert len(set(ids)) == len(ids)


def test_memory_does_not_grow_with_the_file(tmp_path, make_runner):
    """The same 1,000 results from a 1,000-line file and from a 200,000-line one: the run's
    peak of traced memory is the same to within what 5 bytes per extra line would cost."""
    small = write_prompts(tmp_path / "small.jsonl", 1_000)
    big = write_prompts(tmp_path / "big.jsonl", BIG)
    peaks = []
    for path, num_items in ((small, 1_000), (big, BIG)):
        tracemalloc.start()
        outcome, sink, _, _ = stream_file(path, make_runner, num_items, stop_after=1_000)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert len(sink.lines) >= 1_000
    assert peaks[1] - peaks[0] < 5 * (BIG - 1_000), f"peak {peaks[1]:,} B with the big file, {peaks[0]:,} B with the small"


def interrupt_when(output: Path, num_lines: int, interrupts: Interrupts) -> threading.Thread:
    """A thread that interrupts the run (as a first Ctrl-C does) once the output has num_lines lines."""
    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if output.exists() and output.read_bytes().count(b"\n") >= num_lines:
                interrupts.interrupt()
                return
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_interrupted_runs_resumed_end_with_every_id_once(tmp_path, fake_job, read_jsonl):
    """Interrupt, resume and interrupt again, tear the last line as kill -9 might, resume to the
    end: every id is in the output exactly once, and all succeeded."""
    count = 3_000
    prompts = write_prompts(tmp_path / "prompts.jsonl", count, max_tokens=3)
    out = tmp_path / "out.jsonl"
    for resume, stop_at in ((False, 500), (True, 1_500)):
        interrupts = Interrupts()
        watcher = interrupt_when(out, stop_at, interrupts)
        assert fake_job(prompts, out, resume=resume, interrupts=interrupts) == 130
        watcher.join()
        records = read_jsonl(out)
        ids = [record["id"] for record in records]
        assert len(ids) == len(set(ids)) and len(ids) < count
        assert {record["finish_reason"] for record in records} <= {"length", "cancelled"}
        assert not any(record["error"] for record in records), "no line for requests that never started"
    with out.open("ab") as handle:
        handle.write(b'{"id": "r7", "text": "torn by a kil')
    assert fake_job(prompts, out, resume=True) == 0
    final = read_jsonl(out)
    assert sorted(record["id"] for record in final) == sorted(f"r{index}" for index in range(count))
    assert all(record["finish_reason"] == "length" for record in final)


def test_in_input_order_an_interrupted_run_leaves_gaps_only_where_nothing_started(tmp_path, fake_job, read_jsonl):
    prompts = write_prompts(tmp_path / "prompts.jsonl", 2_000, max_tokens=3)
    out = tmp_path / "out.jsonl"
    interrupts = Interrupts()
    watcher = interrupt_when(out, 300, interrupts)
    assert fake_job(prompts, out, keep_input_order=True, interrupts=interrupts) == 130
    watcher.join()
    records = read_jsonl(out)
    positions = [int(record["id"][1:]) for record in records]
    assert positions == sorted(positions) and positions[:300] == list(range(300))
    assert not any(record["error"] for record in records), "no line for requests that never started"
    assert fake_job(prompts, out, keep_input_order=True, resume=True) == 0
    assert sorted(int(record["id"][1:]) for record in read_jsonl(out)) == list(range(2_000))


class FailingSink:
    """A disk that fills up after `room` lines."""

    def __init__(self, room: int) -> None:
        self.lines: list[bytes] = []
        self.room = room

    def write_line(self, data: bytes) -> None:
        if len(self.lines) >= self.room:
            raise OutputError("cannot write results to out.jsonl: No space left on device")
        self.lines.append(data)


def test_a_failed_write_stops_the_run_at_once_and_keeps_what_was_written(tmp_path, make_runner):
    backend = FakeBackend(num_slots=4, window=64, n_batch=64, decode_delay=0.001)
    runner = make_runner(backend)
    path = write_prompts(tmp_path / "prompts.jsonl", 5_000, max_tokens=20)
    sink = FailingSink(room=10)
    run = BatchRun(runner, iter(CountingItems(path)), 5_000, ResultWriter(sink, False), PromptFormat.JSONL, "fake",
                   WINDOW)
    with runner:
        try:
            run.execute(_Display(5_000))
        except OutputError:
            pass
        else:
            raise AssertionError("the write failure must end the run")
        assert runner.snapshot().num_waiting == 0, "everything queued was cancelled"
        num_decodes = len(backend.calls)
        time.sleep(0.05)
        assert len(backend.calls) <= num_decodes + 1, "nothing decodes after the failure"
    assert len(sink.lines) == 10


def test_an_unbuffered_file_sink_reports_a_full_disk(tmp_path):
    sink = ResultSink(open("/dev/full", "ab", buffering=0), "/dev/full")
    try:
        sink.write_line(b"{}\n")
    except OutputError as error:
        assert str(error) == "cannot write results to /dev/full: No space left on device"
    else:
        raise AssertionError("/dev/full accepted a line")
    finally:
        sink.close()


def test_a_sink_writes_whole_lines_through_short_writes():
    class Trickle(io.RawIOBase):
        def __init__(self) -> None:
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, chunk) -> int:
            self.data += bytes(chunk[:3])  # the OS may take fewer bytes than it was given
            return min(3, len(chunk))

    stream = Trickle()
    ResultSink(stream, "trickle").write_line(b'{"id": "a"}\n')
    assert bytes(stream.data) == b'{"id": "a"}\n'


def test_a_line_whose_id_is_that_of_another_lines_choice_gets_its_own_result(tmp_path, fake_job, read_jsonl):
    """Choice k of line `x` runs as `x#k`; a line of its own called `x#1` must not be mixed up
    with it, whichever is submitted first."""
    lines = [{"id": "x", "prompt": "aa", "n": 2, "seed": 1}, {"id": "x#1", "prompt": "bbbb"},
             {"id": "y#0", "prompt": "cc"}, {"id": "y", "prompt": "dd", "n": 2, "seed": 2}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    assert fake_job(prompts, out) == 0
    records = {record["id"]: record for record in read_jsonl(out)}
    assert sorted(records) == ["x", "x#1", "y", "y#0"]
    assert records["x"]["n"] == records["y"]["n"] == 2 and len(records["x"]["choices"]) == 2
    assert records["x#1"]["prompt_tokens"] != records["x"]["prompt_tokens"], "its own prompt, not a choice of x"
    assert records["y#0"]["finish_reason"] == "length" and records["y#0"]["error"] is None
