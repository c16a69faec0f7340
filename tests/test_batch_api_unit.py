"""The Files and Batch APIs on the fake backend, spoken to with the real openai client: uploads,
batches created, polled, listed and cancelled, their output parsed back with the SDK's types,
bad lines and bad files, limits, resuming after a stop and after a torn line, and batch work
kept below interactive requests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import openai
import pytest
from openai.types import Batch, Completion, FileObject
from openai.types.chat import ChatCompletion

from fakes import FakeBackend
from helpers import serving, wait_until
from multiseq import Priority
from multiseq.formats.output import OutputError, ResultSink
from multiseq.server import ServerSettings, create_app
from multiseq.server.batches import LINES_PER_SLOT

MODEL = "fake-model"
HI = "<user>Hi<assistant>"  # how the fake backend renders [{"role": "user", "content": "Hi"}]
REPLY = "Hello there, friend!"
ENDED = ("completed", "failed", "cancelled")


def chat_line(custom_id: str, **body) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def completion_line(custom_id: str, prompt: str = "abc", max_tokens: int = 4, **body) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body})


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def batch_server(make_runner, serve_app, data_dir):
    """batch_server(backend=None, **settings) -> (openai client, base URL, runner): a server
    keeping its files and batches in data_dir."""
    def start(backend: FakeBackend | None = None, **settings):
        backend = backend or FakeBackend(num_slots=4, window=256, n_batch=64, replies={HI: REPLY})
        runner = make_runner(backend)
        settings.setdefault("data_dir", data_dir)
        app = create_app(runner, ServerSettings(model_name=MODEL, **settings))
        base = serve_app(app)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=settings.get("api_key") or "unused", max_retries=0)
        return client, base, runner
    return start


def upload(client: openai.OpenAI, tmp_path: Path, lines: list[str], name: str = "input.jsonl") -> FileObject:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    with path.open("rb") as handle:
        return client.files.create(file=handle, purpose="batch")


def run_batch(client: openai.OpenAI, file_id: str, endpoint: str = "/v1/chat/completions", **create) -> Batch:
    return client.batches.create(input_file_id=file_id, endpoint=endpoint, completion_window="24h", **create)


def wait_for_end(client: openai.OpenAI, batch_id: str, timeout: float = 30) -> Batch:
    found: list[Batch] = []

    def ended() -> bool:
        found[:] = [client.batches.retrieve(batch_id)]
        return found[0].status in ENDED

    wait_until(ended, timeout, f"the end of batch {batch_id}")
    return found[0]


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def custom_ids(*files: list[dict]) -> list[str]:
    return sorted(line["custom_id"] for lines in files for line in lines)


def assert_error_shape(body: dict, kind: str, param: str | None = None, code: str | None = None) -> None:
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == kind and body["error"]["param"] == param and body["error"]["code"] == code
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]


# --- what works ----------------------------------------------------------------------------------

def test_a_chat_batch_runs_and_its_output_parses_with_the_sdk_types(batch_server, tmp_path):
    client, _, _ = batch_server()
    source = upload(client, tmp_path, [chat_line(f"q{index}") for index in range(6)] + [chat_line("two", n=2)])
    assert isinstance(source, FileObject) and source.purpose == "batch" and source.filename == "input.jsonl"
    assert source.bytes == (tmp_path / "input.jsonl").stat().st_size
    assert client.files.content(source.id).content == (tmp_path / "input.jsonl").read_bytes()
    created = run_batch(client, source.id, metadata={"job": "nightly"})
    assert created.status == "validating" and created.metadata == {"job": "nightly"} and created.model == MODEL
    batch = wait_for_end(client, created.id)
    assert batch.status == "completed" and batch.error_file_id is None and batch.errors is None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (7, 7, 0)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.expires_at
    output = client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output" and output.filename == f"{batch.id}_output.jsonl"
    lines = lines_of(client, batch.output_file_id)
    assert custom_ids(lines) == sorted([f"q{index}" for index in range(6)] + ["two"])
    for line in lines:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert all(choice.message.content == REPLY for choice in completion.choices)
        assert len(completion.choices) == (2 if line["custom_id"] == "two" else 1)


def test_a_completions_batch(batch_server, tmp_path):
    client, _, _ = batch_server()
    source = upload(client, tmp_path, [completion_line("a", "abc", 5), completion_line("b", "xyz", 3)])
    batch = wait_for_end(client, run_batch(client, source.id, endpoint="/v1/completions").id)
    texts = {line["custom_id"]: Completion.model_validate(line["response"]["body"]).choices[0].text
             for line in lines_of(client, batch.output_file_id)}
    assert texts == {"a": "defgh", "b": "{|}"}


def test_bad_lines_are_error_lines_and_the_rest_runs(batch_server, tmp_path):
    client, _, _ = batch_server()
    source = upload(client, tmp_path, [
        chat_line("good"),
        "{this is not json",
        chat_line("other-model", model="gpt-4o"),
        completion_line("wrong-url"),
        chat_line("bad-field", temperature="hot"),
        chat_line("also-good"),
    ])
    batch = wait_for_end(client, run_batch(client, source.id).id)
    assert batch.status == "completed"
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (6, 2, 4)
    assert custom_ids(lines_of(client, batch.output_file_id)) == ["also-good", "good"]
    errors = {line["custom_id"]: line["response"] for line in lines_of(client, batch.error_file_id)}
    assert set(errors) == {"2", "other-model", "wrong-url", "bad-field"}  # a line that is not JSON: its number
    for response in errors.values():
        assert response["status_code"] == 400
        assert_error_shape(response["body"], "invalid_request_error", response["body"]["error"]["param"])
    assert errors["2"]["body"]["error"]["message"].startswith("line 2: not valid JSON")
    assert errors["other-model"]["body"]["error"]["param"] == "model"
    assert errors["wrong-url"]["body"]["error"]["param"] == "url"
    assert errors["bad-field"]["body"]["error"]["param"] == "temperature"


def test_batches_and_files_are_listed_newest_first_page_by_page(batch_server, tmp_path):
    client, _, _ = batch_server()
    source = upload(client, tmp_path, [chat_line("only")])
    made = [run_batch(client, source.id).id for _ in range(3)]
    first = client.batches.list(limit=2)
    assert [batch.id for batch in first.data] == made[::-1][:2] and first.has_more
    assert [batch.id for batch in client.batches.list(limit=2, after=made[1]).data] == [made[0]]
    assert [batch.id for batch in client.batches.list(limit=2)] == made[::-1], "auto-pagination follows has_more"
    for batch_id in made:
        wait_for_end(client, batch_id)
    files = [file.id for file in client.files.list()]
    assert files[-1] == source.id and len(files) == 4  # the input, and each batch's output
    assert [file.id for file in client.files.list(purpose="batch")] == [source.id]
    assert [file.id for file in client.files.list(order="asc", limit=1)] == [source.id, *files[:-1][::-1]]


def test_deleting_files(batch_server, tmp_path, data_dir):
    client, _, _ = batch_server()
    source = upload(client, tmp_path, [chat_line("only")])
    batch = wait_for_end(client, run_batch(client, source.id).id)
    deleted = client.files.delete(batch.output_file_id)
    assert deleted.deleted and deleted.id == batch.output_file_id
    with pytest.raises(openai.NotFoundError):
        client.files.content(batch.output_file_id)
    client.files.delete(source.id)
    assert [path.name for path in (data_dir / "files").iterdir()] == []


# --- what is refused -----------------------------------------------------------------------------

def test_an_unknown_file_or_batch_is_404_in_openais_shape(batch_server):
    client, _, _ = batch_server()
    for call in (lambda: client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                                               completion_window="24h"),
                 lambda: client.files.retrieve("file-nope"), lambda: client.files.content("file-nope"),
                 lambda: client.files.delete("file-nope")):
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        assert_error_shape(raised.value.response.json(), "not_found_error", "file_id", "file_not_found")
        assert "file-nope" in raised.value.message
    for call in (lambda: client.batches.retrieve("batch_nope"), lambda: client.batches.cancel("batch_nope")):
        with pytest.raises(openai.NotFoundError) as raised:
            call()
        assert_error_shape(raised.value.response.json(), "not_found_error", "batch_id", "batch_not_found")


@pytest.mark.parametrize("create, param", [
    (dict(endpoint="/v1/moderations"), "endpoint"),
    (dict(completion_window="1h"), "completion_window"),
    (dict(metadata={"key": 1}), "metadata"),
    (dict(extra_body={"output_expires_after": {"anchor": "created_at", "seconds": 3600}}), "output_expires_after"),
])
def test_a_bad_batch_request_is_400_naming_the_field(batch_server, tmp_path, create, param):
    client, _, _ = batch_server()
    source = upload(client, tmp_path, [chat_line("only")])
    arguments = dict(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h") | create
    with pytest.raises(openai.BadRequestError) as raised:
        client.batches.create(**arguments)
    assert_error_shape(raised.value.response.json(), "invalid_request_error", param)


def test_uploads_are_bounded_and_must_be_for_batches(batch_server, tmp_path, data_dir):
    client, _, _ = batch_server(max_upload_bytes=1000)
    big = tmp_path / "big.jsonl"
    big.write_text(chat_line("x" * 2000) + "\n")
    with pytest.raises(openai.APIStatusError) as raised:
        client.files.create(file=big.open("rb"), purpose="batch")
    assert raised.value.status_code == 413
    assert_error_shape(raised.value.response.json(), "invalid_request_error", "file", "file_too_large")
    small = tmp_path / "small.jsonl"
    small.write_text(chat_line("a") + "\n")
    with pytest.raises(openai.BadRequestError) as raised:
        client.files.create(file=small.open("rb"), purpose="fine-tune")
    assert_error_shape(raised.value.response.json(), "invalid_request_error", "purpose")
    assert list((data_dir / "files").iterdir()) == [], "a refused upload leaves nothing on disk"
    assert client.files.list().data == []


def test_a_batch_of_the_wrong_file_fails_validation_with_the_reason(batch_server, tmp_path):
    client, _, _ = batch_server(max_batch_lines=3)
    cases = {
        "duplicate_custom_id": [chat_line("same"), chat_line("same")],
        "too_many_requests": [chat_line(str(index)) for index in range(4)],
        "empty_file": ["", "  "],
    }
    for code, lines in cases.items():
        batch = wait_for_end(client, run_batch(client, upload(client, tmp_path, lines).id).id)
        assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None, code
        assert [error.code for error in batch.errors.data] == [code]
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    batch = wait_for_end(client, run_batch(client, client.files.create(file=binary.open("rb"), purpose="batch").id).id)
    assert batch.status == "failed" and batch.errors.data[0].code == "invalid_file_format"
    assert str(tmp_path) not in batch.errors.data[0].message


def test_the_api_key_guards_files_and_batches(batch_server, tmp_path):
    client, base, _ = batch_server(api_key="secret")
    upload(client, tmp_path, [chat_line("only")])
    stranger = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0)
    for call in (stranger.files.list, stranger.batches.list):
        with pytest.raises(openai.AuthenticationError):
            call()


def test_without_a_data_directory_the_apis_are_404(make_runner, serve_app):
    runner = make_runner(FakeBackend())
    base = serve_app(create_app(runner, ServerSettings(model_name=MODEL)))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as raised:
        client.files.list()
    assert "data directory" in raised.value.message


# --- cancelling, stopping, resuming --------------------------------------------------------------

def slow_backend(**options) -> FakeBackend:
    return FakeBackend(num_slots=2, window=256, n_batch=64, decode_delay=0.01, **options)


def test_a_cancelled_batch_keeps_the_lines_already_done(batch_server, tmp_path):
    client, _, runner = batch_server(slow_backend())
    source = upload(client, tmp_path, [completion_line(f"r{index}", max_tokens=8) for index in range(40)])
    batch = run_batch(client, source.id, "/v1/completions")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 3, 30, "three lines done")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = wait_for_end(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at and batch.error_file_id is None
    done = lines_of(client, batch.output_file_id)
    assert 3 <= len(done) == batch.request_counts.completed < 40
    assert all(line["response"]["status_code"] == 200 for line in done), "no line for the cancelled requests"
    wait_until(lambda: runner.snapshot().num_running == 0 and runner.num_waiting == 0, 5, "the runner idle")
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: nothing changes


def test_a_batch_that_ended_cannot_be_cancelled(batch_server, tmp_path):
    client, _, _ = batch_server()
    batch = wait_for_end(client, run_batch(client, upload(client, tmp_path, [chat_line("only")]).id).id)
    with pytest.raises(openai.ConflictError) as raised:
        client.batches.cancel(batch.id)
    assert_error_shape(raised.value.response.json(), "invalid_request_error", "batch_id", "batch_not_cancellable")


def test_a_batch_waiting_its_turn_is_cancelled_at_once(batch_server, tmp_path):
    client, _, _ = batch_server(slow_backend())
    first = run_batch(client, upload(client, tmp_path, [completion_line(f"r{i}", max_tokens=8) for i in range(60)]).id,
                      "/v1/completions")
    second = run_batch(client, upload(client, tmp_path, [chat_line("later")], "second.jsonl").id)
    wait_until(lambda: client.batches.retrieve(second.id).status == "in_progress", 10, "the second batch validated")
    assert client.batches.retrieve(first.id).status == "in_progress"
    assert client.batches.cancel(second.id).status == "cancelled"
    client.batches.cancel(first.id)
    assert wait_for_end(client, first.id).status == "cancelled"


def test_a_stopped_server_resumes_the_batch_and_runs_each_line_once(make_runner, data_dir, tmp_path):
    """Stopped mid-batch (its running lines cancelled, never written), then a torn line as a
    crash would leave it: the next server runs exactly the lines with no output line."""
    lines = [completion_line(f"r{index}", max_tokens=8) for index in range(30)] + ["{torn input"]
    settings = ServerSettings(model_name=MODEL, data_dir=data_dir)
    app = create_app(make_runner(slow_backend()), settings)
    with serving(app) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        batch = run_batch(client, upload(client, tmp_path, lines).id, "/v1/completions")
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 4, 30, "four lines done")
    output = data_dir / "batches" / batch.id / "output.jsonl"
    before = output.read_text().splitlines()
    assert 4 <= len(before) < 30
    done = [json.loads(line)["custom_id"] for line in before]
    missing = next(f"r{index}" for index in range(30) if f"r{index}" not in done)
    with output.open("a") as handle:  # a crash before the newline of `missing`'s line: whole JSON, yet torn
        handle.write(json.dumps({"id": "batch_req_torn", "custom_id": missing, "response": {"status_code": 200}}))
    app = create_app(make_runner(slow_backend()), settings)
    with serving(app) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        assert client.batches.retrieve(batch.id).status in ("in_progress", "finalizing", "completed")
        batch = wait_for_end(client, batch.id)
        output_lines = lines_of(client, batch.output_file_id)
        error_lines = lines_of(client, batch.error_file_id)
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (30, 1)
    assert custom_ids(output_lines, error_lines) == sorted([f"r{index}" for index in range(30)] + ["31"])
    assert [json.dumps(line) for line in output_lines[:len(before)]] == [json.dumps(json.loads(line)) for line in before]


# A server whose process kills itself (SIGKILL) in the middle of a group commit: the group's
# output lines are written, its error lines only half (one torn line). argv: data dir, input.
CRASHING_SERVER = """
import os, signal, sys
from pathlib import Path
import openai
from fakes import FakeBackend
from helpers import serving
from multiseq import Runner, RunnerConfig
from multiseq.formats.output import ResultSink
from multiseq.formats.output import OutputError, ResultSink
from multiseq.server import ServerSettings, create_app
from multiseq.server import commits

commits.COMMIT_INTERVAL_SECONDS = 0.2  # groups of several lines of each kind
whole_write = ResultSink.write_lines
output_written = []

def write_lines(sink, lines):
    if sink.name.endswith("output.jsonl"):
        output_written.append(len(lines))
    elif output_written and len(lines) >= 2:  # a group holding both kinds, its output already written
        data = b"".join(lines)
        os.write(sink._stream.fileno(), data[:len(data) - len(lines[-1]) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    whole_write(sink, lines)

ResultSink.write_lines = write_lines
backend = FakeBackend(num_slots=2, window=256, n_batch=64, decode_delay=0.01)
runner = Runner(RunnerConfig(parallel=2, slot_ctx=256, n_batch=64, threads=1, seed=0), backend=backend)
app = create_app(runner, ServerSettings(model_name="fake-model", data_dir=Path(sys.argv[1])))
with serving(app) as base:
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    source = client.files.create(file=open(sys.argv[2], "rb"), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
    print(batch.id, flush=True)
    signal.pause()  # until the commit kills the process
"""


def test_a_kill_in_the_middle_of_a_group_commit_still_writes_each_custom_id_once(make_runner, data_dir, tmp_path):
    """Lines are committed in groups; killed (SIGKILL) with a group's output lines written and
    its error lines torn, the next server finishes the batch with every custom_id in exactly
    one line, and counts taken from the files."""
    good = [completion_line(f"good{index}", max_tokens=4) for index in range(30)]
    bad = [completion_line(f"bad{index}", model="another-model") for index in range(30)]
    source = tmp_path / "input.jsonl"
    source.write_text("".join(line + "\n" for pair in zip(good, bad) for line in pair), encoding="utf-8")
    tests_dir = Path(__file__).parent
    child = subprocess.run([sys.executable, "-c", CRASHING_SERVER, str(data_dir), str(source)], cwd=tests_dir,
                           capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(tests_dir)})
    assert child.returncode == -signal.SIGKILL, child.stderr
    batch_id = child.stdout.split()[0]
    errors_file = data_dir / "batches" / batch_id / "errors.jsonl"
    assert not errors_file.read_bytes().endswith(b"\n"), "killed halfway through a group's error lines"

    app = create_app(make_runner(slow_backend()), ServerSettings(model_name=MODEL, data_dir=data_dir))
    with serving(app) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        batch = wait_for_end(client, batch_id)
        output_lines, error_lines = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
    every_id = sorted([f"good{index}" for index in range(30)] + [f"bad{index}" for index in range(30)])
    assert custom_ids(output_lines, error_lines) == every_id
    assert {line["custom_id"] for line in error_lines} == {f"bad{index}" for index in range(30)}
    assert (batch.status, batch.request_counts.completed, batch.request_counts.failed) == ("completed", 30, 30)


def test_a_result_file_that_cannot_be_written_fails_the_batch_keeping_the_lines_on_disk(batch_server, tmp_path,
                                                                                      monkeypatch):
    """A write that fails (a full disk) in the committer ends the batch failed, with a
    server_error, its requests stopped and the lines committed before it published."""
    whole_write = ResultSink.write_lines

    def write_until_full(sink, lines):
        if sink.num_lines >= 2:
            raise OutputError(f"cannot write results to {sink.name}: No space left on device")
        whole_write(sink, lines)

    monkeypatch.setattr(ResultSink, "write_lines", write_until_full)
    client, _, runner = batch_server(slow_backend())
    source = upload(client, tmp_path, [completion_line(f"r{index}", max_tokens=8) for index in range(40)])
    batch = wait_for_end(client, run_batch(client, source.id, "/v1/completions").id)
    assert batch.status == "failed" and [error.code for error in batch.errors.data] == ["server_error"]
    done = lines_of(client, batch.output_file_id)
    assert 2 <= len(done) == batch.request_counts.completed < 40
    assert "No space" not in json.dumps(batch.errors.model_dump()), "the disk's error goes to the log, not the client"
    wait_until(lambda: runner.snapshot().num_running == 0 and runner.num_waiting == 0, 5, "the batch's requests stopped")


# --- below interactive work ----------------------------------------------------------------------

def test_batch_lines_run_below_interactive_requests_and_few_at_a_time(batch_server, tmp_path):
    """Batch lines go to the runner at Priority.BATCH, at most LINES_PER_SLOT x slots at once;
    an interactive request goes at Priority.INTERACTIVE, and --max-queue, which batch work does
    not use up, does not refuse it."""
    client, _, runner = batch_server(slow_backend(replies={HI: REPLY}), max_queue=1)
    seen, open_ids, most_open = [], set(), [0]
    lock = threading.Lock()
    submit = runner.submit

    def spying_submit(request, **options):
        finish = options.get("on_finish")

        def on_finish(result):
            with lock:
                open_ids.discard(result.id)
            if finish is not None:
                finish(result)

        with lock:
            seen.append((request.id, request.priority))
            open_ids.add(request.id)
            most_open[0] = max(most_open[0], sum(1 for open_id in open_ids if open_id.startswith("batch_")))
        return submit(request, **(options | {"on_finish": on_finish}))

    runner.submit = spying_submit
    batch = run_batch(client, upload(client, tmp_path, [completion_line(f"r{index}", max_tokens=6)
                                                        for index in range(40)]).id, "/v1/completions")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 2, 30, "the batch running")
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], temperature=0)
    assert reply.choices[0].message.content == REPLY
    assert client.batches.retrieve(batch.id).request_counts.completed < 40, "the reply came while the batch ran"
    assert wait_for_end(client, batch.id).request_counts.completed == 40
    batch_priorities = {priority for request_id, priority in seen if request_id.startswith(batch.id)}
    interactive = [priority for request_id, priority in seen if not request_id.startswith("batch_")]
    assert batch_priorities == {Priority.BATCH} and interactive == [Priority.INTERACTIVE]
    assert most_open[0] <= LINES_PER_SLOT * runner.config.parallel


def test_a_batch_runs_on_the_model_its_lines_name_loaded_for_it(make_runner, serve_app, data_dir, tmp_path):
    """Two models served; the second loads at its first use. A batch whose lines name the
    second runs on it (loaded for the batch), its output naming it; a line of that batch
    naming the first is that line's error; a batch naming none runs on the first."""
    from multiseq.config import RunnerConfig
    from multiseq.server.loader import ModelLoader

    app = create_app(make_runner(FakeBackend(num_slots=2, window=256, n_batch=64, replies={HI: REPLY})),
                     ServerSettings(model_name=MODEL, more_models=("second",), data_dir=data_dir))
    state = app.state.server
    state.models.named("second").config = RunnerConfig(model="second.gguf", parallel=2)
    state.models.default.config = RunnerConfig(model="first.gguf", parallel=2)
    opened = []

    def open_runner(config: RunnerConfig):
        opened.append(config.model)
        return make_runner(FakeBackend(num_slots=2, window=256, n_batch=64, replies={HI: "I am the second."}))

    state.loader = ModelLoader(state.models, open_runner, state.attach, on_unloaded=state.forget_runner)
    client = openai.OpenAI(base_url=f"{serve_app(app)}/v1", api_key="unused", max_retries=0)
    second = upload(client, tmp_path, [chat_line("s1", model="second"), chat_line("s2", model="second:latest"),
                                        chat_line("mixed", model=MODEL), chat_line("unnamed", model=None)])
    batch = wait_for_end(client, run_batch(client, second.id).id)
    assert batch.status == "completed" and batch.model == "second" and opened == ["second.gguf"]
    outputs = {line["custom_id"]: line["response"]["body"] for line in lines_of(client, batch.output_file_id)}
    assert {name: body["choices"][0]["message"]["content"] for name, body in outputs.items()} == {
        "s1": "I am the second.", "s2": "I am the second.", "unnamed": "I am the second."}
    assert {body["model"] for body in outputs.values()} == {"second"}
    [error] = lines_of(client, batch.error_file_id)
    assert error["custom_id"] == "mixed" and error["response"]["body"]["error"]["param"] == "model"

    first = upload(client, tmp_path, [chat_line("f1", model=None)], name="first.jsonl")
    batch = wait_for_end(client, run_batch(client, first.id).id)
    assert batch.model == MODEL and lines_of(client, batch.output_file_id)[0]["response"]["body"]["model"] == MODEL


def test_a_batch_whose_requests_were_cancelled_under_it_resumes_them_and_completes_whole(batch_server, tmp_path):
    """Requests of a running batch cancelled by something else than the batch (its model
    unloaded under it): they get no line, and the batch runs them again instead of completing
    without them."""
    backend = FakeBackend(num_slots=2, window=256, n_batch=64, decode_delay=0.02, replies={HI: REPLY})
    client, _, runner = batch_server(backend)
    source = upload(client, tmp_path, [completion_line(f"line-{index}", max_tokens=12, ignore_eos=True)
                                       for index in range(6)])
    batch = run_batch(client, source.id, endpoint="/v1/completions")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 1, 30, "a first line")
    assert runner.cancel_all() > 0, "lines were running or waiting"
    batch = wait_for_end(client, batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 6 and batch.request_counts.failed == 0
    assert custom_ids(lines_of(client, batch.output_file_id)) == sorted(f"line-{index}" for index in range(6))
